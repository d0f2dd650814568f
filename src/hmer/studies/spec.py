"""What a study varies: grid specs for the ablations and the search space of the sweep.

A grid study is a `StudySpec`: one or more axes (dotted Config keys and their values;
the first value of each axis is the baseline), a model preset per study preset size,
overrides held equal in every cell, and, where a variant is more than one field, the
fields that come with a value: a registered variant names its own when it registers
(ConvS2S brings its learned token positions; hmer.registry), a spec may add more. The seed is
always one more axis, so every (variant, seed) pair is one grid cell and one trial.

A sweep is a `SweepSpec`: a list of `SweepParam`, each a dotted key with a range that is
absolute or relative to the preset's value (a learning-rate range of x1/8 to x4 means
the same thing for Adadelta at 1.0 and SGD at 0.08).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..registry import linked_overrides

SEED_KEY = "train.seed"


class SearchSpaceError(ValueError):
    """A study's grid or search space reaches a value its config key does not allow (a bug in the spec)."""


@dataclass(frozen=True)
class StudySpec:
    """A grid ablation; see the module docstring.

    Attributes:
        name: the study family and script name, e.g. "ablate_direction".
        description: one line for the banner and the MLflow parent run.
        axes: dotted key -> values; the first value of each axis is the baseline variant.
        model_presets: the model preset per model size of a budget: {"tiny": "tiny", "full": "bttr"}.
        fixed: overrides held equal in every cell (on top of the model preset and the study budget).
        linked: axis key -> value -> overrides that come with that value, on top of those the
            value's registry entry brings (`Registry.register(..., linked=...)`).
        baseline: the baseline cell (axis key -> value); default: the first value of each axis.
    """

    name: str
    description: str
    axes: Mapping[str, Sequence[Any]]
    model_presets: Mapping[str, str]
    fixed: Mapping[str, Any] = field(default_factory=dict)
    linked: Mapping[str, Mapping[Any, Mapping[str, Any]]] = field(default_factory=dict)
    baseline: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.axes:
            raise ValueError(f"study {self.name!r} has no grid axis")
        if SEED_KEY in self.axes:
            raise ValueError(f"{SEED_KEY} is added by the study runner; give seeds with --seeds instead")
        for key, values in self.axes.items():
            if not values or len(set(map(repr, values))) != len(values):
                raise ValueError(f"axis {key!r} of study {self.name!r} needs distinct values, got {values!r}")
        for key, value in self.baseline_cell.items():
            if value not in self.axes[key]:
                raise ValueError(f"baseline {key}={value!r} is not on the axis {list(self.axes[key])!r}")

    @property
    def baseline_cell(self) -> dict[str, Any]:
        """The baseline variant: axis key -> value."""
        if self.baseline is not None:
            return {key: self.baseline[key] for key in self.axes}
        return {key: values[0] for key, values in self.axes.items()}

    def model_preset(self, size: str) -> str:
        """The model preset for a study preset's size ("tiny" or "full")."""
        try:
            return self.model_presets[size]
        except KeyError:
            raise ValueError(f"study {self.name!r} has no model preset of size {size!r}") from None

    def search_space(self, seeds: Sequence[int]) -> dict[str, list[Any]]:
        """The Optuna grid: every axis plus the seed axis."""
        return {**{key: list(values) for key, values in self.axes.items()}, SEED_KEY: [int(s) for s in seeds]}

    def cells(self, seeds: Sequence[int]) -> list[dict[str, Any]]:
        """Every grid cell, seed-major (all variants of the first seed first), baseline first."""
        import itertools

        keys = list(self.axes)
        baseline = tuple(self.baseline_cell[k] for k in keys)
        variants = sorted(itertools.product(*(self.axes[k] for k in keys)), key=lambda v: v != baseline)
        return [{**dict(zip(keys, values)), SEED_KEY: int(seed)} for seed in seeds for values in variants]

    def check_cells(self, base, seeds: Sequence[int]) -> None:
        """Every cell's config is allowed (`base`: the study's base Config); a ValueError naming the
        study, the cell and the key before anything runs. A refused cell is a bug in the spec."""
        for cell in self.cells(seeds):
            try:
                base.override(self.overrides(cell))
            except ValueError as exc:
                raise SearchSpaceError(f"study {self.name!r}: cell {cell_label(cell)} is not a valid config, a bug in "
                                       f"the study's grid: {exc}") from None

    def overrides(self, cell: Mapping[str, Any]) -> dict[str, Any]:
        """The Config overrides of one cell: the fixed ones, its axis values and what they bring."""
        values: dict[str, Any] = dict(self.fixed)
        for key in self.axes:
            values[key] = cell[key]
            values.update(linked_overrides(key, cell[key]))
            values.update(self.linked.get(key, {}).get(cell[key], {}))
        values[SEED_KEY] = int(cell[SEED_KEY])
        return values


def variant_label(cell: Mapping[str, Any]) -> str:
    """The variant of a cell, without the seed: "bi", or "rnn/l2r" for two axes."""
    return "/".join(str(v) for k, v in cell.items() if k != SEED_KEY)


def cell_label(cell: Mapping[str, Any]) -> str:
    """The variant as keys and values, without the seed: "model.direction=bi" (the hmer.cell tag)."""
    return ",".join(f"{k}={v}" for k, v in cell.items() if k != SEED_KEY)


def cell_key(cell: Mapping[str, Any]) -> str:
    """A cell's identity, seed included, stable across processes: '{"model.direction": "bi", ...}'."""
    return json.dumps({k: cell[k] for k in sorted(cell)}, sort_keys=True)


@dataclass(frozen=True)
class SweepParam:
    """One dimension of a sweep.

    A float or int range (`low`, `high`, `log`), or a list of `choices`. With `relative`,
    bounds and choices are multiples of the preset's value of `key`. `scales` names keys
    that move in proportion (the feed-forward width follows the model width). With
    `share_of_training`, the value sampled is a share of the trial's training steps and `key`
    gets that many steps (a warm-up of 1,000 steps is a tenth of one trial and all of another
    when trials train different epochs); Optuna then knows the parameter as `name`.
    """

    key: str
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    integer: bool = False
    choices: tuple[Any, ...] = ()
    relative: bool = False
    scales: tuple[str, ...] = ()
    share_of_training: bool = False

    @property
    def name(self) -> str:
        """The parameter's name in Optuna: the key, or what the sampled share is of."""
        return f"{self.key} (share of training)" if self.share_of_training else self.key

    def distribution(self, base: Mapping[str, Any]):
        """The Optuna distribution of this parameter given the base config's flat values."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        factor = float(base[self.key]) if self.relative else 1.0
        if self.choices:
            values = [c * factor for c in self.choices] if self.relative else list(self.choices)
            if self.integer:
                values = [int(round(v)) for v in values]
            return CategoricalDistribution(values)
        low, high = self.low * factor, self.high * factor
        if self.integer:
            return IntDistribution(int(round(low)), int(round(high)), log=self.log)
        return FloatDistribution(low, high, log=self.log)

    def suggest(self, trial, base: Mapping[str, Any]) -> Any:
        """Ask the Optuna trial for a value, under this parameter's (dotted-key) name."""
        from optuna.distributions import CategoricalDistribution, IntDistribution

        dist = self.distribution(base)
        if isinstance(dist, CategoricalDistribution):
            return trial.suggest_categorical(self.name, list(dist.choices))
        if isinstance(dist, IntDistribution):
            return trial.suggest_int(self.name, dist.low, dist.high, log=dist.log)
        return trial.suggest_float(self.name, dist.low, dist.high, log=dist.log)

    def overrides(self, value: Any, base: Mapping[str, Any], training_steps: int = 0) -> dict[str, Any]:
        """The Config overrides for a sampled `value`, including the keys that scale with it
        (`training_steps`: the trial's, for a share of training)."""
        if self.share_of_training:
            return {self.key: int(round(float(value) * training_steps))}
        values = {self.key: value}
        if self.scales:
            ratio = float(value) / float(base[self.key])
            for key in self.scales:
                scaled = float(base[key]) * ratio
                values[key] = int(round(scaled)) if isinstance(base[key], int) else scaled
        return values


@dataclass(frozen=True)
class SweepSpec:
    """A hyperparameter search with pruning; see the module docstring."""

    name: str
    description: str
    params: tuple[SweepParam, ...]
    model_presets: Mapping[str, str]
    fixed: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 1  # every trial trains with this seed: the sweep varies hyperparameters, not luck

    def model_preset(self, size: str) -> str:
        try:
            return self.model_presets[size]
        except KeyError:
            raise ValueError(f"sweep {self.name!r} has no model preset of size {size!r}") from None

    def sampled_config(self, base, values: Mapping[str, Any], trial: int | str = "?"):
        """`base` (a Config) with a trial's sampled `values`; a value its field does not allow is a
        bug in the search space, and the SearchSpaceError says so."""
        try:
            return base.override(values)
        except ValueError as exc:
            raise SearchSpaceError(f"sweep {self.name!r}, trial {trial}: a sampled value is outside what its key "
                                   f"allows, a bug in the search space: {exc}") from None

    def check_space(self, base) -> None:
        """Both ends of every range (and every choice) of the search space are allowed values of `base`
        (a Config), so no trial can sample one that is not; SearchSpaceError before anything runs."""
        flat = base.to_flat_dict()
        for param in self.params:
            dist = param.distribution(flat)
            ends = list(dist.choices) if hasattr(dist, "choices") else [dist.low, dist.high]
            for value in ends:
                self.sampled_config(base, param.overrides(value, flat), trial=f"(range of {param.key})")


# ---- the studies of the suite ----------------------------------------------------------------

DIRECTION = StudySpec(
    name="ablate_direction",
    description="decoding direction: left-to-right, right-to-left, bidirectional (BTTR)",
    axes={"model.direction": ("l2r", "r2l", "bi")},
    model_presets={"tiny": "tiny", "full": "bttr"},
)

DECODER = StudySpec(
    name="ablate_decoder",
    description="decoder family: GRU with coverage attention (WAP), transformer (BTTR), ConvS2S",
    axes={"model.decoder": ("rnn", "transformer", "convs2s")},
    model_presets={"tiny": "tiny", "full": "bttr"},
    # ConvS2S's learned token positions come with it from its registration (hmer.model.convs2s).
)

COVERAGE = StudySpec(
    name="ablate_coverage",
    description="CoMER attention refinement: no coverage, self, cross, fusion",
    axes={"model.coverage": ("none", "self", "cross", "fusion")},
    model_presets={"tiny": "tiny-comer", "full": "comer-fusion"},
)

POSENC = StudySpec(
    name="ablate_posenc",
    description="image positional encoding: 2-D sinusoidal, learned, CAPE, none",
    axes={"model.image_pos": ("sin2d", "learned", "cape", "none")},
    model_presets={"tiny": "tiny", "full": "bttr"},
)

ENCODER = StudySpec(
    name="ablate_encoder",
    description="where the project's encoder departs from BTTR's code: padding mask, tail order, sinusoids",
    # Baseline: BTTR's code (the `bttr` preset). The other values are the project's choices
    # (kept by the tiny presets) and CoMER's tail, in every combination, since they interact:
    # the tail decides whether positions are added before or after the LayerNorm.
    axes={"model.mask_padding": (False, True), "model.encoder_tail": ("relu-norm-pos", "pos-norm"),
          "model.image_pos": ("sin2d-bttr", "sin2d")},
    model_presets={"tiny": "tiny", "full": "bttr"},
)

ABLATIONS: dict[str, StudySpec] = {s.name: s for s in (DIRECTION, DECODER, COVERAGE, POSENC, ENCODER)}

SWEEP = SweepSpec(
    name="sweep",
    description=("what learns most per CPU-minute: TPE over the learning rate, warm-up, schedule, batch size, "
                 "label smoothing, dropout, rendering height and style, scale and renderer augmentation, "
                 "encoder and decoder width and depth; every trial gets the same training compute (the "
                 "budget's sweep_trial_cpu_minutes) and trains the epochs that fit it"),
    params=(
        SweepParam("train.lr", low=1 / 4, high=4.0, log=True, relative=True),
        SweepParam("train.warmup_steps", low=0.0, high=0.15, share_of_training=True),
        SweepParam("train.schedule", choices=("cosine", "plateau")),
        SweepParam("data.max_batch_size", choices=(8, 16, 32), integer=True, scales=("data.batch_pixels",)),
        SweepParam("train.label_smoothing", low=0.0, high=0.2),
        SweepParam("model.dropout", low=0.0, high=0.3),
        SweepParam("model.encoder_dropout", low=0.0, high=0.2),
        SweepParam("data.render_height", choices=(48, 64, 80), integer=True),
        SweepParam("data.scale_aug_max", choices=(0.0, 1.4)),
        SweepParam("data.render_style", choices=("direct", "standard-like")),
        SweepParam("data.aug_share", low=0.0, high=1.0),
        SweepParam("model.growth_rate", choices=(8, 12, 16), integer=True),
        SweepParam("model.num_dense_layers", choices=(3, 4, 6), integer=True),
        SweepParam("model.d_model", choices=(0.75, 1.0, 1.5), relative=True, integer=True,
                   scales=("model.dim_feedforward",)),
        SweepParam("model.num_decoder_layers", choices=(1, 2, 3), integer=True),
    ),
    model_presets={"tiny": "tiny", "full": "bttr"},
    # Scale augmentation, when a trial turns it on, is CoMER's range x0.7 .. x1.4. Renderer
    # augmentation redraws `data.aug_share` of the training images with one recipe of moderate
    # distortions (docs/data.md measures each; antialiasing, the costly one, is left to downscaling,
    # which gives the same grey edges). Validation is also drawn standard-like and the objective
    # reads both (sweeps.sweep_objective). No test year is decoded: a sweep selects on validation
    # only, and its winner is trained again by the studies.
    fixed={"data.scale_aug_min": 0.7, "data.test_years": "", "data.val_alt": "standard-like",
           "data.aug_width_min": 0.5, "data.aug_width_max": 1.5, "data.aug_pressure": 0.3,
           "data.aug_downscale": 0.5, "data.aug_blur": 0.8, "data.aug_slant": 8.0, "data.aug_rotate": 3.0,
           "data.aug_jitter": 0.5, "data.aug_elastic": 1.5},
)
