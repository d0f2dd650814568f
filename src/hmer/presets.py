"""Presets with their recipes: what `hmer train --preset NAME` starts from.

Two words, two things. A **preset** is a named model, one of `hmer models` (the factory's
`PRESETS`): the ModelConfig of one of the papers' models, or a tiny or small one for a CPU.
A **recipe** is how a model is optimised (`hmer.recipes`: `bttr`, `comer`). A preset
trains with the recipe of its paper unless told otherwise:

    preset_with_recipe("comer-fusion")   # CoMER fusion, CoMER recipe (SGD 0.08, momentum 0.9,
                                         # scale augmentation x0.7 to x1.4)
    preset_with_recipe("wap-rnn")        # every other family: the BTTR recipe (Adadelta 1.0)

Every field of the result remains overridable (`--recipe`, `--set`).
"""

from __future__ import annotations

from .config import Config, ModelConfig
from .recipes import apply_recipe


def model_config(name: str) -> ModelConfig:
    """The model preset `name` as a ModelConfig; a KeyError that lists the presets when there is none."""
    from .model import factory

    if name not in factory.PRESETS:
        raise KeyError(f"unknown preset {name!r}; `hmer models` lists them: {', '.join(sorted(factory.PRESETS))}")
    return factory.preset_config(name)


def recipe_of(name: str) -> str:
    """The recipe preset `name` trains with: its paper's (CoMER's for `comer*`, else BTTR's)."""
    return "comer" if name.startswith("comer") else "bttr"


def preset_with_recipe(name: str) -> Config:
    """A complete Config: preset `name`'s model, trained with its paper's recipe."""
    cfg = Config(model=model_config(name), name=name)
    recipe = recipe_of(name)
    cfg = apply_recipe(cfg, recipe)
    if recipe == "comer":
        cfg = cfg.override({"data.scale_aug_min": 0.7, "data.scale_aug_max": 1.4})
    return cfg.validate()

