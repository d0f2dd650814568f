"""`hmer import CHECKPOINT`: a published BTTR / CoMER checkpoint as an MLflow run of the suite.

The run holds what a trained run holds for reloading: params (the flat Config, with the reference's
search rule), `config.json` and `model/model.safetensors` (`hmer.checkpoint`), so `hmer evaluate RUN`
and `hmer predict RUN` work on it; the model is also registered (default `<preset>-reference`). With
`years`, the test years are scored and logged as trained runs log them, for `hmer report --runs`.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from ..checkpoint import MODEL_FILE, model_artifact, save_model_file
from .reference_checkpoint import REFERENCES, ReferenceModel, read_reference_checkpoint
from . import keys
from .run import log_metrics, log_params, split_metrics
from .store import git_commit, open_experiment


@dataclass
class ImportResult:
    run_id: str
    reference: ReferenceModel
    registered: Optional[str]  # "name/version", or None
    scores: dict  # year -> Scores, for the years scored at import


def import_reference(checkpoint: str | Path, *, tracking_uri: str | None = None, experiment: str = "hmer",
                     run_name: str | None = None, dictionary: str | Path | None = None,
                     register_as: str | None = "", data: str | None = None, years: Sequence[str] = (),
                     limit: int = 0, device: str = "cpu") -> ImportResult:
    """Record `checkpoint` as a run (module doc). register_as: "" = `<preset>-reference`, None = not."""
    ref = read_reference_checkpoint(checkpoint, dictionary)
    cfg = ref.config
    client, experiment_id = open_experiment(tracking_uri, experiment)
    repo, _ = REFERENCES[ref.family]
    tags = {
        keys.VARIANT: f"{cfg.name} (reference)",
        keys.STATUS: "running",
        keys.GIT_COMMIT: git_commit(),
        keys.IMPORT_SOURCE: str(Path(checkpoint).resolve()),
        keys.IMPORT_REFERENCE: repo,
        keys.IMPORT_LIGHTNING_VERSION: ref.lightning_version,
        keys.IMPORT_EPOCH: str(ref.epoch),
        keys.IMPORT_HYPER_PARAMETERS: json.dumps(ref.hyper_parameters, sort_keys=True, default=str)[:5000],
        keys.IMPORT_REFERENCE_ONLY_SYMBOLS: " ".join(ref.mapping.reference_only),
        keys.IMPORT_NEVER_PREDICTED_SYMBOLS: " ".join(ref.mapping.project_only),
    }
    run = client.create_run(experiment_id, run_name=run_name or f"{cfg.name}-reference", tags=tags)
    run_id = run.info.run_id
    status = "FAILED"
    try:
        num_params = sum(p.numel() for p in ref.model.parameters())
        log_params(client, run_id, {**cfg.to_flat_dict(), "num_params": num_params})
        client.log_text(run_id, json.dumps(cfg.to_dict(), indent=2, sort_keys=True), "config.json")
        artifact = model_artifact(ref.model, cfg, ref.vocab, ref.epoch, -1.0)
        with tempfile.TemporaryDirectory() as tmp:
            save_model_file(artifact, Path(tmp) / "model" / MODEL_FILE)
            client.log_artifacts(run_id, str(Path(tmp) / "model"), "model")
        scores = _score_years(client, run_id, ref, data, years, limit, device) if years else {}
        registered = None
        if register_as is not None:
            name = register_as or f"{cfg.name}-reference"
            registered = _register(client, name, run_id)
            client.set_tag(run_id, keys.REGISTERED_MODEL, registered)
        client.set_tag(run_id, keys.STATUS, "finished")
        status = "FINISHED"
        return ImportResult(run_id, ref, registered, scores)
    finally:
        client.set_terminated(run_id, status=status)


def _register(client, name: str, run_id: str) -> str:
    """A new version of registered model `name` from the run's `model/` folder (not an MLflow flavour,
    which `mlflow.register_model` would want)."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name, description="imported with `hmer import`; reload with "
                                                         "`hmer evaluate RUN` / `hmer predict RUN`")
    source = f"{client.get_run(run_id).info.artifact_uri}/model"
    version = client.create_model_version(name, source, run_id=run_id)
    return f"{name}/{version.version}"


def _score_years(client, run_id: str, ref: ReferenceModel, data: str | None, years: Sequence[str], limit: int,
                 device: str) -> dict:
    """Decode and score the test years as training's final evaluation does, logged the same way."""
    import time

    from ..data import load_dataset
    from ..device import autocast_dtype, resolve_device
    from ..evaluation.evaluate import decode_options, evaluate_split
    from .artifacts import log_test_predictions

    cfg = ref.config
    dev = resolve_device(device)
    model = ref.model.to(dev)
    data_cfg = cfg.data
    data_cfg.test_limit = limit
    splits = load_dataset(data or cfg.data.path or None, data_cfg, splits=tuple(years))
    metrics: dict[str, float] = {}
    results = {}
    for year in years:
        t0 = time.monotonic()
        results[year] = evaluate_split(model, splits[year], ref.vocab,
                                       **decode_options(cfg, dev, autocast_dtype(cfg.train.precision, dev)))
        metrics.update(split_metrics(f"test_{year}", results[year], time.monotonic() - t0))
    log_test_predictions(client, run_id, results)
    log_metrics(client, run_id, metrics, step=0)
    return {year: res.scores for year, res in results.items()}
