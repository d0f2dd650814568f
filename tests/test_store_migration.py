"""The committed store is today's schema, and the one migration that made it so (issue 67) is idempotent.

`hmer runs migrate` (hmer.store.migrate) brought every run, study and tag to today's schema once.
These tests read copies of the committed store: its two databases and its small JSON artifacts (the
configs the migration rewrites), never its weights. They also age a copy back to the old schema (the
old budget tag, unprefixed trial attributes, configs without the keys added since, the preset `tiny`,
a run without a fingerprint) and migrate it: it comes back as committed, and a second migration
changes nothing. `hmer runs show` reads a committed run's config as it trained.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from hmer.config import Config
from hmer.store.migrate import OLD_BUDGET_KEY, VALUES_THEN, flat_of, migrate_store
from hmer.tracking import keys

REPO = Path(__file__).resolve().parents[1]
MLRUNS = REPO / "mlruns"
KNOWN = set(Config().to_flat_dict())

pytestmark = pytest.mark.skipif(not (MLRUNS / "mlflow.db").exists() or not (MLRUNS / "optuna.db").exists(),
                                reason="no committed store in mlruns/ (a checkout without results)")


def _store_copy(folder: Path) -> Path:
    """The committed store's databases and JSON artifacts (no weights, no figures) under `folder`."""
    folder.mkdir(parents=True)
    for name in ("mlflow.db", "optuna.db"):
        shutil.copy(MLRUNS / name, folder / name)
    for path in (MLRUNS / "artifacts").rglob("*.json"):
        target = folder / path.relative_to(MLRUNS)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    return folder


def _configs(folder: Path) -> dict[Path, dict]:
    return {path: json.loads(path.read_text()) for path in sorted((folder / "artifacts").rglob("config.json"))}


def _study_configs(folder: Path) -> dict[str, dict]:
    storage = optuna.storages.RDBStorage(f"sqlite:///{folder / 'optuna.db'}")
    return {s.study_name: storage.get_study_system_attrs(storage.get_study_id_from_name(s.study_name))[keys.CONFIG]
            for s in storage.get_all_studies()}


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted([folder / "mlflow.db", folder / "optuna.db", *(folder / "artifacts").rglob("*.json")]):
        h.update(path.read_bytes())
    return h.hexdigest()


def schema_problems(folder: Path) -> list[str]:
    """What in the store in `folder` is not today's schema, in words."""
    problems = [f"{path}: lacks {sorted(KNOWN - set(flat_of(stored)))}" for path, stored in _configs(folder).items()
                if KNOWN - set(flat_of(stored))]
    problems += [f"study {name}: its base config lacks {sorted(KNOWN - set(flat))}"
                 for name, flat in _study_configs(folder).items() if KNOWN - set(flat)]
    with closing(sqlite3.connect(folder / "mlflow.db")) as db:
        problems += [f"run {run}: tag {OLD_BUDGET_KEY}" for (run,) in
                     db.execute("SELECT run_uuid FROM tags WHERE key = ?", (OLD_BUDGET_KEY,))]
        problems += [f"run {run}: param {key}={value}" for run, key, value in db.execute(
            "SELECT run_uuid, key, value FROM params WHERE key = 'preset' OR (key IN ('name', 'model_preset') AND "
            "value = 'tiny')")]
        problems += [f"run {run}: no fingerprint" for (run,) in db.execute(
            "SELECT run_uuid FROM tags c WHERE key = ? AND NOT EXISTS (SELECT 1 FROM tags t WHERE t.run_uuid = "
            "c.run_uuid AND t.key IN (?, ?, ?))", (keys.GIT_COMMIT, keys.FINGERPRINT, keys.ROLE, keys.IMPORT_SOURCE))]
    with closing(sqlite3.connect(folder / "optuna.db")) as db:
        problems += [f"trial attribute {key}" for (key,) in
                     db.execute("SELECT DISTINCT key FROM trial_user_attributes WHERE key NOT LIKE 'hmer.%'")]
        problems += [f"study attribute {OLD_BUDGET_KEY}" for _ in
                     db.execute("SELECT 1 FROM study_user_attributes WHERE key = ?", (OLD_BUDGET_KEY,))]
    return problems


def test_the_committed_store_is_today_s_schema_and_migrating_it_changes_nothing(tmp_path):
    folder = _store_copy(tmp_path / "store")
    assert schema_problems(folder) == []
    before = _digest(folder)
    assert migrate_store(folder, repo=None) == []
    assert _digest(folder) == before


def _age(folder: Path) -> str:
    """The copy in `folder` written in the schema before the migration; the run left without a fingerprint."""
    for path, stored in _configs(folder).items():  # the keys whose value is the one they had before they existed
        aged = {**stored, "name": "tiny" if stored["name"] == "tiny-transformer" else stored["name"]}
        for key, value in VALUES_THEN.items():
            section, _, name = key.partition(".")
            if aged[section].get(name) == value:
                aged[section] = {k: v for k, v in aged[section].items() if k != name}
        path.write_text(json.dumps(aged))
    storage = optuna.storages.RDBStorage(f"sqlite:///{folder / 'optuna.db'}")
    for name, flat in _study_configs(folder).items():
        aged = {k: v for k, v in flat.items() if VALUES_THEN.get(k, object()) != v}
        aged["name"] = "tiny" if aged["name"] == "tiny-transformer" else aged["name"]
        storage.set_study_system_attr(storage.get_study_id_from_name(name), keys.CONFIG, aged)
    with closing(sqlite3.connect(folder / "optuna.db")) as db, db:
        db.execute("UPDATE trial_user_attributes SET key = substr(key, 6) WHERE key LIKE 'hmer.test_%' OR key IN "
                   "(?, ?, ?, ?, ?)", (keys.TRIAL_RUN_ID, keys.TRIAL_EPOCHS, keys.TRIAL_STOPPED_BY,
                                       keys.TRIAL_CPU_SECONDS_PER_IMAGE, keys.TRIAL_FITTED_EPOCHS))
        db.execute("UPDATE study_user_attributes SET key = ? WHERE key = ?", (OLD_BUDGET_KEY, keys.BUDGET))
    with closing(sqlite3.connect(folder / "mlflow.db")) as db, db:
        db.execute("UPDATE tags SET key = ? WHERE key = ?", (OLD_BUDGET_KEY, keys.BUDGET))
        db.execute("UPDATE params SET key = 'preset' WHERE key = 'budget'")
        db.execute("UPDATE params SET value = 'tiny' WHERE key IN ('name', 'model_preset') AND value = "
                   "'tiny-transformer'")
        (run,) = db.execute("SELECT run_uuid FROM tags WHERE key = ? LIMIT 1", (keys.FINGERPRINT,)).fetchone()
        db.execute("DELETE FROM tags WHERE run_uuid = ? AND key = ?", (run, keys.FINGERPRINT))
        db.execute("UPDATE tags SET value = ? WHERE run_uuid = ? AND key = ?", ("0" * 40, run, keys.GIT_COMMIT))
    return run


def test_a_store_in_the_old_schema_migrates_to_the_committed_one_and_a_second_migration_changes_nothing(tmp_path):
    committed = _store_copy(tmp_path / "committed")
    folder = _store_copy(tmp_path / "aged")
    unfingerprinted = _age(folder)
    assert len(schema_problems(folder)) > 100

    changes = migrate_store(folder, repo=REPO)
    assert schema_problems(folder) == []
    assert any("config.json of" in change for change in changes) and any("base config" in c for c in changes)
    assert any("trial attribute(s) under the hmer. prefix" in change for change in changes)
    # every config as the committed store holds it: a key it lacked took the value it trained with
    assert list(_configs(folder).values()) == list(_configs(committed).values())
    assert _study_configs(folder) == _study_configs(committed)
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    assert client.get_run(unfingerprinted).data.tags[keys.FINGERPRINT] == "unknown: commit 0000000 is not in this clone"

    before = _digest(folder)
    assert migrate_store(folder, repo=REPO) == []
    assert _digest(folder) == before


def test_hmer_runs_show_prints_a_committed_run_s_study_commit_config_and_scores(capsys):
    """`hmer runs show` of a committed trial run and of a run of `hmer train`, read from the committed
    store itself (its artifacts are where its database says; it only reads)."""
    from hmer.cli import main

    uri = f"sqlite:///{MLRUNS / 'mlflow.db'}"
    client = MlflowClient(uri)
    run = next(r for r in client.search_runs(
        [client.get_experiment_by_name("ablate_decoder-cpu-gehring").experiment_id], max_results=100)
        if r.data.tags.get(keys.CELL) == "model.decoder=convs2s" and "test_2014_exprate" in r.data.metrics)
    assert main(["runs", "show", run.info.run_id[:10], "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    tags = run.data.tags
    assert f"study ablate_decoder-cpu-gehring (budget cpu), trial {tags[keys.TRIAL]}, cell model.decoder=convs2s, " \
           f"seed {tags[keys.SEED]}" in out
    assert f"trained at commit {tags[keys.GIT_COMMIT]}" in out
    assert "config it trained with (its config.json):" in out
    assert '    model.conv_attention ' in out and '"gehring"' in out  # Gehring's attention, before ffdbb27
    assert f"2014: exprate {run.data.metrics['test_2014_exprate']:.2f}" in out
    assert "predictions/test_2014.csv" in out and "weights: model" in out
    assert main(["runs", "show", "f03c6924", "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert "2014: exprate 16.84" in out
    assert "training: 22 of 22 epochs, finished" in out and "best 13.33 at epoch 21, last 12.04 (epoch 22)" in out
    assert main(["runs", "show", "d9873c59", "--tracking-uri", uri]) == 0
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
