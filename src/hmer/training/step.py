"""One training step: a batch's loss, its gradients, the optimiser's step.

The trainer, `hmer bench train` and a sweep trial's cost measurement all step this way;
`train.cuda_graphs` replays it from a CUDA graph per batch shape (`training.graphs.GraphedStep`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..model import HMERModel


class LossModule(torch.nn.Module):
    """`forward` = the model's training loss, so DistributedDataParallel can wrap it."""

    def __init__(self, model: HMERModel, label_smoothing: float = 0.0, counted: Tensor | None = None,
                 counting_weight: float = 1.0):
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing
        self.counting_weight = counting_weight
        self.counted = counted  # the classes a counting model counts (hmer.model.counting), on its device

    def forward(self, images, image_mask, tgt_in, tgt_out):
        return self.model.loss_from_targets(images, image_mask, tgt_in, tgt_out, self.label_smoothing,
                                            counted=self.counted, counting_weight=self.counting_weight)


def train_step(loss_module: torch.nn.Module, optimizer: torch.optim.Optimizer, model: torch.nn.Module, tb,
               grad_clip: float, amp_dtype: torch.dtype | None = None) -> Tensor:
    """One step on `tb` (a `loader.TrainBatch`): autocast when `amp_dtype`, clipping when `grad_clip` > 0.
    Returns the loss, not detached."""
    device_type = tb.batch.images.device.type
    with torch.autocast(device_type, dtype=amp_dtype, enabled=amp_dtype is not None):
        loss = loss_module(tb.batch.images, tb.batch.image_mask, tb.tgt_in, tb.tgt_out)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss
