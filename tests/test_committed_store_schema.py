"""The committed store is in today's schema, and `hmer runs show` reads a committed run as it trained.

The library reads one schema (the committed store was migrated to it once, issue 67), so these tests
hold the committed store to it: every config a run or study stored loads as today's `Config` (no key
it does not know), no tag, param or trial attribute keeps an old name, and every run the suite
trained carries its training code's fingerprint. They read the two databases and the JSON artifacts
in place, never the weights.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from hmer.config import Config
from hmer.tracking import keys

REPO = Path(__file__).resolve().parents[1]
MLRUNS = REPO / "mlruns"
KNOWN = set(Config().to_flat_dict())
OLD_NAMES = {"tag": "hmer.preset", "param": "preset", "preset": "tiny"}  # what the migration renamed

pytestmark = pytest.mark.skipif(not (MLRUNS / "mlflow.db").exists() or not (MLRUNS / "optuna.db").exists(),
                                reason="no committed store in mlruns/ (a checkout without results)")


def _flat(stored: dict) -> dict:
    """A stored config, nested by section as `config.json` holds it, in dotted keys."""
    return {"name": stored.get("name", ""), **{f"{section}.{key}": value for section in ("model", "data", "train")
                                               for key, value in (stored.get(section) or {}).items()}}


def schema_problems(folder: Path) -> list[str]:
    """What in the store in `folder` is not today's schema, in words."""
    configs: dict = {path: _flat(json.loads(path.read_text()))
                     for path in sorted((folder / "artifacts").rglob("config.json"))}
    storage = optuna.storages.RDBStorage(f"sqlite:///{folder / 'optuna.db'}")
    configs |= {f"study {s.study_name}'s base config": storage.get_study_system_attrs(
        storage.get_study_id_from_name(s.study_name))[keys.CONFIG] for s in storage.get_all_studies()}
    problems = [f"{where}: unknown keys {sorted(set(flat) - KNOWN)}" for where, flat in configs.items()
                if set(flat) - KNOWN]
    problems += [f"{where}: preset {flat['name']}" for where, flat in configs.items()
                 if flat.get("name") == OLD_NAMES["preset"]]
    with closing(sqlite3.connect(folder / "mlflow.db")) as db:
        problems += [f"run {run}: tag {OLD_NAMES['tag']}" for (run,) in
                     db.execute("SELECT run_uuid FROM tags WHERE key = ?", (OLD_NAMES["tag"],))]
        problems += [f"run {run}: param {key}={value}" for run, key, value in db.execute(
            "SELECT run_uuid, key, value FROM params WHERE key = ? OR (key IN ('name', 'model_preset') AND "
            "value = ?)", (OLD_NAMES["param"], OLD_NAMES["preset"]))]
        problems += [f"run {run}: no fingerprint" for (run,) in db.execute(
            "SELECT run_uuid FROM tags c WHERE key = ? AND NOT EXISTS (SELECT 1 FROM tags t WHERE t.run_uuid = "
            "c.run_uuid AND t.key IN (?, ?, ?))", (keys.GIT_COMMIT, keys.FINGERPRINT, keys.ROLE, keys.IMPORT_SOURCE))]
    with closing(sqlite3.connect(folder / "optuna.db")) as db:
        problems += [f"trial attribute {key}" for (key,) in
                     db.execute("SELECT DISTINCT key FROM trial_user_attributes WHERE key NOT LIKE 'hmer.%'")]
        problems += [f"study attribute {OLD_NAMES['tag']}" for _ in
                     db.execute("SELECT 1 FROM study_user_attributes WHERE key = ?", (OLD_NAMES["tag"],))]
    return problems


def test_the_committed_store_is_today_s_schema():
    assert schema_problems(MLRUNS) == []
    # every config a run stored loads as it trained, whole
    for path in sorted((MLRUNS / "artifacts").rglob("config.json"))[:50]:
        assert Config.from_dict(json.loads(path.read_text())).to_flat_dict() == {
            **Config().to_flat_dict(), **_flat(json.loads(path.read_text()))}, path


def test_the_schema_check_sees_an_old_name_and_an_unknown_key(tmp_path):
    import shutil

    for name in ("mlflow.db", "optuna.db"):
        shutil.copy(MLRUNS / name, tmp_path / name)
    path = next((MLRUNS / "artifacts").rglob("config.json"))
    stored = json.loads(path.read_text())
    target = tmp_path / path.relative_to(MLRUNS)
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps({**stored, "name": "tiny", "model": {**stored["model"], "bogus": 1}}))
    with closing(sqlite3.connect(tmp_path / "mlflow.db")) as db, db:
        (run,) = db.execute("SELECT run_uuid FROM tags WHERE key = ? LIMIT 1", (keys.FINGERPRINT,)).fetchone()
        db.execute("DELETE FROM tags WHERE run_uuid = ? AND key = ?", (run, keys.FINGERPRINT))
        db.execute("INSERT INTO tags (key, value, run_uuid) VALUES (?, 'cpu', ?)", (OLD_NAMES["tag"], run))
    found = schema_problems(tmp_path)
    assert f"{target}: unknown keys ['model.bogus']" in found and f"{target}: preset tiny" in found
    assert f"run {run}: no fingerprint" in found and f"run {run}: tag hmer.preset" in found


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
