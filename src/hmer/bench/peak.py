"""The FLOPs a step performs (`count_flops`) and the peak they are read against (`peak_gflops_for`):
a known GPU's data sheet, else a matmul measured on this process's threads (`hmer bench peak`)."""

from __future__ import annotations

import sys
import time

import torch

from ..device import synchronize

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
