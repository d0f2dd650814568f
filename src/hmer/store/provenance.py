"""What trained a run, in one place: `hmer runs show RUN`.

    shown = run_provenance(client, storage, run_id)   # a Provenance; shown.lines() is what the command prints

A run's stored config (`config.json`) is rebuilt through today's layers (hmer.presets.LAYERS) from
what the store records about it:

- a study's trial run: its study's spec and budget (Optuna user attributes), the study's stored
  base config as a resume takes it, and its cell (the `hmer.cell` and `hmer.seed` tags; a sweep
  trial's drawn values, fitted epochs and warm-up steps);
- a run of `hmer train`: the command that trained it, where it is written down
  (`config_history.TRAIN_COMMANDS`), else its preset alone.

Each value is shown with the layer that set it, as `hmer config` shows it, and the values where the
run trained otherwise than today's layers give are named, with the reason where it is written down
(`config_history`). Beside them: the study, cell, seed and commit, how far it trained (epochs,
CPU-hours, the CPU cost an epoch lately and what is left at it, validation ExpRate so far: a run that
spans sessions), the training-code fingerprint against today's (hmer.training.fingerprint), the
scores per year, and where the weights and predictions are. `tests/test_config_replay.py` holds
every committed run to this rebuild.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..config import Config, stored_config
from ..presets import Resolution, resolve_preset
from ..reports.markup import measures
from ..studies.budgets import StudyBudget, get_budget
from ..studies.resolution import budget_resolution, cell_resolution, stored_base, study_resolution, sweep_trial_values
from ..studies.spec import STUDIES, StudySpec, SweepSpec
from ..tracking import keys
from ..tracking.run import process_gone
from .config_history import CELLS_CHANGED_SINCE, STUDY_SETS, TRAIN_COMMANDS


@dataclass
class StudyRecord:
    """What a store records of one study: its spec, budget, stored base config, trials and attributes."""

    name: str
    spec: StudySpec | SweepSpec
    budget: StudyBudget
    base: dict[str, Any]
    trials: dict[int, Any]
    attrs: dict[str, Any]

    def fresh(self) -> Resolution:
        """What a study of this spec under this budget begins with today: the budget's workers, and
        the --set its command gave where `config_history.STUDY_SETS` writes it down."""
        spec = self.spec
        n_trials = self.attrs[keys.N_TRIALS] if isinstance(spec, SweepSpec) else \
            len(spec.cells(self.attrs[keys.GRID]["train.seed"]))
        return study_resolution(spec, self.budget, n_trials=n_trials, n_jobs=self.budget.default_jobs,
                                overrides=STUDY_SETS.get(self.name))


def study_record(storage: str, name: str) -> StudyRecord:
    """Study `name` of the Optuna storage `storage`, read."""
    import optuna

    study = optuna.load_study(study_name=name, storage=storage)
    attrs = dict(study.user_attrs)
    spec = STUDIES.get(attrs[keys.SPEC])
    base = stored_base(storage, name, spec.name) or {}
    return StudyRecord(name, spec, get_budget(attrs[keys.BUDGET]), base, {t.number: t for t in study.trials}, attrs)


def stored_flat(stored: dict[str, Any]) -> dict[str, Any]:
    """A run's `config.json` as flat keys, under the one policy for stored configs."""
    return Config.from_dict(stored, stored=True).to_flat_dict()


def differences(stored: dict[str, Any], rebuilt: Resolution) -> dict[str, tuple[Any, Any, str]]:
    """Key -> (stored, rebuilt, the layer that set it) where a run's flat stored config and its
    rebuild differ; the machine keys are this process's, as a stored config taken up again has them."""
    mine = stored_config(stored, rebuilt.config).to_flat_dict()
    flat = rebuilt.config.to_flat_dict()
    return {key: (mine[key], flat[key], rebuilt.sources[key]) for key in flat if mine[key] != flat[key]}


def rebuild_trial(record: StudyRecord, tags: dict[str, str]) -> tuple[Resolution, str]:
    """(today's resolution of a study's trial run with `tags`, its variant label)."""
    spec = record.spec
    resumed = record.fresh().take_stored(record.base, record.name)
    if isinstance(spec, SweepSpec):
        trial = record.trials[int(tags[keys.TRIAL])]
        drawn = {p.key: trial.params[p.name] for p in spec.params if not p.share_of_training}
        # its warm-up steps, as the trial fitted them to its epochs, are in its label
        label = dict(pair.split("=", 1) for pair in tags[keys.CELL].split(","))
        drawn.update({"train.epochs": trial.user_attrs[keys.TRIAL_FITTED_EPOCHS],
                      **{p.key: int(label[p.key]) for p in spec.params if p.share_of_training}})
        rebuilt = resumed.apply("cell", f"trial {trial.number}", sweep_trial_values(spec, resumed.config, drawn))
        return rebuilt, f"trial {trial.number}"
    grid = record.attrs[keys.GRID]
    given = dict(pair.split("=", 1) for pair in tags[keys.CELL].split(","))
    cell = {key: next(v for v in grid[key] if str(v) == given[key]) for key in spec.axes}
    cell["train.seed"] = int(tags[keys.SEED])
    return cell_resolution(resumed, spec, cell), "/".join(str(cell[key]) for key in spec.axes)


def rebuild_command(run_id: str, stored: dict[str, Any]) -> tuple[Resolution, dict[str, str], str]:
    """(today's resolution of a run of `hmer train`, the keys written down as changed since and why,
    where its command is written down; "" where it is not, and only its preset is rebuilt)."""
    command = TRAIN_COMMANDS.get(run_id)
    preset = stored["name"]
    if command is None:
        return resolve_preset(preset), {}, ""
    resolved = budget_resolution(preset, get_budget(command.budget)) if command.budget else resolve_preset(preset)
    rebuilt = resolved.apply("set", "--set", {key: stored[key] for key in command.set_keys})
    return rebuilt, command.changed, command.where


@dataclass
class Progress:
    """How far a run trained, read from its per-epoch metrics: what a run that spans sessions
    needs said of it (epochs, CPU time and its rate, what is left, validation so far)."""

    status: str
    epochs: int
    planned: int | None
    cpu_seconds: list[tuple[int, float]]  # (epoch, the training's CPU seconds up to its end)
    validation: list[tuple[int, float]]  # (epoch, validation ExpRate)
    stopped_by: str | None = None

    RATE_EPOCHS = 10  # the CPU cost an epoch is read over the last ten: a shared machine's rate drifts

    def lines(self) -> list[str]:
        planned = f" of {self.planned}" if self.planned else ""
        out = [f"  training: {self.epochs}{planned} epochs, {self.status}"
               + (f" ({self.stopped_by})" if self.stopped_by and self.status != "finished" else "")]
        if self.cpu_seconds:
            (first, before), (last, total) = self.cpu_seconds[max(0, len(self.cpu_seconds) - 1 - self.RATE_EPOCHS)], \
                self.cpu_seconds[-1]
            words = f"    {total / 3600:.2f} CPU-hours of training"
            if last > first:
                rate = (total - before) / (last - first)
                words += f", {rate:.0f} CPU-seconds an epoch over the last {last - first}"
                if self.planned and self.epochs < self.planned and self.status != "finished":
                    left = self.planned - self.epochs
                    words += f"; {left} epochs left, about {left * rate / 3600:.1f} CPU-hours at that rate"
            out.append(words)
        if self.validation:
            best = max(value for _, value in self.validation)
            at = min(epoch for epoch, value in self.validation if value == best)
            out.append(f"    validation ExpRate: best {best:.2f} at epoch {at}, last {self.validation[-1][1]:.2f} "
                       f"(epoch {self.validation[-1][0]})")
        return out


def _per_epoch(client, run_id: str, key: str) -> list[tuple[int, float]]:
    """One value an epoch, the last logged where an epoch was trained again after a stop."""
    points = sorted(client.get_metric_history(run_id, key), key=lambda p: (p.timestamp, p.step))
    return sorted({int(p.step): float(p.value) for p in points}.items())


def training_progress(client, run, stored: dict[str, Any]) -> Progress:
    """A run's `Progress`, from its metric history and its stored `train.epochs`."""
    run_id, tags = run.info.run_id, run.data.tags
    cpu = _per_epoch(client, run_id, "train_cpu_seconds")
    validation = _per_epoch(client, run_id, "val_exprate")
    losses = _per_epoch(client, run_id, "train_loss")
    epochs = max([e for e, _ in (*losses, *validation, *cpu)], default=0)
    status, stopped_by = tags.get(keys.STATUS) or run.info.status.lower(), tags.get(keys.STOPPED_BY)
    gone = process_gone(tags) if run.info.status == "RUNNING" else None
    if gone is not None:  # the store says running; its process says otherwise
        status, stopped_by = "interrupted", (f"{gone}; the store still holds it RUNNING until `hmer train --resume "
                                             f"{run_id[:8]}`, or its study's command, continues it")
    planned = stored.get("train.epochs")
    return Progress(status, epochs, int(planned) if planned else None, cpu, validation, stopped_by)


@dataclass
class Provenance:
    """What trained one run (see the module docstring)."""

    run_id: str
    tags: dict[str, str]
    rebuilt: Resolution
    stored: dict[str, Any]
    differences: dict[str, tuple[Any, Any, str]]
    written_down: dict[str, str]  # key -> why it trained otherwise, where that is written down
    rebuilt_from: str
    today_fingerprint: str
    scores: dict[str, dict[str, float]] = field(default_factory=dict)  # year -> measure -> value
    artifacts: list[str] = field(default_factory=list)
    artifact_uri: str = ""
    progress: Progress | None = None

    def lines(self) -> list[str]:
        tags = self.tags
        out = [f"run {self.run_id}" + (f" ({tags[keys.MLFLOW_RUN_NAME]})" if keys.MLFLOW_RUN_NAME in tags else "")]
        if keys.STUDY in tags:
            out.append(f"  study {tags[keys.STUDY]}, trial {tags.get(keys.TRIAL, '?')}, cell "
                       f"{tags.get(keys.CELL, '?')}, seed {tags.get(keys.SEED, '?')}")
        if keys.REUSED_FROM in tags:
            out.append(f"  copied from run {tags[keys.REUSED_FROM]} (the same config and seed, trained once)")
        out.append(f"  trained at commit {tags.get(keys.GIT_COMMIT, 'unknown')} (`git show` it), on "
                   f"{tags.get(keys.DEVICE, 'an unknown device')}")
        if self.progress is not None:
            out += self.progress.lines()
        fingerprint = tags.get(keys.FINGERPRINT)
        if fingerprint is None:
            out.append(f"  training code: no fingerprint recorded (`hmer runs fingerprint` measures its commit's); "
                       f"today's is {self.today_fingerprint}")
        else:
            same = "the same as today's" if fingerprint == self.today_fingerprint else \
                f"not today's ({self.today_fingerprint}): another computation"
            out.append(f"  training code: fingerprint {fingerprint}, {same}")
        if keys.FINGERPRINT_CHANGED in tags:
            out.append(f"  resumed with other code: {tags[keys.FINGERPRINT_CHANGED]}")
        for tag, words in ((keys.WARM_RESTART, "optimiser restarted (warm restart) at epoch(s)"),
                           (keys.BEST_RESET, "best chosen afresh from epoch(s)")):
            if tag in tags:
                out.append(f"  {words} {tags[tag]}")
        out.append(f"  config rebuilt through today's layers from {self.rebuilt_from}:")
        rows = self.rebuilt.rows()
        width = max(len(key) for key, _, _ in rows)
        shown = [json.dumps(v) if isinstance(v, str) else str(v) for _, v, _ in rows]
        value_width = max(len(v) for v in shown)
        out.append(f"    {'key':<{width}}  {'value':<{value_width}}  layer")
        for (key, _, layer), value in zip(rows, shown):
            mark = ""
            if key in self.differences:
                trained = self.differences[key][0]
                why = self.written_down.get(key, "not written down: a change this table does not explain")
                mark = f"   <- the run trained {json.dumps(trained) if isinstance(trained, str) else trained}: {why}"
            out.append(f"    {key:<{width}}  {value:<{value_width}}  {layer}{mark}")
        if not self.differences:
            out.append("  today's layers build the config it trained, value for value")
        if self.scores:
            out.append("  scores (%):")
            for year, values in self.scores.items():
                out.append(f"    {year}: " + ", ".join(f"{m} {v:.0f}" if m == "n" else f"{m} {v:.2f}"
                                                      for m, v in values.items()))
        else:
            out.append("  no test scores (not finished, or stopped before its test years)")
        out.append(f"  files: {self.artifact_uri}")
        weights = [a for a in self.artifacts if a.startswith("model")]
        predictions = [a for a in self.artifacts if a.startswith("predictions/")]
        out.append(f"    weights: {', '.join(weights) or 'none'}")
        out.append(f"    predictions: {', '.join(predictions) or 'none'}")
        return out


def run_provenance(client, storage: str | None, run_id: str, today_fingerprint: str) -> Provenance:
    """What trained run `run_id` of the MLflow store `client` (studies in the Optuna `storage`)."""
    import tempfile

    from ..tracking.portable import download_run_artifact, list_run_artifacts

    run = client.get_run(run_id)
    tags = dict(run.data.tags)
    with tempfile.TemporaryDirectory(prefix="hmer-show-") as tmp:
        try:
            stored = stored_flat(json.loads(open(download_run_artifact(client, run_id, "config.json", tmp)).read()))
        except (OSError, ValueError) as exc:
            raise ValueError(f"run {run_id} has no readable config.json ({exc}): it trained nothing here") from None
    if keys.STUDY in tags and storage is not None:
        record = study_record(storage, tags[keys.STUDY])
        rebuilt, variant = rebuild_trial(record, tags)
        written = CELLS_CHANGED_SINCE.get((tags[keys.STUDY], variant), {})
        source = f"study {record.name} (spec {record.spec.name}, budget {record.budget.name}, its stored base config)"
    else:
        rebuilt, written, where = rebuild_command(run_id, stored)
        source = f"its command, written down in {where}" if where else \
            f"its preset {stored['name']} alone (a run of `hmer train` whose --set is not written down)"
    metrics = run.data.metrics
    # a scored split logs its size, test_<year>_n, once (its measures, the graph measure's among them,
    # are test_<year>_<measure>: "2014_lgeval" is no year)
    years = sorted(key[len("test_"):-len("_n")] for key in metrics if key.startswith("test_") and key.endswith("_n"))
    scores = {year: {m: metrics[f"test_{year}_{m}"] for m in (*measures(), "n") if f"test_{year}_{m}" in metrics}
              for year in years}
    artifacts = list_run_artifacts(client, run_id)
    if "predictions" in artifacts:
        artifacts += [f"predictions/{name}" for name in list_run_artifacts(client, run_id, "predictions")]
    return Provenance(run_id, tags, rebuilt, stored, differences(stored, rebuilt), written, source,
                      today_fingerprint, scores, sorted(artifacts), run.info.artifact_uri,
                      training_progress(client, run, stored))
