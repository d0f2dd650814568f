"""Processes side by side on one machine (hmer.device.share_device): a study's workers, or
`hmer bench train --set bench.share=N`. The GPU's memory share is checked on a GPU by the campaign's
check step (tools/gpu_campaign_steps.py); the CPU threads are checked here."""

from __future__ import annotations

import io
import os

import pytest
import torch

from hmer.bench import run_benchmark
from hmer.device import share_device


@pytest.fixture
def threads_restored():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def test_each_of_n_processes_takes_its_share_of_the_cores(threads_restored, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(_cores())
    share_device(torch.device("cpu"), 1)  # alone: nothing changes
    assert torch.get_num_threads() == _cores()
    share_device(torch.device("cpu"), 2)
    assert torch.get_num_threads() == max(1, _cores() // 2)
    share_device(torch.device("cpu"), 4 * _cores())  # more processes than cores: one thread each
    assert torch.get_num_threads() == 1
    # OMP_NUM_THREADS set by whoever started the process wins
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(_cores())
    share_device(torch.device("cpu"), 2)
    assert torch.get_num_threads() == _cores()


def test_bench_share_runs_the_benchmark_as_one_of_n(threads_restored, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(_cores())
    out = io.StringIO()
    run_benchmark("train", preset="tiny-transformer", device="cpu", images=2, out=out,
                  overrides=["bench.pool=16", "bench.warmup=0", "bench.flop_batches=0", "bench.share=2"])
    assert f"threads={max(1, _cores() // 2)} share=2 " in out.getvalue()
