"""Throughput benchmarks behind `hmer bench train` and `hmer bench decode` (their knobs and lines:
docs/benchmarks.md, "The tools"). Both end with `images_per_second=<number>` for scripts.
"""

from __future__ import annotations

from .decode import bench_decode
from .setup import prepare
from .train import bench_train

BENCHMARKS = {"train": bench_train, "decode": bench_decode}


def run_benchmark(what: str, preset: str = "bttr", device: str = "auto", data: str | None = None,
                  images: int = 0, seconds: float = 0.0, overrides: list[str] | None = None,
                  out=None, config: str | None = None) -> int:
    """Run one benchmark, printing to `out` (default sys.stdout); `config`, a JSON config file (a
    run's config.json), stands in for the preset. Returns the exit status (0)."""
    if what not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {what!r}: {' or '.join(BENCHMARKS)}")
    return BENCHMARKS[what](prepare(what, preset, device, data, images, seconds, overrides, out, config))


__all__ = ["BENCHMARKS", "run_benchmark"]
