"""Which device and precision a command runs on: one rule for training, evaluation and import."""

from __future__ import annotations

import platform

import torch


def resolve_device(name: str) -> torch.device:
    """`auto`: the GPU when there is one, else the CPU; any other name as torch reads it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """bf16 autocast on GPU by default; full fp32 on CPU, where bf16 is slower and less exact."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def device_description(device: torch.device) -> str:
    """The device in words, as a run's tag records it: the GPU's name, or the CPU and its threads."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
