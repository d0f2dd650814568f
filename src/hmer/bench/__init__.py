"""Throughput benchmarks behind `hmer bench train` (the trainer's step over the trainer's input
pipeline) and `hmer bench decode` (beam search on the evaluation bucketing, and batched decoding checked
against decoding one image at a time); their knobs and lines: docs/benchmarks.md, "The tools". Both end
with `images_per_second=<number>` for scripts.
"""

from __future__ import annotations

import numpy as np
import torch

from .setup import Bench, prepare
from .timing import flop_line, print_batching, print_rate, print_timing, timed


def run_benchmark(what: str, preset: str = "bttr", device: str = "auto", data: str | None = None,
                  images: int = 0, seconds: float = 0.0, overrides: list[str] | None = None,
                  out=None, config: str | None = None) -> int:
    """Run one benchmark, printing to `out` (default sys.stdout); `config`, a JSON config file (a
    run's config.json), stands in for the preset. Returns the exit status (0)."""
    if what not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {what!r}: {' or '.join(BENCHMARKS)}")
    return BENCHMARKS[what](prepare(what, preset, device, data, images, seconds, overrides, out, config))


def bench_train(b: Bench) -> int:
    from ..data import Vocab, make_batches
    from ..data.batching import PadLadder
    from ..training.graphs import GraphedStep
    from ..training.loader import make_train_batch
    from ..training.optim import build_optimizer
    from ..training.planning import cache_plans, plan, training_shapes
    from ..training.step import LossModule, train_step
    from ..device import size_cudnn_plan_cache

    cfg, exprs, dev, out = b.cfg, b.exprs, b.device, b.out
    ladder = PadLadder.from_data_config(cfg.data)
    batches = make_batches(exprs, cfg.data.batch_pixels, cfg.data.max_batch_size, shuffle=True, seed=0)
    print_batching(b, batches, ladder, None)
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

    graphed = GraphedStep(loss_module, opt, b.model, cfg.train.grad_clip, b.amp) if cfg.train.cuda_graphs else None

    def step(tb, graph: bool = True):
        if graph and graphed is not None:
            graphed(tb)
        else:
            train_step(loss_module, opt, b.model, tb, cfg.train.grad_clip, b.amp)
        return len(tb)

    warmup = b.knobs["warmup"] if b.knobs["warmup"] >= 0 else (6 if compiled else 2)
    timing = timed(b, batches, make, step, warmup)
    if graphed is not None:
        print(f"graphs={graphed.graphs} graph_failures={len(graphed.failures)}"
              + (f" first_failure={next(iter(graphed.failures.values()))[:200]!r}" if graphed.failures else ""),
              file=out)
    # FLOPs through the ordinary step: a graph's replay runs no operator the counter could see
    flops = flop_line(b, timing, lambda items: [step(tb, graph=False) for tb in items], make, default_batches=8,
                      epoch=batches)
    print_timing(b, timing, flops)
    print(f"epoch_seconds_8835={8835 / timing.images_per_second:.1f}", file=out)
    print_rate(b, timing)
    return 0


def bench_decode(b: Bench) -> int:
    from ..data import Vocab, collate, make_batches
    from ..data.batching import PadLadder
    from ..decoding import decode_batch

    cfg, exprs, dev, out = b.cfg, b.exprs, b.device, b.out
    ladder = PadLadder.from_data_config(cfg.data)
    max_px = cfg.data.max_image_pixels
    # Shuffled batch order: a subset of a year is then a fair sample of its sizes.
    batches = make_batches(exprs, cfg.data.eval_batch_pixels, cfg.data.eval_max_batch_size,
                           shuffle=True, seed=0, max_image_pixels=max_px)
    print_batching(b, batches, ladder, max_px)
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
    timing = timed(b, batches, make, step, warmup, before_timing=lambda: hyp_tokens.__setitem__(slice(None), [0, 0]))
    timed_hyp_tokens = list(hyp_tokens)  # the FLOP count below decodes again
    flops = flop_line(b, timing, lambda items: [step(item) for item in items], make, default_batches=2)
    print_timing(b, timing, flops)
    print(f"mean_hyp_tokens={timed_hyp_tokens[0] / max(timed_hyp_tokens[1], 1):.1f} "
          f"max_decode_len={cfg.train.max_decode_len} beam_size={cfg.train.beam_size} "
          f"direction={cfg.model.direction}", file=out)
    if b.from_data:
        print(f"year_seconds_{b.split}={len(exprs) / timing.images_per_second:.1f} "
              f"(all {len(exprs)} images of {b.split})", file=out)
    if b.knobs["check_unbatched"] > 0:
        print(f"unbatched_match={_check_unbatched(b.knobs['check_unbatched'], timing.batches, exprs, make, decode)}",
              file=out)
    print_rate(b, timing)
    return 0


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


BENCHMARKS = {"train": bench_train, "decode": bench_decode}

__all__ = ["BENCHMARKS", "run_benchmark"]
