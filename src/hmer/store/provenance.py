"""What trained a run, in one place: `hmer runs show`.

Its study, cell, seed and commit, how far it trained (for a run that spans sessions), its training-code
fingerprint against today's, its config as it trained, its scores per year, and where its files are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..config import Config
from ..registry import METRICS
from ..tracking import keys
from ..tracking.portable import list_run_artifacts, load_run_json
from ..tracking.run import process_gone


@dataclass
class Progress:
    """How far a run trained, from its per-epoch metrics: epochs, CPU time and rate, what is left, validation."""

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
            first, before = self.cpu_seconds[max(0, len(self.cpu_seconds) - 1 - self.RATE_EPOCHS)]
            last, total = self.cpu_seconds[-1]
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


def run_provenance(client, run_id: str, today_fingerprint: str) -> list[str]:
    """What trained run `run_id` of the MLflow store `client` (see the module docstring), line by line."""
    run = client.get_run(run_id)
    try:
        config = Config.from_dict(load_run_json(client, run_id, "config.json")).to_flat_dict()
    except (OSError, ValueError) as exc:
        raise ValueError(f"run {run_id} has no readable config.json ({exc}): it trained nothing here") from None
    tags, metrics = run.data.tags, run.data.metrics
    out = [f"run {run_id}" + (f" ({tags[keys.MLFLOW_RUN_NAME]})" if keys.MLFLOW_RUN_NAME in tags else "")]
    if keys.STUDY in tags:
        out.append(f"  study {tags[keys.STUDY]} (budget {tags.get(keys.BUDGET, '?')}), trial "
                   f"{tags.get(keys.TRIAL, '?')}, cell {tags.get(keys.CELL, '?')}, seed {tags.get(keys.SEED, '?')}")
    if keys.REUSED_FROM in tags:
        out.append(f"  copied from run {tags[keys.REUSED_FROM]} (the same config and seed, trained once)")
    out.append(f"  trained at commit {tags.get(keys.GIT_COMMIT, 'unknown')} (`git show` it), on "
               f"{tags.get(keys.DEVICE, 'an unknown device')}")
    out += training_progress(client, run, config).lines()
    fingerprint = tags.get(keys.FINGERPRINT)
    if fingerprint is None:
        out.append(f"  training code: no fingerprint recorded; today's is {today_fingerprint}")
    else:
        same = "the same as today's" if fingerprint == today_fingerprint else \
            f"not today's ({today_fingerprint}): another computation"
        out.append(f"  training code: fingerprint {fingerprint}, {same}")
    if keys.FINGERPRINT_CHANGED in tags:
        out.append(f"  resumed with other code: {tags[keys.FINGERPRINT_CHANGED]}")
    for tag, words in ((keys.WARM_RESTART, "optimiser restarted (warm restart) at epoch(s)"),
                       (keys.BEST_RESET, "best chosen afresh from epoch(s)")):
        if tag in tags:
            out.append(f"  {words} {tags[tag]}")
    shown = {key: json.dumps(value) if isinstance(value, str) else str(value) for key, value in config.items()}
    width = max(len(key) for key in shown)
    out += ["  config it trained with (its config.json):", *(f"    {key:<{width}}  {value}"
                                                            for key, value in shown.items())]
    # the years from test_<year>_n, one a scored split (test_2014_lgeval_exprate would give "2014_lgeval")
    years = sorted(key[len("test_"):-len("_n")] for key in metrics if key.startswith("test_") and key.endswith("_n"))
    scores = {year: {m: metrics[f"test_{year}_{m}"] for m in (*METRICS.names(), "n") if f"test_{year}_{m}" in metrics}
              for year in years}
    if not scores:
        out.append("  no test scores (not finished, or stopped before its test years)")
    else:
        out += ["  scores (%):", *(f"    {year}: " + ", ".join(f"{m} {v:.0f}" if m == "n" else f"{m} {v:.2f}"
                                                         for m, v in values.items())
                                   for year, values in scores.items())]
    artifacts = list_run_artifacts(client, run_id)
    if "predictions" in artifacts:
        artifacts += [f"predictions/{name}" for name in list_run_artifacts(client, run_id, "predictions")]
    artifacts.sort()
    weights = [a for a in artifacts if a.startswith("model")]
    predictions = [a for a in artifacts if a.startswith("predictions/")]
    out.append(f"  files: {run.info.artifact_uri}")
    out.append(f"    weights: {', '.join(weights) or 'none'}")
    out.append(f"    predictions: {', '.join(predictions) or 'none'}")
    return out
