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
"""

from __future__ import annotations

import math
import os
import resource
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
import torch

if TYPE_CHECKING:  # the model library is imported when a benchmark runs, not for `hmer --help`
    from .model import HMERModel

# CROHME train (8,393 expressions after the validation hold-out, standard renderer): means, standard
# deviations and correlations of log height, log width and log caption length.
_LOG_MEAN = np.array([4.576, 5.500, 2.358])
_LOG_STD = np.array([0.352, 0.761, 0.979])
_LOG_CORR = np.array([[1.0, 0.542, 0.704], [0.542, 1.0, 0.821], [0.704, 0.821, 1.0]])

BENCH_DEFAULTS: dict[str, Any] = {
    "pool": 0, "warmup": -1, "weights": "", "check_unbatched": 0, "start_at": 0.0, "flop_batches": -1,
    "batches": 0, "share": 1,
}

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
    _sync(device)
    reps, start = 0, time.perf_counter()
    while True:
        torch.mm(a, b)
        reps += 1
        _sync(device)
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
    from .device import cpu_description

    out = out if out is not None else sys.stdout
    if threads:
        torch.set_num_threads(threads)
    print(f"threads={torch.get_num_threads()} matmul_size={size} dtype=float32 "
          f"processor={cpu_description()!r}", file=out)
    print(f"peak_gflops={matmul_peak_gflops(size):.1f}", file=out)
    return 0


def synthetic_expressions(n: int, seed: int = 0):
    """Stroke-like images and captions whose (height, width, length) follow CROHME train's joint
    log-normal fit (median about 97 x 245 px, 11 tokens; wider images hold longer captions)."""
    from PIL import Image, ImageDraw

    from .data import Expression
    from .data.vocab import CROHME_SYMBOLS

    rng = np.random.default_rng(seed)
    cov = _LOG_CORR * np.outer(_LOG_STD, _LOG_STD)
    logs = rng.multivariate_normal(_LOG_MEAN, cov, size=n)
    out = []
    for i in range(n):
        h = int(np.clip(round(math.exp(logs[i, 0])), 24, 488))
        w = int(np.clip(round(math.exp(logs[i, 1])), 24, 2048))
        length = int(np.clip(round(math.exp(logs[i, 2])), 1, 96))
        img = Image.new("L", (w, h), 0)
        draw = ImageDraw.Draw(img)
        for _ in range(max(2, w // 25)):
            pts = [(float(rng.uniform(0, w)), float(rng.uniform(0, h))) for _ in range(4)]
            draw.line(pts, fill=255, width=3)
        tokens = [CROHME_SYMBOLS[j] for j in rng.integers(0, len(CROHME_SYMBOLS), length)]
        out.append(Expression(name=f"synthetic_{i}", tokens=tokens, image=np.asarray(img, dtype=np.uint8)))
    return out


def split_overrides(overrides: Sequence[str] | None) -> tuple[list[str], dict[str, Any]]:
    """(config overrides, bench knobs): `bench.KEY=VALUE` items are the benchmark's own."""
    config_items, knobs = [], dict(BENCH_DEFAULTS)
    for item in overrides or []:
        key, sep, value = item.partition("=")
        if not key.startswith("bench."):
            config_items.append(item)
            continue
        name = key[len("bench."):].strip()
        if not sep or name not in BENCH_DEFAULTS:
            raise ValueError(f"unknown benchmark setting {item!r}; known: "
                             + ", ".join(f"bench.{k}" for k in BENCH_DEFAULTS))
        knobs[name] = type(BENCH_DEFAULTS[name])(value.strip())
    return config_items, knobs


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Bench:
    """What both benchmarks share: the config, device, precision, model and expressions, the
    benchmark-only knobs, where the figures go, and how many images to time."""

    what: str
    preset: str
    cfg: Any
    knobs: dict[str, Any]
    device: torch.device
    amp: torch.dtype | None
    model: HMERModel
    exprs: list
    split: str
    from_data: bool
    images: int
    seconds: float
    out: Any

    @property
    def gpu(self) -> bool:
        return self.device.type == "cuda"


def run_benchmark(what: str, preset: str = "bttr", device: str = "auto", data: str | None = None,
                  images: int = 0, seconds: float = 0.0, overrides: list[str] | None = None,
                  out=None, config: str | None = None) -> int:
    """Run one benchmark and print its figures to `out` (default: the current sys.stdout); the last
    line is `images_per_second=<number>`. `config`, a JSON config file (a run's config.json), stands
    in for the preset. Returns the exit status (0)."""
    if what not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {what!r}: {' or '.join(BENCHMARKS)}")
    return BENCHMARKS[what](prepare(what, preset, device, data, images, seconds, overrides, out, config))


def prepare(what: str, preset: str, device: str, data: str | None, images: int, seconds: float,
            overrides: list[str] | None, out, config: str | None = None) -> Bench:
    """The shared setup: config (the preset's, or the `config` file's) with overrides, device, model
    (trained weights with `bench.weights`), expressions (a split of `data`, or synthetic ones), and
    the header lines."""
    from .config import Config, parse_overrides
    from .data import load_dataset
    from .device import autocast_dtype, cpu_description, resolve_device, share_device
    from .model import build_model
    from .presets import preset_with_recipe
    from .training.setup import prepare_model

    out = out if out is not None else sys.stdout
    config_items, knobs = split_overrides(overrides)
    base = Config.load(config) if config else preset_with_recipe(preset)
    cfg = base.override(parse_overrides(config_items))
    dev = resolve_device(device)
    share_device(dev, int(knobs["share"]))  # one of N processes side by side (bench.share)
    torch.manual_seed(0)
    if knobs["weights"]:
        from .tracking.models import load_model

        model, wcfg, _ = load_model(knobs["weights"], device="cpu")
        cfg.model = wcfg.model
        model = model.to(dev)
    else:
        model = build_model(cfg.model).to(dev)
    model = prepare_model(model, cfg.train)
    gpu = dev.type == "cuda"
    if not images:
        images = (4096 if what == "train" else 1000) if gpu else (48 if what == "train" else 8)
    data_path = data or os.environ.get("HMER_DATA")
    split = "train" if what == "train" else "2014"
    if data_path:
        exprs = load_dataset(data_path, cfg.data, splits=(split,))[split]
        source = f"CROHME {split} ({data_path})"
    else:
        exprs = synthetic_expressions(knobs["pool"] or (8393 if what == "train" else 1000))
        source = f"synthetic ({len(exprs)} expressions)"
    bench = Bench(what, preset, cfg, knobs, dev, autocast_dtype(cfg.train.precision, dev), model, exprs, split,
                  bool(data_path), images, seconds, out)
    from .training.loader import auto_prefetch

    params = sum(p.numel() for p in model.parameters())
    origin = f"config={config}" if config else f"preset={preset}"
    print(f"benchmark={what} {origin} device={dev} precision={bench.amp or torch.float32} "
          f"params={params} source={source}", file=out)
    print(f"processor={cpu_description()!r}", file=out)  # CPU figures differ by core kind
    compiled = bool(cfg.train.compile) and what == "train"
    print(f"weights={knobs['weights'] or 'random'} threads={torch.get_num_threads()} share={knobs['share']} "
          f"compile={compiled} "
          f"prefetch={auto_prefetch(cfg.data.prefetch, dev)} pin_memory={gpu} "
          f"channels_last={bool(cfg.train.channels_last)} conv1x1_as_matmul={bool(cfg.train.conv1x1_as_matmul)}",
          file=out)
    return bench


def bench_train(b: Bench) -> int:
    """`hmer bench train`: the trainer's step over the trainer's input pipeline (module docstring)."""
    from .data import Vocab, make_batches
    from .data.ladder import PadLadder
    from .training.graphs import GraphedStep
    from .training.loader import make_train_batch
    from .training.optim import build_optimizer
    from .training.planning import cache_plans, plan, training_shapes
    from .training.setup import LossModule, optimizer_step
    from .device import size_cudnn_plan_cache

    cfg, exprs, dev, out = b.cfg, b.exprs, b.device, b.out
    ladder = PadLadder.from_data_config(cfg.data)
    batches = make_batches(exprs, cfg.data.batch_pixels, cfg.data.max_batch_size, shuffle=True, seed=0)
    _print_batching(b, batches, ladder, None)
    if ladder.enabled:
        shapes = training_shapes(cfg, exprs)
        line = f"ladder_shapes={len(shapes)}"
        if b.gpu:  # before the first convolution of the process: torch reads it once
            limit, how = size_cudnn_plan_cache(cache_plans(b.model, len(shapes)))
            line += f" cudnn_plan_cache={limit} ({how})"
        print(line, file=out)
        if cfg.train.plan_shapes:
            n, seconds = plan(b.model, shapes, dev, b.amp, cfg.train.channels_last)
            print(f"planned_shapes={n} plan_seconds={seconds:.2f}", file=out)
    opt = build_optimizer(b.model.parameters(), cfg.train)
    b.model.train()
    loss_module: torch.nn.Module = LossModule(b.model, cfg.train.label_smoothing)
    compiled = bool(cfg.train.compile)
    if compiled:
        # a compiled Module is a Module (OptimizedModule); torch.compile's stubs say only Callable
        loss_module = torch.compile(loss_module, dynamic=True)  # type: ignore[assignment]
    aug_rng = np.random.default_rng(0)
    vocab = Vocab()

    def make(idx):
        scale = None
        if cfg.data.scale_aug_max > 0:  # the trainer's per-batch scale augmentation (CoMER)
            scale = float(aug_rng.uniform(cfg.data.scale_aug_min, cfg.data.scale_aug_max))
        return make_train_batch([exprs[i] for i in idx], vocab, cfg.model.direction, dev, scale,
                                cfg.train.channels_last, ladder)

    def ordinary(tb):
        optimizer_step(loss_module, opt, b.model, tb, cfg.train.grad_clip, b.amp)
        return len(tb)

    graphed = GraphedStep(loss_module, opt, b.model, cfg.train.grad_clip, b.amp) if cfg.train.cuda_graphs else None

    def step(tb):
        if graphed is None:
            return ordinary(tb)
        graphed(tb)
        return len(tb)

    warmup = b.knobs["warmup"] if b.knobs["warmup"] >= 0 else (6 if compiled else 2)
    timing = _timed(b, batches, make, step, warmup)
    if graphed is not None:
        print(f"graphs={graphed.graphs} graph_failures={len(graphed.failures)}"
              + (f" first_failure={next(iter(graphed.failures.values()))[:200]!r}" if graphed.failures else ""),
              file=out)
    # FLOPs through the ordinary step: a graph's replay runs no operator the counter could see
    flops = _flop_line(b, timing, lambda items: [ordinary(tb) for tb in items], make, default_batches=8)
    _print_timing(b, timing, flops)
    print(f"epoch_seconds_8835={8835 / timing.images_per_second:.1f}", file=out)
    _print_rate(b, timing)
    return 0


def bench_decode(b: Bench) -> int:
    """`hmer bench decode`: beam search on the evaluation bucketing (module docstring)."""
    from .data import Vocab, collate, make_batches
    from .data.ladder import PadLadder
    from .decoding import decode_batch

    cfg, exprs, dev, out = b.cfg, b.exprs, b.device, b.out
    ladder = PadLadder.from_data_config(cfg.data)
    max_px = cfg.data.max_image_pixels
    # Shuffled batch order: a subset of a year is then a fair sample of its sizes.
    batches = make_batches(exprs, cfg.data.eval_batch_pixels, cfg.data.eval_max_batch_size,
                           shuffle=True, seed=0, max_image_pixels=max_px)
    _print_batching(b, batches, ladder, max_px)
    b.model.eval()
    vocab = Vocab()
    hyp_tokens = [0, 0]  # tokens, hypotheses (timed region only)

    def decode(batch):
        with torch.autocast(dev.type, dtype=b.amp, enabled=b.amp is not None):
            return decode_batch(b.model, batch.images, batch.image_mask, cfg.model.direction,
                                beam_size=cfg.train.beam_size, max_len=cfg.train.max_decode_len,
                                length_penalty=cfg.train.length_penalty, search_rule=cfg.train.search_rule,
                                sos_id=vocab.sos_id, eos_id=vocab.eos_id, pad_id=vocab.pad_id)

    def make(idx):
        batch = collate([exprs[i] for i in idx], vocab, max_pixels=max_px, ladder=ladder)
        if b.gpu:  # as the training loader does it
            batch = batch.pin_memory()
        batch = batch.to(dev, non_blocking=True)
        if cfg.train.channels_last:
            batch.images = batch.images.contiguous(memory_format=torch.channels_last)
        return len(idx), batch

    @torch.inference_mode()
    def step(item):
        n, batch = item
        hyps = decode(batch)
        hyp_tokens[0] += sum(len(h) for h in hyps)
        hyp_tokens[1] += len(hyps)
        return n

    warmup = b.knobs["warmup"] if b.knobs["warmup"] >= 0 else 1
    timing = _timed(b, batches, make, step, warmup, before_timing=lambda: hyp_tokens.__setitem__(slice(None), [0, 0]))
    timed_hyp_tokens = list(hyp_tokens)  # the FLOP count below decodes again
    flops = _flop_line(b, timing, lambda items: [step(item) for item in items], make, default_batches=2)
    _print_timing(b, timing, flops)
    print(f"mean_hyp_tokens={timed_hyp_tokens[0] / max(timed_hyp_tokens[1], 1):.1f} "
          f"max_decode_len={cfg.train.max_decode_len} beam_size={cfg.train.beam_size} "
          f"direction={cfg.model.direction}", file=out)
    if b.from_data:
        print(f"year_seconds_{b.split}={len(exprs) / timing.images_per_second:.1f} "
              f"(all {len(exprs)} images of {b.split})", file=out)
    if b.knobs["check_unbatched"] > 0:
        print(f"unbatched_match={_check_unbatched(b.knobs['check_unbatched'], timing.batches, exprs, make, decode)}",
              file=out)
    _print_rate(b, timing)
    return 0


BENCHMARKS = {"train": bench_train, "decode": bench_decode}


@dataclass
class Timing:
    """The timed region: images, wall and CPU seconds, the wall time spent waiting for data, and
    the batches it drew from (cut to `bench.batches` when set)."""

    images: int
    seconds: float
    cpu_seconds: float
    waited: float
    batches: list

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds


def _print_batching(b: Bench, batches, ladder, max_px) -> None:
    from .data.batching import padded_shapes, padding_share

    print(f"padding_share={padding_share(b.exprs, batches, max_px, ladder):.3f} batches={len(batches)} "
          f"shapes={len(set(padded_shapes(b.exprs, batches, max_px, ladder)))} "
          f"mean_batch_size={len(b.exprs) / len(batches):.2f}", file=b.out)


def _timed(b: Bench, batches, make, step, warmup: int, before_timing=None) -> Timing:
    """Warm-up, then `step(make(idx))` over the batches in order, cycled, until `b.images` images or
    `b.seconds` have passed; `data.prefetch` batches made ahead in a thread, as in training."""
    from .training.loader import auto_prefetch, prefetched

    dev, out = b.device, b.out
    if b.knobs["batches"] > 0:
        batches = batches[:b.knobs["batches"]]
        print(f"timed_batches={len(batches)} (cycled, after one untimed pass)", file=out)
        warmup_batches = batches
    else:
        # Warm-up on the smallest batches (allocator, kernels, optimiser state; compile traces
        # with dynamic shapes): a random batch can cost minutes on a CPU and teaches nothing more.
        area = {id(idx): len(idx) * max(b.exprs[i].image.shape[0] for i in idx)
                * max(b.exprs[i].image.shape[1] for i in idx) for idx in batches}
        smallest = sorted(batches, key=lambda idx: area[id(idx)])
        warmup_batches = [smallest[k % len(smallest)] for k in range(warmup)]

    def order() -> Iterator[Sequence[int]]:
        while True:
            yield from batches

    for idx in warmup_batches:
        step(make(idx))
    _sync(dev)
    stream = prefetched(make, order(), auto_prefetch(b.cfg.data.prefetch, dev))
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
    _sync(dev)
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    stream.close()
    return Timing(done, elapsed, cpu, waited, batches)


def _flop_line(b: Bench, timing: Timing, run_steps, make, default_batches: int) -> str:
    """FLOPs an image over the first batches, against the peak of the step's precision ('' with
    bench.flop_batches=0)."""
    flop_batches = b.knobs["flop_batches"] if b.knobs["flop_batches"] >= 0 else default_batches
    if flop_batches <= 0:
        return ""
    counted_idx = timing.batches[:flop_batches]
    counted = [make(idx) for idx in counted_idx]
    flops = count_flops(lambda: run_steps(counted))
    gflop_per_image = flops / sum(len(idx) for idx in counted_idx) / 1e9
    achieved = gflop_per_image * timing.images_per_second
    peak, source, measured = peak_gflops_for(b.device, b.amp or torch.float32)
    return (f"gflop_per_image={gflop_per_image:.4f} achieved_gflops={achieved:.1f} peak_gflops={peak:.1f} "
            f"share_of_peak={achieved / peak:.4f} matmul_gflops={measured:.1f}\npeak_source={source!r}")


def _print_timing(b: Bench, timing: Timing, flop_line: str) -> None:
    print(f"images={timing.images} seconds={timing.seconds:.2f} cpu_seconds={timing.cpu_seconds:.2f} "
          f"images_per_cpu_second={timing.images / timing.cpu_seconds:.3f} "
          f"data_wait_share={timing.waited / timing.seconds:.3f}", file=b.out)
    print(f"peak_memory_mb={_peak_memory_mb(b.device):.0f}", file=b.out)
    if flop_line:
        print(flop_line, file=b.out)


def _print_rate(b: Bench, timing: Timing) -> None:
    ips = timing.images_per_second
    print(f"images_per_second={ips:.2f}" if ips >= 1 else f"images_per_second={ips:.3g}", file=b.out)


@torch.inference_mode()
def _check_unbatched(n: int, batches, exprs, make, decode) -> str:
    """Decode the images of the first batches (n in all) in their batches and one at a time."""
    same = total = 0
    for idx in batches:
        if total >= n:
            break
        idx = list(idx)[: n - total]
        _, batch = make(idx)
        batched = decode(batch)
        for i, hyp in zip(idx, batched):
            _, alone = make([i])
            same += int(decode(alone)[0] == hyp)
            total += 1
    return f"{same}/{total}"
