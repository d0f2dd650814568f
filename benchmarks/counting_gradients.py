"""Where a counting model's gradient goes: the decoder's cross-entropy and CAN's counting loss, each
with its gradient's norm, at initialisation and for a trained run, on the run's own training batches;
and the trained run's teacher-forced token accuracy on the hold-out beside a run without counting.

    OMP_NUM_THREADS=1 python benchmarks/counting_gradients.py --run COUNTING_RUN --baseline RUN \
        [--tracking-uri URI] [--batches 6]

Why it exists: at the `cpu` budget the counting cells of `ablate_counting` learn far less than the
cells without it (docs/studies.md). CAN's count of a class is a sum of sigmoids over the feature
map's positions, about half the positions at initialisation, and the counts' embedding joins the
logits (hmer.model.counting): the first batches' cross-entropy is then far above log(V), and the
clipped gradient of the first steps goes to undoing the count's term. This prints how far.
Both runs' batches are drawn in one fixed order, without augmentation.
"""

from __future__ import annotations

import argparse


def _batches(cfg, split: str, n: int):
    import numpy as np
    import torch

    from hmer.data import Vocab, make_batches
    from hmer.data.splits import load_dataset
    from hmer.training.loader import train_batches

    exprs = load_dataset(cfg.data.path or None, cfg.data, splits=[split])[split]
    chosen = make_batches(list(exprs), cfg.data.batch_pixels, cfg.data.max_batch_size, shuffle=True, seed=0)[:n]
    steps = train_batches(exprs, chosen, Vocab(), cfg.model.direction, torch.device("cpu"), scale_range=(1.0, 1.0),
                          rng=np.random.default_rng(0))
    return [next(steps) for _ in chosen]


def gradient_shares(model, batches) -> None:
    """Per batch: the cross-entropy, the counting loss, the norm of each one's gradient, and the
    count the model gives an image against the caption's (summed over the classes)."""
    import torch
    import torch.nn.functional as F

    from hmer.data import Vocab
    from hmer.model.counting import caption_counts, counting_loss
    from hmer.training.setup import counted_classes

    counted = counted_classes(Vocab())
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    for k, tb in enumerate(batches):
        feats, mask = model.encode(tb.batch.images, tb.batch.image_mask)
        logits = model.decode(feats, mask, tb.tgt_in)
        ce = F.cross_entropy(logits.flatten(0, 1).float(), tb.tgt_out.flatten(), ignore_index=0)
        mean, branches = model.decoder.counter(feats, mask)
        target = caption_counts(tb.tgt_out, tb.batch.images.shape[0], counted)
        count = counting_loss(branches, mean, target)
        norms = []
        for loss in (ce, count):
            grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
            norms.append(float(torch.sqrt(sum((g.float() ** 2).sum() for g in grads if g is not None))))
        print(f"  batch {k}: cross-entropy {float(ce.detach()):8.3f}  counting loss {float(count.detach()):8.3f}  "
              f"|grad| {norms[0]:9.3f} and {norms[1]:7.3f}  count an image {float(mean.detach().sum(1).mean()):8.1f} "
              f"(caption {float(target.sum(1).mean()):.1f})", flush=True)


def token_accuracy(model, batches) -> float:
    """Teacher-forced: the share of the target tokens that are the argmax, in eval mode."""
    import torch

    model.eval()
    right = total = 0
    with torch.no_grad():
        for tb in batches:
            feats, mask = model.encode(tb.batch.images, tb.batch.image_mask)
            guess = model.decode(feats, mask, tb.tgt_in).argmax(-1)
            live = tb.tgt_out != 0
            right += int((guess == tb.tgt_out)[live].sum())
            total += int(live.sum())
    return right / max(total, 1)


def main() -> None:
    import torch

    from hmer.model import build_model
    from hmer.tracking.models import load_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="a counting run (id or its first 8 characters), or its model file")
    p.add_argument("--baseline", default=None, help="a run without counting to compare the token accuracy with")
    p.add_argument("--tracking-uri", default=None, help="MLflow store (default: sqlite mlruns/mlflow.db)")
    p.add_argument("--batches", type=int, default=6, help="training and hold-out batches measured (default: 6)")
    args = p.parse_args()
    torch.set_num_threads(1)

    trained, cfg, _ = load_model(args.run, args.tracking_uri)
    train = _batches(cfg, "train", args.batches)
    torch.manual_seed(cfg.train.seed)
    print(f"{cfg.model.decoder} with counting, at initialisation (seed {cfg.train.seed}):")
    gradient_shares(build_model(cfg.model), train)
    print(f"{cfg.model.decoder} with counting, trained ({args.run}):")
    gradient_shares(trained, train)
    held_out = _batches(cfg, "val", args.batches)
    print(f"teacher-forced token accuracy on {args.batches} hold-out batches: {token_accuracy(trained, held_out):.3f} "
          f"with counting ({args.run})", end="")
    if args.baseline:
        baseline, _, _ = load_model(args.baseline, args.tracking_uri)
        print(f", {token_accuracy(baseline, held_out):.3f} without ({args.baseline})", end="")
    print()


if __name__ == "__main__":
    main()
