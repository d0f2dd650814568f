"""Reload a trained model from an MLflow run id or a checkpoint file."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from ..config import Config
from ..data import Vocab
from ..checkpoint import MODEL_FILES, load_checkpoint
from .store import NoStoreThere, existing_store, mlflow_client


class RunNotFoundError(LookupError):
    """Neither a checkpoint file nor a run id in the tracking store."""


def load_model(run_or_checkpoint: str, tracking_uri: str | None = None,
               device: str | torch.device = "cpu"):
    """(model in eval mode, Config, Vocab) from a checkpoint or model file (best.pt / last.pt /
    model.safetensors / model.pt), or a run id: its `model/model.safetensors` (an older run's
    `model.pt`), downloaded into a temporary folder."""
    from ..model import build_model

    path = Path(run_or_checkpoint)
    if path.is_file():
        ckpt = load_checkpoint(path, map_location=device)
    elif path.suffix in (".pt", ".pth", ".safetensors") or "/" in run_or_checkpoint:
        raise RunNotFoundError(f"{run_or_checkpoint}: no such checkpoint file")
    else:
        ckpt = _load_run_model(run_or_checkpoint, tracking_uri, device)
    cfg = Config.from_dict(ckpt["config"])
    vocab = Vocab(ckpt["vocab"][3:]) if "vocab" in ckpt else Vocab()
    model = build_model(cfg.model)
    model.load_state_dict(ckpt["model"])
    model.to(device).eval()
    return model, cfg, vocab


def _load_run_model(run_id: str, tracking_uri: str | None, device: str | torch.device) -> dict:
    from mlflow.exceptions import MlflowException

    from .portable import download_run_artifact, list_run_artifacts
    from .store import quiet_mlflow

    quiet_mlflow()
    try:
        uri = existing_store(tracking_uri)  # read alone: a mistyped path creates no store
    except NoStoreThere as exc:
        raise RunNotFoundError(f"{run_id}: not a checkpoint file, and {exc}") from None
    client = mlflow_client(uri)
    run_id = _run_id_in_store(client, run_id, "not a checkpoint file, nor a run in")
    with tempfile.TemporaryDirectory(prefix="hmer-model-") as dest:
        try:
            logged = list_run_artifacts(client, run_id, "model")
            name = next(f for f in MODEL_FILES if f in logged)
            local = download_run_artifact(client, run_id, f"model/{name}", dest)
        except (MlflowException, OSError, StopIteration):
            raise RunNotFoundError(f"run {run_id} has no model artifact (model/{MODEL_FILES[0]}) "
                                   "(it may have failed before finishing)") from None
        return load_checkpoint(Path(local), map_location=device)


def log_evaluation(run_id: str, results: dict, tracking_uri: str | None = None) -> None:
    """`hmer evaluate` results ({split: SplitResult}) recorded as training records its test years
    (`test_<split>_exprate`, ..., `predictions/test_<split>.csv`); a later one adds a metric point."""
    from .artifacts import log_test_predictions
    from .run import log_metrics

    client = mlflow_client(tracking_uri)
    run_id = _run_id_in_store(client, run_id, "not a run in")
    log_metrics(client, run_id, {key: value for split, res in results.items()
                                 for key, value in res.scores.as_dict(f"test_{split}").items()}, step=0)
    log_test_predictions(client, run_id, results)


def _run_id_in_store(client, run_id: str, missing: str) -> str:
    """`run_id` if the store has it, else the run `hmer runs import` made of it, else `run_by_prefix`."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_run(run_id)
        return run_id
    except MlflowException:
        from .transfer import find_by_source_id

        imported = find_by_source_id(client, run_id)
        if imported is not None:
            return imported
    return run_by_prefix(client, run_id, missing)


def run_by_prefix(client, given: str, missing: str = "no run in") -> str:
    """The run whose id begins with `given` (8 characters at least, as `hmer runs show` prints ids);
    RunNotFoundError when none does, or listing them when several do."""
    from .store import search_all_runs

    if len(given) < 8:
        raise RunNotFoundError(f"run {given!r}: give its id, or its first 8 characters at least")
    found = [run.info.run_id for run in search_all_runs(client, deleted_too=True) if run.info.run_id.startswith(given)]
    if len(found) == 1:
        return found[0]
    if found:
        raise RunNotFoundError(f"{given}: {len(found)} runs in {client.tracking_uri} begin with it "
                               f"({', '.join(found[:5])}): give more of the id")
    raise RunNotFoundError(f"{given}: {missing} {client.tracking_uri}")
