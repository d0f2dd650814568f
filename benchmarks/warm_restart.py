"""What dropping the optimiser's state at every lease costs a run carried across machines.

    python benchmarks/warm_restart.py --recipe comer           # CPU: tiny model, short captions, ~30 min on one thread

Three runs of the same config, seed and data (`hmer.training.train`, each in its own MLflow stores):

- **continuous**: all --epochs in one process;
- **carried, optimiser kept**: --lease-epochs at a time, each "lease" in a fresh store and
  checkpoint folder (a new machine), the run moved between them with `hmer.training.carry`
  (`pack_run(optimizer_state=True)`, `unpack_run`), exactly as the GPU campaign carries it;
- **carried, optimiser dropped**: the same with the campaign's default, `optimizer_state=False`: the
  fp32 weights, schedule and random generators travel, the momentum (SGD) or running averages
  (Adadelta, AdamW) start afresh at every lease (tagged `hmer.warm_restart`).

Each carried run ends in the benchmark's home store, where its per-epoch training loss, validation
loss and validation ExpRate are read back (the curve the carries must keep continuous), printed as
a table with the gaps to the continuous run, and plotted (--out).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "crohme" / "crohme-inkml.zip"
KEYS = ("train_loss", "val_loss", "val_exprate")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.environ.get("HMER_DATA") or (str(SHARED) if SHARED.is_file() else None))
    p.add_argument("--preset", default="tiny-transformer")
    p.add_argument("--recipe", default="comer", choices=("bttr", "comer"),
                   help="comer: SGD with momentum, what the GPU campaign trains (default)")
    p.add_argument("--train", type=int, default=600, help="training expressions (0 = all)")
    p.add_argument("--val", type=int, default=100, help="validation expressions (0 = all)")
    p.add_argument("--max-tokens", type=int, default=5, help="keep expressions of at most this many tokens")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--lease-epochs", type=int, default=2, help="epochs a lease trains before the run is carried")
    p.add_argument("--set", dest="overrides", nargs="*", default=[], metavar="KEY=VALUE")
    p.add_argument("--home", default=None, help="the home MLflow store folder (default: a temporary one)")
    p.add_argument("--out", default=str(ROOT / "docs" / "warm_restart_curves.png"))
    args = p.parse_args()

    import numpy as np

    from hmer.config import Config, parse_overrides
    from hmer.data import load_dataset
    from hmer.data.splits import subset
    from hmer.model_presets import preset_with_recipe
    from hmer.recipes import apply_recipe
    from hmer.tracking.store import git_commit, mlflow_client
    from hmer.training import train
    from hmer.training.carry import pack_run, unpack_run

    started = time.perf_counter()
    commit = git_commit(short=True, root=ROOT)
    print(f"# {datetime.datetime.now():%Y-%m-%d %H:%M} commit={commit} python={platform.python_version()} "
          f"load_average={os.getloadavg()[0]:.2f}")
    print(f"# {shlex.join(['python', 'benchmarks/warm_restart.py', *sys.argv[1:]])}")
    cfg = apply_recipe(preset_with_recipe(args.preset), args.recipe).override({
        "train.device": "cpu", "train.epochs": args.epochs, "train.val_every": 1, "train.attention_maps": 0,
        "train.beam_size": 1, "data.test_years": "", **parse_overrides(args.overrides)})
    data = load_dataset(args.data, cfg.data, splits=("train", "val"))
    if args.max_tokens > 0:
        data = {s: [e for e in v if len(e.tokens) <= args.max_tokens] for s, v in data.items()}
    data = {"train": subset(data["train"], args.train, cfg.data.val_seed, "train"),
            "val": subset(data["val"], args.val, cfg.data.val_seed, "val")}
    print(f"data={args.data} train={len(data['train'])} val={len(data['val'])} preset={args.preset} "
          f"recipe={args.recipe} ({cfg.train.optimizer}, lr {cfg.train.lr:g}) epochs={args.epochs} "
          f"lease_epochs={args.lease_epochs}", flush=True)

    with tempfile.TemporaryDirectory(prefix="warm-restart-") as tmp:
        home = Path(args.home or Path(tmp) / "home")
        home_uri = f"sqlite:///{home / 'mlflow.db'}"
        home.mkdir(parents=True, exist_ok=True)
        run_ids, seconds = {}, {}
        t0 = time.perf_counter()
        run_ids["continuous"] = train(cfg, data=data, tracking_uri=home_uri, experiment="warm-restart",
                                      run_name="continuous", run_dir=home / "continuous").run_id
        seconds["continuous"] = time.perf_counter() - t0
        for name, keep in (("optimiser kept", True), ("optimiser dropped", False)):
            t0 = time.perf_counter()
            lease = Path(tmp) / f"{name.split()[1]}-lease0"
            uri = f"sqlite:///{lease / 'mlflow.db'}"
            lease.mkdir(parents=True)
            result = train(cfg, data=data, tracking_uri=uri, experiment="warm-restart", run_name=name,
                           run_dir=lease / "ckpt", pause_after_epochs=args.lease_epochs)
            checkpoint, n = lease / "ckpt" / "last.pt", 0
            while True:
                carried = Path(tmp) / f"{name.split()[1]}-carried{n}.tar"
                pack_run(result.run_id, carried, tracking_uri=uri, checkpoint=checkpoint, optimizer_state=keep)
                if result.stopped_by != "paused":
                    break
                n += 1  # the next lease: a fresh store and checkpoint folder, only the file carried in
                lease = Path(tmp) / f"{name.split()[1]}-lease{n}"
                uri = f"sqlite:///{lease / 'mlflow.db'}"
                lease.mkdir(parents=True)
                checkpoint = unpack_run(carried, tracking_uri=uri, checkpoints=lease).checkpoint
                result = train(Config(), data=data, tracking_uri=uri, resume=checkpoint,
                               pause_after_epochs=args.lease_epochs)
                print(f"  {name}: lease {n} ended at epoch {result.epochs} ({result.stopped_by})", flush=True)
            run_ids[name] = unpack_run(carried, tracking_uri=home_uri, checkpoints=Path(tmp) / "home-ckpt").run_id
            seconds[name] = time.perf_counter() - t0

        client = mlflow_client(home_uri)
        curves = {name: {key: {m.step: m.value for m in client.get_metric_history(rid, key)} for key in KEYS}
                  for name, rid in run_ids.items()}
        tags = {name: client.get_run(rid).data.tags.get("hmer.warm_restart", "-") for name, rid in run_ids.items()}
    names = list(run_ids)
    for name in names:
        print(f"{name}: run {run_ids[name]}, warm restarts at epochs {tags[name]}, {seconds[name]:.0f} s")
    epochs = sorted(curves["continuous"]["train_loss"])
    print("\n| epoch | " + " | ".join(f"{n}: {k}" for k in KEYS for n in names) + " |")
    print("|---" * (1 + len(KEYS) * len(names)) + "|")
    for e in epochs:
        cells = [(f"{curves[n][k][e]:.1f}" if k == "val_exprate" else f"{curves[n][k][e]:.4f}")
                 if e in curves[n][k] else "–" for k in KEYS for n in names]
        restart = " (restart)" if str(e) in tags["optimiser dropped"].split(",") else ""
        print(f"| {e}{restart} | " + " | ".join(cells) + " |")
    for n in names[1:]:
        for k in KEYS:
            gaps = np.array([curves[n][k][e] - curves["continuous"][k][e] for e in epochs])
            print(f"{n} - continuous {k}: max |gap| {np.abs(gaps).max():.4f}, mean gap {gaps.mean():+.4f}, "
                  f"last epoch {curves[n][k][epochs[-1]]:.4f} against {curves['continuous'][k][epochs[-1]]:.4f}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4), constrained_layout=True)
    for name, style in zip(names, ("o-", "s--", "^:")):
        for ax, key in zip(axes, KEYS):
            ax.plot(epochs, [curves[name][key].get(e, np.nan) for e in epochs], style, label=name)
    restarts = [int(e) for e in tags["optimiser dropped"].split(",") if e.isdigit()]
    for ax, key in zip(axes, KEYS):
        for e in restarts:
            ax.axvline(e - 0.5, color="grey", alpha=0.25)
        ax.set_xlabel("epoch")
        ax.set_title(key.replace("_", " ") + (" (%)" if key == "val_exprate" else ""))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{args.preset}, {args.recipe} recipe, {len(data['train'])} training / {len(data['val'])} validation "
                 f"expressions (<= {args.max_tokens} tokens), carried every {args.lease_epochs} epochs "
                 f"(grey: the optimiser restarts), commit {commit}", fontsize=9)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"plot={args.out} total_seconds={time.perf_counter() - started:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
