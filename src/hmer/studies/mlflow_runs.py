"""A study's MLflow side: its parent run, and the child runs of trials whose worker died.

One study is one MLflow parent run (tags `hmer.study=<name>`, `hmer.role=study`; params: the
study name, budget, grid and storage), created once and reopened on resume. Every trial is one
child run made by `hmer.training.train`, tagged with the study and the trial number.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import optuna
from optuna.trial import TrialState

from ..tracking import keys
from ..tracking.run import close_failed, log_params
from ..tracking.store import mlflow_client, search_all_runs
from .storage import first_use_lock


def study_runs_filter(study_name: str) -> str:
    """An MLflow filter for every run of the study, the parent included."""
    quoted = study_name.replace("'", "\\'")
    return f"tags.`{keys.STUDY}` = '{quoted}'"


def parent_run(study: optuna.Study, known: str | None, *, tracking_uri: str, experiment: str,
               params: Mapping[str, Any], tags: Mapping[str, str], artifact: Mapping[str, Any],
               reopen: bool = True) -> tuple[str, str]:
    """The study's MLflow parent run, created once and reopened on resume: (experiment id, run id).

    `known` is the run id the study recorded (None for a new study); a run of another MLflow
    store is looked up by its tags instead. `reopen=False` (a study with nothing left to run)
    finds the run without marking it RUNNING again, so that reading a finished study writes nothing.
    """
    from ..tracking.store import setup_mlflow

    with first_use_lock(tracking_uri):  # MLflow's first use of a new store migrates its schema
        experiment_id = setup_mlflow(tracking_uri, experiment)
    client = mlflow_client(tracking_uri)
    run_id = known
    if run_id is not None:
        try:
            client.get_run(run_id)
        except Exception:  # noqa: BLE001 - recorded in another MLflow store
            run_id = None
    if run_id is None:
        found = client.search_runs([experiment_id], filter_string=(
            f"{study_runs_filter(study.study_name)} and tags.`{keys.ROLE}` = 'study'"),
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
    """FINISHED when the study is complete; FAILED/KILLED when it stops short and no one else runs it.
    A parent already FINISHED is left as it is (its end time stays the study's)."""
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
    """The child runs of the study's trials (every run that has a trial number)."""
    runs = search_all_runs(client, [experiment_id], study_runs_filter(study_name))
    return [run for run in runs if keys.TRIAL in run.data.tags]


def fail_dead_trial_runs(client, experiment_id: str, study: optuna.Study) -> list[str]:
    """Mark FAILED the MLflow runs of trials that Optuna has marked FAIL but MLflow has not.

    That is a trial whose worker died: while training (the run is left RUNNING), or in
    the moment between train() ending its run and Optuna recording the trial (the run is
    FINISHED, but the cell runs again, so this run must not count twice in a table).
    train() itself ends its run FAILED on every exception it sees. A run that a later trial
    continues carries that trial's number and is left alone. Returns the run ids marked.
    """
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
    """What the study's finished trials cost, measured by the trials themselves, as one line for
    its banner ("" before the first trial finishes): their number (trials copied from another
    study are counted apart: they cost nothing here), the mean CPU time of a trial
    (training with its validation passes plus the final decodings; runs log `cpu_seconds` since
    commit 34547ea) and its wall-clock time (training plus the final decodings)."""
    finished = [r for r in trial_runs(client, experiment_id, study_name)
                if r.info.status == "FINISHED" and "train_seconds" in r.data.metrics]
    done = [r for r in finished if keys.REUSED_FROM not in r.data.tags]  # copies cost nothing here
    copied = len(finished) - len(done)
    if not done:
        return f"{copied} trial(s) copied from other studies, none trained yet" if copied else ""

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    wall = [r.data.metrics["train_seconds"] + sum(v for k, v in r.data.metrics.items() if k.endswith("_decode_seconds"))
            for r in done]
    cpu = [r.data.metrics["cpu_seconds"] for r in done if "cpu_seconds" in r.data.metrics]
    parts = [f"measured on its {len(done)} finished trial(s): {mean(wall) / 60:.0f} min wall-clock a trial "
             f"({sum(wall) / 3600:.1f} h in all)"]
    if cpu:
        parts.append(f"{mean(cpu) / 60:.0f} CPU-min a trial (training, validation and final decoding"
                     + (f"; {len(cpu)} of the trials record it)" if len(cpu) < len(done) else ")"))
    if copied:
        parts.append(f"and {copied} trial(s) copied from other studies at no cost (hmer.studies.reuse)")
    return ", ".join(parts)
