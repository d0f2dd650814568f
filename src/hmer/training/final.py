"""The end of a run: the best-on-validation weights decoded on every test year, and what is logged (its metrics
and artifacts: docs/architecture.md, "MLflow records"; `model/model.safetensors` is what `hmer evaluate RUN` and
`hmer predict RUN` fetch). `TrainResult` is what `train(cfg)` returns, which the final scoring fills in and the
studies record on their trials.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..checkpoint import MODEL_FILE, load_checkpoint, save_model_file
from ..data.augment import VAL_ALT
from ..evaluation.evaluate import decode_options, evaluate_split
from ..evaluation.metrics import Scores
from ..tracking import keys
from ..tracking.artifacts import PREDICTIONS, SPLIT, log_attention_maps, predictions_artifact, write_predictions_csv
from ..tracking.run import RunLogger, split_metrics
from .setup import Setup


@dataclass
class TrainResult:
    run_id: str
    best_val_exprate: float
    best_epoch: int
    epochs: int
    stopped_by: str  # "epochs" | "budget" | "target" (stop_at_val_exprate reached) | "paused"
    test_scores: dict[str, Scores] = field(default_factory=dict)
    # validation decoded as the test years are at the end ("val", and "val-alt" with data.val_alt)
    validation_scores: dict[str, Scores] = field(default_factory=dict)
    checkpoint: Path | None = None
    num_params: int = 0
    train_seconds: float = 0.0  # wall clock of the whole loop, validation included
    train_cpu_seconds: float = 0.0  # CPU time of the same, the process's threads summed
    step_seconds: float = 0.0  # time in training steps only (what images per second divides by)
    images_trained: int = 0  # images seen by training steps, all ranks and epochs


def final_evaluation(run: RunLogger, setup: Setup, result: TrainResult, best_path: Path, progress: bool) -> None:
    """Decode validation and the test years with the best weights; fill `result.test_scores`; log it all."""
    cfg, model, data = setup.cfg, setup.model, setup.data
    best = load_checkpoint(best_path, map_location="cpu") if best_path.is_file() else None
    if best is not None:
        model.load_state_dict(best["model"])
    model.eval()
    final: dict[str, float] = {"best_val_exprate": max(result.best_val_exprate, 0.0), "best_epoch": result.best_epoch,
                               "train_seconds": result.train_seconds, "train_cpu_seconds": result.train_cpu_seconds,
                               "gpu_minutes": result.train_seconds / 60.0 if setup.device.type == "cuda" else 0.0,
                               "num_params": result.num_params}
    if result.step_seconds > 0:  # training steps only; validation passes are not counted
        final["train_images_per_second"] = result.images_trained / result.step_seconds
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        (tmp_path / PREDICTIONS).mkdir()
        (tmp_path / SPLIT).mkdir()
        # Validation decoded as the test years are: how well the split that selected the checkpoint predicts them.
        splits = [("val", "val_final", data.get("val") or []), (VAL_ALT, f"{VAL_ALT}_final", data.get(VAL_ALT) or [])]
        splits += [(y, f"test_{y}", data[y]) for y in setup.test_years]
        for split, key, exprs in splits:
            if not exprs:
                continue
            t0, cpu0 = time.monotonic(), time.process_time()
            res = evaluate_split(model, exprs, setup.vocab, **decode_options(
                cfg, setup.device, setup.amp_dtype, beam=cfg.train.beam_size,
                progress=f"{key} decoding" if progress else None))
            (result.validation_scores if split in ("val", VAL_ALT) else result.test_scores)[split] = res.scores
            final.update(split_metrics(key, res, time.monotonic() - t0))
            final[f"{key}_decode_cpu_seconds"] = time.process_time() - cpu0
            write_predictions_csv(tmp_path / predictions_artifact(key), res.rows())
        run.log_artifacts(str(tmp_path / PREDICTIONS), PREDICTIONS)
        if any((tmp_path / SPLIT).iterdir()):
            run.log_artifacts(str(tmp_path / SPLIT), SPLIT)
        if best is not None:
            # the checkpoint's own tensors in a format that loads without unpickling (hmer.checkpoint)
            save_model_file(best, tmp_path / "model" / MODEL_FILE)
            run.log_artifacts(str(tmp_path / "model"), "model")
        try:
            log_attention_maps(run, model, data.get("val") or data["train"], setup.vocab, cfg, setup.device,
                               cfg.train.attention_maps)
        except Exception as e:  # a picture must never cost a finished run
            run.set_tag(keys.ATTENTION_MAPS_ERROR, f"{type(e).__name__}: {e}"[:500])
    final["cpu_seconds"] = result.train_cpu_seconds + sum(v for k, v in final.items()
                                                          if k.endswith("_decode_cpu_seconds"))
    run.log_metrics(final, step=result.epochs)
