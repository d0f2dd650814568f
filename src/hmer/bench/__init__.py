"""Throughput benchmarks behind `hmer bench train` and `hmer bench decode`: what they time, the
`bench.KEY=VALUE` knobs and every line they print are in docs/benchmarks.md, "The tools".

Both end with `images_per_second=<number>` so scripts can read the last line. The modules: `setup`
(the knobs, the config, model and expressions, the header), `timing` (the timed region and its lines),
`train` and `decode` (the two steps), `peak` (FLOPs and the peak they are read against), `synthetic`
(the images without `--data`).
"""

from __future__ import annotations

from .decode import bench_decode
from .setup import prepare
from .train import bench_train

BENCHMARKS = {"train": bench_train, "decode": bench_decode}


def run_benchmark(what: str, preset: str = "bttr", device: str = "auto", data: str | None = None,
                  images: int = 0, seconds: float = 0.0, overrides: list[str] | None = None,
                  out=None, config: str | None = None) -> int:
    """Run one benchmark and print its figures to `out` (default: the current sys.stdout); the last
    line is `images_per_second=<number>`. `config`, a JSON config file (a run's config.json), stands
    in for the preset. Returns the exit status (0)."""
    if what not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {what!r}: {' or '.join(BENCHMARKS)}")
    return BENCHMARKS[what](prepare(what, preset, device, data, images, seconds, overrides, out, config))


__all__ = ["BENCHMARKS", "run_benchmark"]
