"""The GPU campaign (tools/gpu_campaign.py) rehearsed on the CPU: three slices with tiny presets,
training interrupted at the end of slice 1, resumed on the same machine in slice 2 and on a fresh
machine (from the resumable copy in $OUT) in slice 3, then the exported runs merged into a fresh
MLflow store, where `hmer report` shows them with their device."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from hmer.cli import main
from tiny_dataset import write_dataset

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "gpu_campaign.py"


def _slice(n: int, home: Path, out: Path, data: Path, resume: Path) -> dict:
    # cap-scale: this machine's cores are shared, so wall-clock caps are stretched (CPU time is what's small).
    cmd = [sys.executable, str(SCRIPT), "--slice", str(n), "--device", "cpu", "--rehearse", "--home", str(home),
           "--out", str(out), "--data", str(data), "--resume-from", str(resume), "--wheels", str(home / "no-wheels"),
           "--slice-seconds", "3000", "--eval-seconds", "30", "--epochs-per-slice", "1", "--cap-scale", "10"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all((out / f).stat().st_size <= 16 * 2**20 for f in files), files
    return json.loads((out / "status.json").read_text())


@pytest.mark.slow
def test_campaign_rehearsal_resumes_across_slices_and_comes_home(tmp_path, monkeypatch):
    data = write_dataset(tmp_path / "data")
    home, carried = tmp_path / "device-home", tmp_path / "carried"
    carried.mkdir()
    outs = [tmp_path / f"out{i}" for i in (1, 2, 3)]

    s1 = _slice(1, home, outs[0], data, carried / "resume.tar")
    assert {k: v["status"] for k, v in s1["steps"].items()} == {
        "install": "done", "data": "done", "check": "done", "shape-cost": "done", "bench-train": "done"}
    assert "S1_baseline" in json.loads((outs[0] / "shape_cost.json").read_text())
    assert not s1["train"].get("finished") and s1["train"]["run_id"]
    bench = (outs[0] / "bench.md").read_text()
    assert "| train | tiny | large k=4, padded to 32 px | done |" in bench
    assert "| train | tiny | compile | timeout |" in bench

    s2 = _slice(2, home, outs[1], data, carried / "resume.tar")  # warm machine: the same home
    assert not s2["train"].get("finished") and s2["train"]["run_id"] == s1["train"]["run_id"]

    shutil.rmtree(home)  # a fresh machine: only what came back in $OUT is carried in
    shutil.copy(outs[1] / "resume.tar", carried / "resume.tar")
    s3 = _slice(3, home, outs[2], data, carried / "resume.tar")
    assert s3["train"]["finished"] and s3["train"]["run_id"] == s1["train"]["run_id"]
    assert s3["steps"]["restore"]["status"] == "done" and s3["steps"]["bench-decode"]["status"] == "done"
    log = (outs[2] / "campaign-slice3.log").read_text()
    assert "[slice 1 " in log and "[slice 2 " in log and "[slice 3 " in log

    # Home: every slice's export merged into a fresh store; nothing duplicated.
    store = f"sqlite:///{tmp_path / 'home-store' / 'mlflow.db'}"
    (tmp_path / "home-store").mkdir()
    monkeypatch.setenv("HMER_MLRUNS", str(tmp_path / "home-store"))
    for out in outs:
        exports = sorted({p.name.split(".part-")[0] for p in out.glob("runs-slice*")})
        assert len(exports) == 1
        assert main(["runs", "import", str(out / exports[0]), "--tracking-uri", store]) == 0
    client = MlflowClient(store)
    trained = client.get_experiment_by_name("gpu-campaign")
    runs = client.search_runs([trained.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.data.tags["hmer.source_run_id"] == s1["train"]["run_id"]
    assert run.data.tags["hmer.device"].startswith("cpu") and run.data.tags["hmer.warm_restart"] in ("2", "3")
    assert "hmer.error" not in run.data.tags and run.info.status == "FINISHED"
    epochs = sorted(m.step for m in client.get_metric_history(run.info.run_id, "train_loss"))
    assert epochs == [1, 2, 3]
    assert "test_2014_exprate" in run.data.metrics
    bench_runs = client.search_runs([client.get_experiment_by_name("gpu-bench").experiment_id])
    assert {r.data.params["setting"] for r in bench_runs} >= {"large k=4, padded to 32 px"}

    report = tmp_path / "report"
    assert main(["report", "--experiment", "gpu-campaign", "--tracking-uri", store, "--out", str(report)]) == 0
    with (report / "runs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["device"][:3] for r in rows] == ["cpu"]


def test_skipped_steps_are_recorded_and_not_run(tmp_path):
    data = write_dataset(tmp_path / "data")
    home, out = tmp_path / "device-home", tmp_path / "out"
    skip = ["check", "shape-cost", "bench-train", "train", "bench-decode"]
    cmd = [sys.executable, str(SCRIPT), "--slice", "1", "--device", "cpu", "--rehearse", "--home", str(home),
           "--out", str(out), "--data", str(data), "--wheels", str(home / "no-wheels"), "--slice-seconds", "600",
           *[arg for step in skip for arg in ("--skip", step)]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    status = json.loads((out / "status.json").read_text())
    assert {k: v["status"] for k, v in status["steps"].items()} == {
        "install": "done", "data": "done", **{step: "skipped" for step in skip}}
    assert not status["train"] and "bench-train: skipped (--skip)" in (out / "campaign-slice1.log").read_text()


def test_an_unknown_step_to_skip_is_refused_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--skip", "bench-trian", "--out", str(tmp_path / "out")],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and not (tmp_path / "out").exists()
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "gpu_campaign.py: error: argument --skip: invalid choice: 'bench-trian'")
