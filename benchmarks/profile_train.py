"""Where a training step's time goes: `torch.profiler` over real CROHME batches.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/profile_train.py --preset small --set data.render_height=64

Builds the preset with its recipe, renders the first batches of the training split as the trainer
batches it, takes a few warm-up steps, times `--steps` optimiser steps (`training.step.train_step`,
as the trainer steps), then profiles the same steps again and prints the operators by self CPU
time, and by input shape. Compare before and after a change side by side in the same minute (a
worktree of the old commit with `PYTHONPATH=<it>/src`): these machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch.profiler import ProfilerActivity, profile

from hmer.allocator import tune_malloc
from hmer.config import parse_overrides
from hmer.data import Vocab, load_dataset, make_batches
from hmer.model import build_model
from hmer.model.accelerations import accelerate
from hmer.model_presets import preset_with_recipe
from hmer.training.loader import make_train_batch
from hmer.training.optim import build_optimizer
from hmer.training.step import LossModule, train_step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--data", default=os.environ.get("HMER_DATA"), help="CROHME zip or folder (default: $HMER_DATA)")
    p.add_argument("--steps", type=int, default=25, help="steps timed, then profiled")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rows", type=int, default=25, help="operators printed (0: the timing alone, no profile)")
    p.add_argument("--set", dest="overrides", nargs="*", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    tune_malloc()  # profile what `hmer train` and the studies run (hmer.allocator)
    if not args.data:
        p.error("give --data or set HMER_DATA")

    cfg = preset_with_recipe(args.preset).override(parse_overrides(args.overrides))
    torch.manual_seed(0)
    model = build_model(cfg.model)
    accelerate(model, torch.device("cpu"))  # as the trainer steps (training.setup.prepare_model)
    channels_last = bool(cfg.train.channels_last)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    exprs = load_dataset(args.data, cfg.data, splits=("train",))["train"]
    batches = make_batches(exprs, cfg.data.batch_pixels, cfg.data.max_batch_size, shuffle=True, seed=0)
    vocab = Vocab()
    optimizer = build_optimizer(model.parameters(), cfg.train)
    model.train()
    loss_module = LossModule(model, cfg.train.label_smoothing)
    steps = [make_train_batch([exprs[i] for i in idx], vocab, cfg.model.direction, torch.device("cpu"), None,
                              channels_last) for idx in batches[:args.warmup + args.steps]]

    def run(batch_list) -> None:
        for tb in batch_list:
            train_step(loss_module, optimizer, model, tb, cfg.train.grad_clip, None)

    run(steps[:args.warmup])
    timed = steps[args.warmup:]
    images = sum(len(tb) for tb in timed)
    start = time.perf_counter()
    run(timed)
    seconds = time.perf_counter() - start
    print(f"preset={args.preset} threads={torch.get_num_threads()} steps={len(timed)} images={images} "
          f"seconds={seconds:.2f} images_per_second={images / seconds:.1f}")
    if args.rows == 0:
        return
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        run(timed)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
