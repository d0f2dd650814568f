"""build_model and the named model presets: a family at a size, each with its recipe.

    model = build_model(cfg.model)          # a ModelConfig
    model = build_model("comer-fusion")     # a preset name
    for name, description, num_params in list_presets(): ...
    print(models_table())                   # what `hmer models` prints: presets, then every variant

A **family** is what a model computes (its decoder, coverage, positions, norms), a **size** how big
it is (widths and depths), both as ModelConfig fields over the defaults (BTTR's sizes). A
**preset** names one family at one size, its direction, and the recipe it trains with
(`hmer.recipes`); `hmer.presets` resolves it into a Config, layer by layer (family, then size, then
the preset's direction, then the recipe: a size wins over its family where both set a key).
Naming: `<family>` trains bidirectionally (one decoder on l2r + r2l targets, as BTTR and CoMER);
`<family>-l2r` is the same model trained left-to-right only. The `tiny*` presets are the families
shrunk for CPU tests and smoke runs (stride 8: two dense blocks), `small` a CPU model twice as wide.

`bttr` and `comer-*` compute the reference code's functions (Green-Wood/BTTR 43cabd4,
Green-Wood/CoMER ee15cdb; checked against their outputs in tests/test_reference_fidelity.py):
no padding mask in the encoder, each one's encoder tail and image positions, BTTR's
embedding LayerNorm. The project's alternatives are config values, measured by
`studies/ablate_encoder.py`. The CPU sizes pin the project's choices, so that the tiny presets
compute what they always have.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from ..config import Config, ModelConfig
from ..registry import catalogue, linked_overrides
from .hmer_model import HMERModel

# ---- families: what a model computes --------------------------------------------------------------
# What the reference code does where the project's defaults differ.
_REFERENCE_ENCODER = {"mask_padding": False}
_BTTR = {**_REFERENCE_ENCODER, "decoder": "transformer", "coverage": "none", "encoder_tail": "relu-norm-pos",
         "image_pos": "sin2d-bttr", "embed_norm": True, "embed_pos_norm": False}
_COMER = {**_REFERENCE_ENCODER, "decoder": "transformer", "encoder_tail": "pos-norm", "image_pos": "sin2d",
          "embed_norm": True, "embed_pos_norm": True, "coverage_channels": 32, "coverage_kernel": 5}

# name -> (ModelConfig fields, description). A family's decoder brings what its registration links
# to it (`model.decoder=convs2s`: learned token positions and the scaled attention, hmer.model.convs2s),
# under the family's own fields.
FAMILIES: dict[str, tuple[dict[str, Any], str]] = {
    "transformer": ({"decoder": "transformer"}, "transformer"),  # the project's own: the ModelConfig defaults
    "bttr": (_BTTR, "BTTR: DenseNet-B + transformer decoder"),
    "comer-self": ({**_COMER, "coverage": "self"}, "CoMER, ARM with self coverage"),
    "comer-cross": ({**_COMER, "coverage": "cross"}, "CoMER, ARM with cross coverage"),
    "comer-fusion": ({**_COMER, "coverage": "fusion"}, "CoMER, ARM with fusion coverage (the paper's model)"),
    "wap-rnn": ({"decoder": "rnn", "image_pos": "none", "dropout": 0.2},
                "DenseWAP: DenseNet-B + GRU decoder with coverage attention"),
    "convs2s": ({"decoder": "convs2s", "conv_layers": 3, "conv_kernel": 3, "dropout": 0.2},
                "DenseNet-B + ConvS2S decoder (GLU convolutions, multi-step attention)"),
}

# ---- sizes: how big ----------------------------------------------------------------------------------
_TINY = {
    "growth_rate": 8, "num_dense_layers": 4, "num_dense_blocks": 2, "d_model": 64, "nhead": 4,
    "num_decoder_layers": 2, "dim_feedforward": 128, "dropout": 0.1, "encoder_dropout": 0.1,
    "coverage_channels": 8, "rnn_hidden": 64, "rnn_attention": 64, "rnn_embedding": 64,
    "conv_layers": 2,
    # The project's own encoder, as the tiny presets have always had it (runs on record use them):
    # a CPU size keeps it whatever the family's (the CoMER family's tail included).
    "mask_padding": True, "encoder_tail": "relu-norm-pos",
}
# Twice tiny's width, for CPU training (docs/cpu_protocol.md).
_SMALL = {**_TINY, "growth_rate": 12, "d_model": 128, "nhead": 8, "dim_feedforward": 256, "coverage_channels": 16,
          "rnn_hidden": 128, "rnn_attention": 128, "rnn_embedding": 128}

# name -> (ModelConfig fields, description)
SIZES: dict[str, tuple[dict[str, Any], str]] = {
    "full": ({}, "the papers' sizes (the ModelConfig defaults)"),
    "tiny": (_TINY, "growth 8, 2x4 dense layers, d 64"),
    "small": (_SMALL, "growth 12, 2x4 dense layers, d 128"),
    # The shape of the committed sweep's best trial (`sweep-cpu` trial 25; the `cpu` recipe is the rest
    # of it): small's encoder with 2x6 dense layers, a decoder of width 192 (FFN 384) and 3 layers; the
    # widths the sweep did not vary (heads, coverage, GRU) are small's. The `cpu` study budget's size.
    "cpu": ({**_SMALL, "num_dense_layers": 6, "d_model": 192, "dim_feedforward": 384, "num_decoder_layers": 3},
            "growth 12, 2x6 dense layers, d 192, 3 decoder layers"),
}


# ---- presets: a family at a size, with its recipe ----------------------------------------------------
@dataclass(frozen=True)
class Preset:
    """A named model: `family` at `size`, trained `direction`, with `recipe` (a name of hmer.recipes)."""

    family: str
    size: str
    recipe: str
    direction: str = "bi"

    @property
    def description(self) -> str:
        if self.size == "full":
            return f"{FAMILIES[self.family][1]}; {'bidirectional' if self.direction == 'bi' else 'left-to-right'}"
        use = "CPU tests and smoke runs" if self.size == "tiny" else "CPU training"
        return f"{self.family} for {use} ({SIZES[self.size][1]})"


PRESETS: dict[str, Preset] = {}
for _family in ("bttr", "comer-self", "comer-cross", "comer-fusion", "wap-rnn", "convs2s"):
    # each paper's family with its paper's recipe: CoMER's for CoMER, BTTR's for the others
    _recipe = "comer" if _family.startswith("comer") else "bttr"
    PRESETS[_family] = Preset(_family, "full", _recipe)
    PRESETS[f"{_family}-l2r"] = Preset(_family, "full", _recipe, direction="l2r")
# The CPU presets train with BTTR's recipe, `tiny-comer` too: what each has always trained with
# (the smoke studies, the tests, the timings of docs/benchmarks.md). At the `cpu` budget a study
# trains every one of them with the `cpu` recipe instead (hmer.studies.budgets).
PRESETS.update({
    "tiny": Preset("transformer", "tiny", "bttr"),
    "tiny-transformer": Preset("transformer", "tiny", "bttr"),
    "tiny-comer": Preset("comer-fusion", "tiny", "bttr"),
    "tiny-rnn": Preset("wap-rnn", "tiny", "bttr"),
    "tiny-convs2s": Preset("convs2s", "tiny", "bttr"),
    "small": Preset("transformer", "small", "bttr"),
})
DESCRIPTIONS: dict[str, str] = {name: preset.description for name, preset in PRESETS.items()}


def family_fields(name: str) -> dict[str, Any]:
    """The ModelConfig fields family `name` sets: what its decoder brings, then its own."""
    fields, _ = FAMILIES[name]
    brought = linked_overrides("model.decoder", fields["decoder"])
    return {**{key.removeprefix("model."): value for key, value in brought.items()}, **fields}


def size_fields(name: str) -> dict[str, Any]:
    """The ModelConfig fields size `name` sets; a KeyError that lists the sizes when there is none."""
    if name not in SIZES:
        raise KeyError(f"unknown model size {name!r}; known: {', '.join(SIZES)}")
    return dict(SIZES[name][0])


def preset_layers(name: str, size: str | None = None) -> list[tuple[str, str, dict[str, Any]]]:
    """The model layers of preset `name`, in the order they apply: (layer, its name, ModelConfig
    fields) for its family, its size (or `size`, a budget's) and the preset itself (its direction)."""
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}")
    preset = PRESETS[name]
    size = size or preset.size
    return [("family", preset.family, family_fields(preset.family)), ("size", size, size_fields(size)),
            ("preset", name, {"direction": preset.direction})]


def preset_config(name: str, size: str | None = None) -> ModelConfig:
    """The ModelConfig of preset `name`: the defaults, then its layers (`preset_layers`)."""
    fields: dict[str, Any] = {}
    for _, _, values in preset_layers(name, size):
        fields.update(values)
    cfg = dataclasses.replace(ModelConfig(), **fields)
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
    """`hmer models`: the presets (family, size, recipe) with their parameter counts, then the
    registered variants that a config can name (decoders, coverages, positions, search rules, metrics)."""
    rows = [(name, params, PRESETS[name], description) for name, description, params in list_presets()]
    columns = ("preset", "family", "size", "recipe")
    width = [max(len(c), *(len(v) for v in values)) for c, values in
             zip(columns, zip(*((name, p.family, p.size, p.recipe) for name, _, p, _ in rows)))]
    head = "  ".join(f"{c:<{w}}" for c, w in zip(columns, width))
    lines = [f"{head}  {'params':>9}  description"]
    for name, params, preset, description in rows:
        cells = "  ".join(f"{v:<{w}}" for v, w in zip((name, preset.family, preset.size, preset.recipe), width))
        lines.append(f"{cells}  {params / 1e6:>8.2f}M  {description}")
    variants = catalogue()
    key_width = max(len(key) for key, _, _ in variants)
    name_width = max(len(name) for _, name, _ in variants)
    lines += ["", f"{'variant of':<{key_width}}  {'name':<{name_width}}  description"]
    previous = None
    for key, name, description in variants:
        lines.append(f"{key if key != previous else '':<{key_width}}  {name:<{name_width}}  {description}")
        previous = key
    return "\n".join(lines)
