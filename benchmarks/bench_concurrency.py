"""Several trials side by side on one device: N processes of `hmer bench train` at once.

    python benchmarks/bench_concurrency.py                                  # CPU: tiny, 1 and 2 processes
    python benchmarks/bench_concurrency.py --device cuda --procs 1,2,4,8 --preset bttr --data <zip>

For each N in --procs, N processes start together, each warms up, then all wait for the same
moment (`--set bench.start_at=T`) and train for --seconds; the timed regions therefore overlap.
Printed per N: the total images/s (sum over the processes), per-process images/s (mean, min and
max), the scaling of the total against one process, total images per CPU-second, and the peak
memory of one process. Each process is one of N sharing the machine as a study's workers share it
(`--set bench.share=N`, `hmer.device.share_device`): cores // N torch threads, so that N processes
do not oversubscribe the host's cores (on a GPU the step is host-bound, so this matters there
too), and on a GPU at most 0.9 / N of its memory, so that no process starves the others. Their
kernels time-slice the GPU (the CUDA MPS daemon, `nvidia-cuda-mps-control -d`, would run them
concurrently; say in the figures which it was).

A process that finishes its warm-up after the common start prints `late_start_s`; the table then
flags that N, and --setup-seconds should be raised.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import figures_of  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--preset", default=None, help="default: tiny on CPU, bttr on GPU")
    p.add_argument("--procs", default=None, help="comma-separated process counts (default: 1,2 on CPU, 1,2,4,8 on GPU)")
    p.add_argument("--seconds", type=float, default=0.0, help="timed training per process (default: 30 CPU, 60 GPU)")
    p.add_argument("--setup-seconds", type=float, default=0.0,
                   help="from launch to the common start: imports, data, warm-up (default: 45 CPU, 120 GPU)")
    p.add_argument("--data", default=None, help="real CROHME batches instead of synthetic")
    p.add_argument("--threads", type=int, default=0, help="torch threads per process (default: cores // N)")
    p.add_argument("--set", dest="overrides", nargs="*", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    gpu = args.device.startswith("cuda")
    preset = args.preset or ("bttr" if gpu else "tiny-transformer")
    procs = [int(n) for n in (args.procs or ("1,2,4,8" if gpu else "1,2")).split(",")]
    seconds = args.seconds or (60.0 if gpu else 30.0)
    setup = args.setup_seconds or (120.0 if gpu else 45.0)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

    from hmer.tracking.store import git_commit

    commit = git_commit(short=True, root=ROOT)  # "-dirty" when tracked files have uncommitted changes
    print(f"# {datetime.datetime.now():%Y-%m-%d %H:%M} device={args.device} commit={commit} cores={cores} "
          f"python={platform.python_version()} load_average={os.getloadavg()[0]:.2f}")
    print(f"# {shlex.join(['python', 'benchmarks/bench_concurrency.py', *sys.argv[1:]])}")
    print("| processes | threads each | total img/s | per process img/s: mean (min–max) | scaling vs 1 "
          "| total img/CPU-s | peak MB per process | note |")
    print("|---|---|---|---|---|---|---|---|")
    base_total = None
    commands, figures = [], []
    for n in procs:
        threads = args.threads or max(1, cores // n)
        env = dict(os.environ)
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        start_at = time.time() + setup
        bench_args = ["bench", "train", "--preset", preset, "--device", args.device, "--images", "100000000",
                      "--seconds", str(seconds), *(["--data", args.data] if args.data else []),
                      "--set", *args.overrides, f"bench.share={n}", f"bench.start_at={start_at:.3f}"]
        commands.append(("OMP_NUM_THREADS=%d " % threads if threads else "") + f"{n} x hmer "
                        + shlex.join(bench_args[:-1]) + " bench.start_at=<common start>")
        running = [subprocess.Popen([sys.executable, "-m", "hmer.cli", *bench_args], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env) for _ in range(n)]
        results, errors = [], []
        for proc in running:
            out, err = proc.communicate()
            if proc.returncode != 0:
                errors.append((err or out).strip().splitlines()[-1:] or ["?"])
            else:
                results.append(figures_of(out))
        if errors:
            print(f"| {n} | {threads or '–'} | error: {errors[0][0]} | | | | | |", flush=True)
            continue
        ips = [float(r["images_per_second"]) for r in results]
        cpu_ips = sum(float(r["images"]) / max(float(r["cpu_seconds"]), 1e-9) for r in results)
        total = sum(ips)
        base_total = base_total or (total if n == procs[0] else None)
        scaling = f"{total / base_total:.2f}x" if base_total else "–"
        late = max((float(r.get("late_start_s", 0)) for r in results), default=0.0)
        note = f"late start {late:.0f} s: raise --setup-seconds" if late > 0 else ""
        peak = max(float(r["peak_memory_mb"]) for r in results)
        print(f"| {n} | {threads or 'all'} | {total:.3g} | {total / n:.3g} ({min(ips):.3g}–{max(ips):.3g}) | "
              f"{scaling} | {cpu_ips:.3g} | {peak:.0f} | {note} |", flush=True)
        figures.append(f"total_images_per_second_{n}={total:.4g}" + (f" scaling_{n}={total / base_total:.3f}"
                                                                       if base_total else ""))
    print("\n" + " ".join(figures))  # for scripts (tools/gpu_campaign.py): key=value per process count
    print(f"\nCommands (each process also got --set bench.start_at=<the common start>, {setup:.0f} s after launch):")
    for c in commands:
        print(f"    {c}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
