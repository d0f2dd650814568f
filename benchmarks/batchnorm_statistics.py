"""Does a trained model's BatchNorm gap between training and evaluation cost ExpRate?

    OMP_NUM_THREADS=1 python benchmarks/batchnorm_statistics.py RUN [--batches 300] [--beam 1]

Scores the run's validation split with its stored running statistics, then replaces every batch
norm's running mean and variance by their average over `--batches` un-augmented training batches
(the run's own batching, `momentum=None`: a cumulative average, not an exponential one) and scores
it again. Prints both ExpRates and the largest shift of a running mean, in standard deviations.
Small training batches make the statistics a batch is normalised with noisy; this says whether the
running averages evaluation uses are off because of it (docs/training.md).
"""

from __future__ import annotations

import argparse
import os

import torch

from hmer.allocator import tune_malloc
from hmer.data import collate, load_dataset, make_batches
from hmer.evaluation.evaluate import decode_options, evaluate_split
from hmer.tracking.models import load_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="run id or checkpoint")
    p.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI, then mlruns/")
    p.add_argument("--data", default=os.environ.get("HMER_DATA"), help="CROHME zip or folder (default: $HMER_DATA)")
    p.add_argument("--batches", type=int, default=300, help="training batches the statistics are averaged over")
    p.add_argument("--beam", type=int, default=1, help="validation beam (1: greedy)")
    args = p.parse_args()
    tune_malloc()
    model, cfg, vocab = load_model(args.run, args.tracking_uri)
    data = load_dataset(args.data, cfg.data, splits=("train", "val"))
    train, val = data["train"], data["val"]
    options = decode_options(cfg, torch.device("cpu"), None, beam=args.beam)

    before = evaluate_split(model, val, vocab, **options).scores
    norms = [m for m in model.modules() if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d))]
    stored = [(m.running_mean.clone(), m.running_var.clone()) for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    batches = make_batches(train, cfg.data.batch_pixels, cfg.data.max_batch_size, shuffle=True, seed=0)
    batches = batches[:args.batches]
    model.train()  # batch statistics, and the running averages updated; no gradients
    with torch.no_grad():
        for idx in batches:
            b = collate([train[i] for i in idx], vocab)
            model.encode(b.images, b.image_mask)
    model.eval()
    shift = max(float(((m.running_mean - mean).abs() / (var.sqrt() + 1e-5)).max())
                for m, (mean, var) in zip(norms, stored))
    after = evaluate_split(model, val, vocab, **options).scores
    images = sum(len(idx) for idx in batches)
    print(f"stored running statistics: val ExpRate {before.exprate:.2f} (<=1 edit {before.le1:.2f})")
    print(f"averaged over {len(batches)} training batches ({images} images): val ExpRate {after.exprate:.2f} "
          f"(<=1 edit {after.le1:.2f}); largest shift of a running mean {shift:.2f} sd")


if __name__ == "__main__":
    main()
