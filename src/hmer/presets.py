"""What a config is made of, layer by layer, and which layer set each value.

A config is resolved in layers, each setting some keys over the ones below it; the last layer that
sets a key decides its value. In order (`LAYERS`):

    default   the ModelConfig / DataConfig / TrainConfig defaults (hmer.config)
    family    what the model computes: the preset's family (hmer.model.factory.FAMILIES)
    size      how big: the preset's size, or the one a study budget names (SIZES)
    preset    the preset itself: its name and direction (PRESETS)
    recipe    how it trains: the preset's recipe, or the one a budget or --recipe names (hmer.recipes)
    budget    a study budget's own keys: epochs, decoding, limits (hmer.studies.budgets)
    study     the study spec's fixed keys, held equal in every cell (a sweep's seed too)
    set       --set KEY=VALUE, and the options that stand for a key (--data, --device, --epochs)
    stored    on resume: the study's stored base config wins (hmer.config.stored_config)
    cell      the grid cell's axis values, what they bring (hmer.registry linked values), its seed

A size or recipe named by a budget or --recipe replaces the preset's own (its keys are not applied
underneath), so every key a recipe sets is that recipe's. This module resolves a preset (the layers
up to the recipe); `hmer.studies.resolution` adds the budget, the study, --set, the stored config
and the cell; `hmer config` prints the result with the layer of each value.

    preset_with_recipe("comer-fusion")             # CoMER fusion, CoMER's recipe (SGD, scale augmentation)
    resolve_preset("tiny", size="cpu", recipe="cpu").sources["model.d_model"]   # 'size cpu'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .config import Config, stored_config
from .recipes import recipe_values

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
            raise ValueError(f"the {layer} layer comes before the {self.last} layer (hmer.presets.LAYERS)")
        source = f"{layer} {name}".rstrip()
        sources = {**self.sources, **{key: source for key in values}}
        return Resolution(self.config.override(dict(values)), sources, layer)

    def take_stored(self, stored: Mapping[str, Any], name: str) -> "Resolution":
        """The `stored` layer: a study's base config stored by the process that began it (flat keys)
        wins over every layer below, as a resumed study runs it (`hmer.config.stored_config`: this
        process's machine keys, `VALUES_BEFORE_KEY_EXISTED` for a key it lacks). A key whose stored
        value is the one resolved keeps its layer."""
        if LAYERS.index("stored") < LAYERS.index(self.last):
            raise ValueError(f"the stored layer comes before the {self.last} layer (hmer.presets.LAYERS)")
        resumed = stored_config(dict(stored), self.config)
        before, after = self.config.to_flat_dict(), resumed.to_flat_dict()
        changed = {key: (f"stored {name}" if key in stored else f"stored {name}, a key it lacks: its value before "
                         f"the key existed") for key in after if after[key] != before[key]}
        return Resolution(resumed, {**self.sources, **changed}, "stored")

    def rows(self) -> list[tuple[str, Any, str]]:
        """(key, value, layer) for every key, in the config's order."""
        return [(key, value, self.sources[key]) for key, value in self.config.to_flat_dict().items()]


def resolve_preset(name: str, *, size: str | None = None, recipe: str | None = None,
                   named_by: str = "") -> Resolution:
    """Preset `name` resolved up to its recipe: the defaults, its family, its size (or `size`), the
    preset (its name and direction), its recipe (or `recipe`). `named_by` says who named another
    size or recipe ("budget cpu", "--recipe"), for the layer's label. A KeyError that lists the
    presets when there is none."""
    from .model import factory

    if name not in factory.PRESETS:
        raise KeyError(f"unknown preset {name!r}; `hmer models` lists them: {', '.join(sorted(factory.PRESETS))}")
    resolution = Resolution()
    for layer, layer_name, fields in factory.preset_layers(name, size):
        values = {f"model.{key}": value for key, value in fields.items()}
        if layer == "preset":
            values["name"] = name
        elif layer == "size" and size and size != factory.PRESETS[name].size and named_by:
            layer_name = f"{layer_name} ({named_by})"
        resolution = resolution.apply(layer, layer_name, values)
    own = factory.PRESETS[name].recipe
    recipe = recipe or own
    label = f"{recipe} ({named_by})" if recipe != own and named_by else recipe
    return resolution.apply("recipe", label, recipe_values(recipe))


def preset_with_recipe(name: str) -> Config:
    """A complete Config: preset `name`'s model, trained with its recipe (`resolve_preset`)."""
    return resolve_preset(name).config
