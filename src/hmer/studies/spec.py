"""What a study varies: grid specs for the ablations and the search space of the sweep.

A grid study is a `StudySpec`: axes (dotted Config keys and their values, the first the baseline), a
model preset per budget size, overrides held equal in every cell, and the fields that come with a
value (a registered variant names its own, hmer.registry; a spec may add more). The seed is one more
axis: every (variant, seed) pair is one cell and one trial. A sweep is a `SweepSpec` of `SweepParam`s,
each a key with a range absolute or relative to the preset's value (x1/8 to x4 means the same for
Adadelta at 1.0 and SGD at 0.08). Each study is one module of `hmer.studies.suite`, registered in
`STUDIES` (docs/studies.md, "Add a study in one file").
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from ..registry import Registry, linked_overrides

SEED_KEY = "train.seed"
# A study's name names an MLflow experiment, an Optuna study and a folder of the store (`artifacts/<study>/`).
STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def check_study_name(name: str) -> str:
    """`name` if a study may be called so (`STUDY_NAME`), else a one-line ValueError."""
    if not STUDY_NAME.fullmatch(name):
        raise ValueError(f"study name {name!r}: a study's name is 1-100 letters, digits, '_', '.' or '-', starting "
                         f"with a letter or digit (it names an MLflow experiment and a folder of the store)")
    return name


class SearchSpaceError(ValueError):
    """A study's grid or space reaches a value its config key does not allow (a bug in the spec)."""


@dataclass(frozen=True)
class StudySpec:
    """A grid ablation; see the module docstring."""

    name: str  # the study and script name, e.g. "ablate_direction"
    description: str  # one line
    axes: Mapping[str, Sequence[Any]]  # dotted key -> values; the first value of each axis is the baseline
    model_presets: Mapping[str, str]  # the preset per budget size: {"tiny": "tiny-transformer", "full": "bttr"}
    fixed: Mapping[str, Any] = field(default_factory=dict)  # overrides held equal in every cell
    # axis key -> value -> the overrides that come with it, besides its registry entry's
    linked: Mapping[str, Mapping[Any, Mapping[str, Any]]] = field(default_factory=dict)
    baseline: Mapping[str, Any] | None = None  # the baseline cell; default the first value of each axis
    # the `variant_label`s trained, the baseline among them; default all (`--variants`)
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

    def search_space(self, seeds: Sequence[int], variants: Sequence[str] | None = None) -> dict[str, list[Any]]:
        """The Optuna grid: every axis (only `variants`' values, where given) and the seed axis."""
        chosen = self.variant_cells(variants)
        return {**{key: [v for v in values if any(c[key] == v for c in chosen)] for key, values in self.axes.items()},
                SEED_KEY: [int(s) for s in seeds]}

    def variant_cells(self, variants: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """The variants without the seed, baseline first: all, or those of `variants` in their order. A
        ValueError names one the grid lacks, or a choice without the baseline (the paired comparisons need it)."""
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
        """Every cell (of `variants`, where given), seed-major, baseline first."""
        return [{**cell, SEED_KEY: int(seed)} for seed in seeds for cell in self.variant_cells(variants)]

    def overrides(self, cell: Mapping[str, Any]) -> dict[str, Any]:
        """A cell's Config overrides: its axis values and what they bring. The fixed keys are the study's
        layer, below `--set`, so that a `--set` of one holds in every cell."""
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
    """A cell's identity, seed included, stable across processes (sorted JSON)."""
    return json.dumps({k: cell[k] for k in sorted(cell)}, sort_keys=True)


@dataclass(frozen=True)
class SweepParam:
    """One dimension of a sweep: a float or int range (`low`, `high`, `log`) or `choices`, multiples of the
    preset's value with `relative`. `scales`: keys moving in proportion (the FFN width with the model's).
    With `share_of_training`, the sampled share of the trial's training steps gives `key` its steps
    (1,000 warm-up steps are a tenth of one trial, all of another); Optuna knows it as `name`."""

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
        """The parameter's name in Optuna."""
        return f"{self.key} (share of training)" if self.share_of_training else self.key

    def distribution(self, base: Mapping[str, Any]):
        """The Optuna distribution given the base config's flat values."""
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
        """Ask the Optuna trial for a value, under this parameter's name."""
        dist = self.distribution(base)
        if isinstance(dist, CategoricalDistribution):
            return trial.suggest_categorical(self.name, list(dist.choices))
        if isinstance(dist, IntDistribution):
            return trial.suggest_int(self.name, dist.low, dist.high, log=dist.log)
        return trial.suggest_float(self.name, dist.low, dist.high, log=dist.log)

    def overrides(self, value: Any, base: Mapping[str, Any], training_steps: int = 0) -> dict[str, Any]:
        """The overrides for a sampled `value`, the keys that scale with it included."""
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


# ---- every study of the suite, by name ----------------------------------------------------------------

STUDIES: Registry[StudySpec | SweepSpec] = Registry("study", home=".studies.suite")
"""Every study by its name ("ablate_direction", "sweep"): each module of `hmer.studies.suite` registers
its spec here, and the package imports them all at the first lookup (`hmer.registry`)."""


def preset_of(spec: StudySpec | SweepSpec, size: str) -> str:
    """The model preset of `spec` for a budget's preset size."""
    try:
        return spec.model_presets[size]
    except KeyError:
        raise ValueError(f"study {spec.name!r} has no model preset of size {size!r}") from None


def ablations() -> dict[str, StudySpec]:
    """The grid studies by name, in registration order."""
    return {name: spec for name in STUDIES for spec in [STUDIES.get(name)] if isinstance(spec, StudySpec)}
