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
decoding) and times a float32 matmul on the same threads (`hmer bench peak`), and prints
`gflop_per_image`, `achieved_gflops` (FLOPs per image times images per second),
`peak_gflops` and `share_of_peak`: how close the step comes to what the core can do.

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
from typing import Any, Iterator, Sequence

import numpy as np
import torch

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


def matmul_peak_gflops(size: int = PEAK_MATMUL_SIZE, seconds: float = 1.0, device: torch.device | None = None,
                       ) -> float:
    """The float32 GFLOP/s of a `size` x `size` matmul on this process's threads: the ceiling a
    model's dense arithmetic can reach here, measured rather than read off a data sheet (the
    cores that CI and developers get differ, and so does what else runs on them)."""
    device = device or torch.device("cpu")
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
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


def run_benchmark(what: str, preset: str = "bttr", device: str = "auto", data: str | None = None,
                  images: int = 0, seconds: float = 0.0, overrides: list[str] | None = None,
                  out=None) -> int:
    """Run one benchmark and print its figures to `out` (default: the current sys.stdout); the last
    line is `images_per_second=<number>`. Returns the exit status (0)."""
    out = out if out is not None else sys.stdout
    from .config import parse_overrides
    from .data import Vocab, collate, load_dataset, make_batches
    from .data.batching import padded_shapes, padding_share
    from .device import autocast_dtype, cpu_description, resolve_device, share_device
    from .model import build_model
    from .presets import preset_with_recipe
    from .training.optim import build_optimizer
    from .training.loader import auto_prefetch, make_train_batch, prefetched
    from .training.setup import LossModule, optimizer_step

    if what not in ("train", "decode"):
        raise ValueError(f"unknown benchmark {what!r}: train or decode")
    config_items, knobs = split_overrides(overrides)
    cfg = preset_with_recipe(preset).override(parse_overrides(config_items))
    dev = resolve_device(device)
    share_device(dev, int(knobs["share"]))
    gpu = dev.type == "cuda"
    prefetch = auto_prefetch(cfg.data.prefetch, dev)
    channels_last = bool(cfg.train.channels_last)
    compiled = bool(cfg.train.compile) and what == "train"
    warmup = knobs["warmup"] if knobs["warmup"] >= 0 else ((6 if compiled else 2) if what == "train" else 1)

    torch.manual_seed(0)
    weights = knobs["weights"]
    if weights:
        from .tracking.models import load_model

        model, wcfg, _ = load_model(weights, device="cpu")
        cfg.model = wcfg.model
        model = model.to(dev)
    else:
        model = build_model(cfg.model).to(dev)
    amp = autocast_dtype(cfg.train.precision, dev)
    if not images:
        images = (4096 if what == "train" else 1000) if gpu else (48 if what == "train" else 8)
    data_path = data or os.environ.get("HMER_DATA")
    if data_path:
        split = "train" if what == "train" else "2014"
        exprs = load_dataset(data_path, cfg.data, splits=(split,))[split]
        source = f"CROHME {split} ({data_path})"
    else:
        exprs = synthetic_expressions(knobs["pool"] or (8393 if what == "train" else 1000))
        source = f"synthetic ({len(exprs)} expressions)"
    vocab = Vocab()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    params = sum(p.numel() for p in model.parameters())
    print(f"benchmark={what} preset={preset} device={dev} precision={amp or torch.float32} "
          f"params={params} source={source}", file=out)
    print(f"processor={cpu_description()!r}", file=out)  # CPU figures differ by core kind
    print(f"weights={weights or 'random'} threads={torch.get_num_threads()} share={knobs['share']} compile={compiled} "
          f"prefetch={prefetch} pin_memory={gpu} channels_last={channels_last}", file=out)

    def to_device(b):  # decoding's batches: as the training loader does it
        if gpu:
            b = b.pin_memory()
        b = b.to(dev, non_blocking=True)
        if channels_last:
            b.images = b.images.contiguous(memory_format=torch.channels_last)
        return b

    pad = cfg.data.pad_multiple
    if what == "train":
        batches = make_batches(exprs, cfg.data.batch_pixels, cfg.data.max_batch_size, shuffle=True, seed=0)
        print(f"padding_share={padding_share(exprs, batches, pad_multiple=pad):.3f} batches={len(batches)} "
              f"shapes={len(set(padded_shapes(exprs, batches, pad_multiple=pad)))} "
              f"mean_batch_size={len(exprs) / len(batches):.2f}", file=out)
        opt = build_optimizer(model.parameters(), cfg.train)
        model.train()
        loss_module: torch.nn.Module = LossModule(model, cfg.train.label_smoothing)
        if compiled:
            loss_module = torch.compile(loss_module, dynamic=True)
        aug_rng = np.random.default_rng(0)

        def make(idx):
            scale = None
            if cfg.data.scale_aug_max > 0:  # the trainer's per-batch scale augmentation (CoMER)
                scale = float(aug_rng.uniform(cfg.data.scale_aug_min, cfg.data.scale_aug_max))
            return make_train_batch([exprs[i] for i in idx], vocab, cfg.model.direction, dev, scale, channels_last, pad)

        def step(tb):
            optimizer_step(loss_module, opt, model, tb, cfg.train.grad_clip, amp)
            return len(tb)
    else:
        from .decoding import decode_batch

        max_px = cfg.data.max_image_pixels
        # Shuffled batch order: a subset of a year is then a fair sample of its sizes.
        batches = make_batches(exprs, cfg.data.eval_batch_pixels, cfg.data.eval_max_batch_size,
                               shuffle=True, seed=0, max_image_pixels=max_px)
        print(f"padding_share={padding_share(exprs, batches, max_px, pad):.3f} batches={len(batches)} "
              f"shapes={len(set(padded_shapes(exprs, batches, max_px, pad)))} "
              f"mean_batch_size={len(exprs) / len(batches):.2f}", file=out)
        model.eval()
        hyp_tokens = [0, 0]  # tokens, hypotheses (timed region only)

        def decode(b):
            with torch.autocast(dev.type, dtype=amp, enabled=amp is not None):
                return decode_batch(model, b.images, b.image_mask, cfg.model.direction,
                                    beam_size=cfg.train.beam_size, max_len=cfg.train.max_decode_len,
                                    length_penalty=cfg.train.length_penalty, search_rule=cfg.train.search_rule,
                                    sos_id=vocab.sos_id, eos_id=vocab.eos_id, pad_id=vocab.pad_id)

        def make(idx):
            return len(idx), to_device(collate([exprs[i] for i in idx], vocab, max_pixels=max_px, pad_multiple=pad))

        @torch.inference_mode()
        def step(item):
            n, b = item
            hyps = decode(b)
            hyp_tokens[0] += sum(len(h) for h in hyps)
            hyp_tokens[1] += len(hyps)
            return n

    if knobs["batches"] > 0:
        batches = batches[:knobs["batches"]]
        print(f"timed_batches={len(batches)} (cycled, after one untimed pass)", file=out)
        warmup_batches = batches
    else:
        # Warm-up on the smallest batches (allocator, kernels, optimiser state; compile traces
        # with dynamic shapes): a random batch can cost minutes on a CPU and teaches nothing more.
        area = {id(idx): len(idx) * max(exprs[i].image.shape[0] for i in idx)
                * max(exprs[i].image.shape[1] for i in idx) for idx in batches}
        smallest = sorted(batches, key=lambda idx: area[id(idx)])
        warmup_batches = [smallest[k % len(smallest)] for k in range(warmup)]

    def order() -> Iterator[Sequence[int]]:
        while True:
            yield from batches

    for idx in warmup_batches:
        step(make(idx))
    _sync(dev)
    stream = prefetched(make, order(), prefetch)
    if what == "decode":
        hyp_tokens[:] = [0, 0]
    if gpu:
        torch.cuda.reset_peak_memory_stats(dev)
    if knobs["start_at"]:
        late = time.time() - knobs["start_at"]
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
        if done >= images or (seconds and time.perf_counter() - start >= seconds):
            break
    _sync(dev)
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    stream.close()
    ips = done / elapsed
    timed_hyp_tokens = list(hyp_tokens) if what == "decode" else []  # the FLOP count below decodes again
    flop_batches = knobs["flop_batches"] if knobs["flop_batches"] >= 0 else (8 if what == "train" else 2)
    flop_line = ""
    if flop_batches > 0:
        counted = [make(idx) for idx in batches[:flop_batches]]
        n_counted = sum(len(idx) for idx in batches[:flop_batches])
        flops = count_flops(lambda: [step(item) for item in counted])
        gflop_per_image = flops / n_counted / 1e9
        peak = matmul_peak_gflops(device=dev)
        flop_line = (f"gflop_per_image={gflop_per_image:.4f} achieved_gflops={gflop_per_image * ips:.1f} "
                     f"peak_gflops={peak:.1f} share_of_peak={gflop_per_image * ips / peak:.3f}")
    print(f"images={done} seconds={elapsed:.2f} cpu_seconds={cpu:.2f} images_per_cpu_second={done / cpu:.3f} "
          f"data_wait_share={waited / elapsed:.3f}", file=out)
    print(f"peak_memory_mb={_peak_memory_mb(dev):.0f}", file=out)
    if flop_line:
        print(flop_line, file=out)
    if what == "train":
        print(f"epoch_seconds_8835={8835 / ips:.1f}", file=out)
    else:
        print(f"mean_hyp_tokens={timed_hyp_tokens[0] / max(timed_hyp_tokens[1], 1):.1f} "
              f"max_decode_len={cfg.train.max_decode_len} beam_size={cfg.train.beam_size} "
              f"direction={cfg.model.direction}", file=out)
        if data_path:
            print(f"year_seconds_{split}={len(exprs) / ips:.1f} (all {len(exprs)} images of {split})", file=out)
        if knobs["check_unbatched"] > 0:
            print(f"unbatched_match={_check_unbatched(knobs['check_unbatched'], batches, exprs, make, decode)}",
                  file=out)
    print(f"images_per_second={ips:.2f}" if ips >= 1 else f"images_per_second={ips:.3g}", file=out)
    return 0


@torch.inference_mode()
def _check_unbatched(n: int, batches, exprs, make, decode) -> str:
    """Decode the images of the first batches (n in all) in their batches and one at a time."""
    same = total = 0
    for idx in batches:
        if total >= n:
            break
        idx = list(idx)[: n - total]
        _, b = make(idx)
        batched = decode(b)
        for i, hyp in zip(idx, batched):
            _, alone = make([i])
            same += int(decode(alone)[0] == hyp)
            total += 1
    return f"{same}/{total}"
