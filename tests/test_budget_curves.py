"""The same cells at two budgets (hmer.reports.budget_curves): the plateau and gap readings on
curves whose answer is known, then the committed store's cpu and long coverage runs read and
drawn (read-only: the store is opened through its SQLite file, never written)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hmer.reports.budget_curves import (
    PLATEAU_EPOCHS,
    budget_history,
    budget_summary,
    claim_cells,
    gap_summary,
    plateau,
    plot_budget_curves,
)
from hmer.reports.paper_claims import CLAIMS

MLRUNS = Path(__file__).resolve().parents[1] / "mlruns"


def test_a_plateau_is_read_from_the_means_of_the_last_epochs_not_from_single_epochs():
    rising = pd.Series(np.linspace(0, 30, 60))
    # stopped learning at epoch 30, then read up and down by ±2.5 points from one epoch to the next
    flat = pd.Series(np.r_[np.linspace(0, 30, 30), 30 + 2.5 * np.sin(2.1 * np.arange(50))])
    assert flat.iloc[-PLATEAU_EPOCHS:].max() - flat.iloc[-PLATEAU_EPOCHS:].min() > 4  # no single-epoch rule holds
    assert plateau(rising) == "still rising"
    assert plateau(flat) == "plateau"
    assert plateau(flat.iloc[:2 * PLATEAU_EPOCHS - 1]) == "too short to tell"
    assert plateau(pd.Series(np.r_[np.linspace(0, 30, 30), np.linspace(30, 20, 30)])) == "falling"


def test_a_claims_cells_are_its_first_comparison_the_study_trains():
    coverage = next(c for c in CLAIMS if c.name == "coverage")
    assert claim_cells(coverage, ["none", "fusion"]) == ("fusion", "none")
    assert claim_cells(coverage, ["self", "none"]) == ("self", "none")
    assert claim_cells(coverage, ["none"]) == ("fusion", "none")  # the long study trains its baseline first
    assert claim_cells(coverage, ["sin2d"]) is None


def _curves(claim, budget, winner, loser, seeds, epochs, rate, tests):
    rows = []
    for variant, slope in ((winner, rate[0]), (loser, rate[1])):
        for seed in seeds:
            for step in range(1, epochs + 1):
                rows.append({"claim": claim, "budget": budget, "variant": variant, "seed": seed,
                             "run_id": f"{budget}-{variant}-{seed}", "state": "finished", "step": step,
                             "val_exprate": slope * step, "cpu_hours": 0.04 * step, "winner": winner, "loser": loser,
                             "test_2014_exprate": tests[variant]})
    return rows


def test_the_gap_of_a_later_budget_grows_shrinks_or_holds_against_the_first():
    rows = _curves("coverage", "cpu", "fusion", "none", (1, 2, 3), 13, (1.0, 0.5), {"fusion": 16.0, "none": 12.0})
    rows += _curves("coverage", "long", "fusion", "none", (1,), 100, (0.4, 0.35), {"fusion": 36.0, "none": 30.0})
    rows += _curves("direction", "cpu", "bi", "l2r", (1, 2, 3), 13, (1.0, 0.9), {"bi": 12.0, "l2r": 10.0})
    rows += _curves("direction", "long", "bi", "l2r", (1,), 100, (0.3, 0.3), {"bi": 30.0, "l2r": 29.5})
    history = pd.DataFrame(rows)
    gaps = gap_summary(history).set_index(["claim", "budget"])
    assert gaps.loc[("coverage", "cpu"), "test_2014_gap"] == pytest.approx(4.0)
    assert gaps.loc[("coverage", "long"), "test_2014_trend"] == "grows"  # 6 against 4
    assert gaps.loc[("direction", "long"), "test_2014_trend"] == "shrinks"  # 0.5 against 2
    # the validation gap over the last epochs both variants reached
    assert gaps.loc[("coverage", "long"), "val_gap_last_epochs"] == pytest.approx(0.05 * np.mean(range(96, 101)))
    summary = budget_summary(history).set_index(["claim", "budget", "variant"])
    assert summary.loc[("coverage", "long", "fusion"), "best_val_exprate"] == pytest.approx(40.0)
    assert summary.loc[("coverage", "long", "fusion"), "cpu_hours"] == pytest.approx(4.0)
    assert summary.loc[("coverage", "cpu", "none"), "plateau"] == "too short to tell"
    assert np.isnan(summary.loc[("coverage", "cpu", "none"), "last_spread"])


@pytest.mark.skipif(not (MLRUNS / "mlflow.db").exists(),
                    reason="no committed store in mlruns/ (a checkout without results)")
def test_the_committed_coverage_runs_are_read_at_both_budgets_and_drawn(tmp_path):
    shutil.copy(MLRUNS / "mlflow.db", tmp_path / "mlflow.db")  # the histories live in the database alone
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    history = budget_history(["coverage"], tracking_uri=uri)
    runs = history.drop_duplicates("run_id")
    cpu = runs[runs["budget"] == "cpu"]
    assert sorted(cpu["variant"].unique()) == ["fusion", "none"] and sorted(cpu["seed"].unique()) == [1, 2, 3]
    assert (history[history["budget"] == "cpu"].groupby("run_id")["step"].max() == 13).all()
    long = history[history["budget"] == "long"]
    assert not long.empty and long["step"].max() >= 28  # kept unfinished at epoch 28 or later
    assert set(long["variant"]) <= {"fusion", "none"}
    fig = plot_budget_curves(history, path=tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 10_000 and len(fig.axes) == 2


def test_a_study_s_curves_count_each_cell_once_where_an_attempt_was_killed_and_trained_again(tmp_path):
    """The committed `cpu` coverage study began some cells more than once (a killed worker's run,
    tagged `hmer.trained_again_in`); its curves draw each (variant, seed) once, the finished run."""
    from hmer.reports import curve_runs, load_runs

    shutil.copy(MLRUNS / "mlflow.db", tmp_path / "mlflow.db")
    runs = load_runs(f"sqlite:///{tmp_path / 'mlflow.db'}", study="ablate_coverage-cpu")
    killed = runs["tags.hmer.trained_again_in"].notna()
    assert killed.sum() >= 3 and runs[killed]["run_id"].nunique() == killed.sum()
    curves = curve_runs(runs)
    assert not curves["run_id"].isin(runs[killed]["run_id"]).any()
    assert not curves.duplicated(["variant", "seed"]).any()
    assert len(curves) == len(runs[~killed].drop_duplicates(["variant", "seed"])) == 12  # four coverages, three seeds
