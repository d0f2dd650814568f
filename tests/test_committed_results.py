"""The committed results (issues 12, 24 and 48): the store in mlruns/ opens from a clone, holds the finished
direction study with its weights, and the README prints the tables `hmer report` makes from each study.
Read-only: every check works on a copy or only reads."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from hmer.checkpoint import MODEL_FILES
from hmer.cli import main as hmer_main
from hmer.studies.frontier_report import SETTING_KEYS, read_flops, training_pflop
from hmer.tracking import keys
from hmer.tracking.portable import load_run_json

REPO = Path(__file__).resolve().parents[1]
MLRUNS = REPO / "mlruns"
STUDY = "ablate_direction-cpu"
YEARS = ("2014", "2016", "2019")

pytestmark = pytest.mark.skipif(not (MLRUNS / "mlflow.db").exists() or not (MLRUNS / "optuna.db").exists(),
                                reason="no committed store in mlruns/ (a checkout without results)")


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """The store as a fresh clone in another folder has it (its artifacts, its databases)."""
    root = tmp_path_factory.mktemp("clone")
    shutil.copytree(MLRUNS, root / "mlruns", ignore=shutil.ignore_patterns("checkpoints", "*.lock"))
    return root


def _study_runs(client: MlflowClient):
    experiment = client.get_experiment_by_name(STUDY)
    assert experiment is not None, f"experiment {STUDY} is not in the committed store"
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    return [r for r in runs if keys.ROLE not in r.data.tags and r.info.status == "FINISHED"
            and "test_2014_exprate" in r.data.metrics]


def test_every_artifact_location_is_relative_to_the_checkout():
    db = sqlite3.connect(f"file:{MLRUNS / 'mlflow.db'}?mode=ro", uri=True)
    try:
        locations = [row[0] for row in db.execute("SELECT artifact_location FROM experiments")]
        locations += [row[0] for row in db.execute("SELECT artifact_uri FROM runs")]
    finally:
        db.close()
    absolute = [loc for loc in locations if loc and (loc.startswith(("file:", "/")) or re.match(r"^[A-Za-z]:", loc))]
    assert not absolute, f"absolute artifact locations in the committed store: {absolute[:3]}"


def test_the_direction_study_is_complete_with_weights_and_no_training_state(clone, monkeypatch):
    monkeypatch.chdir(clone)
    client = MlflowClient("sqlite:///mlruns/mlflow.db")
    runs = _study_runs(client)
    cells = {(r.data.params["model.direction"], r.data.tags[keys.SEED]) for r in runs}
    assert {d for d, _ in cells} == {"l2r", "r2l", "bi"} and len(cells) >= 9, sorted(cells)
    for run in runs:
        folder = clone / run.info.artifact_uri
        assert any((folder / "model" / name).is_file() for name in MODEL_FILES), f"run {run.info.run_id} has no weights"
        assert not list(folder.rglob("last.pt")) and not list(folder.rglob("*optim*")), run.info.run_id
        assert (folder / "split" / "val.txt").is_file()
    for direction in ("l2r", "r2l", "bi"):
        for year in YEARS:
            scores = [r.data.metrics[f"test_{year}_exprate"] for r in runs
                      if r.data.params["model.direction"] == direction]
            assert sum(scores) > 0, f"{direction} reads nothing right on {year}"

    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{clone / 'mlruns' / 'optuna.db'}")
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) >= 9


def test_committed_checkpoints_are_the_smallest_files_that_continue_the_unfinished_studies():
    """A study published unfinished (`hmer runs publish --keep-unfinished`) carries, of each cell
    in flight, the run its next trial continues, with `last.pt` and, only where its weights are not
    the best so far, `best.pt`; nothing else is committed for good (issue 49)."""
    from hmer.checkpoint import load_checkpoint
    from hmer.store.publish import resumable_runs, unfinished_studies

    client = MlflowClient(f"sqlite:///{MLRUNS / 'mlflow.db'}")
    continued = resumable_runs(client, f"sqlite:///{MLRUNS / 'optuna.db'}", sorted(unfinished_studies(client)), MLRUNS)
    kept = sorted(p.name for p in (MLRUNS / "checkpoints").iterdir()) if (MLRUNS / "checkpoints").is_dir() else []
    assert set(kept) == continued, f"checkpoints of runs that are not to be continued: {set(kept) - continued}"
    for run_id in kept:
        last = load_checkpoint(MLRUNS / "checkpoints" / run_id / "last.pt")
        files = sorted(p.name for p in (MLRUNS / "checkpoints" / run_id).iterdir())
        assert files == (["last.pt"] if last["best_epoch"] == last["epoch"] else ["best.pt", "last.pt"]), files
        logged = client.get_metric_history(run_id, "train_loss")
        assert logged and max(m.step for m in logged) >= int(last["epoch"]), run_id  # never ahead of its records


def test_the_committed_store_names_no_machine_path_runs_nothing_and_calls_every_study_by_its_name():
    """The whole committed store (both databases, every artifact): what `hmer runs publish` makes
    of a workspace, and refuses to publish otherwise (issue 49)."""
    from hmer.store.clean import store_problems

    problems = [str(p) for p in store_problems(MLRUNS)]
    assert not problems, f"{len(problems)} problem(s) in the committed store:\n" + "\n".join(problems)


def test_every_study_s_parent_run_carries_its_table():
    """A finished study's, a sweep's and a superseded study's parent run have their table, as
    description and `table.md`, for whoever opens the study in `mlflow ui`."""
    from hmer.reports.runs import list_studies
    from hmer.store.study_run import TABLE_ARTIFACT
    from hmer.tracking.portable import list_run_artifacts

    uri = f"sqlite:///{MLRUNS / 'mlflow.db'}"
    client = MlflowClient(uri)
    studies = list_studies(uri)
    assert not studies.empty
    for _, row in studies.iterrows():
        if row["state"] != "finished" and not isinstance(row["superseded_by"], str):
            continue  # kept unfinished: its table will change
        experiment = client.get_experiment_by_name(row["experiment"])
        (parent,) = [r for r in client.search_runs([experiment.experiment_id])
                     if r.data.tags.get(keys.ROLE) == "study"]
        assert TABLE_ARTIFACT in list_run_artifacts(client, parent.info.run_id), row["study"]
        assert parent.data.tags.get(keys.MLFLOW_NOTE), row["study"]


def _report(clone, monkeypatch, capsys, *options: str, study: str = STUDY) -> str:
    """What `hmer report --study STUDY [options]` prints, run in the clone on its store."""
    monkeypatch.chdir(clone)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("HMER_MLRUNS", str(clone / "mlruns"))
    capsys.readouterr()
    assert hmer_main(["report", "--study", study, *options, "--out", str(clone / "report")]) == 0
    return capsys.readouterr().out


def test_hmer_report_lists_the_committed_study_with_its_budget(clone, monkeypatch, capsys):
    # Its parent run has the budget as the param `preset`, the name it had when the study ran.
    monkeypatch.chdir(clone)
    capsys.readouterr()
    assert hmer_main(["report", "--list", "--tracking-uri", "sqlite:///mlruns/mlflow.db"]) == 0
    row = next(cells for cells in map(str.split, capsys.readouterr().out.splitlines()) if cells[:1] == [STUDY])
    assert row[1:4] == ["grid", "cpu", "finished"], row


# Each finished study the README has a section for, and its variants as the report names them:
# tools/readme_tables.py's, which writes those tables
sys.path.insert(0, str(REPO / "tools"))
from readme_tables import STUDY_VARIANTS as README_STUDIES  # noqa: E402
from readme_tables import frontier_block  # noqa: E402


@pytest.mark.parametrize("study", README_STUDIES)
def test_the_readme_prints_the_table_hmer_report_makes(clone, monkeypatch, capsys, study):
    printed = _report(clone, monkeypatch, capsys, study=study)
    readme = (REPO / "README.md").read_text()
    variants = README_STUDIES[study]
    pattern = "^(" + "|".join(map(re.escape, variants)) + ") "
    table_rows = [line for line in printed.splitlines() if re.match(pattern, line)]
    # the per-year table and the paired differences, a row per variant each
    assert len(table_rows) >= 2 * len(variants), printed
    for row in table_rows[:2 * len(variants)]:
        assert row in readme, f"the README does not print this row of `hmer report --study {study}`:\n{row}"


def test_the_readme_prints_the_frontier_hmer_report_makes(clone, monkeypatch, capsys):
    """Issue 66's frontier in the README: its finished points and where the budgets sit, as `hmer report
    --frontier` prints them from the committed store (the FLOPs an image from benchmarks/results)."""
    monkeypatch.chdir(clone)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("HMER_MLRUNS", str(clone / "mlruns"))
    capsys.readouterr()
    assert hmer_main(["report", "--frontier", "--out", str(clone / "frontier")]) == 0
    block = frontier_block(capsys.readouterr().out)
    assert block in (REPO / "README.md").read_text(), f"the README does not print `hmer report --frontier`:\n{block}"


def test_the_readme_quotes_the_test_within_two_edits(clone, monkeypatch, capsys):
    printed = _report(clone, monkeypatch, capsys, "--metric", "le2")
    bi = next(line for line in printed.splitlines() if line.startswith("bi ") and "[" in line)
    quoted = [line.rstrip() for line in (REPO / "README.md").read_text().splitlines()
              if line.startswith("bi ") and "≤2" not in line and line.count("[") >= 3]
    # the README prints the row up to the last year's p-values (not the cost columns)
    assert any(bi.startswith(line) and len(line) > 60 for line in quoted), \
        f"the README does not quote `hmer report --study {STUDY} --metric le2`:\n{bi}"


def test_the_readme_names_the_best_cpu_model_the_store_holds():
    """The results at a glance name the best model trained on a CPU: of every finished run in the
    committed store that was trained on a CPU and scored on the test years, the one that validation
    picks (its final validation ExpRate; copies of a run left out), with its test figures, its
    CPU-hours and its budget."""
    client = MlflowClient(f"sqlite:///{MLRUNS / 'mlflow.db'}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id], max_results=1000)
            if r.info.status == "FINISHED" and "test_2014_exprate" in r.data.metrics
            and "val_final_exprate" in r.data.metrics and not r.data.tags.get(keys.REUSED_FROM)
            and r.data.tags.get(keys.DEVICE, "cpu").startswith("cpu")]
    best = max(runs, key=lambda r: r.data.metrics["val_final_exprate"])
    (row,) = [line for line in (REPO / "README.md").read_text().splitlines()
              if line.startswith("| **the best CPU model**")]
    m, tags = best.data.metrics, best.data.tags
    years = ("2014", "2014-std", "2016", "2019")
    assert f"(run `{best.info.run_id[:8]}`)" in row, (row, best.info.run_id)
    assert row.endswith(" | ".join(f"{m[f'test_{y}_exprate']:.1f}" for y in years) + " |"), row
    assert f"{m['train_cpu_seconds'] / 3600:.1f} CPU-hours" in row, row
    # its training compute as the frontier counts it: the FLOPs an image at its width and input, times its images
    config = load_run_json(client, best.info.run_id, "config.json")  # of today's schema, unlike older runs' params
    setting = tuple(config[section][name] for section, name in (key.split(".") for key in SETTING_KEYS))
    pflop = training_pflop(read_flops(REPO / "benchmarks" / "results" / "frontier_flops.csv"), setting,
                           config["train"]["epochs"])
    assert pflop is not None, f"benchmarks/results/frontier_flops.csv has no FLOPs an image of {setting}"
    assert f"{pflop:.2f} PFLOP" in row, row
    # the frontier trains at the cpu budget; its 64-epoch 0.7 cell is the `scaled` budget's config, test
    # years aside (tests/test_scaled_budget.py)
    scaled = tags.get(keys.STUDY) == "frontier-cpu" and tags.get(keys.VARIANT) == "192/0.7/0.0/64"
    assert f"the `{'scaled' if scaled else tags[keys.BUDGET]}` budget" in row, row


def test_the_readme_s_long_runs_stand_where_the_store_says():
    """The README's table of the long runs ("Where they stand") reads each run from the committed
    store: its epochs and whether it finished, its CPU-hours, its best validation ExpRate and epoch,
    its last 20 epochs' mean against the 20 before, and its test ExpRate per year."""
    client = MlflowClient(f"sqlite:///{MLRUNS / 'mlflow.db'}")
    lines = (REPO / "README.md").read_text().splitlines()
    start = lines.index(next(line for line in lines if line.startswith("| run | cell | epochs |"))) + 2
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    rows = lines[start:end]
    assert len(rows) >= 3, "the long runs' table lost its rows"
    long_runs = {r.info.run_id: r for e in client.search_experiments() if e.name.endswith("-long")
                 for r in client.search_runs([e.experiment_id], max_results=1000)
                 if not r.data.tags.get(keys.REUSED_FROM)}
    for row in rows:
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        (run,) = [r for run_id, r in long_runs.items() if run_id.startswith(cells[0].strip("`"))]
        m = run.data.metrics
        val = {p.step: p.value for p in sorted(client.get_metric_history(run.info.run_id, "val_exprate"),
                                               key=lambda p: p.timestamp)}  # an epoch trained again: its last
        epochs = max(val)
        finished = run.info.status == "FINISHED"
        assert cells[2].startswith(f"{epochs}, finished" if finished else f"{epochs} of "), (row, epochs, finished)
        hours = f"{m['train_cpu_seconds'] / 3600:.2f}"
        assert cells[3] == (f"{hours} / {m['cpu_seconds'] / 3600:.2f}" if finished else f"{hours} so far"), row
        best = max(val.values())
        assert cells[4] == f"{best:.1f} ({min(s for s, v in val.items() if v == best)})", row
        if finished and epochs >= 40:
            curve = [val[s] for s in sorted(val)]
            last, before = sum(curve[-20:]) / 20, sum(curve[-40:-20]) / 20
            assert cells[5].startswith(f"{last:.1f} against {before:.1f}"), row
        for cell, year in zip(cells[6:10], ("2014", "2014-std", "2016", "2019")):
            key = f"test_{year}_exprate"
            assert cell == (f"{m[key]:.1f}" if key in m else "–"), (row, year)


def test_the_readme_states_the_22_epoch_recipe_as_stored():
    client = MlflowClient(f"sqlite:///{MLRUNS / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("cpu-best")
    assert experiment is not None, "the cpu budget's recipe at 22 epochs (experiment cpu-best) is not in the store"
    finished = [r for r in client.search_runs([experiment.experiment_id]) if r.info.status == "FINISHED"]
    run = max(finished, key=lambda r: r.data.metrics["val_final_exprate"])  # chosen on validation
    readme = (REPO / "README.md").read_text()
    heading = next(line for line in readme.splitlines()
                   if line.startswith("### The `cpu` budget's recipe at 22 epochs"))
    figures = " / ".join(f"{run.data.metrics[f'test_{year}_exprate']:.1f}" for year in YEARS)
    assert figures in heading, f"README says {heading!r}; the store says {figures}"
    assert f"| ExpRate | {run.data.metrics['val_final_exprate']:.1f} |" in readme
    standard = f"{run.data.metrics['test_2014-std_exprate']:.1f} % on the standard 2014 images"
    assert standard in heading, f"README says {heading!r}; the store says {standard}"
    cost = f"{run.data.metrics['cpu_seconds'] / 3600:.2f} CPU-hours"
    assert cost in readme, f"the README does not state the best model's cost as stored ({cost})"


def test_the_readme_states_what_a_cpu_budget_trial_costs_as_stored():
    """Issue 24's cost target is reported from the committed run that measured it."""
    client = MlflowClient(f"sqlite:///{MLRUNS / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("cpu-budget-cost")
    assert experiment is not None, "the cost measurement (experiment cpu-budget-cost) is not in the committed store"
    (run,) = [r for r in client.search_runs([experiment.experiment_id]) if r.info.status == "FINISHED"]
    m = run.data.metrics
    readme = " ".join((REPO / "README.md").read_text().split())
    assert f"at `{run.data.tags[keys.GIT_COMMIT][:7]}`" in readme
    assert f"reads **{m['test_2014_exprate']:.1f} % on 2014**" in readme
    assert f"cost **{m['cpu_seconds'] / 60:.0f} CPU-minutes**: {m['train_cpu_seconds'] / 60:.0f} of training" in readme
    decoding = sum(v for k, v in m.items() if k.endswith("_decode_cpu_seconds"))
    assert f"{(m['cpu_seconds'] - m['train_cpu_seconds']) / 60:.0f} of final decoding" in readme
    assert f"in {decoding:.0f} CPU-seconds" in readme


def test_the_readme_links_the_direction_study_as_mlflow_ui_opens_it():
    """The README's link opens the committed study's runs as model training, and the study is
    marked as such in the store, with its table on the parent run (issue 28)."""
    from hmer.tracking.ui import ui_url

    client = MlflowClient(f"sqlite:///{MLRUNS / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(STUDY)
    assert experiment.tags.get(keys.MLFLOW_EXPERIMENT_KIND) == keys.EXPERIMENT_KIND_TRAINING
    assert f"<{ui_url(experiment.experiment_id)}>" in (REPO / "README.md").read_text()
    (parent,) = [r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get(keys.ROLE) == "study"]
    assert "| l2r (baseline) | 3 |" in parent.data.tags.get(keys.MLFLOW_NOTE, "")


def test_the_readmes_main_job_resumes_the_committed_study_and_writes_nothing(clone):
    # `python studies/ablate_direction.py` on a fresh clone: the study is complete, so the command
    # prints its table and leaves the store's bytes as they were, whatever defaults changed since.
    before = {p.name: p.read_bytes() for p in (clone / "mlruns").glob("*.db")}
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["HMER_MLRUNS"] = str(clone / "mlruns")
    proc = subprocess.run([sys.executable, str(REPO / "studies" / "ablate_direction.py")], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "l2r (baseline)" in proc.stdout
    # issue 70: "expected cost: about 5.8 h" had come a second before "9 of 9 cells already complete"
    lines = proc.stdout.splitlines()
    budget = next(i for i, line in enumerate(lines) if line.startswith("budget cpu: "))
    assert lines.index("resuming: 9 of 9 cells already complete") < budget, lines[:6]
    assert "expected cost" not in proc.stdout
    assert {p.name: p.read_bytes() for p in (clone / "mlruns").glob("*.db")} == before


def test_the_readme_prints_the_claims_table_hmer_report_makes(clone, monkeypatch):
    """Every measured row of `hmer report --claims` (ExpRate and within two edits) is in the README
    as printed, under the header that names both tests' columns, and each claim without a study is
    named there as such."""
    from hmer.reports.paper_claims import format_claims
    from hmer.reports.paper_claims import CLAIMS, NO_STUDY, claims_table

    monkeypatch.chdir(clone)
    readme = (REPO / "README.md").read_text()
    for metric in ("exprate", "le2"):
        df = claims_table(tracking_uri="sqlite:///mlruns/mlflow.db", metric=metric)  # the cpu and long budgets
        lines = format_claims(df, "markdown").splitlines()
        (header,) = [line for line in lines if line.startswith("| claim |")]
        assert "verdict, all seeds" in header and "verdict, per-seed McNemar" in header
        assert header in readme, f"the README's claims table on {metric} has not this header:\n{header}"
        rows = [line for line in lines if line.startswith("| ") and NO_STUDY not in line and line != header]
        assert rows, f"the store answers no claim on {metric}"
        for row in rows:
            assert row in readme, \
                f"the README does not print this row of `hmer report --claims --metric {metric}`:\n{row}"
        for claim in CLAIMS:
            if (df.loc[df["claim"] == claim.name, "verdict"] == NO_STUDY).all():
                assert f"The {claim.name} claim" in readme or f"the {claim.name} claim" in readme, claim.name


def test_the_cpu_budget_is_the_committed_sweeps_best_trial():
    """Issue 24: the `cpu` budget is the recipe of the committed sweep's best trial, with the two
    changes docs/cpu_protocol.md measured ("The budget"): cosine decay, and the epochs of about an
    hour of training at the trial's measured cost, the warm-up keeping the trial's share."""
    import json
    import math

    from hmer.config import Config
    from hmer.studies.budgets import BUDGETS
    from hmer.studies.resolution import budget_resolution

    study = optuna.load_study(study_name="sweep-cpu", storage=f"sqlite:///{MLRUNS / 'optuna.db'}")
    finished = [t for t in study.trials
                if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    assert len(finished) >= 24, f"the committed sweep has {len(finished)} trials finished or pruned"
    best = study.best_trial
    # every key the budget sets: its size's and its recipe's, and its own
    resolved = budget_resolution("tiny-transformer", BUDGETS["cpu"])
    budget = {key: value for key, value, layer in resolved.rows() if layer.split()[0] in ("size", "recipe", "budget")}
    assert budget["train.schedule"] == "cosine"

    client = MlflowClient(f"sqlite:///{MLRUNS / 'mlflow.db'}")
    run = client.get_run(best.user_attrs[keys.TRIAL_RUN_ID])
    trained = Config.from_dict(json.loads((REPO / run.info.artifact_uri / "config.json").read_text())).to_flat_dict()
    changed = {"train.schedule", "train.epochs", "train.warmup_steps", "train.beam_size", "train.max_decode_len"}
    for key, value in budget.items():
        if key in changed:
            continue
        if isinstance(value, float):
            assert math.isclose(value, trained[key], rel_tol=0.01), (key, value, trained[key])
        else:
            assert value == trained[key], (key, value, trained[key])
    default = Config().to_flat_dict()
    for key, value in trained.items():  # every renderer augmentation the trial trained with is the budget's too
        if key.startswith("data.aug_") and value != default[key]:
            assert key in budget, key

    epochs = best.user_attrs[keys.TRIAL_EPOCHS]
    seconds_an_epoch = run.data.metrics["train_cpu_seconds"] / epochs
    assert budget["train.epochs"] == round(3600 / seconds_an_epoch), seconds_an_epoch
    assert budget["train.warmup_steps"] == round(trained["train.warmup_steps"] / epochs * budget["train.epochs"])


def test_hmer_report_of_the_committed_sweep_prints_its_trials_best_first(clone, monkeypatch, capsys):
    """A sweep has no variants and seeds: its report is its own table, not a grid's."""
    monkeypatch.chdir(clone)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    capsys.readouterr()
    assert hmer_main(["report", "--study", "sweep-cpu", "--tracking-uri", f"sqlite:///{clone / 'mlruns' / 'mlflow.db'}",
                      "--out", str(clone / "sweep-report")]) == 0
    printed = capsys.readouterr().out
    study = optuna.load_study(study_name="sweep-cpu", storage=f"sqlite:///{MLRUNS / 'optuna.db'}")
    rows = [line.split() for line in printed.splitlines() if re.match(r"^\s*\d+\s+(COMPLETE|PRUNED|FAIL)", line)]
    assert len(rows) == len(study.trials)
    assert rows[0][:2] == [str(study.best_trial.number), "COMPLETE"]
    assert float(rows[0][2]) == pytest.approx(study.best_value, abs=0.005)
    assert "seeds" not in printed  # no grid table
    assert (clone / "sweep-report" / "sweep.txt").read_text() in printed
