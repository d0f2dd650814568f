"""What the evaluation batch size (`data.eval_batch_pixels`) costs a trained model's decoding on a CPU:
time, CPU time and peak memory, and whether the hypotheses change.

    python benchmarks/decode_batching.py RUN [--year 2014] [--limit N] [--pixels 1600000,400000]

Each size decodes the year (its first N expressions with --limit) with the run's own decoding (beam,
search rule, the joint search of a bidirectional model) as `hmer evaluate` does, in a fresh process
pinned to a core with one thread, two sizes side by side at a time on cores 0 and 1, so that a pair is
measured in the same minute. It prints one row a size: wall and CPU seconds, the peak resident memory
of the process (`ru_maxrss`) and before decoding began, ExpRate, and how many hypotheses differ from
the first size's. The default size (1,600,000 px, at most 64 images) was chosen for the GPU, where a
larger batch fills the card; on a CPU a beam search over a batch steps until its longest hypothesis
ends, so a large batch carries its finished images along.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def decode(run: str, year: str, limit: int | None, pixels: int, tracking_uri: str | None) -> dict:
    """Decode in this process and measure it (the child's side)."""
    from hmer.allocator import tune_malloc
    from hmer.data import load_dataset
    from hmer.device import autocast_dtype, cpu_description, resolve_device
    from hmer.evaluation.evaluate import decode_options, evaluate_split
    from hmer.tracking import load_model

    tune_malloc()  # as `hmer evaluate` runs (hmer.allocator): freed memory stays in the process
    device = resolve_device("cpu")
    model, cfg, vocab = load_model(run, tracking_uri, device)
    cfg = cfg.override({"data.eval_batch_pixels": pixels, **({"data.test_limit": limit} if limit else {})})
    exprs = load_dataset(cfg.data.path or None, cfg.data, splits=(year,))[year]
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    wall, cpu = time.perf_counter(), time.process_time()
    result = evaluate_split(model, exprs, vocab,
                            **decode_options(cfg, device, autocast_dtype(cfg.train.precision, device)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return dict(host=cpu_description(), pixels=pixels, n=len(exprs), wall_s=wall, cpu_s=cpu,
                rss_before_gib=rss_before / 2**20, peak_rss_gib=peak / 2**20, exprate=result.scores.exprate,
                predictions=[" ".join(p) for p in result.predictions])


def measure(args, pixels: list[int]) -> list[dict]:
    """Each size in its own process, one thread pinned to a core, two at a time."""
    rows: list[dict] = []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for start in range(0, len(pixels), 2):
        procs = []
        for core, size in enumerate(pixels[start:start + 2]):
            cmd = ["taskset", "-c", str(core), sys.executable, __file__, args.run, "--year", args.year,
                   "--pixels", str(size), "--child"]
            cmd += ["--limit", str(args.limit)] if args.limit else []
            cmd += ["--tracking-uri", args.tracking_uri] if args.tracking_uri else []
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
        for size, proc in zip(pixels[start:start + 2], procs):
            out, _ = proc.communicate()
            if proc.returncode:
                raise SystemExit(f"decode_batching: decoding at {size} px exited {proc.returncode} (its error above)")
            rows.append(json.loads(out.strip().splitlines()[-1]))
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="a run id (its first 8 characters at least) whose model artifact is decoded")
    p.add_argument("--year", default="2014", help="the test year (default: 2014)")
    p.add_argument("--limit", type=int, default=None, help="decode only the first N expressions")
    p.add_argument("--pixels", default="1600000,400000",
                   help="evaluation batch sizes in pixels, comma-separated (default: 1600000,400000)")
    p.add_argument("--tracking-uri", default=None, help="the MLflow store (default: as `hmer evaluate`)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    pixels = [int(x) for x in args.pixels.split(",") if x.strip()]
    if args.child:
        print(json.dumps(decode(args.run, args.year, args.limit, pixels[0], args.tracking_uri)))
        return 0
    from hmer.tracking import load_model
    from hmer.tracking.models import RunNotFoundError

    try:  # a mistyped run: one line here, not a traceback from each child
        load_model(args.run, args.tracking_uri)
    except RunNotFoundError as exc:
        print(f"decode_batching: error: {exc}", file=sys.stderr)
        return 2
    rows = measure(args, pixels)
    first = rows[0]["predictions"]
    print(f"# {args.run}, {args.year}, {rows[0]['n']} expressions, one thread a size, two sizes side by side; "
          f"{rows[0]['host']}, {os.cpu_count()} cores")
    print("| eval_batch_pixels | wall s | CPU s | peak RSS GiB (before decoding) | ExpRate "
          "| hypotheses unlike the first |")
    print("|--:|--:|--:|--:|--:|--:|")
    for row in rows:
        differ = sum(a != b for a, b in zip(first, row["predictions"]))
        print(f"| {row['pixels']:,} | {row['wall_s']:.0f} | {row['cpu_s']:.0f} | {row['peak_rss_gib']:.2f} "
              f"({row['rss_before_gib']:.2f}) | {row['exprate']:.2f} | {differ} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
