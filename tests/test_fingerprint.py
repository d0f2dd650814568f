"""The training-code fingerprint (hmer.training.fingerprint): the same code gives the same one, a
change of what training computes changes it, a change elsewhere does not, and `hmer runs
migrate` measures an older commit's in a worktree of it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from hmer.training.fingerprint import code_fingerprint, fingerprint_of_source

REPO = Path(__file__).resolve().parents[1]
ATTENTION = "torch.matmul(q * (1.0 / math.sqrt(self.head_dim)), k.transpose(-2, -1))"


def _source_copy(tmp_path: Path, name: str) -> Path:
    src = tmp_path / name / "src"
    shutil.copytree(REPO / "src" / "hmer", src / "hmer", ignore=shutil.ignore_patterns("__pycache__"))
    return src


def test_one_operation_s_rounding_changes_the_fingerprint_and_a_report_s_edit_does_not(tmp_path, monkeypatch):
    today = code_fingerprint()
    assert len(today) == 16 and int(today, 16) >= 0

    # The same formula in another order: the scale applied to the scores instead of the queries.
    reordered = _source_copy(tmp_path, "reordered")
    attention = reordered / "hmer" / "model" / "attention.py"
    assert ATTENTION in attention.read_text()
    attention.write_text(attention.read_text().replace(
        ATTENTION, "torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)"))
    changed, measured = fingerprint_of_source(reordered)
    assert changed != today
    assert set(measured["parts"]) == {"transformer-bi", "comer-fusion", "rnn", "convs2s"}
    assert all(not part["unknown"] and len(part["losses"]["train_loss"]) == 2 for part in measured["parts"].values())

    # Nothing that trains: the reports' tables.
    edited = _source_copy(tmp_path, "edited")
    tables = edited / "hmer" / "reports" / "tables.py"
    tables.write_text(tables.read_text() + "\n# a comment and a constant that nothing trains with\nUNUSED = 1\n")
    # measured as rank 0 of torchrun measures it, with the launcher's variables: the measuring child
    # is one process (it read them once, and waited for a rank 1 that never came)
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29577", "TORCHELASTIC_RUN_ID": "fingerprint-test"}.items():
        monkeypatch.setenv(key, value)
    assert fingerprint_of_source(edited, timeout=600)[0] == today


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="needs the project's git history (a clone)")
def test_runs_of_an_older_commit_are_fingerprinted_at_that_commit(tmp_path):
    """`hmer runs migrate` tags each run without a fingerprint with its commit's, measured in a
    worktree of that commit; a commit the clone lacks, or uncommitted code, is unknown."""
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("old-runs")
    runs = {commit: client.create_run(experiment, tags={"hmer.git_commit": commit}).info.run_id
            for commit in (head, f"{head}-dirty", "0" * 40)}
    parent = client.create_run(experiment, tags={"hmer.git_commit": head, "hmer.role": "study"}).info.run_id
    env = {k: v for k, v in os.environ.items() if k not in ("HMER_MLRUNS", "MLFLOW_TRACKING_URI")}
    out = subprocess.run([sys.executable, "-m", "hmer.cli", "runs", "migrate", str(tmp_path)],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    tags = {commit: client.get_run(run).data.tags.get("hmer.fingerprint") for commit, run in runs.items()}
    # HEAD's committed code is what the checkout runs, unless its training code has uncommitted changes
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "src/hmer"], capture_output=True,
                           text=True).stdout.strip()
    assert (tags[head] == code_fingerprint()) or dirty, (tags, out.stdout)
    assert len(tags[head]) == 16 and f"of {head[:7]}: {tags[head]}" in out.stdout
    assert tags[f"{head}-dirty"].startswith("unknown: trained from uncommitted changes")
    assert tags["0" * 40] == "unknown: commit 0000000 is not in this clone"
    assert "hmer.fingerprint" not in client.get_run(parent).data.tags  # a study's own run trains nothing
    assert not list((tmp_path).glob("hmer-fingerprint-wt-*"))
    worktrees = subprocess.run(["git", "-C", str(REPO), "worktree", "list"], capture_output=True, text=True).stdout
    assert "hmer-fingerprint-wt-" not in worktrees  # the worktree it made is gone
    # run again: nothing left to measure
    again = subprocess.run([sys.executable, "-m", "hmer.cli", "runs", "migrate", str(tmp_path)],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert again.returncode == 0 and "nothing changed" in again.stdout, again.stdout + again.stderr
