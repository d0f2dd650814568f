"""Which device and precision a command runs on: one rule for training, evaluation and import."""

from __future__ import annotations

import os
import platform
from contextlib import suppress

import torch

# Share of a GPU's memory that N processes side by side divide between them: each CUDA context
# (about 0.5 GiB, outside the caching allocator's count) needs the rest.
GPU_SHARE = 0.9


def resolve_device(name: str) -> torch.device:
    """`auto`: the GPU when there is one, else the CPU; any other name as torch reads it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """bf16 autocast on GPU by default; full fp32 on CPU, where bf16 is slower and less exact."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on a GPU (a timing's ends); on a CPU the work is done already."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_description(device: torch.device) -> str:
    """The device in words, as a run's tag records it: the GPU's name, or the CPU, the widest
    vector instructions torch uses on it and its threads ("cpu (AMD EPYC, AVX2, 1 threads)").

    A run's CPU-minutes are only comparable on the same kind of core: the machines lent to this
    project have been both AVX-512 cores with a matmul peak near 200 GFLOP/s a thread and AVX2
    ones near 60, so the tag says which one a cost was measured on."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({cpu_description()}, {torch.get_num_threads()} threads)"


def cpu_description() -> str:
    """The processor's model name (Linux's /proc/cpuinfo, else what `platform` knows of it) and the
    widest vector instructions torch's kernels use on it: "AMD EPYC, AVX2"."""
    model = platform.processor() or platform.machine()
    with suppress(OSError), open("/proc/cpuinfo") as f:
        model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    return f"{model}, {torch.backends.cpu.get_cpu_capability()}"


# cuDNN's v8 API keeps the execution plans it built in an LRU cache of this many entries by default
# (torch's TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT; 0 = unbounded, negative = none). A plan is about
# 200 KiB of host memory (torch's docs: 10,000 plans ~ 2 GiB).
CUDNN_PLAN_CACHE = "TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT"
CUDNN_PLAN_CACHE_DEFAULT = 10_000


def size_cudnn_plan_cache(plans: int) -> tuple[int, str]:
    """Let cuDNN keep `plans` execution plans (never fewer than torch's default): the plans of
    every batch shape of a pad ladder, so that none is evicted and built again at the next epoch.

    torch reads TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT once, at the process's first cuDNN convolution,
    so this must run before it; a value already in the environment (set by hand, or by an earlier
    call in this process) is kept. Returns (the limit in effect, where it came from)."""
    if CUDNN_PLAN_CACHE in os.environ:
        return int(os.environ[CUDNN_PLAN_CACHE]), "environment"
    limit = max(int(plans), CUDNN_PLAN_CACHE_DEFAULT)
    os.environ[CUDNN_PLAN_CACHE] = str(limit)
    return limit, "sized to the ladder"


def share_device(device: torch.device, processes: int) -> None:
    """This process is one of `processes` that train side by side on this machine (a study's
    workers, `hmer bench train --set bench.share=N`): it takes `cores // processes` torch threads
    (unless OMP_NUM_THREADS says), so that together they do not oversubscribe the host's cores, and
    on a GPU at most `GPU_SHARE / processes` of its memory, so that a process that outgrows its
    share runs out of memory alone instead of starving its neighbours (PyTorch's caching allocator
    refuses more: `torch.cuda.set_per_process_memory_fraction`). Kernels of several processes
    time-slice the GPU; throughput adds up while each process leaves it idle (a host-bound step)."""
    if processes <= 1:
        return
    if not os.environ.get("OMP_NUM_THREADS"):
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        torch.set_num_threads(max(1, cores // processes))
    if device.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(GPU_SHARE / processes, device)
