"""The reference papers' optimisation recipes as config values (`train.recipe`).

A recipe only fills the optimiser fields of `TrainConfig`; every field stays overridable, so
`--set train.recipe=comer train.lr=0.04` is a CoMER run at half the learning rate. What the
fields build (optimisers, schedules) is `hmer.training.optim`.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, TypeVar

C = TypeVar("C", bound="Overridable")


class Overridable(Protocol):
    """What a recipe is applied to: `hmer.config.Config`. Not imported here, since config.py reads
    the recipe names from this module (the foundation has no import cycle)."""

    def override(self: C, values: Mapping[str, Any]) -> C: ...

RECIPES: dict[str, dict[str, Any]] = {
    "bttr": {"train.optimizer": "adadelta", "train.lr": 1.0, "train.rho": 0.9, "train.eps": 1e-6,
             "train.weight_decay": 1e-4},
    "comer": {"train.optimizer": "sgd", "train.lr": 0.08, "train.momentum": 0.9,
              "train.weight_decay": 1e-4},
}


def apply_recipe(cfg: C, recipe: str) -> C:
    """A copy of `cfg` with the recipe's optimiser fields, and train.recipe set."""
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; known: {', '.join(RECIPES)}")
    return cfg.override({**RECIPES[recipe], "train.recipe": recipe})
