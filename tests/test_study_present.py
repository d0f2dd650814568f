"""The committed store presented for its two UIs (issue 49): `hmer runs present FOLDER`, as the store
is brought up to date, on a copy of mlruns/ (its databases, and the artifacts a table and a
figure are made from; not the weights). A study that ends now is presented by the same function,
called by the command that ran it (`hmer.cli.study.present`: tests/test_studies.py runs one); the
browser's view of the result is tests/test_ui.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
from pathlib import Path

import optuna
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState
from optuna_dashboard import get_note

from hmer.cli import main as hmer_main
from hmer.reports.runs import list_studies, load_runs, study_parent
from hmer.store.study_run import FIGURE_ARTIFACT, summary_metric, summary_run_name, summary_runs
from hmer.reports.tables import study_table
from hmer.store.present import load_for_notes, present_studies
from hmer.studies.session import OBJECTIVE_NAMES
from hmer.tracking import keys

REPO = Path(__file__).resolve().parents[1]
MLRUNS = REPO / "mlruns"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def presented(tmp_path_factory):
    """(the copy's folder, what `hmer runs present` printed)."""
    if not (MLRUNS / "mlflow.db").is_file():
        pytest.skip("no committed store in mlruns/")
    folder = tmp_path_factory.mktemp("presented") / "mlruns"
    shutil.copytree(MLRUNS, folder, ignore=shutil.ignore_patterns("checkpoints", "*.lock", "model", "attention",
                                                                  "split"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert hmer_main(["runs", "present", str(folder)]) == 0
    return folder, out.getvalue()


def _uri(folder: Path) -> str:
    return f"sqlite:///{folder / 'mlflow.db'}"


def _digests(folder: Path) -> dict[str, str]:
    figures = sorted(folder.glob(f"artifacts/*/*/artifacts/{FIGURE_ARTIFACT}"))
    files = [folder / "mlflow.db", folder / "optuna.db", *figures]
    return {str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def test_the_command_presents_every_study(presented):
    folder, out = presented
    studies = set(list_studies(_uri(folder))["study"])
    lines = out.splitlines()
    assert {line.split(":")[0].removeprefix("study ") for line in lines[:-1]} == studies
    assert len(lines) == len(studies) + 1
    assert lines[-1].startswith(f"presented {len(studies)} studies of {folder}")


def test_presenting_again_writes_nothing(presented):
    folder, _ = presented
    before = _digests(folder)
    assert not any(present_studies(_uri(folder)).values())
    assert _digests(folder) == before


def test_each_grid_study_compares_its_variants_beside_its_parent_run(presented):
    folder, _ = presented
    uri = _uri(folder)
    client = MlflowClient(uri)
    studies = list_studies(uri)
    grids = studies[studies["kind"] == "grid"]
    # a grid study kept unfinished (to be continued) has no table to present yet
    grids = grids[(grids["state"] == "finished") | grids["superseded_by"].fillna("").astype(bool)]
    assert len(grids) >= 3
    for _, row in studies.iterrows():
        parent = client.get_run(study_parent(row["study"], uri)["run_id"])
        assert keys.VARIANT not in parent.data.tags, row["study"]  # no group of its own when grouped by variant
    for _, row in grids.iterrows():
        study = row["study"]
        parent = client.get_run(study_parent(study, uri)["run_id"])
        assert not [k for k in parent.data.metrics if "/" in k], study  # the one-bar charts of the old layout
        note = parent.data.tags[keys.MLFLOW_NOTE]
        assert f"get-artifact?path={FIGURE_ARTIFACT}&run_uuid={parent.info.run_id}" in note
        figure = folder / parent.info.artifact_uri.removeprefix("mlruns/") / FIGURE_ARTIFACT
        assert figure.read_bytes().startswith(b"\x89PNG"), figure
        table = study_table(study, uri)
        summaries = {r.data.tags[keys.VARIANT]: r for r in summary_runs(client, parent.info.experiment_id, study)}
        assert sorted(summaries) == sorted(str(v) for v, r in table.iterrows() if r["seeds"] > 0), study
        trials = load_runs(uri, study=study)
        for variant, summary in summaries.items():
            seeds = int(table.loc[variant, "seeds"])
            assert summary.info.run_name == summary_run_name(variant, seeds)
            assert summary.data.tags[keys.MLFLOW_PARENT_RUN_ID] == parent.info.run_id
            for year in table.attrs["years"]:
                assert summary.data.metrics[summary_metric(str(year))] == pytest.approx(
                    table.loc[variant, f"{year}_exprate_mean"]), (study, variant, year)
            # the variant's colour: its summary run's, and every one of its trials' runs
            colours = set(trials.loc[trials["variant"] == variant, f"tags.{keys.MLFLOW_RUN_COLOR}"])
            assert colours == {summary.data.tags[keys.MLFLOW_RUN_COLOR]}, (study, variant, colours)
        assert len({r.data.tags[keys.MLFLOW_RUN_COLOR] for r in summaries.values()}) == len(summaries)


def test_optuna_dashboard_reads_each_study(presented):
    folder, _ = presented
    uri, storage = _uri(folder), f"sqlite:///{folder / 'optuna.db'}"
    superseded = {str(r["study"]): str(r["superseded_by"]) for _, r in list_studies(uri).iterrows()
                  if isinstance(r["superseded_by"], str) and r["superseded_by"]}
    assert superseded  # the committed store keeps two superseded studies
    continued_somewhere = 0
    for name in optuna.get_all_study_names(storage):
        study, _ = load_for_notes(name, storage)
        kind = study.user_attrs[keys.KIND]
        assert study.metric_names == [OBJECTIVE_NAMES[kind]], name
        description = study.user_attrs[keys.DESCRIPTION]
        parent = study_parent(name, uri)
        artifact = Path(folder / parent["artifact_uri"].removeprefix("mlruns/") / "study.json")
        assert description == json.loads(artifact.read_text())["description"]  # what the study was begun as
        note = get_note(study)
        assert note.startswith(f"**{name}**: {description}"), note[:200]
        if name in superseded:
            assert study.user_attrs[keys.SUPERSEDED_BY] == superseded[name]
            assert f"**Superseded by {superseded[name]}**" in note
        else:
            assert keys.SUPERSEDED_BY not in study.user_attrs and "Superseded" not in note
        trials = study.get_trials(deepcopy=False)
        taker: dict[int, int] = {}  # a dead trial: the first later trial that says it continued it
        for trial in trials:
            resumed = trial.user_attrs.get(keys.RESUMED_FROM)
            continued = trial.user_attrs.get(keys.CONTINUES)
            named = (resumed["trial"] if isinstance(resumed, dict) else None, int(continued) if continued else None)
            for dead in named:
                if dead is not None:
                    taker.setdefault(dead, trial.number)
        for dead, number in taker.items():
            assert trials[dead].state == TrialState.FAIL
            trial_note = get_note(optuna.Trial(study, trials[dead]._trial_id))
            assert trial_note.startswith("**Failed**: ") and f"Trial {number} took it over" in trial_note, \
                (name, dead, trial_note)
        continued_somewhere += len(taker)
    assert continued_somewhere > 10  # the committed studies' workers died often: the check above ran


def test_a_study_s_comparison_lists_its_summary_runs_and_finished_trials_and_nothing_else(presented):
    """The killed attempts whose cell a later run trained from the start are marked in their names and
    left out of the study's comparison link (tracking.ui.STUDY_COMPARISON_RUNS), with the parent run
    and the failed trials; nothing is deleted. In ablate_posenc-cpu-mixed-code (or ablate_posenc-cpu
    before its sin2d cells were trained again) `none` seed 3 was begun three times."""
    from hmer.store.study_run import KILLED_ATTEMPT
    from hmer.tracking.ui import STUDY_COMPARISON_RUNS

    folder, _ = presented
    client = MlflowClient(_uri(folder))
    studies = list_studies(_uri(folder))
    for study in studies[studies["kind"] == "grid"]["study"]:
        runs = load_runs(_uri(folder), study=study)
        if runs.empty:  # a study just begun: no trial has a run yet
            continue
        finished = runs[runs["status"] == "FINISHED"]
        done = set(zip(finished["variant"], finished["seed"]))
        trained = pd.Series([cell in done for cell in zip(runs["variant"], runs["seed"])], index=runs.index)
        attempts = runs[(runs["status"] != "FINISHED") & trained]
        for _, attempt in attempts.iterrows():
            run = client.get_run(attempt["run_id"])  # kept, marked
            assert run.data.tags[keys.TRAINED_AGAIN_IN] in set(finished["run_id"])
            assert run.info.run_name.endswith(KILLED_ATTEMPT), run.info.run_name
        experiment = str(runs["experiment_id"].iloc[0])
        listed = client.search_runs([experiment], filter_string=STUDY_COMPARISON_RUNS, max_results=1000)
        shown = sorted(r.info.run_id for r in listed)
        summaries = [r.info.run_id for r in summary_runs(client, experiment, study)]
        unfinished = runs[(runs["status"] != "FINISHED") & ~runs["run_id"].isin(attempts["run_id"])
                          & (runs["status"] != "FAILED")]
        assert shown == sorted([*summaries, *finished["run_id"], *unfinished["run_id"]]), study
    posenc = next(s for s in ("ablate_posenc-cpu-mixed-code", "ablate_posenc-cpu") if s in set(studies["study"]))
    runs = load_runs(_uri(folder), study=posenc)
    none3 = runs[(runs["variant"] == "none") & (runs["seed"] == 3)]
    assert len(none3) == 3 and sum(client.get_run(r).info.run_name.endswith(KILLED_ATTEMPT)
                                   for r in none3["run_id"]) == 2
