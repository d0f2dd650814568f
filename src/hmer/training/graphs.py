"""The training step replayed as a CUDA graph per batch shape (`train.cuda_graphs`).

Why. With its shapes seen, a reference step of `bttr` still takes 60-100 ms on an H100 or H200 for
about 6 ms of arithmetic (docs/benchmarks.md section 5): the host launching some thousand kernels
one by one. A CUDA graph records them once and launches them as one. A graph holds fixed shapes and
fixed addresses, so it needs static shapes: the pad ladder gives the images a few (hmer.data.batching),
and here the captions are padded to a ladder of lengths too (`LENGTH_LADDER`).

How a step runs (`GraphedStep.__call__`): the targets are padded with the pad token to the next rung of
`LENGTH_LADDER` (the loss ignores pad targets and no real position attends to a later one, so the loss is the
same; CoMER's attention refinement does take BatchNorm statistics over the padded steps, as it does over the
padding of shorter captions); the batch is copied into the static tensors of its shape; its graph replays the
gradients zeroed, forward, loss and backward into `.grad` tensors allocated once before the first capture (so
every graph writes the addresses the optimiser reads); clipping and the optimiser's step run eagerly, as in
`step.train_step` (they take the schedule's rate, a Python number that a graph would freeze).

The first batch of a shape takes that step eagerly (the real step for that batch, warming cuDNN,
cuBLAS and the allocator), then a warm-up pass on a side stream and the capture, with the buffers
(BatchNorm statistics) and the RNG put back afterwards, so neither changes the training. Graphs share
one memory pool: they never run at once, and the only tensors that outlive a replay (the loss) are
kept. A shape whose capture fails stays eager, its reason kept in `failures`.

On a CPU there is no graph: the step runs eagerly on the static tensors, which is what
tests/test_training_graphs.py holds to the ordinary step (the same losses and weights).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..data.batching import PadLadder
from ..model.decoder_base import PAD_ID

# Caption lengths (target positions) padded to multiples of 8, each rung at least 1.25 times the one
# below: 8, 16, 24, 32, 40, 56, 72, 96, 120, 152, 192, 240 for the lengths CROHME has.
LENGTH_LADDER = PadLadder(8, 1.25)


def pad_targets(tgt_in: Tensor, tgt_out: Tensor, ladder: PadLadder = LENGTH_LADDER) -> tuple[Tensor, Tensor]:
    """[B', L] targets padded on the right with the pad token to [B', ladder.rung(L)]."""
    length = tgt_in.shape[1]
    extra = ladder.rung(length) - length
    if extra == 0:
        return tgt_in, tgt_out
    return (torch.nn.functional.pad(tgt_in, (0, extra), value=PAD_ID),
            torch.nn.functional.pad(tgt_out, (0, extra), value=PAD_ID))


@dataclass
class _Static:
    """One shape's static inputs, its loss and, on a GPU, its graph."""

    images: Tensor
    image_mask: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    loss: Tensor | None = None
    graph: Any = None


@dataclass
class GraphedStep:
    """`step.train_step` with the forward and backward of each batch shape replayed from a CUDA graph
    (module docstring). Call it with a `loader.TrainBatch`; it returns the batch's loss, detached."""

    loss_module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    model: torch.nn.Module
    grad_clip: float
    amp_dtype: torch.dtype | None = None
    statics: dict[tuple, _Static] = field(default_factory=dict)
    failures: dict[tuple, str] = field(default_factory=dict)
    pool: Any = None

    @property
    def graphs(self) -> int:
        """Shapes replayed from a graph so far."""
        return sum(1 for s in self.statics.values() if s.graph is not None)

    def __call__(self, tb) -> Tensor:
        images, mask = tb.batch.images, tb.batch.image_mask
        tgt_in, tgt_out = pad_targets(tb.tgt_in, tb.tgt_out)
        key = (tuple(images.shape), tuple(tgt_in.shape), images.is_contiguous(memory_format=torch.channels_last))
        # Gradients live in fixed tensors that every graph writes and the optimiser reads: they are
        # zeroed in place, never set to None (which `train_step` does).
        for p in self.model.parameters():
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
        first = key not in self.statics
        if first:
            self.statics[key] = _Static(
                torch.empty_like(images), torch.empty_like(mask), torch.empty_like(tgt_in), torch.empty_like(tgt_out))
        static = self.statics[key]
        for target, source in zip((static.images, static.image_mask, static.tgt_in, static.tgt_out),
                                  (images, mask, tgt_in, tgt_out)):
            target.copy_(source)
        if static.graph is not None:
            static.graph.replay()
            assert static.loss is not None  # the capture recorded it
            loss = static.loss.detach().clone()  # the next replay of this shape overwrites it
        else:
            # eager: on a CPU always; on a GPU at a shape's first batch (the real step, which plans
            # and warms up what the capture then records) and where a capture failed
            loss = self._forward_backward(static).detach()
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        if first and images.device.type == "cuda":
            self._capture(key, static)
        return loss

    def _forward_backward(self, static: _Static) -> Tensor:
        """Zero the gradients in place, then the loss and its backward: what a graph records."""
        self.optimizer.zero_grad(set_to_none=False)
        device_type = static.images.device.type
        # autocast's cache of cast weights must not outlive a capture (torch.cuda.graphs' rule)
        with torch.autocast(device_type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None, cache_enabled=False):
            loss = self.loss_module(static.images, static.image_mask, static.tgt_in, static.tgt_out)
        loss.backward()
        return loss

    def _capture(self, key: tuple, static: _Static) -> None:
        """Record `static`'s graph; the warm-up's effects on the buffers and the RNG are undone (the
        capture itself runs nothing)."""
        buffers = {name: b.clone() for name, b in self.model.named_buffers()}
        cpu_rng, cuda_rng = torch.get_rng_state(), torch.cuda.get_rng_state()
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # torch.cuda.graphs' warm-up on a side stream before a capture
                self._forward_backward(static)
            torch.cuda.current_stream().wait_stream(side)
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                static.loss = self._forward_backward(static)
            static.graph = graph
        except Exception as exc:  # noqa: BLE001 - an operation a graph cannot hold: this shape stays eager
            self.failures[key] = f"{type(exc).__name__}: {exc}"
            static.graph, static.loss = None, None
        finally:
            with torch.no_grad():
                for name, b in self.model.named_buffers():
                    b.copy_(buffers[name])
            torch.set_rng_state(cpu_rng)
            torch.cuda.set_rng_state(cuda_rng)
