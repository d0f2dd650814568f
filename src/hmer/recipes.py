"""How a model is trained, by name: the recipes a preset states and a budget names (`hmer.model_presets`).

A recipe owns every key it sets (optimiser, schedule and, where it has them, regularisation and the data
pipeline's training-time choices) and is one config layer: a budget's or `--recipe`'s replaces the
preset's whole; every key stays overridable. What each recipe is: docs/training.md, "Recipes".

Plain values, importing nothing of the suite: `hmer.config` reads the labels from here.
"""

from __future__ import annotations

from typing import Any

# Renderer augmentation as the sweep trains it (`data.aug_share` of the training images redrawn):
# one recipe of moderate distortions, each measured in docs/data.md. Antialiasing, the costly one,
# is left to downscaling, which gives the same grey edges. The sweep holds it fixed and varies the
# share (hmer.studies.suite.sweep); the `swept` recipe takes it with its best trial's share.
RENDERER_AUGMENTATION: dict[str, Any] = {
    "data.aug_width_min": 0.5, "data.aug_width_max": 1.5, "data.aug_pressure": 0.3, "data.aug_downscale": 0.5,
    "data.aug_blur": 0.8, "data.aug_slant": 8.0, "data.aug_rotate": 3.0, "data.aug_jitter": 0.5,
    "data.aug_elastic": 1.5,
}

RECIPES: dict[str, dict[str, Any]] = {
    "bttr": {"train.recipe": "bttr", "train.optimizer": "adadelta", "train.lr": 1.0, "train.rho": 0.9,
             "train.eps": 1e-6, "train.weight_decay": 1e-4},
    "comer": {"train.recipe": "comer", "train.optimizer": "sgd", "train.lr": 0.08, "train.momentum": 0.9,
              "train.weight_decay": 1e-4, "data.scale_aug_min": 0.7, "data.scale_aug_max": 1.4},
    # Sweep trial 25's choices, with two changes measured by the pilots of experiment cpu-budget-pilot:
    # cosine decay to 1e-5 (at fixed epochs it read 2.3 points more on 2014 than the sweep's constant
    # rate), and a warm-up of the trial's share of the steps of the `cpu` budget's 13 epochs. Its
    # model shape is the `swept` size (hmer.model_presets.SIZES).
    "swept": {
        # `train.recipe` names the papers' recipes only; every config this one trained stores `custom`
        # (a study's cell is compared with the store's runs field for field: hmer.studies.objective.find_trained)
        "train.recipe": "custom", "train.optimizer": "adamw", "train.lr": 6.5e-4, "train.weight_decay": 0.01,
        "train.eps": 1e-8, "train.label_smoothing": 0.173, "train.warmup_steps": 163,
        "train.schedule": "cosine", "train.min_lr": 1e-5,
        "model.dropout": 0.046, "model.encoder_dropout": 0.145,
        "data.render_height": 48, "data.render_style": "standard-like",
        "data.max_batch_size": 8, "data.batch_pixels": 160000,
        "data.scale_aug_min": 0.7, "data.scale_aug_max": 1.4,
        "data.aug_share": 0.144, **RENDERER_AUGMENTATION,
    },
}


def recipe_labels() -> tuple[str, ...]:
    """What `train.recipe` may hold: the labels the recipes write, and `custom` for any other."""
    return tuple(dict.fromkeys([*(recipe["train.recipe"] for recipe in RECIPES.values()), "custom"]))


def recipe_values(name: str) -> dict[str, Any]:
    """The keys recipe `name` sets; a ValueError that lists the recipes when there is none."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; known: {', '.join(RECIPES)}")
    return dict(RECIPES[name])
