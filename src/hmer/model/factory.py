"""build_model and the named model presets.

    model = build_model(cfg.model)          # a ModelConfig
    model = build_model("comer-fusion")     # a preset name
    for name, description, num_params in list_presets(): ...
    print(models_table())                   # what `hmer models` prints: presets, then every variant

A preset is a dict of ModelConfig field overrides over the defaults (BTTR's sizes).
Naming: `<family>` trains bidirectionally (one decoder on l2r + r2l targets, as BTTR and
CoMER); `<family>-l2r` is the same model trained left-to-right only. The `tiny*` presets are
the same architectures shrunk for CPU tests and smoke runs (stride 8: two dense blocks).

`bttr` and `comer-*` compute the reference code's functions (Green-Wood/BTTR 43cabd4,
Green-Wood/CoMER ee15cdb; checked against their outputs in tests/test_reference_fidelity.py):
no padding mask in the encoder, each one's encoder tail and image positions, BTTR's
embedding LayerNorm. The project's alternatives are config values, measured by
`studies/ablate_encoder.py`. The `tiny*` presets pin the project's choices, so that they
compute what they always have.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn as nn

from ..config import Config, ModelConfig
from ..registry import catalogue
from .hmer_model import HMERModel

# What the reference code does where the project's defaults differ.
_REFERENCE_ENCODER = {"mask_padding": False}
_BTTR = {**_REFERENCE_ENCODER, "decoder": "transformer", "coverage": "none", "encoder_tail": "relu-norm-pos",
         "image_pos": "sin2d-bttr", "embed_norm": True, "embed_pos_norm": False}
_COMER = {**_REFERENCE_ENCODER, "decoder": "transformer", "encoder_tail": "pos-norm", "image_pos": "sin2d",
          "embed_norm": True, "embed_pos_norm": True, "coverage_channels": 32, "coverage_kernel": 5}
_WAP = {"decoder": "rnn", "image_pos": "none", "dropout": 0.2}
_CONVS2S = {"decoder": "convs2s", "token_pos": "learned", "conv_layers": 3, "conv_kernel": 3, "dropout": 0.2,
            "conv_attention": "scaled"}
_TINY = {
    "growth_rate": 8, "num_dense_layers": 4, "num_dense_blocks": 2, "d_model": 64, "nhead": 4,
    "num_decoder_layers": 2, "dim_feedforward": 128, "dropout": 0.1, "encoder_dropout": 0.1,
    "coverage_channels": 8, "rnn_hidden": 64, "rnn_attention": 64, "rnn_embedding": 64,
    "conv_layers": 2,
    # The project's own encoder, as the tiny presets have always had it (runs on record use them).
    "mask_padding": True, "encoder_tail": "relu-norm-pos",
}

_FAMILIES: dict[str, tuple[dict[str, Any], str]] = {
    "bttr": (_BTTR, "BTTR: DenseNet-B + transformer decoder"),
    "comer-self": ({**_COMER, "coverage": "self"}, "CoMER, ARM with self coverage"),
    "comer-cross": ({**_COMER, "coverage": "cross"}, "CoMER, ARM with cross coverage"),
    "comer-fusion": ({**_COMER, "coverage": "fusion"}, "CoMER, ARM with fusion coverage (the paper's model)"),
    "wap-rnn": (_WAP, "DenseWAP: DenseNet-B + GRU decoder with coverage attention"),
    "convs2s": (_CONVS2S, "DenseNet-B + ConvS2S decoder (GLU convolutions, multi-step attention)"),
}

PRESETS: dict[str, dict[str, Any]] = {}
DESCRIPTIONS: dict[str, str] = {}
for _name, (_overrides, _text) in _FAMILIES.items():
    PRESETS[_name] = {**_overrides, "direction": "bi"}
    DESCRIPTIONS[_name] = f"{_text}; bidirectional"
    PRESETS[f"{_name}-l2r"] = {**_overrides, "direction": "l2r"}
    DESCRIPTIONS[f"{_name}-l2r"] = f"{_text}; left-to-right"

_TINY_FAMILIES: dict[str, tuple[dict[str, Any], str]] = {
    "tiny": ({"decoder": "transformer"}, "transformer"),
    "tiny-transformer": ({"decoder": "transformer"}, "transformer"),
    "tiny-comer": ({**_COMER, "coverage": "fusion"}, "CoMER fusion coverage"),
    "tiny-rnn": (_WAP, "GRU + coverage attention"),
    "tiny-convs2s": (_CONVS2S, "ConvS2S"),
}
for _name, (_overrides, _text) in _TINY_FAMILIES.items():
    PRESETS[_name] = {**_overrides, **_TINY, "direction": "bi"}  # the tiny sizes win
    DESCRIPTIONS[_name] = f"tiny {_text} for CPU tests and smoke runs (growth 8, 2x4 dense layers, d 64)"

# Between tiny and the paper size, for CPU training (docs/cpu_protocol.md): twice tiny's width.
# The `cpu` study budget applies the same widths to every study's tiny preset.
SMALL_WIDTHS = {"growth_rate": 12, "d_model": 128, "nhead": 8, "dim_feedforward": 256, "coverage_channels": 16,
                "rnn_hidden": 128, "rnn_attention": 128, "rnn_embedding": 128}
PRESETS["small"] = {"decoder": "transformer", **_TINY, **SMALL_WIDTHS, "direction": "bi"}
DESCRIPTIONS["small"] = "small transformer for CPU training (growth 12, 2x4 dense layers, d 128)"


def preset_config(name: str) -> ModelConfig:
    """The ModelConfig of preset `name` (defaults + the preset's overrides)."""
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}")
    cfg = dataclasses.replace(ModelConfig(), **PRESETS[name])
    cfg.validate()
    return cfg


def build_model(cfg: ModelConfig | Config | str) -> HMERModel:
    """An HMERModel from a ModelConfig, a full Config (its .model) or a preset name."""
    if isinstance(cfg, str):
        cfg = preset_config(cfg)
    elif isinstance(cfg, Config):
        cfg = cfg.model
    return HMERModel(cfg)


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def list_presets() -> list[tuple[str, str, int]]:
    """(name, description, number of parameters) for every preset, in definition order.
    Models are built on the meta device: no memory, no initialisation cost."""
    rows = []
    for name in PRESETS:
        with torch.device("meta"):
            model = build_model(name)
        rows.append((name, DESCRIPTIONS[name], count_parameters(model)))
    return rows


def models_table() -> str:
    """`hmer models`: the presets with their parameter counts, then the registered variants that
    a config can name (decoders, coverages, positions, search rules, metrics)."""
    rows = list_presets()
    width = max(len(r[0]) for r in rows)
    lines = [f"{'preset':<{width}}  {'params':>9}  description"]
    lines += [f"{name:<{width}}  {params / 1e6:>8.2f}M  {description}" for name, description, params in rows]
    variants = catalogue()
    key_width = max(len(key) for key, _, _ in variants)
    name_width = max(len(name) for _, name, _ in variants)
    lines += ["", f"{'variant of':<{key_width}}  {'name':<{name_width}}  description"]
    previous = None
    for key, name, description in variants:
        lines.append(f"{key if key != previous else '':<{key_width}}  {name:<{name_width}}  {description}")
        previous = key
    return "\n".join(lines)
