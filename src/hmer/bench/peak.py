"""The ceiling a benchmark's figures are read against: the FLOPs a step performs (`count_flops`),
and the peak of the device in the step's precision, from the data sheet of a known GPU or measured
as a matmul on this process's threads (`peak_gflops_for`); `hmer bench peak` prints the measured one."""

from __future__ import annotations

import sys
import time

import torch

from ..device import synchronize

PEAK_MATMUL_SIZE = 2048

# Dense tensor-core peaks in TFLOP/s, by what `torch.cuda.get_device_name` contains (most specific
# first). NVIDIA's data sheets print the 16-bit figures with 2:4 structured sparsity, twice the dense
# ones: H100 SXM5 ("H100 80GB HBM3") BF16 1,979 sparse = 989 dense, FP32 67 (NVIDIA H100 Tensor Core
# GPU data sheet; 989.4 dense BF16 and 66.9 FP32 in the Hopper whitepaper's table, also at
# glennklockwood.com/garden/processors/h100); H100 PCIe BF16 1,513 sparse = 756, FP32 51 (same data
# sheet); H100 NVL and H200 NVL BF16 1,671 sparse = 835, FP32 60 (their data sheets); H200 (SXM) is
# the same GH100 silicon at the same clocks as the H100 SXM5: BF16 1,979 sparse = 989, FP32 67 (NVIDIA
# H200 data sheet). Not ~790: no Hopper part has that dense BF16 figure, so the 11.6 TFLOP/s of the
# second lease's 454.6 img/s x 25.45 GFLOP is 1.2 % of its H100 SXM5's peak.
GPU_PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 PCIe": {"bf16": 756.0, "fp32": 51.0},
    "H100 NVL": {"bf16": 835.0, "fp32": 60.0},
    "H200 NVL": {"bf16": 835.0, "fp32": 60.0},
    "H100": {"bf16": 989.0, "fp32": 67.0},
    "H200": {"bf16": 989.0, "fp32": 67.0},
}
_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def datasheet_peak_gflops(gpu_name: str, dtype: torch.dtype) -> tuple[float, str] | None:
    """(dense GFLOP/s, its source) from `GPU_PEAK_TFLOPS` for the GPU so named in a 16-bit dtype, or
    None (a GPU not in the table, float32: the caller measures a matmul instead). float32 is
    measured even where the table has it: a float32 step's convolutions run as TF32 on tensor cores
    by default (cudnn.allow_tf32), its matmuls at full float32, so no one figure is its peak."""
    if dtype not in (torch.bfloat16, torch.float16):
        return None
    for key, peaks in GPU_PEAK_TFLOPS.items():
        if key in gpu_name:
            return peaks["bf16"] * 1000, f"datasheet: {key}, dense {_DTYPE_NAMES[dtype]} tensor cores"
    return None


def peak_gflops_for(device: torch.device, dtype: torch.dtype) -> tuple[float, str, float]:
    """(the peak a step in `dtype` is read against, its source, the measured matmul GFLOP/s in
    `dtype`): the data sheet's where `datasheet_peak_gflops` knows it, else the measured matmul."""
    measured = matmul_peak_gflops(device=device, dtype=dtype)
    sheet = datasheet_peak_gflops(torch.cuda.get_device_name(device), dtype) if device.type == "cuda" else None
    if sheet is not None:
        return sheet[0], sheet[1], measured
    return measured, f"measured: {_DTYPE_NAMES.get(dtype, str(dtype))} matmul {PEAK_MATMUL_SIZE}", measured


def matmul_peak_gflops(size: int = PEAK_MATMUL_SIZE, seconds: float = 1.0, device: torch.device | None = None,
                       dtype: torch.dtype = torch.float32) -> float:
    """The GFLOP/s of a `size` x `size` matmul in `dtype` on this process's threads (or GPU): the
    ceiling a model's dense arithmetic can reach here, measured rather than read off a data sheet
    (the cores that CI and developers get differ, and so does what else runs on them)."""
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
    """The floating-point operations `run()` performs, as torch.utils.flop_counter counts them
    (matmuls, convolutions and attention: the work that scales; elementwise ops count 0)."""
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
