"""What a study varies: grid specs for the ablations and the search space of the sweep.

A grid study is a `StudySpec`: one or more axes (dotted Config keys and their values;
the first value of each axis is the baseline), a model preset per preset size of a budget,
overrides held equal in every cell, and, where a variant is more than one field, the
fields that come with a value: a registered variant names its own when it registers
(ConvS2S brings its learned token positions; hmer.registry), a spec may add more. The seed is
always one more axis, so every (variant, seed) pair is one grid cell and one trial.

A sweep is a `SweepSpec`: a list of `SweepParam`, each a dotted key with a range that is
absolute or relative to the preset's value (a learning-rate range of x1/8 to x4 means
the same thing for Adadelta at 1.0 and SGD at 0.08).

The studies themselves are not here: each is one module of `hmer.studies.suite`, which holds its
spec and registers it in `STUDIES` under its name (docs/studies.md, "Add a study in one file").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..registry import Registry, linked_overrides

SEED_KEY = "train.seed"
# What a study's name may hold: it names an MLflow experiment, an Optuna study and a folder of the store's
# artifacts (`artifacts/<study>/`), so letters, digits and `_ . -`, starting with a letter or digit.
STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def check_study_name(name: str) -> str:
    """`name` if a study may be called so (`STUDY_NAME`); a ValueError in one line saying what a name holds."""
    if not STUDY_NAME.fullmatch(name):
        raise ValueError(f"study name {name!r}: a study's name is 1-100 letters, digits, '_', '.' or '-', starting "
                         f"with a letter or digit (it names an MLflow experiment and a folder of the store)")
    return name


class SearchSpaceError(ValueError):
    """A study's grid or search space reaches a value its config key does not allow (a bug in the spec)."""


@dataclass(frozen=True)
class StudySpec:
    """A grid ablation; see the module docstring.

    Attributes:
        name: the study family and script name, e.g. "ablate_direction".
        description: one line for the banner and the MLflow parent run.
        axes: dotted key -> values; the first value of each axis is the baseline variant.
        model_presets: the model preset per model size of a budget: {"tiny": "tiny-transformer", "full": "bttr"}.
        fixed: overrides held equal in every cell (on top of the model preset and the study budget).
        linked: axis key -> value -> overrides that come with that value, on top of those the
            value's registry entry brings (`Registry.register(..., linked=...)`).
        baseline: the baseline cell (axis key -> value); default: the first value of each axis.
        variants: the variants the study trains (`variant_label`s, the baseline among them), where it
            trains part of its grid; default every one. `--variants` replaces them.
    """

    name: str
    description: str
    axes: Mapping[str, Sequence[Any]]
    model_presets: Mapping[str, str]
    fixed: Mapping[str, Any] = field(default_factory=dict)
    linked: Mapping[str, Mapping[Any, Mapping[str, Any]]] = field(default_factory=dict)
    baseline: Mapping[str, Any] | None = None
    variants: tuple[str, ...] | None = None

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
        if self.variants is not None:
            self.variant_cells(self.variants)  # every one on the grid, the baseline among them

    @property
    def baseline_cell(self) -> dict[str, Any]:
        """The baseline variant: axis key -> value."""
        if self.baseline is not None:
            return {key: self.baseline[key] for key in self.axes}
        return {key: values[0] for key, values in self.axes.items()}

    def model_preset(self, size: str) -> str:
        """The model preset for a budget's preset size ("tiny" or "full")."""
        try:
            return self.model_presets[size]
        except KeyError:
            raise ValueError(f"study {self.name!r} has no model preset of size {size!r}") from None

    def search_space(self, seeds: Sequence[int], variants: Sequence[str] | None = None) -> dict[str, list[Any]]:
        """The Optuna grid: every axis (the values of `variants` only, where given) plus the seed axis."""
        chosen = self.variant_cells(variants)
        return {**{key: [v for v in values if any(c[key] == v for c in chosen)] for key, values in self.axes.items()},
                SEED_KEY: [int(s) for s in seeds]}

    def variant_cells(self, variants: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """The grid's variants without the seed, baseline first: every one, or those named in
        `variants` (`variant_label`s), in their order. A ValueError names a variant the grid lacks,
        or a choice without the baseline, which every paired comparison of the study's table needs."""
        import itertools

        keys = list(self.axes)
        baseline = tuple(self.baseline_cell[k] for k in keys)
        every = [dict(zip(keys, values)) for values in
                 sorted(itertools.product(*(self.axes[k] for k in keys)), key=lambda v: v != baseline)]
        if not variants:
            return every
        labels = [variant_label(cell) for cell in every]
        unknown = [v for v in variants if v not in labels]
        if unknown:
            raise ValueError(f"study {self.name!r} has no variant {unknown[0]!r}; its variants: {', '.join(labels)}")
        if labels[0] not in variants:
            raise ValueError(f"study {self.name!r}: the variants {', '.join(variants)} leave out the baseline "
                             f"{labels[0]!r}, which the study's paired comparisons need")
        by_label = dict(zip(labels, every))
        return [every[0], *(by_label[v] for v in dict.fromkeys(variants) if v != labels[0])]

    def cells(self, seeds: Sequence[int], variants: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Every grid cell (of `variants` only, where given), seed-major (all variants of the first
        seed first), baseline first."""
        return [{**cell, SEED_KEY: int(seed)} for seed in seeds for cell in self.variant_cells(variants)]

    def overrides(self, cell: Mapping[str, Any]) -> dict[str, Any]:
        """The Config overrides of one cell: its axis values and what they bring. The fixed ones are the
        study's layer, below `--set`, so that a `--set` of a fixed key holds in every cell."""
        values: dict[str, Any] = {}
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


# ---- every study of the suite, by name ----------------------------------------------------------------

STUDIES: Registry[StudySpec | SweepSpec] = Registry("study", home=".studies.suite")
"""Every study by its name ("ablate_direction", "sweep"): each module of `hmer.studies.suite` registers
its spec here, and the package imports them all at the first lookup (`hmer.registry`)."""


def ablations() -> dict[str, StudySpec]:
    """The grid studies by name, in registration order (the suite's modules alphabetically)."""
    return {name: spec for name in STUDIES for spec in [STUDIES.get(name)] if isinstance(spec, StudySpec)}
