"""One writer at a time per store (hmer.tracking.lock), with real processes: two `hmer runs publish`
started together into one committed store, one publish killed while it holds the lock, one stopped by
SIGTERM, and the other commands that write a store (`hmer runs import`, `workspace`, `present`, `rename`, `supersede`,
`rescore`) refused while another process holds it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from hmer import cli
from hmer.tracking.lock import LOCK_FILE
from hmer.tracking.store import open_experiment
from hmer.tracking.transfer import export_runs

REPO = Path(__file__).resolve().parents[1]


def _workspace(tmp_path: Path) -> tuple[Path, dict]:
    """A workspace store with one finished run, a checkout whose mlruns/ is the committed store,
    and the environment that points `hmer` at it."""
    work = tmp_path / "ws"
    work.mkdir()
    uri = f"sqlite:///{work / 'mlflow.db'}"
    client = MlflowClient(uri)
    run = client.create_run(open_experiment(uri, "results")[1])
    client.log_text(run.info.run_id, "name,truth,prediction,distance\nx,a,a,0\n", "predictions/test_2014.csv")
    client.set_terminated(run.info.run_id)
    checkout = tmp_path / "checkout"
    (checkout / "mlruns").mkdir(parents=True)
    (checkout / "pyproject.toml").write_text('[project]\nname = "hmer"\n')
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(HMER_MLRUNS=str(checkout / "mlruns"), PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1")
    return work, env


def _publish(work: Path, env: dict, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hmer.cli", "runs", "publish", str(work)], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_publishes_started_together_one_publishes_and_the_other_names_it(tmp_path):
    work, env = _workspace(tmp_path)
    mlruns = Path(env["HMER_MLRUNS"])
    first, second = _publish(work, env, tmp_path), _publish(work, env, tmp_path)
    done = {p.pid: (p.wait(timeout=600), *p.communicate()) for p in (first, second)}
    assert sorted(rc for rc, _, _ in done.values()) == [0, 2], done
    (winner,) = [pid for pid, (rc, _, _) in done.items() if rc == 0]
    (rc, out, err) = next(v for pid, v in done.items() if pid != winner)
    (line,) = err.strip().splitlines()
    assert f"`hmer runs publish {work}` (pid {winner} on " in line and "since" in line, line
    assert str(mlruns) in line and "nothing was changed" in line, line
    assert "published" in done[winner][1]
    assert MlflowClient(f"sqlite:///{mlruns / 'mlflow.db'}").get_experiment_by_name("results") is not None
    assert sorted(p.name for p in mlruns.iterdir()) == ["artifacts", "mlflow.db"]  # no lock, no staging left


def test_a_publish_killed_while_it_holds_the_lock_leaves_a_stale_lock_that_the_next_names(tmp_path):
    work, env = _workspace(tmp_path)
    mlruns = Path(env["HMER_MLRUNS"])
    lock = mlruns / LOCK_FILE
    killed = _publish(work, env, tmp_path)
    deadline = time.monotonic() + 300
    record: dict = {}
    while not record and killed.poll() is None and time.monotonic() < deadline:
        try:
            record = json.loads(lock.read_text())
        except (OSError, ValueError):
            time.sleep(0.01)
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=60)
    assert record.get("pid") == killed.pid, "the publish ended before it could be killed holding its lock"
    assert lock.is_file()  # what a killed holder leaves

    again = subprocess.run([sys.executable, "-m", "hmer.cli", "runs", "publish", str(work)], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    (line,) = again.stderr.strip().splitlines()
    assert "stale lock" in line and f"(pid {killed.pid} on " in line and "taken over" in line, line
    assert sorted(p.name for p in mlruns.iterdir()) == ["artifacts", "mlflow.db"]


def test_a_publish_stopped_by_sigterm_removes_its_staging_copy_and_changes_nothing(tmp_path):
    """Issue 70: SIGTERM of a publish left its staging copy, `mlruns/.publishing/` (539 MB of it)."""
    work, env = _workspace(tmp_path)
    mlruns = Path(env["HMER_MLRUNS"])
    before = sorted(p.name for p in mlruns.iterdir())
    stopped = _publish(work, env, tmp_path)
    deadline = time.monotonic() + 300
    while not (mlruns / ".publishing").exists() and stopped.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    stopped.send_signal(signal.SIGTERM)
    out, err = stopped.communicate(timeout=300)
    assert stopped.returncode == 128 + signal.SIGTERM, (stopped.returncode, out[-2000:], err[-3000:])
    (line,) = err.strip().splitlines()
    assert line == "hmer: stopped by SIGTERM", line
    assert sorted(p.name for p in mlruns.iterdir()) == before  # no staging copy, no lock, nothing published


HOLD = """
import sys, time
from hmer.tracking.lock import store_lock
with store_lock(sys.argv[1], "a publish, held for the test"):
    print("held", flush=True)
    time.sleep(600)
"""


def test_every_writer_is_refused_while_another_process_writes_the_store(tmp_path, capsys, monkeypatch):
    work, env = _workspace(tmp_path)
    store = f"sqlite:///{work / 'mlflow.db'}"
    export = tmp_path / "runs.tar.gz"
    export_runs(export, tracking_uri=store)
    monkeypatch.setenv("HMER_MLRUNS", env["HMER_MLRUNS"])
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    before = (work / "mlflow.db").read_bytes()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(work)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        writers = (["runs", "import", str(export), "--tracking-uri", store], ["runs", "workspace", str(work)],
                   ["runs", "present", str(work)], ["runs", "rename", "results", "kept", "--tracking-uri", store],
                   ["runs", "supersede", "results", "other", "--tracking-uri", store],
                   ["runs", "rescore", "--tracking-uri", store])
        for argv in writers:
            assert cli.main(argv) == 2
            (line,) = capsys.readouterr().err.strip().splitlines()
            assert f"(pid {holder.pid} on " in line and "a publish, held for the test" in line, line
        assert (work / "mlflow.db").read_bytes() == before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    assert cli.main(["runs", "import", str(export), "--tracking-uri", store]) == 0  # the stale lock taken over
    out, err = capsys.readouterr()
    assert "1 already there" in out and "stale lock" in err and f"(pid {holder.pid} on " in err, (out, err)
    assert not (work / LOCK_FILE).exists()
