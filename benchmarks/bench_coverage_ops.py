"""The two coverage operations that `fe4e3b8` made cheaper, against what they replaced, on one thread.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/bench_coverage_ops.py

1. CoMER's coverage sum: the exclusive cumulative sum over the steps of a fusion ARM's attention
   maps at the `cpu` budget's sizes ([12 images, 60 steps, 16 maps, 6 x 64 features]), forward
   plus backward: `cumsum` shifted by a step (what the ARM used) against `refinement.sums_before`.
2. WAP's coverage convolution (1 map -> 128 channels, 11 x 11) on [8, 1, 3, 64]: the convolution
   against `CoverageAttention.coverage_term`'s unfolded matrix product, forward plus backward
   (training) and forward alone (decoding, where the module keeps the convolution).

Each figure is the mean of many calls, both sides alternating twice; the outputs are checked equal.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from hmer.model.transformer import sums_before


def timed(fn, calls: int) -> float:
    """Mean milliseconds of `fn()` over `calls` calls, after one untimed call."""
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def shifted_cumsum(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.zeros_like(x[:, :1]), x.cumsum(1)[:, :-1]], dim=1)


def main() -> None:
    torch.manual_seed(0)
    maps = torch.rand(12, 60, 16, 384, requires_grad=True)
    grad = torch.randn_like(maps)
    assert torch.equal(shifted_cumsum(maps), sums_before(maps))

    def step(fn):
        return lambda: torch.autograd.grad(fn(maps), maps, grad)

    print("coverage sum, [12, 60, 16, 384], forward + backward (ms):")
    for _ in range(2):
        print(f"  cumsum shifted {timed(step(shifted_cumsum), 10):7.2f}    "
              f"sums_before {timed(step(sums_before), 10):7.2f}")

    conv = torch.nn.Conv2d(1, 128, 11, padding=5, bias=False)
    weight = conv.weight.reshape(128, -1).t()
    beta = torch.rand(8, 1, 3, 64, requires_grad=True)
    upstream = torch.randn(8, 192, 128)

    def by_conv():
        return conv(beta).flatten(2).transpose(1, 2)

    def by_unfold():
        return F.unfold(beta, 11, padding=5).transpose(1, 2) @ weight

    torch.testing.assert_close(by_conv(), by_unfold())

    def train(fn):
        return lambda: torch.autograd.grad(fn(), (beta, conv.weight), upstream)

    print("GRU coverage convolution, [8, 1, 3, 64] -> [8, 192, 128] (ms):")
    for _ in range(2):
        print(f"  forward + backward: conv {timed(train(by_conv), 200):6.2f}    "
              f"unfold {timed(train(by_unfold), 200):6.2f}")
    with torch.no_grad():
        for _ in range(2):
            print(f"  forward alone:      conv {timed(by_conv, 500):6.3f}    unfold {timed(by_unfold, 500):6.3f}")


if __name__ == "__main__":
    main()
