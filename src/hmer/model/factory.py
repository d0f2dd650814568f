"""build_model: an HMERModel from a ModelConfig, a full Config or a preset's name (`hmer.model_presets`).

    model = build_model(cfg.model)          # a ModelConfig
    model = build_model("comer-fusion")     # a preset name
    for name, description, num_params, counting in list_presets(): ...
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from ..config import Config, ModelConfig
from ..model_presets import PRESETS, preset_config
from .hmer_model import HMERModel


def build_model(cfg: ModelConfig | Config | str) -> HMERModel:
    """An HMERModel from a ModelConfig, a full Config (its .model) or a preset name."""
    if isinstance(cfg, str):
        cfg = preset_config(cfg)
    elif isinstance(cfg, Config):
        cfg = cfg.model
    return HMERModel(cfg)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def list_presets() -> list[tuple[str, str, int, int]]:
    """(name, description, number of parameters, what CAN's symbol counting adds to them:
    `model.counting`, hmer.model.counting) for every preset, in definition order. Models are built on
    the meta device: no memory, no initialisation cost."""
    return [(name, PRESETS[name].description, *parameter_counts(preset_config(name))) for name in PRESETS]


def parameter_counts(cfg: ModelConfig) -> tuple[int, int]:
    """The parameters of the model `cfg`, and what CAN's symbol counting adds to them, built on the meta
    device."""
    with torch.device("meta"):
        params = count_parameters(build_model(cfg))
        return params, count_parameters(build_model(dataclasses.replace(cfg, counting=True))) - params
