"""Large-batch training that still learns: the same model and data trained with the small-batch
reference schedule and with a k-times larger batch (learning rate scaled, linear warm-up), each
through the real `hmer.training.train` into an MLflow store; the per-epoch validation ExpRate
(and loss) of both is read back from the store, printed as a table and plotted.

    python benchmarks/large_batch.py                                   # CPU: tiny preset, ~10 min on 2 shared cores
    python benchmarks/large_batch.py --device cuda --preset bttr --train 0 --val 0 --max-tokens 0 \\
        --epochs 60 --batch-pixels 320000 --max-batch 16 --k 8          # GPU: the real question

The reference is `data.batch_pixels` = --batch-pixels with at most --max-batch images per batch;
the large-batch run multiplies both by --k and trains with the large-batch recipe, the config's own
named option: `train.lr_scaling` scales `train.lr` by sqrt(k) for adaptive optimisers (Adadelta,
AdamW) or by k for SGD (`--rule auto`; the CoMER recipe, `--recipe comer`, is SGD), k measured as
the ratio of the two batches' optimiser steps an epoch (`train.lr_reference_batch_pixels` and
`train.lr_reference_max_batch_size` name the reference), and `train.warmup_epochs` warms the rate up
linearly over --warmup-epochs epochs of its own steps. Everything else (seed, epochs, data, model,
plateau schedule) is the same. `--naive` adds a third run: the large batch with the reference
learning rate and no warm-up.

Figures: docs/large_batch_curves.png (--out) and the table printed at the end, both read back from
the MLflow runs (experiment `large-batch` of the default store; --tracking-uri to change).
`--runs reference=RUN_ID large=RUN_ID` re-plots finished runs without training again.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "crohme" / "crohme-inkml.zip"


def scaling_rule(optimizer: str, rule: str) -> str:
    """`train.lr_scaling` for `--rule`: auto is linear for SGD (Goyal et al. 2017) and sqrt for the
    adaptive optimisers (Malladi et al. 2022); see hmer.config.TrainConfig."""
    if rule == "auto":
        return "linear" if optimizer == "sgd" else "sqrt"
    return rule


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.environ.get("HMER_DATA") or (str(SHARED) if SHARED.is_file() else None))
    p.add_argument("--preset", default="tiny-transformer")
    p.add_argument("--recipe", default=None, choices=("bttr", "comer"), help="default: the preset's paper's")
    p.add_argument("--device", default="cpu")
    p.add_argument("--train", type=int, default=200, help="training expressions (0 = all)")
    p.add_argument("--val", type=int, default=80, help="validation expressions (0 = all)")
    p.add_argument("--max-tokens", type=int, default=5,
                   help="keep expressions of at most this many tokens (0 = all): short ones let a tiny "
                        "model reach a non-zero ExpRate within a few CPU epochs")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-pixels", type=int, default=80_000, help="reference pixel budget per batch")
    p.add_argument("--max-batch", type=int, default=4, help="reference maximum images per batch")
    p.add_argument("--k", type=float, default=4.0, help="batch multiplier of the large-batch run")
    p.add_argument("--rule", action="append", default=None, choices=("auto", "sqrt", "linear"),
                   help="train.lr_scaling of the large run: auto (sqrt for adaptive, linear for SGD; the default), "
                        "sqrt, linear; repeated: one large run per rule")
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--naive", action="store_true", help="also the large batch without lr scaling or warm-up")
    p.add_argument("--set", dest="overrides", nargs="*", default=[], metavar="KEY=VALUE")
    p.add_argument("--tracking-uri", default=None)
    p.add_argument("--experiment", default="large-batch")
    p.add_argument("--out", default=str(ROOT / "docs" / "large_batch_curves.png"))
    p.add_argument("--runs", nargs="*", default=[], metavar="NAME=RUN_ID",
                   help="plot these runs of the store instead of training (e.g. reference=ID large=ID)")
    args = p.parse_args()

    import numpy as np

    from hmer.config import parse_overrides
    from hmer.data import load_dataset, make_batches
    from hmer.data.splits import subset
    from hmer.model_presets import preset_with_recipe
    from hmer.recipes import apply_recipe
    from hmer.tracking.store import default_tracking_uri, mlflow_client
    from hmer.training import train
    from hmer.training.optim import batch_scaled_lr

    started = time.perf_counter()
    from hmer.tracking.store import git_commit

    commit = git_commit(short=True, root=ROOT)  # "-dirty" when tracked files have uncommitted changes
    command = shlex.join(["python", "benchmarks/large_batch.py", *sys.argv[1:]])
    print(f"# {datetime.datetime.now():%Y-%m-%d %H:%M} device={args.device} commit={commit} "
          f"python={platform.python_version()} load_average={os.getloadavg()[0]:.2f}")
    print(f"# {command}")

    base = preset_with_recipe(args.preset)
    if args.recipe:
        base = apply_recipe(base, args.recipe)
    base = base.override({
        "train.device": args.device, "train.epochs": args.epochs, "train.val_every": 1,
        "train.attention_maps": 0, "train.plateau_patience": 10 * args.epochs + 10, "data.test_years": "",
        "data.batch_pixels": args.batch_pixels, "data.max_batch_size": args.max_batch,
        **parse_overrides(args.overrides),
    })
    data = load_dataset(args.data, base.data, splits=("train", "val"))
    if args.max_tokens > 0:
        data = {s: [e for e in v if len(e.tokens) <= args.max_tokens] for s, v in data.items()}
    data = {"train": subset(data["train"], args.train, base.data.val_seed, "train"),
            "val": subset(data["val"], args.val, base.data.val_seed, "val")}
    n_train = len(data["train"])
    print(f"data={args.data} train={n_train} val={len(data['val'])} max_tokens={args.max_tokens or 'all'}")

    k = args.k
    big_pixels, big_batch = int(args.batch_pixels * k), int(round(args.max_batch * k))
    rules = list(dict.fromkeys(scaling_rule(base.train.optimizer, r) for r in args.rule or ["auto"]))
    steps_per_epoch = {
        "small": len(make_batches(data["train"], args.batch_pixels, args.max_batch, seed=0)),
        "large": len(make_batches(data["train"], big_pixels, big_batch, seed=0)),
    }
    warmup = int(math.ceil(args.warmup_epochs * steps_per_epoch["large"]))
    large_settings = {"data.batch_pixels": big_pixels, "data.max_batch_size": big_batch}
    runs = [("reference", base, f"batch {args.max_batch} img / {args.batch_pixels:,} px, lr {base.train.lr:g}, "
                                f"no warm-up, {steps_per_epoch['small']} steps/epoch")]
    for rule in rules:
        recipe = {"train.lr_scaling": rule, "train.lr_reference_batch_pixels": args.batch_pixels,
                  "train.lr_reference_max_batch_size": args.max_batch, "train.warmup_epochs": args.warmup_epochs}
        big_lr, measured_k = batch_scaled_lr(base.override(recipe).train, steps_per_epoch["large"],
                                             steps_per_epoch["small"])
        runs.append((f"large-{rule}" if len(rules) > 1 else "large", base.override({**large_settings, **recipe}),
                     f"batch {big_batch} img / {big_pixels:,} px, train.lr_scaling={rule}: lr {big_lr:g} "
                     f"(k = {measured_k:.2f} measured in steps an epoch), warm-up {args.warmup_epochs:g} epoch = "
                     f"{warmup} steps, {steps_per_epoch['large']} steps/epoch"))
    if args.naive:
        runs.append(("large-naive", base.override(large_settings),
                     f"batch {big_batch} img / {big_pixels:,} px, lr {base.train.lr:g}, no warm-up"))

    uri = args.tracking_uri or default_tracking_uri()
    run_ids: dict[str, str] = {}
    seconds: dict[str, float] = {}
    if args.runs:  # plot runs already in the store, train nothing
        run_ids = dict(item.split("=", 1) for item in args.runs)
    for name, cfg, text in ([] if args.runs else runs):
        print(f"run {name}: {text}", flush=True)
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="large-batch-") as checkpoints:  # the curves are in the store
            result = train(cfg.override({"name": f"{args.preset}-{name}"}), data=data, tracking_uri=uri,
                           experiment=args.experiment, run_name=f"{args.preset}-{name}", run_dir=checkpoints,
                           tags={"hmer.variant": f"{args.preset}-{name}", "hmer.large_batch": name})
        seconds[name] = time.perf_counter() - t0
        run_ids[name] = result.run_id
        print(f"  run_id={result.run_id} best_val_exprate={result.best_val_exprate:.1f} "
              f"seconds={seconds[name]:.0f}", flush=True)

    client = mlflow_client(uri)
    curves: dict[str, dict[str, list[tuple[int, float]]]] = {}
    labels: dict[str, str] = {}
    for name, run_id in run_ids.items():
        run = client.get_run(run_id)
        prm = run.data.params
        curves[name] = {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
                        for key in ("val_exprate", "val_le1", "val_loss", "train_loss", "images_per_second")}
        lr = float(prm.get("lr_scaled", prm["train.lr"]))
        warm = (f"{prm['train.warmup_epochs']} epoch" if float(prm.get("train.warmup_epochs", 0)) > 0
                else f"{prm['train.warmup_steps']} steps")
        labels[name] = (f"{name}: batch <= {prm['data.max_batch_size']} img / {int(prm['data.batch_pixels']):,} px, "
                        f"lr {lr:g} ({prm.get('train.lr_scaling', 'none')}), warm-up {warm}")
        print(f"{labels[name]} (run {run_id})")

    names = list(run_ids)
    epochs = sorted({step for n in names for step, _ in curves[n]["val_exprate"]})
    print("\n| epoch | " + " | ".join(f"{n} val ExpRate %" for n in names) + " | "
          + " | ".join(f"{n} val <=1 %" for n in names) + " | "
          + " | ".join(f"{n} val loss" for n in names) + " |")
    print("|---" * (1 + 3 * len(names)) + "|")
    for epoch in epochs:
        cells = []
        for key, fmt in (("val_exprate", "{:.1f}"), ("val_le1", "{:.1f}"), ("val_loss", "{:.3f}")):
            for n in names:
                value = dict(curves[n][key]).get(epoch)
                cells.append(fmt.format(value) if value is not None else "–")
        print(f"| {epoch} | " + " | ".join(cells) + " |")
    for n in names:
        ips = [v for _, v in curves[n]["images_per_second"]]
        took = f", run {seconds[n]:.0f} s (validation included)" if n in seconds else ""
        print(f"{n}: mean training images/s {np.mean(ips):.2f}{took}")
    # How far each curve lies from the reference's, epoch by epoch: the mean absolute difference
    # of the losses over every epoch and over the second half (once the warm-up's start is behind).
    for n in names[1:]:
        for key in ("train_loss", "val_loss", "val_exprate"):
            ref, other = dict(curves[names[0]][key]), dict(curves[n][key])
            common = sorted(set(ref) & set(other))
            if not common:
                continue
            gaps = [other[e] - ref[e] for e in common]
            late = gaps[len(gaps) // 2:]
            print(f"{n} - {names[0]} {key}: mean |gap| {np.mean(np.abs(gaps)):.3f} "
                  f"over epochs {common[0]}-{common[-1]}, "
                  f"{np.mean(np.abs(late)):.3f} over the second half (mean gap {np.mean(late):+.3f}); "
                  f"last epoch {other[common[-1]]:.3f} against {ref[common[-1]]:.3f}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(17, 4), constrained_layout=True)
    panels = (("val_exprate", "validation ExpRate (%)"), ("val_le1", "validation <= 1 error (%)"),
              ("val_loss", "validation loss"), ("train_loss", "training loss"))
    for name, style in zip(names, ("o-", "s--", "^:", "d-.", "v--")):
        for ax, (key, _) in zip(axes, panels):
            steps, values = zip(*curves[name][key]) if curves[name][key] else ((), ())
            ax.plot(steps, values, style, label=labels[name])
    for ax, (_, title) in zip(axes, panels):
        ax.set_xlabel("epoch")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"{args.preset}, {n_train} training / {len(data['val'])} validation expressions"
                 f"{f' (<= {args.max_tokens} tokens)' if args.max_tokens else ''}, {args.device}, "
                 f"commit {commit}", fontsize=9)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"plot={args.out} total_seconds={time.perf_counter() - started:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
