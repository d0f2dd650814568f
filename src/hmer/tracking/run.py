"""One training run in MLflow, from its first tags to its final status (`TrainingRun.start`, `.resume`).

How a run ends, by how its `with` block ends:

    returns                         hmer.status finished           MLflow FINISHED
    returns after run.pause()       hmer.status paused             MLflow KILLED (resumable)
    raises optuna.TrialPruned       hmer.status pruned             MLflow KILLED
    raises hmer.signals.Stopped     hmer.status killed, hmer.stopped_by  MLflow KILLED (resumable)
    raises KeyboardInterrupt        hmer.status failed, hmer.error MLflow KILLED
    raises anything else            hmer.status failed, hmer.error MLflow FAILED

A run records its process (`hmer.pid`, `hmer.host`): one left RUNNING by a process killed outright
is closed FAILED by the next resume or study start in its experiment (`fail_runs_of_dead_processes`).
The trainer sees only `RunLogger` (it never imports MLflow); DDP ranks other than 0 get a `NullRun`.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any, Literal, Protocol

from . import keys
from .store import git_commit, mlflow_client, open_experiment, point_mlflow_at, search_all_runs

BATCH_SIZES = {"params": 100, "tags": 100, "metrics": 1000}  # MLflow refuses larger log_batch calls


class RunLogger(Protocol):
    """What a training loop may do with its run."""

    @property
    def run_id(self) -> str | None: ...  # read-only here, so that a run whose id is always a str fits

    def log_params(self, params: dict[str, Any]) -> None: ...
    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...
    def log_text(self, text: str, artifact_file: str) -> None: ...
    def log_artifacts(self, local_dir: str, artifact_path: str) -> None: ...
    def set_tag(self, key: str, value: str) -> None: ...
    def pause(self) -> None: ...
    def __enter__(self) -> RunLogger: ...
    def __exit__(self, exc_type, exc, tb) -> Literal[False]: ...


class TrainingRun:
    """An MLflow run that a training writes to, and whose status its `with` block settles."""

    def __init__(self, client, run_id: str):
        self.client = client
        self.run_id = run_id
        self._paused = False

    @classmethod
    def start(cls, *, tracking_uri: str | None = None, experiment: str = "hmer", variant: str, device: str,
              run_name: str | None = None, parent_run_id: str | None = None,
              tags: dict[str, str] | None = None) -> TrainingRun:
        """A new run tagged with its variant, commit, device and status `running`, and `tags` (which
        win); `parent_run_id` nests it under a study's parent run."""
        client, experiment_id = open_experiment(tracking_uri, experiment)
        run_tags = {keys.VARIANT: variant, keys.GIT_COMMIT: git_commit(), keys.DEVICE: device,
                    keys.STATUS: "running", **_process_tags(), **(tags or {})}
        if parent_run_id:
            run_tags[keys.MLFLOW_PARENT_RUN_ID] = parent_run_id
        run = client.create_run(experiment_id, run_name=run_name, tags=run_tags)
        return cls(client, run.info.run_id)

    @classmethod
    def resume(cls, run_id: str, *, tracking_uri: str | None = None, from_epoch: int, device: str,
               marks: tuple[str, ...] = ()) -> TrainingRun:
        """The run `run_id` running again from epoch `from_epoch` (`hmer.resumed`) on `device`, its experiment
        made MLflow's current one. `hmer.device` gets `device` appended where it is new (a run continued on
        another host names both: its CPU-hours are theirs). Each tag of `marks` (`hmer.warm_restart`) gets
        `from_epoch` appended to its comma-separated epochs, kept whole across resumes."""
        import mlflow

        client = mlflow_client(point_mlflow_at(tracking_uri))
        run = client.get_run(run_id)
        tags = run.data.tags
        mlflow.set_experiment(experiment_id=run.info.experiment_id)
        client.update_run(run_id, status="RUNNING")
        devices = [d for d in tags.get(keys.DEVICE, "").split(keys.DEVICE_SEPARATOR) if d]
        devices += [device] * (device not in devices)
        for key, value in {keys.STATUS: "running", keys.RESUMED: str(from_epoch), **_process_tags(),
                           keys.DEVICE: keys.DEVICE_SEPARATOR.join(devices)}.items():
            client.set_tag(run_id, key, value)
        for key in marks:
            epochs = [e for e in tags.get(key, "").split(",") if e]
            client.set_tag(run_id, key, ",".join([*epochs, str(from_epoch)]))
        if keys.STOPPED_BY in tags:  # the stop is over: the run goes on
            client.delete_tag(run_id, keys.STOPPED_BY)
        return cls(client, run_id)

    def log_params(self, params: dict[str, Any]) -> None:
        log_params(self.client, self.run_id, params)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        log_metrics(self.client, self.run_id, metrics, step)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def log_artifacts(self, local_dir: str, artifact_path: str) -> None:
        self.client.log_artifacts(self.run_id, local_dir, artifact_path)

    def set_tag(self, key: str, value: str) -> None:
        self.client.set_tag(self.run_id, key, value)

    def pause(self) -> None:
        """The run stops here but is not over: `resume` continues it (it ends KILLED, not FINISHED)."""
        self.set_tag(keys.STATUS, "paused")
        self._paused = True

    def __enter__(self) -> TrainingRun:
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        status = "FAILED"
        try:
            if exc is None:
                status = "KILLED" if self._paused else "FINISHED"
                if not self._paused:
                    self.set_tag(keys.STATUS, "finished")
            elif getattr(exc, "signal_name", None):  # hmer.signals.Stopped: resumable from its last checkpoint
                self.set_tag(keys.STATUS, "killed")
                self.set_tag(keys.STOPPED_BY, str(exc)[:5000])
                status = "KILLED"
            else:
                # Matched by name: Optuna need not be installed for a run to train.
                pruned = type(exc).__name__ == "TrialPruned"
                self.set_tag(keys.STATUS, "pruned" if pruned else "failed")
                if not pruned:
                    self.set_tag(keys.ERROR, f"{type(exc).__name__}: {exc}"[:5000])
                status = "KILLED" if pruned or isinstance(exc, KeyboardInterrupt) else "FAILED"
        finally:
            self.client.set_terminated(self.run_id, status=status)
        return False


def _process_tags() -> dict[str, str]:
    return {keys.PID: str(os.getpid()), keys.HOST: socket.gethostname()}


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def fail_runs_of_dead_processes(experiment: str, tracking_uri: str | None = None) -> list[str]:
    """Close FAILED every RUNNING run of `experiment` on this host whose process is gone (SIGKILL, out
    of memory: no handler sees it); returns their ids. Other hosts' runs (containers share host
    names), runs without process tags and other experiments (a committed study's) are left alone."""
    from .store import quiet_mlflow

    quiet_mlflow()
    client = mlflow_client(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    filter_string = f"attributes.status = 'RUNNING' and tags.`{keys.HOST}` = '{socket.gethostname()}'"
    marked = []
    for run in search_all_runs(client, [found.experiment_id], filter_string):
        gone = process_gone(run.data.tags)
        if gone is not None:
            close_failed(client, run.info.run_id, f"{gone}: it ended without closing the run")
            marked.append(run.info.run_id)
    return marked


def process_gone(tags: dict[str, str]) -> str | None:
    """Why a RUNNING run trains no more: its process (`hmer.pid` on `hmer.host`) ran here and is gone.
    None where it is alive, ran elsewhere, or was not recorded."""
    pid, host = tags.get(keys.PID, ""), tags.get(keys.HOST)
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid() or process_alive(int(pid)):
        return None
    return f"its process (pid {pid} on {host}) is gone, killed outright (SIGKILL, out of memory)"


def close_failed(client, run_id: str, why: str) -> None:
    """End a run its own process can no longer close: FAILED, `hmer.error` saying why."""
    from mlflow.exceptions import MlflowException  # mlflow loads where a store is opened, as in store.py

    for key, value in ((keys.STATUS, "failed"), (keys.ERROR, why)):
        try:
            client.set_tag(run_id, key, value)
        except MlflowException:
            # Two workers closing one dead run at once: the slower insert of a new tag fails on the
            # primary key (PostgreSQL behind `mlflow server`); written again, it is an update.
            client.set_tag(run_id, key, value)
    client.set_terminated(run_id, status="FAILED")


class NullRun:
    """A `RunLogger` that records nothing: what DDP ranks other than 0 log to."""

    def __init__(self, run_id: str | None = None):
        self.run_id = run_id

    def _nothing(self, *args: Any, **kwargs: Any) -> None:
        pass

    log_params = log_metrics = log_text = log_artifacts = set_tag = pause = _nothing

    def __enter__(self) -> NullRun:
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        return False


def split_metrics(key: str, result: Any, decode_seconds: float) -> dict[str, float]:
    """The final metrics of one decoded split (`key`: `test_2014`, ...; `result`: a SplitResult): its
    scores (`<key>_exprate`, ...), `<key>_resized` and `<key>_decode_seconds`."""
    return {**result.scores.as_dict(key), f"{key}_resized": result.resized, f"{key}_decode_seconds": decode_seconds}


def log_params(client, run_id: str, params: dict[str, Any]) -> None:
    """Every param (values as strings), in as few requests as MLflow allows."""
    from mlflow.entities import Param

    log_batch(client, run_id, "params", [Param(k, str(v)) for k, v in params.items()])


def set_tags(client, run_id: str, tags: dict[str, str]) -> None:
    """Every tag (values as strings), in as few requests as MLflow allows."""
    from mlflow.entities import RunTag

    log_batch(client, run_id, "tags", [RunTag(k, str(v)) for k, v in tags.items()])


def log_metrics(client, run_id: str, metrics: dict[str, float], step: int) -> None:
    """Every metric that has a value, at one step and one timestamp, in as few requests as MLflow allows."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    log_batch(client, run_id, "metrics", [Metric(k, float(v), now, step) for k, v in metrics.items() if v is not None])


def log_batch(client, run_id: str, field: str, items: list) -> None:
    """MLflow entities as they are (`field`: params, tags or metrics, such as a metric history copied from
    another run), in as few requests as MLflow allows."""
    size = BATCH_SIZES[field]
    for i in range(0, len(items), size):
        client.log_batch(run_id, **{field: items[i:i + size]})
