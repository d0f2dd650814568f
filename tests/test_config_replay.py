"""Every committed run resolves to what it trained (issue 50).

Each run's stored config (`config.json` among its artifacts, read under the one policy for stored
configs: a key it lacks takes `VALUES_BEFORE_KEY_EXISTED`) is rebuilt from what the store records
about it, through today's layers (hmer.presets.LAYERS), and compared field for field:

- a study's trial run: its study's spec and budget (Optuna user attributes), the study's stored
  base config as a resume takes it, and its cell (the `hmer.cell` and `hmer.seed` tags; a sweep
  trial's drawn values, fitted epochs and warm-up steps);
- a study's stored base config: today's resolution of its spec and budget, unless the study began
  under an earlier definition of its budget (`BEGUN_UNDER_ANOTHER_BUDGET`);
- a run of `hmer train`: the command that trained it (`TRAIN_COMMANDS`: its preset, which the run
  records as its config's `name`, the budget, and the keys its --set gave).

The rebuild is `hmer.store.provenance`'s, what `hmer runs show RUN` prints. Where a run trained
otherwise than today's layers give, the key, the runs and the reason are written down in
`hmer.store.config_history` (`CELLS_CHANGED_SINCE`, a command's `changed`), and the test holds that
exactly those keys differ. The store is read only: its two databases are copied, its artifacts read
in place.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from hmer.config import VALUES_BEFORE_KEY_EXISTED, Config
from hmer.presets import resolve_preset
from hmer.studies.budgets import get_budget
from hmer.store.config_history import BEGUN_UNDER_ANOTHER_BUDGET, CELLS_CHANGED_SINCE, STUDY_SETS, TRAIN_COMMANDS
from hmer.store.provenance import (
    StudyRecord,
    differences,
    rebuild_command,
    rebuild_trial,
    stored_flat,
    study_record,
)
from hmer.studies.resolution import budget_resolution, study_resolution
from hmer.tracking import keys

REPO = Path(__file__).resolve().parents[1]
MLRUNS = REPO / "mlruns"

pytestmark = pytest.mark.skipif(not (MLRUNS / "mlflow.db").exists() or not (MLRUNS / "optuna.db").exists(),
                                reason="no committed store in mlruns/ (a checkout without results)")

@dataclass
class Store:
    client: MlflowClient
    storage: str
    configs: dict[str, Path] = field(default_factory=dict)  # run id -> its config.json


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    folder = tmp_path_factory.mktemp("store")
    for name in ("mlflow.db", "optuna.db"):
        shutil.copy(MLRUNS / name, folder / name)
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    found = Store(client, f"sqlite:///{folder / 'optuna.db'}")
    for experiment in client.search_experiments():
        for run in client.search_runs([experiment.experiment_id], max_results=10_000):
            if run.data.tags.get(keys.ROLE) in ("study", keys.ROLE_SUMMARY):  # they train nothing
                continue
            # the artifacts imported from pilot-export.tar.gz sit one folder deeper than their run's root
            paths = sorted((REPO / run.info.artifact_uri).rglob("config.json"))
            assert len(paths) == 1, f"run {run.info.run_id} ({experiment.name}): config.json {paths}"
            found.configs[run.info.run_id] = paths[0]
    return found


def _stored(path: Path) -> dict:
    return stored_flat(json.loads(path.read_text()))


def _studies(store: Store) -> dict[str, StudyRecord]:
    return {summary.study_name: study_record(store.storage, summary.study_name)
            for summary in optuna.get_all_study_summaries(store.storage)}


def test_every_study_began_with_todays_resolution_of_its_spec_and_budget(store):
    studies = _studies(store)
    assert set(BEGUN_UNDER_ANOTHER_BUDGET) <= set(studies)
    assert set(STUDY_SETS) <= set(studies), "a study in STUDY_SETS that the store lacks"
    for name, values in STUDY_SETS.items():  # each --set written down is one the study needs
        record = studies[name]
        bare = study_resolution(record.spec, record.budget, n_trials=1, n_jobs=record.budget.default_jobs)
        assert differences(Config.from_flat_dict(record.base, stored=True).to_flat_dict(), bare).keys() == values.keys()
    for name, record in studies.items():
        found = differences(Config.from_flat_dict(record.base, stored=True).to_flat_dict(), record.fresh())
        if name in BEGUN_UNDER_ANOTHER_BUDGET:
            assert found, f"{name} begins as today's {record.budget.name} budget: not BEGUN_UNDER_ANOTHER_BUDGET"
        else:
            assert not found, f"study {name}: its stored base config and today's layers differ: {found}"


def test_every_trial_run_of_a_study_resolves_to_its_stored_config(store):
    studies = _studies(store)
    replayed, changed = 0, set()
    for run_id, path in store.configs.items():
        tags = store.client.get_run(run_id).data.tags
        if keys.STUDY not in tags:
            continue
        rebuilt, variant = rebuild_trial(studies[tags[keys.STUDY]], tags)
        expected = CELLS_CHANGED_SINCE.get((tags[keys.STUDY], variant), {})
        found = differences(_stored(path), rebuilt)
        assert set(found) == set(expected), \
            f"run {run_id} ({tags[keys.STUDY]}, {variant}) trained otherwise than its layers give: {found}"
        replayed += 1
        if expected:
            changed.add((tags[keys.STUDY], variant))
    assert replayed == sum(1 for run_id in store.configs if keys.STUDY in store.client.get_run(run_id).data.tags)
    assert changed == set(CELLS_CHANGED_SINCE), "an entry of CELLS_CHANGED_SINCE that no run needs"


def test_every_run_of_hmer_train_resolves_to_its_stored_config_from_its_command(store):
    trained = {run_id for run_id in store.configs if keys.STUDY not in store.client.get_run(run_id).data.tags}
    assert trained == set(TRAIN_COMMANDS), "a committed run of `hmer train` needs its command in TRAIN_COMMANDS"
    for run_id, command in TRAIN_COMMANDS.items():
        stored = _stored(store.configs[run_id])
        preset = stored["name"]
        resolved = budget_resolution(preset, get_budget(command.budget)) if command.budget else resolve_preset(preset)
        needed = [key for key in command.set_keys if stored[key] == resolved.config.to_flat_dict()[key]]
        assert not needed, f"run {run_id}: {needed} resolve to the stored values without --set"
        rebuilt, changed, _ = rebuild_command(run_id, stored)
        found = differences(stored, rebuilt)
        assert set(found) == set(changed) == set(command.changed), \
            f"run {run_id} ({command.where}) trained otherwise than its command gives today: {found}"


def test_hmer_runs_show_prints_a_committed_run_s_layers_commit_and_scores(store, capsys):
    """`hmer runs show` of a committed trial run and of a run whose config trained otherwise, read
    from the committed store itself (its artifacts are where its database says; it only reads)."""
    from hmer.cli import main

    uri, storage = f"sqlite:///{MLRUNS / 'mlflow.db'}", f"sqlite:///{MLRUNS / 'optuna.db'}"
    run = next(r for r in store.client.search_runs(
        [store.client.get_experiment_by_name("ablate_decoder-cpu-gehring").experiment_id], max_results=100)
        if r.data.tags.get(keys.CELL) == "model.decoder=convs2s" and "test_2014_exprate" in r.data.metrics)
    assert main(["runs", "show", run.info.run_id[:10], "--tracking-uri", uri, "--storage", storage]) == 0
    out = capsys.readouterr().out
    tags = run.data.tags
    assert f"study ablate_decoder-cpu-gehring, trial {tags[keys.TRIAL]}, cell model.decoder=convs2s, seed " \
           f"{tags[keys.SEED]}" in out
    assert f"trained at commit {tags[keys.GIT_COMMIT]}" in out
    assert "model.decoder  " in out and "cell model.decoder=convs2s" in out  # a value with its layer
    assert '<- the run trained "gehring": gehring before ffdbb27' in out
    assert f"2014: exprate {run.data.metrics['test_2014_exprate']:.2f}" in out
    assert "predictions/test_2014.csv" in out and "weights: model" in out
    assert main(["runs", "show", "f03c6924", "--tracking-uri", uri, "--storage", storage]) == 0
    out = capsys.readouterr().out
    assert "docs/cpu_protocol.md, The recipe at 22 epochs" in out and "value for value" in out
    assert "2014: exprate 16.84" in out
    assert "training: 22 of 22 epochs, finished" in out and "best 13.33 at epoch 21, last 12.04 (epoch 22)" in out
    assert main(["runs", "show", "d9873c59", "--tracking-uri", uri, "--storage", storage]) == 0
    out = capsys.readouterr().out  # the long budget's none cell: how far it trained and what it cost
    assert "training: 100 of 100 epochs, finished\n    4.02 CPU-hours of training, 145 CPU-seconds an epoch over " \
           "the last 10\n    validation ExpRate: best 30.11 at epoch 83, last 29.25 (epoch 100)" in out


def test_a_stopped_run_s_progress_says_what_is_left_at_its_recent_rate():
    """A run that spans sessions: its epochs of the planned, why it stopped, its CPU cost an epoch
    over the last ten (the first epochs ran slower here) and what the rest would take at that rate."""
    from hmer.store.provenance import Progress

    cpu = [(epoch, 400.0 * min(epoch, 2) + 250.0 * max(epoch - 2, 0)) for epoch in range(1, 13)]
    shown = Progress("killed", 12, 100, cpu, [(10, 11.0), (11, 12.9), (12, 12.5)],
                     "stopped by SIGTERM in epoch 13 of 100, which is dropped").lines()
    assert shown == [
        "  training: 12 of 100 epochs, killed (stopped by SIGTERM in epoch 13 of 100, which is dropped)",
        "    0.92 CPU-hours of training, 250 CPU-seconds an epoch over the last 10; 88 epochs left, about 6.1 "
        "CPU-hours at that rate",
        "    validation ExpRate: best 12.90 at epoch 11, last 12.50 (epoch 12)",
    ]
    assert Progress("finished", 3, 3, [], [], "stopped by SIGTERM").lines() == ["  training: 3 of 3 epochs, finished"]


def test_values_before_key_existed_names_every_key_a_committed_config_lacks(store):
    """The one policy for stored configs holds for the whole store: every key that some committed
    config (a run's config.json, a study's stored base) lacks is in the table, and nothing else."""
    lacking: set[str] = set()
    everything = set(Config().to_flat_dict())
    for path in store.configs.values():
        raw = json.loads(path.read_text())
        lacking |= everything - {"name", *(f"{s}.{k}" for s in ("model", "data", "train") for k in raw.get(s, {}))}
    for record in _studies(store).values():
        lacking |= everything - set(record.base)
    assert lacking == set(VALUES_BEFORE_KEY_EXISTED), (
        f"missing from the table: {sorted(lacking - set(VALUES_BEFORE_KEY_EXISTED))}; "
        f"never lacking: {sorted(set(VALUES_BEFORE_KEY_EXISTED) - lacking)}")
