"""A model preset: what it is made of, and the config it resolves to, layer by layer.

A **family** is what a model computes (decoder, coverage, positions, norms), a **size** its widths and depths,
both ModelConfig fields over the defaults (BTTR's sizes). A **preset** is a family at a size, with its direction
and recipe (`hmer.recipes`): `<family>` trains bidirectionally (as BTTR and CoMER), `<family>-l2r` left-to-right;
`tiny*` are the families shrunk for CPU tests (stride 8: two dense blocks), `small` twice as wide. `bttr` and
`comer-*` compute the reference code's functions (docs/fidelity.md); the CPU sizes pin the project's choices,
so the tiny presets compute what they always have.

This module resolves the layers (`LAYERS`) up to the recipe, `hmer.studies.resolution` the rest; what each
layer sets: docs/training.md, "What a run trains with". Plain values: a preset with its recipe needs neither
the model nor the training code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from .config import Config, ModelConfig, stored_config
from .recipes import recipe_values
from .registry import linked_overrides

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
    # The shape of the committed sweep's best trial (`sweep-cpu` trial 25; the `swept` recipe is the rest
    # of it): small's encoder with 2x6 dense layers, a decoder of width 192 (FFN 384) and 3 layers; the
    # widths the sweep did not vary (heads, coverage, GRU) are small's. The `cpu` study budget's size.
    "swept": ({**_SMALL, "num_dense_layers": 6, "d_model": 192, "dim_feedforward": 384, "num_decoder_layers": 3},
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
# trains every one of them with the `swept` recipe instead (hmer.studies.budgets).
PRESETS.update({
    "tiny-transformer": Preset("transformer", "tiny", "bttr"),
    "tiny-comer": Preset("comer-fusion", "tiny", "bttr"),
    "tiny-rnn": Preset("wap-rnn", "tiny", "bttr"),
    "tiny-convs2s": Preset("convs2s", "tiny", "bttr"),
    "small": Preset("transformer", "small", "bttr"),
})


def preset_layers(name: str, size: str | None = None) -> list[tuple[str, str, dict[str, Any]]]:
    """The model layers of preset `name`, in the order they apply: (layer, its name, ModelConfig
    fields) for its family (what its decoder brings, then its own fields), its size (or `size`, a
    budget's) and the preset itself (its direction)."""
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; `hmer models` lists them: {', '.join(sorted(PRESETS))}")
    preset = PRESETS[name]
    size = size or preset.size
    if size not in SIZES:
        raise KeyError(f"unknown model size {size!r}; known: {', '.join(SIZES)}")
    own, _ = FAMILIES[preset.family]
    brought = linked_overrides("model.decoder", own["decoder"])
    family = {**{key.removeprefix("model."): value for key, value in brought.items()}, **own}
    return [("family", preset.family, family), ("size", size, dict(SIZES[size][0])),
            ("preset", name, {"direction": preset.direction})]


def preset_config(name: str, size: str | None = None) -> ModelConfig:
    """The ModelConfig of preset `name`: the defaults, then its layers (`preset_layers`)."""
    fields = {key: value for _, _, values in preset_layers(name, size) for key, value in values.items()}
    return dataclasses.replace(ModelConfig(), **fields).validate()


# ---- a config, layer by layer ----------------------------------------------------------------------
LAYERS = ("default", "family", "size", "preset", "recipe", "budget", "study", "set", "stored", "cell")


@dataclass(frozen=True)
class Resolution:
    """A config and, for each of its keys, the layer that set it last ("family comer-fusion",
    "budget cpu"). Layers apply in the order of `LAYERS`; each one checks the whole config."""

    config: Config = field(default_factory=Config)
    sources: Mapping[str, str] = field(default_factory=lambda: {key: "default" for key in Config().to_flat_dict()})
    last: str = "default"

    def apply(self, layer: str, name: str, values: Mapping[str, Any]) -> "Resolution":
        """This resolution with `values` (dotted keys) set by `layer` called `name`."""
        if LAYERS.index(layer) < LAYERS.index(self.last):
            raise ValueError(f"the {layer} layer comes before the {self.last} layer (hmer.model_presets.LAYERS)")
        source = f"{layer} {name}".rstrip()
        sources = {**self.sources, **{key: source for key in values}}
        return Resolution(self.config.override(dict(values)), sources, layer)

    def take_stored(self, stored: Mapping[str, Any], name: str) -> "Resolution":
        """The `stored` layer: a study's stored base config (flat keys) wins over every layer below
        (`hmer.config.stored_config`). A key whose stored value is the one resolved keeps its layer."""
        before, after = self.config.to_flat_dict(), stored_config(dict(stored), self.config).to_flat_dict()
        return self.apply("stored", name, {key: value for key, value in after.items() if value != before[key]})

    def rows(self) -> list[tuple[str, Any, str]]:
        """(key, value, layer) for every key, in the config's order."""
        return [(key, value, self.sources[key]) for key, value in self.config.to_flat_dict().items()]


def resolve_preset(name: str, *, size: str | None = None, recipe: str | None = None, named_by: str = "") -> Resolution:
    """Preset `name` resolved up to its recipe (or `size`, `recipe` instead of its own). `named_by` labels who
    named them ("budget cpu", "--recipe")."""
    resolution = Resolution()
    for layer, layer_name, fields in preset_layers(name, size):
        values = {f"model.{key}": value for key, value in fields.items()}
        if layer == "preset":
            values["name"] = name
        elif layer == "size" and size and size != PRESETS[name].size and named_by:
            layer_name = f"{layer_name} ({named_by})"
        resolution = resolution.apply(layer, layer_name, values)
    own = PRESETS[name].recipe
    recipe = recipe or own
    label = f"{recipe} ({named_by})" if recipe != own and named_by else recipe
    return resolution.apply("recipe", label, recipe_values(recipe))


def preset_with_recipe(name: str) -> Config:
    """A complete Config: preset `name`'s model, trained with its recipe (`resolve_preset`)."""
    return resolve_preset(name).config
