"""The optimiser step alone: torch's loop implementation against its fused kernel, for a preset's
parameters, alternating the two in one process, then how far their weights drift apart.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/bench_optimizer.py --preset tiny-transformer \
        --set model.d_model=192 ...

The gradients are fixed random ones (the step's cost does not depend on their values); both sides
start from the same weights. Prints ms per step for each round, then the largest difference of
any weight after `--steps` steps of each.
"""

from __future__ import annotations

import argparse
import time

import torch

from hmer.config import parse_overrides
from hmer.model import build_model
from hmer.model_presets import preset_with_recipe


def optimizer(params, cfg, fused: bool) -> torch.optim.Optimizer:
    tc = cfg.train
    if tc.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=tc.lr, eps=tc.eps, weight_decay=tc.weight_decay, fused=fused or None)
    if tc.optimizer == "sgd":
        return torch.optim.SGD(params, lr=tc.lr, momentum=tc.momentum, weight_decay=tc.weight_decay,
                               fused=fused or None)
    raise SystemExit(f"train.optimizer={tc.optimizer}: torch has no fused kernel for it")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny-transformer")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    ap.add_argument("--steps", type=int, default=50, help="timed steps a round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of loop, then fused")
    args = ap.parse_args()
    cfg = preset_with_recipe(args.preset).override(parse_overrides(args.set))
    reference = build_model(cfg.model)
    torch.manual_seed(0)
    grads = [torch.randn_like(p) * 1e-3 for p in reference.parameters()]
    print(f"preset={args.preset} optimizer={cfg.train.optimizer} threads={torch.get_num_threads()} "
          f"tensors={len(grads)} parameters={sum(g.numel() for g in grads)}")

    def side(fused: bool):
        model = build_model(cfg.model)
        model.load_state_dict(reference.state_dict())
        params = list(model.parameters())
        for p, g in zip(params, grads):
            p.grad = g.clone()
        return params, optimizer(params, cfg, fused)

    for r in range(args.rounds):
        for fused in (False, True):
            params, opt = side(fused)
            for _ in range(3):
                opt.step()
            start = time.perf_counter()
            for _ in range(args.steps):
                opt.step()
            ms = (time.perf_counter() - start) / args.steps * 1e3
            print(f"round={r + 1} {'fused' if fused else 'loop'} ms_per_step={ms:.2f}")
    (a, opt_a), (b, opt_b) = side(False), side(True)
    for _ in range(args.steps):
        opt_a.step()
        opt_b.step()
    drift = max((x - y).abs().max().item() for x, y in zip(a, b))
    print(f"max_weight_difference_after_{args.steps}_steps={drift:.3g} "
          f"bit_identical={all(torch.equal(x, y) for x, y in zip(a, b))}")


if __name__ == "__main__":
    main()
