"""Reports: significance tests and tables on hand-made data where the answer is known, then
loading, tables, plots, attention maps and `hmer report` on the store a real smoke study made."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest

from hmer.reports.runs import PredictionsNotFound, parse_value, typed_column
from hmer.evaluation.significance import (compare, exact_binomial_two_sided, mcnemar, paired_bootstrap,
                                       seed_pairs, sign_flip)
from hmer.reports.tables import MISSING, format_table, grid_order, resolve_baseline, variant_table
from study_store import OVERRIDES, STUDY_NAME, TEST_SPLITS, VARIANTS, study_store

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---- significance on hand-made data ---------------------------------------------------------------

def test_identical_systems_differ_by_nothing_with_p_one():
    rng = np.random.default_rng(3)
    right = rng.random(200) < 0.4
    boot = paired_bootstrap(right, right, n_resamples=2_000)
    assert boot.difference == 0.0 and boot.low == 0.0 and boot.high == 0.0
    assert boot.p_value == 1.0 and boot.n == 200
    test = mcnemar(right, right)
    assert (test.baseline_only, test.variant_only, test.p_value) == (0, 0, 1.0)


@pytest.mark.parametrize("k", [1, 3, 6, 10])
def test_one_system_right_on_every_discordant_pair_matches_the_exact_binomial(k):
    # 30 expressions both read, 20 neither, k only the variant reads: P = 2 * 0.5**k (two-sided).
    base = np.array([True] * 30 + [False] * 20 + [False] * k)
    var = np.array([True] * 30 + [False] * 20 + [True] * k)
    test = mcnemar(base, var)
    assert (test.baseline_only, test.variant_only) == (0, k)
    assert test.p_value == pytest.approx(min(1.0, 2 * 0.5**k), rel=1e-12)
    boot = paired_bootstrap(base, var, n_resamples=4_000, seed=1)
    assert boot.difference == pytest.approx(100.0 * k / len(base))
    if k >= 6:  # a clear difference: the interval excludes zero and the p-value is small
        assert boot.low > 0 and boot.p_value < 0.05


def test_exact_binomial_by_hand():
    assert exact_binomial_two_sided(1, 10) == pytest.approx(2 * (1 + 10) / 1024)
    assert exact_binomial_two_sided(9, 10) == exact_binomial_two_sided(1, 10)
    assert exact_binomial_two_sided(5, 10) == 1.0
    assert exact_binomial_two_sided(0, 0) == 1.0
    # Exact integers down to the smallest doubles (a float sum of tiny terms would lose them).
    assert exact_binomial_two_sided(1, 1000) == pytest.approx(math.ldexp(1001, -999), rel=1e-12)
    with pytest.raises(ValueError):
        exact_binomial_two_sided(3, 2)


def test_bootstrap_interval_and_p_value_are_consistent_and_reproducible():
    rng = np.random.default_rng(0)
    base = rng.random(300) < 0.45
    var = np.where(rng.random(300) < 0.15, ~base, base)  # 15 % of answers flipped, no systematic gain
    a = paired_bootstrap(base, var, n_resamples=3_000, seed=7)
    assert a == paired_bootstrap(base, var, n_resamples=3_000, seed=7)
    assert a.low <= a.difference <= a.high
    # A 95 % interval containing 0 goes with p > 0.05 and vice versa (up to resampling noise at the edge).
    assert (a.low <= 0 <= a.high) == (a.p_value > 0.05)


def test_several_seeds_average_for_the_bootstrap_and_take_the_largest_mcnemar_p():
    n = 40
    base = np.zeros((2, n), dtype=bool)
    var = np.zeros((2, n), dtype=bool)
    var[0, :12] = True  # seed 1: the variant reads 12 more expressions (p = 2 * 0.5**12)
    # seed 2: the two runs are identical (p = 1)
    result = compare(base, var, baseline_seeds=[1, 2], variant_seeds=[2, 1], n_resamples=2_000)
    # Seed-averaged correctness: 12 expressions at 0.5 -> difference 100 * 6 / 40 = 15 points.
    assert result.difference == pytest.approx(15.0)
    assert result.pairs == 2 and result.p_mcnemar == 1.0  # seed 1 with seed 1 (row 1 of var): identical
    one = compare(base[:1], var[:1], n_resamples=2_000)
    assert one.p_mcnemar == pytest.approx(2 * 0.5**12)


def test_seed_pairs_match_seeds_else_sorted_order():
    assert seed_pairs([1, 2, 3], [3, 1]) == [(0, 1), (2, 0)]
    assert seed_pairs([5, 4], [8, 7]) == [(1, 1), (0, 0)]


def _every_sign_flip_p(baseline: np.ndarray, variant: np.ndarray) -> float:
    """The sign-flip p by brute force: the share of all 2^n sign patterns whose |sum| reaches the observed."""
    per_expression = variant.mean(axis=0) - baseline.mean(axis=0)
    observed = abs(per_expression.sum())
    if observed < 1e-12:
        return 1.0
    signs = np.array(list(itertools.product((-1.0, 1.0), repeat=len(per_expression))))
    return float(np.mean(np.abs(signs @ per_expression) >= observed - 1e-9))


def test_the_sign_flip_p_is_the_share_of_all_sign_patterns():
    rng = np.random.default_rng(5)
    for _ in range(30):  # seed counts 1-3 on either side, so every lattice of differences is met
        n = int(rng.integers(4, 13))
        baseline = rng.random((int(rng.integers(1, 4)), n)) < 0.4
        variant = rng.random((int(rng.integers(1, 4)), n)) < 0.55
        result = sign_flip(baseline, variant)
        assert result.p_value == pytest.approx(_every_sign_flip_p(baseline, variant), abs=1e-12)
        assert result.difference == pytest.approx(100 * (variant.mean() - baseline.mean()))


def test_sign_flip_on_known_answers():
    n = 200
    baseline = np.zeros((3, n), dtype=bool)
    variant = np.zeros((3, n), dtype=bool)
    variant[:, :40] = True  # every seed of the variant reads 40 more expressions: the only informative ones
    result = sign_flip(baseline, variant)
    assert result.p_value == pytest.approx(2 * 0.5**40) and result.favours == 1 and result.informative == 40
    assert result.difference == pytest.approx(20.0)
    # exact symmetry: the sides swapped, the same p for the other side
    swapped = sign_flip(variant, baseline)
    assert swapped.p_value == result.p_value and swapped.favours == -1 and swapped.difference == -20.0
    # identical systems, or differences that cancel: p = 1 and no side
    assert sign_flip(variant, variant) == sign_flip(baseline, baseline)
    assert sign_flip(variant, variant).p_value == 1.0 and sign_flip(variant, variant).favours == 0
    level = baseline.copy()
    level[0, :5] = True  # one baseline seed reads 5 expressions ...
    other = baseline.copy()
    other[1, 5:10] = True  # ... one variant seed 5 others
    assert (sign_flip(level, other).p_value, sign_flip(level, other).favours) == (1.0, 0)
    # one expression read by one variant seed of three: p = 1 (its flip is as extreme)
    one = baseline.copy()
    one[2, 0] = True
    assert sign_flip(baseline, one).p_value == 1.0 and sign_flip(baseline, one).favours == 1


def test_sign_flip_holds_its_level_when_the_systems_do_not_differ():
    """Under the null (both sides drawn alike), p < 0.05 in about 5 % of the data sets, never far more."""
    rng = np.random.default_rng(11)
    ps = []
    for _ in range(400):
        skill = rng.random(300) * 0.4  # expressions differ in difficulty, the systems do not
        ps.append(sign_flip(rng.random((3, 300)) < skill, rng.random((3, 300)) < skill).p_value)
    rejected = np.mean(np.array(ps) < 0.05)
    assert 0.02 <= rejected <= 0.08, rejected
    assert 0.4 <= np.median(ps) <= 0.6  # p spread over (0, 1], not piled at either end


def test_sign_flip_is_invariant_to_the_order_of_expressions_and_of_seeds():
    rng = np.random.default_rng(2)
    baseline = rng.random((3, 500)) < 0.12
    variant = rng.random((3, 500)) < 0.15
    result = sign_flip(baseline, variant)
    assert result.p_value < 0.05 and result.favours == 1
    for _ in range(5):
        order = rng.permutation(500)
        assert sign_flip(baseline[:, order], variant[:, order]) == result
        assert sign_flip(baseline[rng.permutation(3)], variant[rng.permutation(3)]) == result


def test_compare_tests_all_seeds_at_once_and_tells_each_pairs_side():
    """Two seed pairs favour the baseline beyond doubt and the third favours the variant a little: the
    largest McNemar p says 'nothing', the sides and the test over all seeds do not."""
    n = 1_000
    baseline = np.zeros((3, n), dtype=bool)
    variant = np.zeros((3, n), dtype=bool)
    baseline[0, :40] = True  # seed 1: the baseline reads 40 more
    baseline[1, 40:70] = True  # seed 2: 30 more
    variant[0, 70:73] = True  # seed 3 (the variant's first row): the variant reads 3 more
    result = compare(baseline, variant, baseline_seeds=[1, 2, 3], variant_seeds=[3, 2, 1], n_resamples=1_000)
    # the pairs match seeds, in the order of the baseline's seeds
    assert [(t.baseline_only, t.variant_only) for t in result.mcnemar] == [(40, 0), (30, 0), (0, 3)]
    assert [t.favours for t in result.mcnemar] == [-1, -1, 1]
    assert result.mcnemar[1].p_value < 1e-6 and result.mcnemar[2].p_value == 0.25  # 3 of 3: 2 * 0.5**3
    assert result.p_mcnemar == max(t.p_value for t in result.mcnemar)
    assert result.sign_flip.favours == -1 and result.sign_flip.p_value < 1e-10
    assert result.sign_flip.difference == pytest.approx(result.difference)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="different numbers"):
        paired_bootstrap([True, False], [True])
    with pytest.raises(ValueError, match="0/1"):
        paired_bootstrap([0.5, 2.0], [1, 0])
    with pytest.raises(ValueError):
        mcnemar([True, False], [True])
    with pytest.raises(ValueError, match="0/1 correctness per run"):
        sign_flip([0.5, 1.0], [1, 0])
    with pytest.raises(ValueError, match="different numbers"):
        sign_flip([True, False], [True])


# ---- params back from strings ------------------------------------------------------------------

def test_params_are_typed_back_by_config_field_or_inferred():
    assert parse_value("1.0", float) == 1.0 and parse_value("300", int) == 300
    assert parse_value("1e3", int) == 1000 and parse_value("False", bool) is False
    assert parse_value("none", str) == "none" and parse_value("2014,2016", str) == "2014,2016"
    assert parse_value("12345") == 12345 and parse_value("0.25") == 0.25 and parse_value("true") is True
    assert parse_value('{"model.direction": "l2r"}') == '{"model.direction": "l2r"}'
    assert parse_value("oops", int) == "oops"  # an old run's value a newer Config refuses
    assert str(typed_column([1, None, 3]).dtype) == "Int64"
    assert str(typed_column([True, None]).dtype) == "boolean"
    assert typed_column([1, 2.5]).dtype == np.float64


# ---- tables on hand-made runs ----------------------------------------------------------------------

def _runs(rows: list[dict]) -> pd.DataFrame:
    """A load_runs-like frame: variant, seed, trial, state, start_time and metrics.* columns."""
    out = []
    for i, r in enumerate(rows):
        row = {"run_id": f"run{i}", "variant": r["variant"], "seed": r.get("seed", 1), "trial": i,
               "state": r.get("state", "finished"),
               "start_time": pd.Timestamp("2026-01-01", tz="UTC") + pd.Timedelta(i, "min"),
               "metrics.num_params": 1_500_000, "metrics.gpu_minutes": r.get("gpu", 2.0),
               "metrics.train_seconds": 600.0, "metrics.train_images_per_second": 100.0}
        for year, score in r.get("scores", {}).items():
            row.update({f"metrics.test_{year}_exprate": score, f"metrics.test_{year}_le1": score + 10,
                        f"metrics.test_{year}_le2": score + 20, f"metrics.test_{year}_n": 50})
        row.update({f"tags.{k}": v for k, v in r.get("tags", {}).items()})
        out.append(row)
    return pd.DataFrame(out)


HAND = [
    {"variant": "l2r", "seed": 1, "scores": {"2014": 40.0, "2016": 38.0}},
    {"variant": "r2l", "seed": 1, "scores": {"2014": 36.0, "2016": 35.0}},
    {"variant": "bi", "seed": 1, "scores": {"2014": 50.0, "2016": 47.0}},
    {"variant": "l2r", "seed": 2, "scores": {"2014": 44.0, "2016": 40.0}},
    {"variant": "bi", "seed": 2, "scores": {"2014": 54.0, "2016": 49.0}},
    {"variant": "r2l", "seed": 2, "state": "failed"},
    {"variant": "r2l", "seed": 3, "state": "pruned", "scores": {"2014": 1.0}},
]


def test_variant_table_means_std_seeds_and_exclusions():
    df = variant_table(_runs(HAND), title="hand")
    assert list(df.index) == ["l2r", "r2l", "bi"] and df.attrs["baseline"] == "l2r"
    assert df.loc["l2r", "2014_exprate_mean"] == 42.0
    assert df.loc["l2r", "2014_exprate_std"] == pytest.approx(np.std([40, 44], ddof=1))
    assert df.loc["bi", "2016_le2_mean"] == 68.0 and df.loc["bi", "seeds"] == 2
    assert df.loc["r2l", "seeds"] == 1 and math.isnan(df.loc["r2l", "2014_exprate_std"])
    assert df.loc["r2l", "excluded"] == 2 and df.attrs["excluded"] == {"failed": 1, "pruned": 1}
    assert df.loc["bi", "2014_delta"] == 10.0 and df.loc["r2l", "2016_delta"] == -4.0
    assert df.loc["l2r", "2014_delta"] == 0.0 and math.isnan(df.loc["bi", "2014_p_bootstrap"])  # no predictions
    assert df.loc["bi", "num_params"] == 1_500_000 and df.loc["bi", "gpu_minutes"] == 2.0
    assert df.loc["bi", "train_minutes"] == 10.0
    assert math.isnan(df.loc["bi", "cpu_minutes"]) and "CPU min" not in format_table(df)  # runs before it was logged
    costed = _runs(HAND).assign(**{"metrics.cpu_seconds": 900.0})
    df = variant_table(costed)
    assert df.loc["bi", "cpu_minutes"] == 15.0 and "CPU min" in format_table(df)


def test_format_table_text_and_markdown():
    df = variant_table(_runs(HAND), title="hand")
    text = format_table(df)
    assert "hand" in text and "2014 ExpRate" in text and "2016 ≤2" in text
    assert f"36.0 ± {MISSING}" in text  # one seed: no standard deviation
    assert "42.0 ± 2.8" in text and "+10.0" in text and "1.50M" in text
    assert "2 (1 failed, 1 pruned)" in text and "without tests" in text
    md = format_table(df, "markdown")
    rows = [line for line in md.splitlines() if line.startswith("|")]
    assert len(rows) == 2 * (2 + 3)  # two tables: header, rule and three variants each
    assert rows[0].startswith("| variant | seeds | 2014 ExpRate")
    assert "| l2r (baseline) |" in md
    with pytest.raises(ValueError):
        format_table(df, "html")
    assert "no runs" in format_table(variant_table(_runs([]).reindex(columns=["run_id", "variant"])))


def test_table_with_predictions_has_paired_tests():
    rng = np.random.default_rng(5)
    names = [f"e{i}" for i in range(80)]
    skill = {"l2r": 0.3, "r2l": 0.3, "bi": 0.8}
    runs = _runs(HAND[:5])
    truth = {r: rng.random(80) < skill[v] for r, v in zip(runs["run_id"], runs["variant"])}
    truth["run1"] = truth["run0"].copy()  # r2l seed 1 reads exactly what l2r seed 1 reads

    def loader(run_id: str, year: str) -> pd.DataFrame:
        if year == "2016":
            raise PredictionsNotFound(run_id)
        return pd.DataFrame({"name": names, "correct": truth[run_id]})

    df = variant_table(runs, predictions=loader, n_resamples=2_000)
    bi = df.loc["bi"]
    expected = 100 * (np.mean([truth["run2"], truth["run4"]], axis=0) - np.mean([truth["run0"], truth["run3"]],
                                                                                   axis=0)).mean()
    assert bi["2014_delta"] == pytest.approx(expected)
    assert bi["2014_delta_low"] > 0 and bi["2014_p_bootstrap"] < 0.01 and bi["2014_p_mcnemar"] < 0.01
    assert df.loc["r2l", "2014_p_mcnemar"] == 1.0 and df.loc["r2l", "2014_delta"] == pytest.approx(
        100 * (truth["run1"].mean() - (truth["run0"].mean() + truth["run3"].mean()) / 2))
    assert math.isnan(bi["2016_p_bootstrap"]) and bi["2016_delta"] == 9.0  # no CSV: metric difference, no test
    assert "<0.001" in format_table(df) or "0.00" in format_table(df)


def test_differences_and_tests_within_two_edits():
    """`metric="le2"`: a variant that reads no formula exactly but gets close is told apart."""
    names = [f"e{i}" for i in range(60)]
    runs = _runs(HAND[:5])
    # l2r is off by 3 or more edits everywhere; bi by exactly 2 on 40 of the 60 (never exact)
    distance = {r: np.full(60, 3) for r in runs["run_id"]}
    for r, v in zip(runs["run_id"], runs["variant"]):
        if v == "bi":
            distance[r][:40] = 2

    def loader(run_id: str, year: str) -> pd.DataFrame:
        d = distance[run_id]
        return pd.DataFrame({"name": names, "distance": d, "correct": d == 0})

    exact = variant_table(runs, years=["2014"], predictions=loader, n_resamples=1_000)
    assert exact.loc["bi", "2014_p_bootstrap"] == 1.0 and exact.loc["bi", "2014_p_mcnemar"] == 1.0
    assert exact.loc["bi", "2014_delta"] == 0.0  # from the predictions: neither reads one exactly
    within = variant_table(runs, years=["2014"], predictions=loader, metric="le2", n_resamples=1_000)
    assert within.loc["bi", "2014_delta_low"] > 0 and within.loc["bi", "2014_p_bootstrap"] < 0.01
    assert within.loc["bi", "2014_p_mcnemar"] < 0.001  # 40 discordant pairs, all one way
    assert within.attrs["metric"] == "le2"
    text = format_table(within)
    assert "2014 Δ ≤2" in text and "Δ ≤2 in percentage points" in text and "Δ ExpRate" not in text
    with pytest.raises(ValueError, match="unknown metric 'le3'"):
        variant_table(runs, predictions=loader, metric="le3")


def test_baseline_from_tag_cell_or_json():
    runs = _runs([{"variant": v, "scores": {"2014": 10.0}, "tags": {"hmer.cell": f"model.direction={v}",
                                                                       "hmer.baseline": str(v == "bi").lower()}}
                  for v in ("l2r", "bi")])
    assert resolve_baseline(runs) == "bi"
    assert resolve_baseline(runs, "model.direction=l2r") == "l2r"
    assert resolve_baseline(runs, json.dumps({"model.direction": "l2r"})) == "l2r"
    assert resolve_baseline(runs, {"model.direction": "bi"}) == "bi"
    assert list(variant_table(runs, baseline="l2r").index) == ["l2r", "bi"]
    assert list(variant_table(runs).index) == ["bi", "l2r"]
    with pytest.raises(ValueError, match="none of the variants"):
        resolve_baseline(runs, "r2l")


def test_a_study_whose_baseline_has_not_finished_a_trial_keeps_it_as_the_baseline():
    """A study in progress (the decoder study: its GRU baseline still training) prints its finished
    variants with no differences, rather than refusing, or measuring them against another one."""
    runs = _runs([{"variant": "rnn", "state": "running"},
                  {"variant": "transformer", "scores": {"2014": 12.0}},
                  {"variant": "convs2s", "scores": {"2014": 0.0}}])
    df = variant_table(runs, baseline=json.dumps({"model.decoder": "rnn"}))
    assert list(df.index) == ["rnn", "transformer", "convs2s"] and df.attrs["baseline"] == "rnn"
    assert df.loc["rnn", "seeds"] == 0 and df.loc["rnn", "excluded"] == 1
    assert df.loc["transformer", "2014_exprate_mean"] == 12.0 and math.isnan(df.loc["transformer", "2014_delta"])
    text = format_table(df)
    assert "rnn (baseline)" in text and "12.0" in text
    assert "The baseline rnn has no finished run yet" in text and "No predictions artifacts" not in text
    with pytest.raises(ValueError, match="none of the variants"):
        variant_table(runs, baseline="l2r")


def test_rows_follow_the_study_grid_with_the_baseline_first():
    parent = pd.Series({"params.grid": json.dumps({"model.direction": ["l2r", "r2l", "bi"], "train.seed": [1, 2]})})
    assert grid_order(parent) == ["l2r", "r2l", "bi"]
    two_axes = pd.Series({"params.grid": json.dumps({"model.decoder": ["rnn", "transformer"], "train.lr": [0.5, 1.0]})})
    assert grid_order(two_axes) == ["rnn/0.5", "rnn/1.0", "transformer/0.5", "transformer/1.0"]
    assert grid_order(None) == [] and grid_order(pd.Series({"params.grid": "not json"})) == []
    runs = _runs(HAND)  # ran in the order l2r, r2l, bi
    assert list(variant_table(runs, order=["bi", "l2r", "r2l"]).index) == ["l2r", "bi", "r2l"]


# ---- on the store a real smoke study made --------------------------------------------------------------

@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return study_store(tmp_path_factory.getbasetemp() / "report-study-store")


@pytest.mark.slow
def test_runs_come_back_typed(store):
    from hmer.reports import list_studies, load_history, load_predictions, load_runs, scored_years

    runs = load_runs(store.tracking_uri, study=store.study)
    assert len(runs) == len(VARIANTS) and set(runs["variant"]) == set(VARIANTS)
    assert (runs["state"] == "finished").all() and runs["seed"].tolist() == [1, 1]
    assert runs["params.train.lr"].dtype == np.float64 and str(runs["params.train.epochs"].dtype) == "Int64"
    assert runs["params.train.compile"].dtype == "boolean" and set(runs["params.model.coverage"]) == set(VARIANTS)
    assert scored_years(runs) == ["2014", "2016", "2019"]
    assert load_runs(store.tracking_uri, experiment=store.study)["run_id"].tolist() == runs["run_id"].tolist()
    studies = list_studies(store.tracking_uri)
    assert studies.loc[0, "study"] == STUDY_NAME and studies.loc[0, "runs"] == len(VARIANTS)
    history = load_history(runs, ["val_exprate", "train_loss"], store.tracking_uri)
    assert set(history["metric"]) == {"val_exprate", "train_loss"}
    assert len(history) == 2 * len(VARIANTS) * OVERRIDES["train.epochs"] and (history["seconds"] >= 0).all()
    preds = load_predictions(runs["run_id"][0], 2016, store.tracking_uri)
    assert len(preds) == TEST_SPLITS["2016"] and preds["correct"].dtype == bool
    with pytest.raises(PredictionsNotFound):
        load_predictions(runs["run_id"][0], 2099, store.tracking_uri)


def test_a_studys_budget_reads_from_its_parent_run_or_a_trial_s_tag():
    from hmer.reports.runs import study_budget
    from hmer.tracking import keys

    assert study_budget(pd.Series({"params.budget": "cpu", f"tags.{keys.BUDGET}": "cpu"})) == "cpu"
    assert study_budget(pd.Series({f"tags.{keys.BUDGET}": "short", "params.name": "x"})) == "short"  # a trial's run
    assert study_budget(pd.Series({"params.name": "x"})) is None


@pytest.mark.slow
def test_hmer_report_list_shows_each_study_with_its_budget(store, capsys):
    from hmer.cli import main as hmer_main

    capsys.readouterr()
    assert hmer_main(["report", "--list", "--tracking-uri", store.tracking_uri]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:4] == ["study", "kind", "budget", "state"], lines
    assert lines[2].split()[:4] == [STUDY_NAME, "grid", "smoke", "finished"], lines


@pytest.mark.slow
def test_study_table_of_the_smoke_study(store):
    from hmer.reports import study_table

    df = study_table(store.study, store.tracking_uri, n_resamples=500)
    assert list(df.index) == list(VARIANTS) and df.attrs["baseline"] == "none"
    assert df["seeds"].tolist() == [1, 1] and df["excluded"].tolist() == [0, 0]
    for year in ("2014", "2016", "2019"):
        assert df[f"{year}_n"].tolist() == [TEST_SPLITS[year]] * 2
        assert df[f"{year}_exprate_mean"].between(0, 100).all()
        assert df[f"{year}_exprate_std"].isna().all()  # one seed
        assert not math.isnan(df.loc["cross", f"{year}_p_mcnemar"])  # the predictions CSVs were used
    assert (df["num_params"] > 0).all() and (df["train_minutes"] > 0).all()
    text = format_table(df)
    assert STUDY_NAME in text and f"± {MISSING}" in text and "none (baseline)" in text


@pytest.mark.slow
def test_report_command_writes_tables_and_plots(store, tmp_path, capsys):
    from hmer.cli.report import report_command

    out = tmp_path / "report"
    assert report_command(study=store.study, tracking_uri=store.tracking_uri, out_dir=out, n_resamples=500) == 0
    md = (out / "table.md").read_text()
    assert f"# Report: {STUDY_NAME}" in md and "| variant | seeds | 2014 ExpRate" in md and "2019 Δ ExpRate" in md
    assert "![ExpRate by variant and year](plots/exprate.png)" in md
    table = pd.read_csv(out / "table.csv", index_col="variant")
    assert list(table.index) == list(VARIANTS) and "2016_exprate_mean" in table.columns
    assert len(pd.read_csv(out / "runs.csv")) == len(VARIANTS)
    for name in ("exprate", "scores", "training_curves"):
        png = out / "plots" / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000
    printed = capsys.readouterr().out
    assert "2014 ExpRate" in printed and "wrote 6 files" in printed

    # The runs trained by other code than today's are named under the table (hmer.training.fingerprint).
    from hmer.training.fingerprint import code_fingerprint

    today = code_fingerprint()
    assert set(pd.read_csv(out / "runs.csv", dtype=str)["fingerprint"]) == {today}
    report_command(study=store.study, tracking_uri=store.tracking_uri, out_dir=out, n_resamples=50,
                   code_fingerprint=today)
    assert f"every run was trained by code that computes what today's does (fingerprint {today})" in \
        capsys.readouterr().out
    report_command(study=store.study, tracking_uri=store.tracking_uri, out_dir=out, n_resamples=50,
                   code_fingerprint="f" * 16)
    line = next(li for li in capsys.readouterr().out.splitlines() if li.startswith("trained by other code"))
    assert line.startswith(f"trained by other code than today's (fingerprint {'f' * 16}): fingerprint {today}: ")
    assert all(f"{variant} seed 1" in line for variant in VARIANTS), line


@pytest.mark.slow
def test_hmer_report_command_line_for_a_study_an_experiment_and_runs(store, tmp_path, capsys):
    from hmer.cli import main
    from hmer.reports import load_runs

    base = ["report", "--tracking-uri", store.tracking_uri]
    assert main(base + ["--study", store.study, "--out", str(tmp_path / "s")]) == 0
    assert main(base + ["--experiment", store.study, "--out", str(tmp_path / "e")]) == 0
    ids = load_runs(store.tracking_uri, study=store.study)["run_id"].tolist()
    assert main(base + ["--runs", *ids, "--out", str(tmp_path / "r")]) == 0
    for folder in ("s", "e", "r"):
        assert (tmp_path / folder / "table.md").is_file() and (tmp_path / folder / "plots" / "exprate.png").is_file()
    capsys.readouterr()
    assert main(base + ["--study", "no-such-study", "--out", str(tmp_path / "x")]) == 2
    assert "no training runs for study 'no-such-study'" in capsys.readouterr().err
    assert main(base + ["--runs", "0" * 32, "--out", str(tmp_path / "y")]) == 2


@pytest.mark.slow
def test_attention_maps_of_a_model_with_and_without_coverage(store):
    from hmer.data import load_dataset
    from hmer.reports import load_runs
    from hmer.tracking.artifacts import attend, plot_attention, token_maps
    from hmer.tracking import load_model

    runs = load_runs(store.tracking_uri, study=store.study)
    runs = runs[runs["state"] == "finished"]
    loaded = {coverage: load_model(runs.loc[runs["params.model.coverage"] == coverage, "run_id"].iloc[0],
                                   store.tracking_uri) for coverage in ("cross", "none")}
    model, cfg, vocab = loaded["cross"]
    expr = load_dataset(cfg.data.path or None, cfg.data, splits=("2014",))["2014"][0]
    maps = token_maps(model, vocab, expr.image, expr.tokens)
    assert maps.shape == (len(expr.tokens), *expr.image.shape) and (maps >= 0).all()
    coverage = token_maps(model, vocab, expr.image, expr.tokens, kind="coverage")
    assert np.allclose(coverage[0], 0.0)  # nothing is covered before the first token
    assert coverage[-1].sum() > maps[0].sum()  # and then the attention of the steps before accumulates
    decoded = attend(model, vocab, expr, cfg=cfg, label="decoded here")  # no tokens given: decode
    assert decoded.maps.shape == (len(decoded.tokens), *expr.image.shape) and decoded.forced is False
    row = [attend(m, v, expr, tokens=list(expr.tokens), label=name) for name, (m, _, v) in loaded.items()]
    assert [r.tokens for r in row] == [list(expr.tokens)] * 2
    fig = plot_attention(row)
    assert len(fig.axes) >= 2 * (len(expr.tokens) + 2)


@pytest.mark.slow
def test_training_curves_are_drawn_against_cpu_time_when_every_run_logged_it(store):
    from hmer.reports import load_history, load_runs
    from hmer.reports.plots import plot_training_curves

    runs = load_runs(store.tracking_uri, study=store.study)
    history = load_history(runs, tracking_uri=store.tracking_uri)
    fig = plot_training_curves(history)
    assert fig.axes[len(fig.axes) // 2].get_xlabel().startswith("CPU minutes")
    # runs from before the metric existed: the time in training steps, and the label says so
    older = history[history["metric"] != "train_cpu_seconds"]
    fig = plot_training_curves(older)
    assert fig.axes[len(fig.axes) // 2].get_xlabel().startswith("minutes in training steps")
    # neither: wall-clock time since each run started
    fig = plot_training_curves(older[older["metric"] != "epoch_seconds"])
    assert fig.axes[len(fig.axes) // 2].get_xlabel().startswith("wall-clock minutes")


def test_a_cpu_time_logged_only_at_the_end_is_spread_over_the_epochs():
    """A run from before `train_cpu_seconds` was logged each epoch has it once, at its last step:
    its curve spreads that total evenly over its epochs rather than use the wall-clock time of
    its steps, which counts every pause (a study's worker stopped for the tests) and every
    other job on the core. A run that logged it every epoch keeps its own figures beside it."""
    from hmer.reports.plots import _with_time_axis

    rows = [("r", "val_exprate", step, 1.0 * step, 0.0) for step in (1, 2, 3)]
    rows += [("r", "epoch_seconds", step, 60.0 * step, 0.0) for step in (1, 2, 3)]
    rows += [("r", "train_cpu_seconds", 3, 540.0, 0.0)]
    history = pd.DataFrame(rows, columns=["run_id", "metric", "step", "value", "seconds"]).assign(variant="v")
    points = history[history["metric"] == "val_exprate"]
    data, label, words = _with_time_axis(history, points)
    assert label.startswith("CPU minutes") and "spread evenly" in words
    assert data.sort_values("step")["minutes"].tolist() == [3.0, 6.0, 9.0]  # 540 s over 3 epochs

    newer = [("n", "val_exprate", s, 1.0, 0.0) for s in (1, 2)] + [("n", "train_cpu_seconds", s, 100.0 * s * s, 0.0)
                                                                    for s in (1, 2)]
    both = pd.concat([history, pd.DataFrame(newer, columns=history.columns[:-1]).assign(variant="v")])
    data, label, _ = _with_time_axis(both, both[both["metric"] == "val_exprate"])
    assert label.startswith("CPU minutes")
    assert data[data["run_id"] == "n"].sort_values("step")["time_s"].tolist() == [100.0, 400.0]  # its own
    assert data[data["run_id"] == "r"].sort_values("step")["time_s"].tolist() == [180.0, 360.0, 540.0]

    # a run that never logged it: the axis falls back to the time in training steps for every run
    data, label, _ = _with_time_axis(history[history["metric"] != "train_cpu_seconds"], points)
    assert label.startswith("minutes in training steps")
    assert data.sort_values("step")["minutes"].tolist() == [1.0, 3.0, 6.0]  # 60 s, then 120 s, then 180 s


def test_standalone_runs_of_one_variant_and_seed_are_told_apart_by_name(tmp_path):
    """Two retrains of one preset in an experiment are two recipes, not two seeds; a study's
    failed trial and its re-run are one variant."""
    from mlflow.tracking import MlflowClient

    from hmer.reports import load_runs
    from hmer.tracking import keys

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    best = client.create_experiment("best", artifact_location=(tmp_path / "a").as_uri())
    study = client.create_experiment("study", artifact_location=(tmp_path / "b").as_uri())
    for name in ("old recipe", "new recipe"):
        client.create_run(best, run_name=name, tags={keys.VARIANT: "small", keys.SEED: "7"})
    client.create_run(best, run_name="other", tags={keys.VARIANT: "tiny", keys.SEED: "7"})
    for name in ("bi seed 1", "bi seed 1 again"):
        client.create_run(study, run_name=name, tags={keys.VARIANT: "bi", keys.SEED: "1", keys.STUDY: "s"})
    runs = load_runs(uri, experiment="best")
    assert sorted(runs["variant"]) == ["new recipe", "old recipe", "tiny"]
    assert load_runs(uri, experiment="study")["variant"].tolist() == ["bi", "bi"]
