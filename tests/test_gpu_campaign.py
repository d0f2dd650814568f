"""The GPU campaign (tools/gpu_campaign.py) rehearsed on the CPU: two leases back to back, each on a
fresh machine (a new home), with only what the device tool carries between them. The first starts
the campaign's run and pauses it; `home` merges its runs into the home store and keeps the carried
run; the second carries it in, finishes it, evaluates it and times its decoding; `home` again. The
home store then holds one run with one continuous curve, its warm restart tagged."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from hmer.cli import main
from tiny_dataset import write_dataset

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "gpu_campaign.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}


def _lease(tmp_path: Path, n: int, data: Path, keep: Path, *extra: str) -> dict:
    home, out = tmp_path / f"machine{n}", tmp_path / f"out{n}"  # a fresh machine each lease
    # cap-scale: this machine's cores are shared, so wall-clock caps are stretched (CPU time is what's small).
    cmd = [sys.executable, str(SCRIPT), "lease", "--device", "cpu", "--rehearse", "--home", str(home), "--out",
           str(out), "--data", str(data), "--carried", str(keep), "--wheels", str(home / "no-wheels"),
           "--lease-seconds", "3000", "--eval-seconds", "30", "--cap-scale", "10", *extra]
    proc = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all((out / f).stat().st_size <= 16 * 2**20 for f in files), files
    status = json.loads((out / "status.json").read_text())
    assert status["files"] == files and not status["out_problems"]
    return status


def _prepare(tmp_path: Path, data: Path, keep: Path) -> str:
    """Before a lease: the data packed and the kept run copied into the folder the call carries."""
    (tmp_path / "wheels").mkdir(exist_ok=True)
    proc = subprocess.run([sys.executable, str(SCRIPT), "prepare", "--data", str(data), "--gpu-dir",
                           str(tmp_path / "gpu"), "--keep", str(keep), "--wheels", str(tmp_path / "wheels")],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def _home(tmp_path: Path, n: int, keep: Path, store: str) -> str:
    proc = subprocess.run([sys.executable, str(SCRIPT), "home", str(tmp_path / f"out{n}"), "--keep", str(keep),
                           "--tracking-uri", store], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_two_leases_carry_one_run_home_as_one_curve(tmp_path, monkeypatch):
    data = write_dataset(tmp_path / "data")
    keep = tmp_path / "repo" / "mlruns" / "carried" / "gpu-campaign.tar.gz"  # committed between leases
    store = f"sqlite:///{tmp_path / 'home-store' / 'mlflow.db'}"
    (tmp_path / "home-store").mkdir()
    monkeypatch.setenv("HMER_MLRUNS", str(tmp_path / "home-store"))

    first = _lease(tmp_path, 1, data, keep, "--epochs-per-lease", "2", "--with", "bench-train")
    assert {k: v["status"] for k, v in first["steps"].items()} == {
        "install": "done", "data": "done", "check": "done", "bench-train": "done", "train": "paused",
        "wrap-up": "done"}
    assert first["train"]["epochs_this_lease"] == [1, 2] and not first["train"]["finished"]
    assert any(f.startswith("carried.tar") for f in first["files"])
    bench = (tmp_path / "out1" / "bench.md").read_text()
    assert "| train | tiny-transformer | large k=4, padded to 32 px | done |" in bench
    assert "| train | tiny-transformer | compile | timeout |" in bench
    said = _home(tmp_path, 1, keep, store)
    assert "kept run" in said and "at epoch 2 of 3" in said and keep.is_file()

    said = _prepare(tmp_path, data, keep)
    assert "carried run" in said and "epoch 2 of 3 done" in said and "the call carries" in said
    gpu = tmp_path / "gpu"
    assert (gpu / "carried.tar.gz").read_bytes() == keep.read_bytes() and (gpu / "crohme.zip").is_file()
    second = _lease(tmp_path, 2, gpu / "crohme.zip", gpu / "carried.tar.gz", "--with", "bench-trials")
    steps = {k: v["status"] for k, v in second["steps"].items()}
    assert steps["carry-in"] == "done" and steps["train"] == "done" and steps["bench-decode"] == "done"
    assert steps["bench-trials"] == "done"
    assert second["train"]["epochs_this_lease"] == [3] and second["train"]["finished"]
    assert not any(f.startswith("carried.tar") for f in second["files"])  # finished: nothing to carry
    said = _home(tmp_path, 2, keep, store)
    assert "has finished" in said and not keep.exists()

    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("gpu-campaign").experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.data.tags["hmer.source_run_id"] == first["train"]["run_id"]
    assert run.info.status == "FINISHED" and run.data.tags["hmer.status"] == "finished"
    assert run.data.tags["hmer.warm_restart"] == "3" and run.data.tags["hmer.device"].startswith("cpu")
    assert run.data.params["data.batch_pixels"] == "20000"  # the rehearsal's train set reached the fresh run
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train_loss")) == [1, 2, 3]
    assert "test_2014_exprate" in run.data.metrics and "test_2019_exprate" in run.data.metrics
    bench_runs = client.search_runs([client.get_experiment_by_name("gpu-bench").experiment_id])
    settings = {r.data.params["setting"] for r in bench_runs}
    assert {"large k=4, padded to 32 px", "2 trials side by side against 1"} <= settings
    trials = next(r for r in bench_runs if r.data.params["setting"].startswith("2 trials"))
    assert trials.data.metrics["images_per_second"] > 0 and trials.data.metrics["scaling"] > 0

    report = tmp_path / "report"
    assert main(["report", "--experiment", "gpu-campaign", "--tracking-uri", store, "--out", str(report)]) == 0
    with (report / "runs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["device"][:3] for r in rows] == ["cpu"]


def test_skipped_steps_are_recorded_and_not_run(tmp_path):
    data = write_dataset(tmp_path / "data")
    home, out = tmp_path / "machine", tmp_path / "out"
    skip = ["check", "carry-in", "train", "bench-decode"]
    cmd = [sys.executable, str(SCRIPT), "lease", "--device", "cpu", "--rehearse", "--home", str(home), "--out",
           str(out), "--data", str(data), "--wheels", str(home / "no-wheels"), "--lease-seconds", "600",
           "--carried", str(tmp_path / "none.tar"), *[arg for step in skip for arg in ("--skip", step)],
           "--with", "shape-cost"]
    proc = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    status = json.loads((out / "status.json").read_text())
    assert {k: v["status"] for k, v in status["steps"].items()} == {
        "install": "done", "data": "done", **{step: "skipped" for step in skip}, "shape-cost": "done",
        "wrap-up": "done"}
    # the per-shape cost diagnostic's CPU rehearsal: its sections' figures come back in $OUT
    assert "S1_baseline" in json.loads((out / "shape_cost.json").read_text())
    assert not status["train"] and "step check: skipped (--skip)" in (out / "lease.log").read_text()
    assert not any(f.startswith("carried.tar") for f in status["files"])


def test_an_unknown_step_is_refused_in_one_line(tmp_path):
    for option in ("--skip", "--with"):
        proc = subprocess.run([sys.executable, str(SCRIPT), "lease", option, "bench-trian", "--out",
                               str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and not (tmp_path / "out").exists()
        assert proc.stderr.strip().splitlines()[-1].startswith(
            f"gpu_campaign.py lease: error: argument {option}: invalid choice: 'bench-trian'")


def test_what_comes_back_is_checked_against_the_device_tools_limits(tmp_path):
    sys.path.insert(0, str(REPO / "tools"))
    from lease import check_out

    out = tmp_path / "out"
    (out / "a" / "b" / "c").mkdir(parents=True)
    assert check_out(out) == []
    for i in range(8):
        (out / f"f{i}").write_bytes(b"x")
    assert check_out(out) == [] and check_out(out, extra_files=1) == ["9 files, more than the 8 that come back"]
    (out / "f0").write_bytes(b"x" * (16 * 2**20 + 1))
    (out / "a" / "b" / "c" / "deep").write_bytes(b"x")
    problems = check_out(out)
    assert "f0 is 16.0 MiB, over 16 MiB" in problems and "a/b/c/deep is more than two folders down" in problems
