"""A study's MLflow side: one parent run (tags `hmer.study`, `hmer.role=study`), created once and
reopened on resume, and the child runs `hmer.training.train` makes for its trials.
"""

from __future__ import annotations

import json
from statistics import mean
from typing import Any, Mapping, Sequence

import optuna
from optuna.trial import TrialState

from ..tracking import keys
from ..tracking.run import close_failed, log_params
from ..tracking.store import open_experiment, search_all_runs, study_filter
from .storage import first_use_lock


def parent_run(study: optuna.Study, known: str | None, *, tracking_uri: str, experiment: str,
               params: Mapping[str, Any], tags: Mapping[str, str], artifact: Mapping[str, Any],
               reopen: bool = True) -> tuple[str, str]:
    """The study's parent run, created once and reopened on resume: (experiment id, run id). `known` is the
    recorded run id (a run of another store is found by its tags); `reopen=False` finds it without
    marking it RUNNING, so that reading a finished study writes nothing."""
    with first_use_lock(tracking_uri):  # MLflow's first use of a new store migrates its schema
        client, experiment_id = open_experiment(tracking_uri, experiment)
    run_id = known
    if run_id is not None:
        try:
            client.get_run(run_id)
        except Exception:  # noqa: BLE001 - recorded in another MLflow store
            run_id = None
    if run_id is None:
        found = client.search_runs([experiment_id], filter_string=(
            f"{study_filter(study.study_name)} and tags.`{keys.ROLE}` = 'study'"),
            order_by=["attributes.start_time ASC"], max_results=1)
        run_id = found[0].info.run_id if found else None
    if run_id is None:
        run = client.create_run(experiment_id, run_name=study.study_name,
                                tags={keys.STUDY: study.study_name, keys.ROLE: "study", keys.STATUS: "running",
                                      **tags})
        run_id = run.info.run_id
        log_params(client, run_id, {k: str(v)[:6000] for k, v in params.items()})
        client.log_text(run_id, json.dumps(artifact, indent=2, sort_keys=True, default=str), "study.json")
    elif reopen:
        client.update_run(run_id, status="RUNNING")
        client.set_tag(run_id, keys.STATUS, "running")
    return experiment_id, run_id


def finish_parent(client, study: optuna.Study, parent_run_id: str, complete: bool, failed: Sequence[str],
                  interrupted: bool) -> None:
    """FINISHED when the study is complete (left alone when already so); FAILED or KILLED when it stops
    short and no one else runs it."""
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    if complete:
        run = client.get_run(parent_run_id)
        if run.info.status == "FINISHED" and run.data.tags.get(keys.STATUS) == "finished":
            return
        client.set_tag(parent_run_id, keys.STATUS, "finished")
        client.set_terminated(parent_run_id, status="FINISHED")
    elif not running:
        client.set_tag(parent_run_id, keys.STATUS, "interrupted" if interrupted else "incomplete")
        if failed:
            client.set_tag(parent_run_id, keys.FAILED, "; ".join(failed)[:5000])
        client.set_terminated(parent_run_id, status="KILLED" if interrupted else "FAILED")


def trial_runs(client, experiment_id: str, study_name: str) -> list:
    """The child runs of the study's trials."""
    runs = search_all_runs(client, [experiment_id], study_filter(study_name))
    return [run for run in runs if keys.TRIAL in run.data.tags]


def fail_dead_trial_runs(client, experiment_id: str, study: optuna.Study) -> list[str]:
    """Mark FAILED the runs of trials Optuna has marked FAIL and MLflow not: their worker died while
    training, or between train() ending the run and Optuna recording the trial (its cell runs again, so
    the run must not count twice). A run a later trial continues carries that trial's number. The run
    ids marked."""
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    marked = []
    for run in trial_runs(client, experiment_id, study.study_name):
        number = run.data.tags[keys.TRIAL]
        if run.info.status in ("FAILED", "KILLED"):
            continue  # already ended as failed / pruned
        if states.get(int(number)) != TrialState.FAIL:
            continue  # running, complete or pruned: MLflow agrees
        close_failed(client, run.info.run_id, f"the worker of trial {number} died (run {run.info.status.lower()}); "
                                              f"the trial is FAIL in Optuna and its cell runs again")
        marked.append(run.info.run_id)
    return marked


def measured_cost(client, experiment_id: str, study_name: str) -> str:
    """What the study's finished trials cost, measured, as one line ("" before the first): their number,
    copies counted apart, and the mean CPU time (runs log `cpu_seconds` since 34547ea) and wall-clock
    time of a trial."""
    finished = [r for r in trial_runs(client, experiment_id, study_name)
                if r.info.status == "FINISHED" and "train_seconds" in r.data.metrics]
    done = [r for r in finished if keys.REUSED_FROM not in r.data.tags]  # copies cost nothing here
    copied = len(finished) - len(done)
    if not done:
        return f"{copied} trial(s) copied from other studies, none trained yet" if copied else ""

    wall = [r.data.metrics["train_seconds"] + sum(v for k, v in r.data.metrics.items() if k.endswith("_decode_seconds"))
            for r in done]
    cpu = [r.data.metrics["cpu_seconds"] for r in done if "cpu_seconds" in r.data.metrics]
    parts = [f"measured on its {len(done)} finished trial(s): {mean(wall) / 60:.0f} min wall-clock a trial "
             f"({sum(wall) / 3600:.1f} h in all)"]
    if cpu:
        parts.append(f"{mean(cpu) / 60:.0f} CPU-min a trial (training, validation and final decoding"
                     + (f"; {len(cpu)} of the trials record it)" if len(cpu) < len(done) else ")"))
    if copied:
        parts.append(f"and {copied} trial(s) copied from other studies at no cost (hmer.studies.objective)")
    return ", ".join(parts)
