"""Opening a study: created under the command's config, or resumed under the one it began with.

A new study records its kind, spec, budget, grid or space, and its base config. An existing study is
resumed under its stored base config, so every trial trains under one config whatever changed in the
code; a command asking for something else is refused before anything runs (docs/studies.md, "Resume").
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Callable, Collection, Mapping

import optuna

from ..config import MACHINE_KEYS
from ..model_presets import Resolution
from ..tracking import keys


def asked_keys(fixed: Mapping[str, Any], overrides: Mapping[str, Any] | None, more: Collection[str] = ()) -> set[str]:
    """The config keys a study's command sets by value: the spec's fixed ones (and `more`) and `--set`;
    the rest comes from the code and may have changed since the study began."""
    return (set(fixed) | set(overrides or {}) | set(more)) - set(MACHINE_KEYS)


# The study attributes a resumed study must have as the command asks, and what they are in words.
CHECKED_ATTRS = {keys.SPEC: "spec", keys.BUDGET: "budget", keys.GRID: "grid", keys.SPACE: "search space"}


def open_study(name: str, storage: optuna.storages.BaseStorage, *, kind: str, sampler: optuna.samplers.BaseSampler,
               pruner: optuna.pruners.BasePruner, attrs: Mapping[str, Any], base: Resolution,
               asked: Collection[str] = (), objective_name: str = "") -> tuple[optuna.Study, Resolution, bool]:
    """Create the study (recording `attrs`, its objective's name and the base config), or load it: the
    stored base config wins (`Resolution.take_stored`), and a command that asks for another kind, spec,
    budget or space (`attrs`) or another value of an `asked` key is refused. Returns the study, the base
    config every trial uses and whether this call created the study."""
    try:
        study = optuna.create_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner,
                                    direction="maximize")
        created = True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)
        created = False
    study_id = storage.get_study_id_from_name(name)
    flat = base.config.to_flat_dict()

    def record() -> None:
        for key, value in attrs.items():
            study.set_user_attr(key, value)
        study.set_user_attr(keys.KIND, kind)
        if objective_name:
            name_objective(study, objective_name)
        storage.set_study_system_attr(study_id, keys.CONFIG, flat)

    if created:
        record()
        return study, base, True
    stored = wait_for_attr(lambda: storage.get_study_system_attrs(study_id), keys.CONFIG, timeout_s=60.0)
    if stored is None:  # its creator died before recording it: this worker records it now
        record()
        return study, base, False
    if study.user_attrs.get(keys.KIND, kind) != kind:
        raise ValueError(f"study {name!r} is a {study.user_attrs[keys.KIND]} study, not a {kind}; "
                         f"choose another --study-name")
    for key, word in CHECKED_ATTRS.items():
        if key in attrs and study.user_attrs.get(key) != attrs[key]:
            raise ValueError(f"study {name!r} exists with {word} {study.user_attrs.get(key)!r}, "
                             f"but this command asks for {attrs[key]!r}; use the same options to resume "
                             f"it, or another --study-name for a new study")
    resumed = base.take_stored(stored, name)
    kept = resumed.config.to_flat_dict()
    differences = [f"{k}: study {kept.get(k)!r}, now {flat.get(k)!r}" for k in sorted(asked)
                   if kept.get(k) != flat.get(k)]
    if differences:
        raise ValueError(f"study {name!r} exists with other settings ({'; '.join(differences[:6])}); "
                         f"use the same options to resume it, or another --study-name for a new study")
    return study, resumed, False


def name_objective(study: optuna.Study, name: str) -> None:
    """`study.set_metric_names([name])` (experimental, stable since 3.2): the objective's name in
    optuna-dashboard."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([name])


def wait_for_attr(read: Callable[[], Mapping[str, Any]], key: str, timeout_s: float) -> Any:
    """A study attribute another worker is about to set; `read` reads them afresh on every call."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = read().get(key)
        if value is not None or time.monotonic() > deadline:
            return value
        time.sleep(0.5)
