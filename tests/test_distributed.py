"""Data-parallel training through torchrun, on CPU with the gloo backend."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

from hmer.training.distributed import DistInfo, shard
from tiny_dataset import write_dataset


def test_shard_gives_every_rank_the_same_number_of_distinct_batches():
    batches = [[i] for i in range(11)]
    parts = [shard(batches, DistInfo(rank=r, world_size=4)) for r in range(4)]
    assert {len(p) for p in parts} == {2}
    flat = [b[0] for p in parts for b in p]
    assert len(flat) == len(set(flat)) == 8
    assert shard(batches, DistInfo()) == batches


def _descendants(pid: int) -> list[int]:
    """The processes below `pid`, children first, read from /proc."""
    children = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return [d for c in children for d in (c, *_descendants(c))]


@pytest.mark.slow
def test_torchrun_two_cpu_processes_train_one_run(tmp_path):
    data = write_dataset(tmp_path / "data")
    env = {**os.environ, "HMER_MLRUNS": str(tmp_path / "mlruns"), "HMER_CACHE": str(tmp_path / "cache"),
           "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}  # SIGABRT prints where each thread of each process is
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
           "-m", "hmer.cli", "train", "--preset", "tiny-transformer", "--device", "cpu", "--data", str(data),
           "--epochs", "2",
           "--no-progress", "--set", "train.beam_size=2", "train.max_decode_len=12", "data.batch_pixels=20000",
           "data.max_batch_size=4", "train.attention_maps=0"]
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as job:
        try:
            out, err = job.communicate(timeout=300)  # about 11 s alone on one core
        except subprocess.TimeoutExpired:
            for pid in [*_descendants(job.pid), job.pid]:  # the ranks (each in a session of its own), then torchrun
                try:
                    os.kill(pid, signal.SIGABRT)
                except ProcessLookupError:  # it ended since it was listed
                    continue
            out, err = job.communicate()
            pytest.fail(f"torchrun did not end in 300 s; stdout:\n{out[-2000:]}\nstderr:\n{err[-8000:]}")
    assert job.returncode == 0, err[-3000:]
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["hmer"])
    assert len(runs) == 1  # rank 0 alone records
    run = runs.iloc[0]
    assert run["status"] == "FINISHED" and run["metrics.test_2014_n"] == 4
    history = mlflow.tracking.MlflowClient().get_metric_history(run["run_id"], "train_loss")
    assert [m.step for m in history] == [1, 2]
