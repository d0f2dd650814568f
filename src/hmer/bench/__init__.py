"""Throughput benchmarks behind `hmer bench train` and `hmer bench decode`.

Both print what they measured, one or more `key=value` per line, and end with
`images_per_second=<number>` so scripts can read the last line. Batches are real
CROHME renderings when `--data` (or $HMER_DATA) is given, otherwise synthetic
stroke images whose heights, widths and caption lengths follow the CROHME training
set's joint distribution, bucketed exactly as in training (or evaluation). Timing
starts after warm-up steps, and on a GPU it synchronises only at the ends of the timed
region, never inside the step.

The training step is the trainer's, fed by the trainer's input pipeline
(`hmer.training.loader`: collate with the preset's scale augmentation, targets built on
the host, pinned and copied without blocking on a GPU, `data.prefetch` batches ahead in a
thread), then autocast, `loss_from_targets`, backward, gradient clipping, optimiser step.
The trainer's settings apply as they do there: `--set train.compile=true`,
`train.channels_last=true`, `data.prefetch=N`, `train.precision=fp32`. The decode
step is `decode_batch` with the preset's beam size, maximum length and direction
(`bi`: BTTR's joint search), on the evaluation bucketing.

Benchmark-only knobs go through `--set bench.KEY=VALUE` beside the config overrides:

    bench.pool=N             synthetic expressions generated, which the bucketing sees (default: 8,393
                             for train, as CROHME train after the hold-out; 1,000 for decode, a
                             test year): the padding share depends on it
    bench.warmup=N           untimed steps on the smallest batches first (default: 2 train / 1 decode,
                             6 when compiling)
    bench.weights=PATH|RUN   decode (or start training) with trained weights: a checkpoint or a
                             run id. Untrained weights rarely emit <eos>, so their hypotheses run
                             to max_len and the decode figure is a pessimistic bound; the
                             `mean_hyp_tokens` line says which case a figure is.
    bench.check_unbatched=N  decode, after timing: N images one at a time, compared with their
                             batched hypotheses (`unbatched_match=k/N`)
    bench.start_at=T         wait after warm-up until Unix time T before the timed region (side-by-
                             side processes: `benchmarks/bench_concurrency.py`)
    bench.flop_batches=N     batches whose FLOPs are counted after the timed region (default: 8 train,
                             2 decode; 0 = no FLOP count and no peak)
    bench.flop_spread=1      train: the counted batches spread evenly over the whole epoch's batches
                             sorted by size, each weighted by its share: the epoch's FLOPs an image
                             (benchmarks/frontier_flops.py); default 0, the first timed batches
    bench.share=N            one of N processes side by side on this machine: cores // N torch threads
                             and, on a GPU, at most 1/N of its memory (`hmer.device.share_device`;
                             `benchmarks/bench_concurrency.py` sets it)
    bench.batches=N          time only the first N batches (in their shuffled order), cycled, after
                             one untimed pass over them in place of the warm-up: the steady state
                             once every input shape has been seen (on a GPU, cuDNN plans a
                             convolution per new shape; docs/benchmarks.md section 5). 0 = all

After the timed region it counts the FLOPs of a few of the same batches with
`torch.utils.flop_counter` (forward and backward for training; the whole search for
decoding) and prints `gflop_per_image`, `achieved_gflops` (FLOPs per image times images per
second), `peak_gflops` and `share_of_peak`: how close the step comes to what the device can do
in the precision the step runs in. The peak is the right one for that precision
(`peak_gflops_for`): on a GPU the data sheet's dense tensor-core figure for bf16 (`GPU_PEAK_TFLOPS`;
a GPU not in the table, and float32 steps, take a matmul measured in that dtype), on a CPU a
matmul measured on the same threads (`hmer bench peak`). `peak_source` says which;
`matmul_gflops` is the measured matmul beside it.

The training step follows the config as the trainer does: `train.conv1x1_as_matmul`, the pad
ladder (`data.pad_multiple`, `data.pad_growth`: `ladder_shapes=` counts every shape it can give the
batches, scale augmentation included), `train.plan_shapes` (the planning pass before the warm-up:
`planned_shapes=`, `plan_seconds=`; on a GPU the cuDNN plan cache is sized to the ladder first) and
`train.cuda_graphs` (`graphs=` shapes captured, `graph_failures=`).

Besides images per second (wall clock) it prints `cpu_seconds` and
`images_per_cpu_second` of the timed region, which move much less than wall time
when other jobs share the CPU, the padding share of the batches, the share of wall
time the step loop spent waiting for data (`data_wait_share`), and peak memory
(GPU: `max_memory_allocated`; CPU: the process's peak resident set, data included).

The modules: `setup` (the knobs, the config, model and expressions, the header), `timing` (the
timed region and its lines), `train` and `decode` (the two steps), `peak` (FLOPs and the peak they
are read against), `synthetic` (the images without `--data`).
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
