"""The timed region both benchmarks share (warm-up, then steps over batches made ahead as in
training) and the lines it prints; the FLOPs a step performs (`count_flops`) and the peak they are read
against (`peak_gflops_for`): a known GPU's data sheet, else a matmul measured on this process's threads
(`hmer bench peak`)."""

from __future__ import annotations

import itertools
import resource
import sys
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from ..device import synchronize
from .setup import Bench

PEAK_MATMUL_SIZE = 2048

# Dense tensor-core peaks in TFLOP/s, by what `torch.cuda.get_device_name` contains (most specific
# first). The data sheets print 16-bit figures with 2:4 sparsity, twice the dense: H100 SXM5 ("H100
# 80GB HBM3") BF16 1,979 = 989 dense, FP32 67 (989.4 / 66.9 in the Hopper whitepaper); H100 PCIe
# 1,513 = 756, FP32 51; H100 NVL and H200 NVL 1,671 = 835, FP32 60; H200 (SXM), the H100 SXM5's
# silicon and clocks, 989 and 67. No Hopper part has ~790 dense BF16: the second lease's 454.6 img/s
# x 25.45 GFLOP (11.6 TFLOP/s) is 1.2 % of its H100 SXM5's peak.
GPU_PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 PCIe": {"bf16": 756.0, "fp32": 51.0},
    "H100 NVL": {"bf16": 835.0, "fp32": 60.0},
    "H200 NVL": {"bf16": 835.0, "fp32": 60.0},
    "H100": {"bf16": 989.0, "fp32": 67.0},
    "H200": {"bf16": 989.0, "fp32": 67.0},
}
_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def datasheet_peak_gflops(gpu_name: str, dtype: torch.dtype) -> tuple[float, str] | None:
    """(dense GFLOP/s, its source) of the GPU so named in a 16-bit dtype, else None (the caller
    measures a matmul). Never float32: its convolutions run as TF32 (cudnn.allow_tf32), its matmuls
    at full float32, so no one figure is its peak."""
    if dtype not in (torch.bfloat16, torch.float16):
        return None
    for key, peaks in GPU_PEAK_TFLOPS.items():
        if key in gpu_name:
            return peaks["bf16"] * 1000, f"datasheet: {key}, dense {_DTYPE_NAMES[dtype]} tensor cores"
    return None


def peak_gflops_for(device: torch.device, dtype: torch.dtype) -> tuple[float, str, float]:
    """(the peak a step in `dtype` is read against, its source, the measured matmul GFLOP/s)."""
    measured = matmul_peak_gflops(device=device, dtype=dtype)
    sheet = datasheet_peak_gflops(torch.cuda.get_device_name(device), dtype) if device.type == "cuda" else None
    if sheet is not None:
        return sheet[0], sheet[1], measured
    return measured, f"measured: {_DTYPE_NAMES.get(dtype, str(dtype))} matmul {PEAK_MATMUL_SIZE}", measured


def matmul_peak_gflops(size: int = PEAK_MATMUL_SIZE, seconds: float = 1.0, device: torch.device | None = None,
                       dtype: torch.dtype = torch.float32) -> float:
    """The GFLOP/s of a `size` x `size` matmul in `dtype` on this process's threads (or GPU),
    measured: the cores CI and developers get differ, and so does what else runs on them."""
    device = device or torch.device("cpu")
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    torch.mm(a, b)  # warm-up: the library picks its kernel, the pages are touched
    synchronize(device)
    reps, start = 0, time.perf_counter()
    while True:
        torch.mm(a, b)
        reps += 1
        synchronize(device)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2 * size**3 * reps / elapsed / 1e9


def count_flops(run) -> int:
    """The FLOPs `run()` performs as torch.utils.flop_counter counts them (elementwise ops count 0)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        run()
    return counter.get_total_flops()


def run_peak(threads: int = 0, size: int = PEAK_MATMUL_SIZE, out=None) -> int:
    """`hmer bench peak`: the matmul ceiling of this process's threads, as `bench train|decode` measure it."""
    from ..device import cpu_description

    out = out if out is not None else sys.stdout
    if threads:
        torch.set_num_threads(threads)
    print(f"threads={torch.get_num_threads()} matmul_size={size} dtype=float32 "
          f"processor={cpu_description()!r}", file=out)
    print(f"peak_gflops={matmul_peak_gflops(size):.1f}", file=out)
    return 0


@dataclass
class Timing:
    """The timed region; `batches` it drew from are cut to `bench.batches` when set."""

    images: int
    seconds: float
    cpu_seconds: float
    waited: float
    batches: list

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds


def print_batching(b: Bench, batches, ladder, max_px) -> None:
    from ..data.batching import padded_shapes, padding_share

    print(f"padding_share={padding_share(b.exprs, batches, max_px, ladder):.3f} batches={len(batches)} "
          f"shapes={len(set(padded_shapes(b.exprs, batches, max_px, ladder)))} "
          f"mean_batch_size={len(b.exprs) / len(batches):.2f}", file=b.out)


def _padded_area(b: Bench, idx) -> int:
    """The pixels of a batch padded to its largest height and width."""
    return len(idx) * max(b.exprs[i].image.shape[0] for i in idx) * max(b.exprs[i].image.shape[1] for i in idx)


def timed(b: Bench, batches, make, step, warmup: int, before_timing=None) -> Timing:
    """Warm-up, then `step(make(idx))` over the batches, cycled, until `b.images` images or
    `b.seconds`; `data.prefetch` batches made ahead in a thread."""
    from ..training.loader import auto_prefetch, prefetched

    dev, out = b.device, b.out
    if b.knobs["batches"] > 0:
        batches = batches[:b.knobs["batches"]]
        print(f"timed_batches={len(batches)} (cycled, after one untimed pass)", file=out)
        warmup_batches = batches
    else:
        # Warm-up on the smallest batches (allocator, kernels, optimiser state; compile traces
        # with dynamic shapes): a random batch can cost minutes on a CPU and teaches nothing more.
        smallest = sorted(batches, key=lambda idx: _padded_area(b, idx))
        warmup_batches = [smallest[k % len(smallest)] for k in range(warmup)]

    for idx in warmup_batches:
        step(make(idx))
    synchronize(dev)
    stream = prefetched(make, itertools.cycle(batches), auto_prefetch(b.cfg.data.prefetch, dev))
    if before_timing is not None:
        before_timing()
    if b.gpu:
        torch.cuda.reset_peak_memory_stats(dev)
    if b.knobs["start_at"]:
        late = time.time() - b.knobs["start_at"]
        if late > 0:
            print(f"late_start_s={late:.2f} (warm-up ended after bench.start_at)", file=out)
        else:
            time.sleep(-late)
    done, waited = 0, 0.0
    cpu0, start = time.process_time(), time.perf_counter()
    while True:
        t0 = time.perf_counter()
        item = next(stream)
        waited += time.perf_counter() - t0
        done += step(item)
        if done >= b.images or (b.seconds and time.perf_counter() - start >= b.seconds):
            break
    synchronize(dev)
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    stream.close()
    return Timing(done, elapsed, cpu, waited, batches)


def flop_line(b: Bench, timing: Timing, run_steps, make, default_batches: int, epoch: Sequence | None = None) -> str:
    """FLOPs an image over the first batches, against the peak of the step's precision ('' with
    bench.flop_batches=0). With `bench.flop_spread=1` and the epoch's batches, the counted batches
    are spread evenly over the epoch sorted by padded size, each standing for its share: a batch's
    FLOPs follow its size, and one shuffle's first batches are a small sample of sizes."""
    flop_batches = b.knobs["flop_batches"] if b.knobs["flop_batches"] >= 0 else default_batches
    if flop_batches <= 0:
        return ""
    if b.knobs["flop_spread"] and epoch:
        stands_for = sorted(epoch, key=lambda idx: _padded_area(b, idx))
        n = min(flop_batches, len(stands_for))
        counted_idx = [stands_for[int((k + 0.5) * len(stands_for) / n)] for k in range(n)]
    else:
        counted_idx = stands_for = timing.batches[:flop_batches]
    counted = [make(idx) for idx in counted_idx]
    flops = count_flops(lambda: run_steps(counted)) * len(stands_for) / len(counted_idx)
    gflop_per_image = flops / sum(len(idx) for idx in stands_for) / 1e9
    achieved = gflop_per_image * timing.images_per_second
    peak, source, measured = peak_gflops_for(b.device, b.amp or torch.float32)
    line = (f"gflop_per_image={gflop_per_image:.4f} achieved_gflops={achieved:.1f} peak_gflops={peak:.1f} "
            f"share_of_peak={achieved / peak:.4f} matmul_gflops={measured:.1f}\npeak_source={source!r}")
    if achieved > peak:  # both are wall-clock rates: the peak's second was shared, the step's were not
        line += ("\npeak_note='the step outran the peak: something else ran on these cores while the peak "
                 "was measured; read the share on an idle machine'")
    return line


def print_timing(b: Bench, timing: Timing, flops: str) -> None:
    print(f"images={timing.images} seconds={timing.seconds:.2f} cpu_seconds={timing.cpu_seconds:.2f} "
          f"images_per_cpu_second={timing.images / timing.cpu_seconds:.3f} "
          f"data_wait_share={timing.waited / timing.seconds:.3f}", file=b.out)
    peak = torch.cuda.max_memory_allocated(b.device) / 2**20 if b.device.type == "cuda" else \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"peak_memory_mb={peak:.0f}", file=b.out)
    if flops:
        print(flops, file=b.out)


def print_rate(b: Bench, timing: Timing) -> None:
    ips = timing.images_per_second
    print(f"images_per_second={ips:.2f}" if ips >= 1 else f"images_per_second={ips:.3g}", file=b.out)
