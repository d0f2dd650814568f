"""`hmer bench decode`: beam search on the evaluation bucketing, and batched decoding checked against
decoding one image at a time."""

from __future__ import annotations

import torch

from .setup import Bench
from .timing import flop_line, print_batching, print_rate, print_timing, timed


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
