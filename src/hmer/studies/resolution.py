"""What a study's cell trains with: its config resolved layer by layer (`hmer.presets.LAYERS`).

The preset's layers (`hmer.presets.resolve_preset`: defaults, family, size, preset, recipe), with
the size and recipe a budget names in place of the preset's own, then the budget's own keys, the
spec's fixed keys, `--set`, the study's stored base config when it is resumed, and the cell:

    base = study_resolution(DIRECTION, get_budget("cpu"), n_trials=9, n_jobs=2)
    cell = cell_resolution(base, DIRECTION, {"model.direction": "bi", "train.seed": 1})
    cell.sources["model.d_model"]        # 'size cpu (budget cpu)'

A study's session runs `base_config` (what its first worker stores), and each trial the cell on
top of the base it resumed (`Grid`, `Sweep`); `hmer config` prints the same resolution.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ..config import Config, check_value
from ..presets import Resolution, resolve_preset
from .budgets import StudyBudget
from .spec import SEED_KEY, StudySpec, SweepSpec, cell_label


def budget_resolution(preset: str, budget: StudyBudget, n_trials: int = 1, n_jobs: int = 1) -> Resolution:
    """Preset `preset` under `budget`: at the budget's size and with its recipe where it names them,
    then the budget's own keys (with the time a trial may train, for `n_trials` on `n_jobs`
    workers, where the budget has a window; one trial on one worker gets all of it)."""
    resolution = resolve_preset(preset, size=budget.size, recipe=budget.recipe, named_by=f"budget {budget.name}")
    return resolution.apply("budget", budget.name, budget.config_overrides(n_trials, n_jobs))


def study_resolution(spec: StudySpec | SweepSpec, budget: StudyBudget, *, n_trials: int, n_jobs: int,
                     overrides: Mapping[str, Any] | None = None, data_path: str | None = None) -> Resolution:
    """The config every cell of `spec` starts from, before a stored one: the spec's model preset of
    the budget's preset size under the budget, the spec's fixed keys (and a sweep's one seed), then
    `overrides` (--set) and `data_path` (--data)."""
    resolution = budget_resolution(spec.model_preset(budget.preset_size), budget, n_trials, n_jobs)
    fixed = dict(spec.fixed)
    if isinstance(spec, SweepSpec):
        fixed[SEED_KEY] = spec.seed  # a sweep varies hyperparameters, not luck
    resolution = resolution.apply("study", spec.name, fixed)
    values = dict(overrides or {})
    if data_path:
        values["data.path"] = str(data_path)
    return resolution.apply("set", "--set", values)


def base_config(spec: StudySpec | SweepSpec, budget: StudyBudget, *, n_trials: int, n_jobs: int,
                overrides: Mapping[str, Any] | None = None, data_path: str | None = None) -> Config:
    """The config a new study of `spec` records and every cell starts from (`study_resolution`)."""
    return study_resolution(spec, budget, n_trials=n_trials, n_jobs=n_jobs, overrides=overrides,
                            data_path=data_path).config


def cell_resolution(base: Resolution, spec: StudySpec, cell: Mapping[str, Any]) -> Resolution:
    """Grid cell `cell` (axis key -> value, and its seed) on `base`: its axis values, what they bring
    (`StudySpec.overrides`) and its seed."""
    return base.apply("cell", f"{cell_label(cell)}, seed {cell[SEED_KEY]}", spec.overrides(cell))


def sweep_trial_values(spec: SweepSpec, base: Config, given: Mapping[str, Any]) -> dict[str, Any]:
    """A sweep trial's keys from what it drew (`given`): a parameter's key with its sampled value
    brings the keys that scale with it (`SweepParam.overrides`); a share-of-training parameter's key
    takes its steps, and `train.epochs` the epochs the trial fitted to its compute, as they are."""
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
    """The grid cell of `spec` that `given` (axis key -> value as text; an axis left out takes the
    baseline's value) and `seed` name; a KeyError or ValueError naming the axis and its values."""
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
    """The base config study `study_name` stored when it began (flat keys), or None when the storage
    holds no such study; read only: a SQLite file that does not exist is not created. A ValueError
    when the study there is of another spec."""
    if storage_url.startswith("sqlite:///") and not Path(storage_url[len("sqlite:///"):]).is_file():
        return None
    from ..tracking import keys
    from .storage import open_storage

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
