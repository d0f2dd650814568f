"""Multi-process data-parallel training (`torchrun --nproc_per_node 4 -m hmer.cli train ...`).

Each rank joins the group (NCCL on GPUs, gloo on CPU), builds the same batch list from the same seed and takes
every `world_size`-th batch: no sampler state to share. Rank 0 alone validates, checkpoints and logs; the
validation score is broadcast so every rank's schedule steps alike.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from typing import Sequence, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: torch.device) -> tuple[DistInfo, torch.device]:
    """Join the process group when launched by torchrun; otherwise a single process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistInfo(), device
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank), device


def wrap(module: torch.nn.Module, info: DistInfo, device: torch.device) -> torch.nn.Module:
    if not info.enabled:
        return module
    device_ids = [device.index] if device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(module, device_ids=device_ids)


def shard(items: Sequence[T], info: DistInfo) -> list[T]:
    """This rank's share of the batches, cut to a multiple of the world size: DDP needs the same number of
    backward passes on every rank. The dropped batches change every epoch, as the order is reshuffled."""
    if not info.enabled:
        return list(items)
    usable = len(items) - len(items) % info.world_size
    if usable == 0:  # fewer batches than ranks: every rank repeats the first ones
        return [items[info.rank % len(items)]] if items else []
    return list(items[info.rank:usable:info.world_size])


def broadcast_float(value: float, info: DistInfo, device: torch.device) -> float:
    if not info.enabled:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.broadcast(t, src=0)
    return float(t.item())


def any_rank(flag: bool, info: DistInfo, device: torch.device) -> bool:
    """True on every rank when it is true on one (e.g. the time budget ran out)."""
    if not info.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def leave(info: DistInfo) -> None:
    """Every rank leaves the process group at one point: a barrier, then each destroys it (the
    order PyTorch's maintainers give for a clean exit, pytorch/pytorch#75097)."""
    if info.enabled and dist.is_initialized():
        gc.collect()  # a DDP wrapper let go of is freed now, on every rank, while the group still stands
        dist.barrier()
        dist.destroy_process_group()


def cleanup(info: DistInfo) -> None:
    """After a failure, when the ranks cannot meet: this rank's group is destroyed on its own."""
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
