"""Experiment presets: a model preset from the factory plus the recipe its paper used.

`experiment_config("comer-fusion")` is the CoMER fusion model with the CoMER recipe
(SGD 0.08, momentum 0.9, scale augmentation x0.7 to x1.4); the BTTR, WAP and ConvS2S
families train with the BTTR recipe (Adadelta 1.0). Every field remains overridable.
"""

from __future__ import annotations

from dataclasses import fields

from .config import Config, ModelConfig
from .training.recipes import apply_recipe


def model_config(name: str) -> ModelConfig:
    """The factory's preset `name` as a ModelConfig."""
    from .model import factory

    presets = factory.PRESETS
    if name not in presets:
        raise KeyError(f"unknown preset {name!r}; `hmer models` lists them: {', '.join(sorted(presets))}")
    preset = presets[name]
    if isinstance(preset, ModelConfig):
        return preset
    if hasattr(factory, "preset_config"):
        return factory.preset_config(name)
    known = {f.name for f in fields(ModelConfig)}
    values = {k.removeprefix("model."): v for k, v in dict(preset).items()}
    return Config().override({f"model.{k}": v for k, v in values.items() if k in known}).model


def experiment_config(name: str) -> Config:
    """A complete Config for the preset, with its paper's recipe."""
    cfg = Config(model=model_config(name), name=name)
    if name.startswith("comer"):
        cfg = apply_recipe(cfg, "comer").override({"data.scale_aug_min": 0.7, "data.scale_aug_max": 1.4})
    else:
        cfg = apply_recipe(cfg, "bttr")
    return cfg.validate()
