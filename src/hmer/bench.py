"""Throughput benchmarks behind `hmer bench train` and `hmer bench decode`.

Both print what they measured, one `key=value` per line, and end with
`images_per_second=<number>` so scripts can read the last line. Batches are real
CROHME renderings when `--data` (or $HMER_DATA) is given, otherwise synthetic
stroke images with the standard images' size distribution, bucketed exactly as in
training. Timing starts after warm-up steps, and on a GPU it synchronises only at the
ends of the timed region, never inside the step.
"""

from __future__ import annotations

import os
import resource
import sys
import time

import numpy as np
import torch


def synthetic_expressions(n: int, seed: int = 0):
    """Stroke-like images with CROHME's size spread (median about 94 x 256) and captions."""
    from PIL import Image, ImageDraw

    from .data import Expression
    from .data.vocab import CROHME_SYMBOLS

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        h = int(np.clip(rng.lognormal(np.log(94), 0.35), 32, 380))
        w = int(np.clip(rng.lognormal(np.log(256), 0.5), 48, 1400))
        img = Image.new("L", (w, h), 0)
        draw = ImageDraw.Draw(img)
        for _ in range(max(2, w // 25)):
            pts = [(float(rng.uniform(0, w)), float(rng.uniform(0, h))) for _ in range(4)]
            draw.line(pts, fill=255, width=3)
        length = int(np.clip(rng.lognormal(np.log(14), 0.6), 1, 150))
        tokens = [CROHME_SYMBOLS[j] for j in rng.integers(0, len(CROHME_SYMBOLS), length)]
        out.append(Expression(name=f"synthetic_{i}", tokens=tokens, image=np.asarray(img, dtype=np.uint8)))
    return out


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_benchmark(what: str, preset: str = "bttr", device: str = "auto", data: str | None = None,
                  images: int = 0, seconds: float = 0.0, overrides: list[str] | None = None,
                  out=sys.stdout) -> int:
    from .config import parse_overrides
    from .data import Vocab, collate, load_dataset, make_batches
    from .data.batching import padding_share
    from .model import build_model
    from .presets import experiment_config
    from .training.recipes import build_optimizer
    from .training.trainer import autocast_dtype, resolve_device

    cfg = experiment_config(preset).override(parse_overrides(overrides))
    dev = resolve_device(device)
    amp = autocast_dtype(cfg.train.precision, dev)
    if not images:
        images = (4096 if what == "train" else 1000) if dev.type == "cuda" else (48 if what == "train" else 8)
    data_path = data or os.environ.get("HMER_DATA")
    if data_path:
        split = "train" if what == "train" else "2014"
        exprs = load_dataset(data_path, cfg.data, splits=(split,))[split]
        source = f"CROHME {split} ({data_path})"
    else:
        exprs = synthetic_expressions(min(images, 2000))
        source = "synthetic"
    vocab = Vocab()
    torch.manual_seed(0)
    model = build_model(cfg.model).to(dev)
    if dev.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    params = sum(p.numel() for p in model.parameters())
    print(f"benchmark={what} preset={preset} device={dev} precision={amp or torch.float32} "
          f"params={params} source={source}", file=out)

    if what == "train":
        batches = make_batches(exprs, cfg.data.batch_pixels, cfg.data.max_batch_size, shuffle=True, seed=0)
        print(f"padding_share={padding_share(exprs, batches):.3f}", file=out)
        opt = build_optimizer(model.parameters(), cfg.train)
        model.train()

        def step(idx):
            b = collate([exprs[i] for i in idx], vocab).to(dev)
            with torch.autocast(dev.type, dtype=amp, enabled=amp is not None):
                loss = model.loss(b.images, b.image_mask, b.token_ids)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
            opt.step()
            return len(idx)
    else:
        from .decoding import decode_batch

        batches = make_batches(exprs, cfg.data.eval_batch_pixels, cfg.data.eval_max_batch_size,
                               shuffle=False, seed=0, max_image_pixels=cfg.data.max_image_pixels)
        model.eval()

        @torch.inference_mode()
        def step(idx):
            b = collate([exprs[i] for i in idx], vocab, max_pixels=cfg.data.max_image_pixels).to(dev)
            with torch.autocast(dev.type, dtype=amp, enabled=amp is not None):
                decode_batch(model, b.images, b.image_mask, cfg.model.direction, beam_size=cfg.train.beam_size,
                             max_len=cfg.train.max_decode_len, length_penalty=cfg.train.length_penalty)
            return len(idx)

    warmup = 2 if what == "train" else 1
    order = [batches[i % len(batches)] for i in range(len(batches) * 1000)]
    for idx in order[:warmup]:
        step(idx)
    _sync(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    done, start = 0, time.perf_counter()
    for idx in order[warmup:]:
        done += step(idx)
        if done >= images or (seconds and time.perf_counter() - start >= seconds):
            break
    _sync(dev)
    elapsed = time.perf_counter() - start
    ips = done / elapsed
    print(f"images={done} seconds={elapsed:.2f}", file=out)
    print(f"peak_memory_mb={_peak_memory_mb(dev):.0f}", file=out)
    if what == "train":
        print(f"epoch_seconds_8835={8835 / ips:.1f}", file=out)
    print(f"images_per_second={ips:.2f}", file=out)
    return 0
