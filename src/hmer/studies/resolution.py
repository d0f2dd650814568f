"""What a study's cell trains with: its config built layer by layer (`hmer.model_presets.LAYERS`), once.

The one builder of a study's configs (the session trains it, `hmer config` prints it with the layer
of each value): the study's base (`study_resolution`), a resumed study's stored base on top
(`Resolution.take_stored`), then the cell (`cell_resolution`):
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from ..config import Config, check_value
from ..model_presets import Resolution, resolve_preset
from ..tracking import keys
from .budgets import StudyBudget
from .spec import SEED_KEY, SearchSpaceError, StudySpec, SweepSpec, cell_label, preset_of
from .storage import open_storage


def budget_resolution(preset: str, budget: StudyBudget, n_trials: int = 1, n_jobs: int = 1) -> Resolution:
    """Preset `preset` under `budget`: its size and recipe where named, then its keys (with a trial's time,
    for `n_trials` on `n_jobs` workers, where it has a window)."""
    resolution = resolve_preset(preset, size=budget.size, recipe=budget.recipe, named_by=f"budget {budget.name}")
    return resolution.apply("budget", budget.name, budget.config_overrides(n_trials, n_jobs))


def study_resolution(spec: StudySpec | SweepSpec, budget: StudyBudget, *, n_trials: int, n_jobs: int,
                     overrides: Mapping[str, Any] | None = None, data_path: str | None = None) -> Resolution:
    """The config every cell of `spec` starts from: the spec's preset under the budget, its fixed keys (and
    a sweep's seed), then `overrides` (--set) and `data_path` (--data)."""
    resolution = budget_resolution(preset_of(spec, budget.preset_size), budget, n_trials, n_jobs)
    fixed = dict(spec.fixed)
    if isinstance(spec, SweepSpec):
        fixed[SEED_KEY] = spec.seed  # a sweep varies hyperparameters, not luck
    resolution = resolution.apply("study", spec.name, fixed)
    values = dict(overrides or {})
    if data_path:
        values["data.path"] = str(data_path)
    return resolution.apply("set", "--set", values)


def cell_resolution(base: Resolution, spec: StudySpec | SweepSpec, cell: Mapping[str, Any],
                    name: str = "trial") -> Resolution:
    """The config a cell of `spec` trains on `base`: a grid cell's axis values, what they bring and its seed,
    or a sweep trial's drawn values (`name` its trial). A config they do not allow is a bug in the
    study's grid or space: SearchSpaceError."""
    space = "search space"
    if isinstance(spec, StudySpec):
        name, space = f"{cell_label(cell)}, seed {cell[SEED_KEY]}", "grid"
    try:
        values = spec.overrides(cell) if isinstance(spec, StudySpec) else sweep_trial_values(spec, base.config, cell)
        return base.apply("cell", name, values)
    except ValueError as exc:
        raise SearchSpaceError(f"study {spec.name!r}: cell {name} is not a valid config, a bug in the study's "
                               f"{space}: {exc}") from None


def check_cells(base: Resolution, spec: StudySpec | SweepSpec, cells: Sequence[Mapping[str, Any]]) -> None:
    """A SearchSpaceError before anything runs where a cell of `cells` builds no allowed config: a grid's
    cells, or a sweep's `range_ends`."""
    for cell in cells:
        cell_resolution(base, spec, cell, name=cell_label(cell))


def range_ends(spec: SweepSpec, base: Config) -> list[dict[str, Any]]:
    """A cell for each end of each range of the sweep's space and each choice (not the shares of training)."""
    flat = base.to_flat_dict()
    cells = []
    for param in spec.params:
        if param.share_of_training:
            continue
        dist = param.distribution(flat)
        cells += [{param.key: value} for value in (list(dist.choices) if hasattr(dist, "choices") else
                                                   [dist.low, dist.high])]
    return cells


def sweep_trial_values(spec: SweepSpec, base: Config, given: Mapping[str, Any]) -> dict[str, Any]:
    """A sweep trial's keys from what it drew: a parameter's value with the keys that scale with it; a
    share of training's steps and `train.epochs` as they are."""
    flat = base.to_flat_dict()
    params = {param.key: param for param in spec.params}
    values: dict[str, Any] = {}
    for key, value in given.items():
        param = params.get(key)
        if param is None and key != "train.epochs":
            raise KeyError(f"{key} is not a parameter of sweep {spec.name!r}: give one of "
                           f"{', '.join([*params, 'train.epochs'])}")
        if param is None or param.share_of_training:
            values[key] = value
        else:
            values.update(param.overrides(check_value(key, value), flat))
    return values


def pick_cell(spec: StudySpec, given: Mapping[str, str], seed: int) -> dict[str, Any]:
    """The cell of `spec` that `given` (axis -> value as text; a missing axis takes the baseline's) and
    `seed` name; a KeyError or ValueError naming the axis and its values."""
    for key in given:
        if key not in spec.axes:
            raise KeyError(f"{key} is not an axis of study {spec.name!r}; its axes: {', '.join(spec.axes)}")
    cell: dict[str, Any] = {}
    for key, values in spec.axes.items():
        if key not in given:
            cell[key] = spec.baseline_cell[key]
            continue
        wanted = check_value(key, given[key])
        if wanted not in values:
            raise ValueError(f"{key}={given[key]} is not on the axis of study {spec.name!r}: "
                             f"{', '.join(map(str, values))}")
        cell[key] = next(value for value in values if value == wanted)
    cell[SEED_KEY] = int(seed)
    return cell


def stored_base(storage_url: str, study_name: str, spec_name: str) -> dict[str, Any] | None:
    """The base config study `study_name` stored (flat keys), or None where there is none; read only. A
    ValueError when the study is of another spec."""
    if storage_url.startswith("sqlite:///") and not Path(storage_url[len("sqlite:///"):]).is_file():
        return None
    storage = open_storage(storage_url)
    try:
        study_id = storage.get_study_id_from_name(study_name)
    except KeyError:
        return None
    spec = storage.get_study_user_attrs(study_id).get(keys.SPEC)
    if spec != spec_name:
        raise ValueError(f"study {study_name!r} is of spec {spec!r}, not {spec_name!r}; choose its --study-name")
    stored = storage.get_study_system_attrs(study_id).get(keys.CONFIG)
    return dict(stored) if stored is not None else None
