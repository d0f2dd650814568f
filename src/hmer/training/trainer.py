"""Train one configuration end to end: data, model, recipe, checkpoints, MLflow, test scores.

`train(cfg)` is the single entry point that `hmer train`, the Optuna studies and the
tests all call. One call is one MLflow run:

1. params (every config field), tags (variant, git commit, device) and `config.json`;
2. per epoch: train loss, validation ExpRate and loss, learning rate, images per second
   (step = epoch), then an atomic checkpoint of everything needed to continue;
3. at the end (epochs done, or wall-clock budget spent): the best-on-validation weights
   are decoded on every test year with the papers' beam search; per-year metrics,
   predictions CSVs, attention maps and the reloadable model are logged.

A killed run continues with `train(cfg, resume=<checkpoint or run id>)` in the same
MLflow run. The batch order and augmentation of an epoch are drawn from
(seed, epoch), and the torch RNG is restored from the checkpoint, so a resumed run ends
with the same weights as one that was never interrupted.
"""

from __future__ import annotations

import csv
import json
import math
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ..config import Config
from ..data import Vocab, collate, load_dataset, make_batches
from ..evaluation.evaluate import SplitResult, decode_options, evaluate_split
from ..evaluation.metrics import Scores
from ..model import build_model
from ..tracking.store import default_checkpoint_root, git_commit, setup_mlflow
from . import distributed as ddp
from .checkpoint import atomic_torch_save, load_checkpoint, rng_state, set_rng_state
from .loader import auto_prefetch, train_batches
from .recipes import LRSchedule, build_optimizer

EpochCallback = Callable[[int, dict[str, float]], None]


@dataclass
class TrainResult:
    run_id: str
    best_val_exprate: float
    best_epoch: int
    epochs: int
    stopped_by: str  # "epochs" | "budget" | "target" (stop_at_val_exprate reached) | "paused"
    test_scores: dict[str, Scores] = field(default_factory=dict)
    checkpoint: Path | None = None
    num_params: int = 0
    train_seconds: float = 0.0  # wall clock of the whole loop, validation included
    step_seconds: float = 0.0  # time in training steps only (what images per second divides by)
    images_trained: int = 0  # images seen by training steps, all ranks and epochs


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """bf16 autocast on GPU by default; full fp32 on CPU, where bf16 is slower and less exact."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


class _LossModule(torch.nn.Module):
    """`forward` = the model's training loss, so DistributedDataParallel can wrap it."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, images, image_mask, tgt_in, tgt_out):
        return self.model.loss_from_targets(images, image_mask, tgt_in, tgt_out)


def train(
    cfg: Config,
    data: dict[str, list] | None = None,
    *,
    tracking_uri: str | None = None,
    experiment: str = "hmer",
    run_name: str | None = None,
    parent_run_id: str | None = None,
    tags: dict[str, str] | None = None,
    epoch_callback: EpochCallback | None = None,
    resume: bool | str | Path | None = False,
    run_dir: str | Path | None = None,
    progress: bool = False,
    log_prefix: str = "",
    pause_after_epochs: int = 0,
) -> TrainResult:
    """Train `cfg` and score it on every test year; see the module docstring.

    `progress` shows progress bars (a terminal); without them one line per epoch is printed,
    starting with `log_prefix` (a study names its trial there), so a log file shows the run.
    `pause_after_epochs` > 0: after that many epochs in this call, checkpoint and return
    (stopped_by "paused", no test years) for `resume` to continue: a machine lent by the slice."""
    from mlflow.tracking import MlflowClient

    ckpt = None
    if resume:
        ckpt = load_checkpoint(resume, map_location="cpu")
        cfg = Config.from_dict(ckpt["config"], stored=True)
    cfg.validate()
    tc = cfg.train
    device = resolve_device(tc.device)
    dist_info, device = ddp.init_distributed(device)
    amp_dtype = autocast_dtype(tc.precision, device)
    seed_everything(tc.seed + dist_info.rank)

    vocab = Vocab()
    if cfg.model.vocab_size != len(vocab):
        raise ValueError(f"model.vocab_size={cfg.model.vocab_size} but the vocabulary has {len(vocab)} tokens")
    if data is None:
        data = load_dataset(cfg.data.path or None, cfg.data)
    train_set, val_set = data["train"], data.get("val", [])
    if not train_set:
        raise ValueError("the training split is empty")
    test_years = [y.strip() for y in cfg.data.test_years.split(",") if y.strip() and y.strip() in data]

    model = build_model(cfg.model).to(device)
    if tc.channels_last:  # NHWC convolutions for the encoder (tensor cores prefer them on a GPU)
        model = model.to(memory_format=torch.channels_last)
    prefetch = auto_prefetch(cfg.data.prefetch, device)
    num_params = sum(p.numel() for p in model.parameters())
    optimizer = build_optimizer(model.parameters(), tc)
    # make_batches fixes the number of batches of an epoch whatever its shuffle seed
    steps_per_epoch = len(ddp.shard(make_batches(train_set, cfg.data.batch_pixels, cfg.data.max_batch_size,
                                                 shuffle=True, seed=0), dist_info))
    schedule = LRSchedule(optimizer, tc, total_steps=steps_per_epoch * tc.epochs)
    loss_module: torch.nn.Module = _LossModule(model)
    if dist_info.enabled:
        loss_module = torch.nn.parallel.DistributedDataParallel(
            loss_module, device_ids=[device.index] if device.type == "cuda" else None
        )
    if tc.compile:
        loss_module = torch.compile(loss_module, dynamic=True)

    start_epoch, best_val, best_epoch, elapsed_before = 1, -1.0, 0, 0.0
    step_seconds, images_trained = 0.0, 0
    run_id = None
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        schedule.load_state_dict(ckpt["schedule"])
        set_rng_state(ckpt["rng"])
        start_epoch = int(ckpt["epoch"]) + 1
        best_val, best_epoch = float(ckpt["best_val_exprate"]), int(ckpt["best_epoch"])
        elapsed_before = float(ckpt.get("train_seconds", 0.0))
        step_seconds, images_trained = float(ckpt.get("step_seconds", 0.0)), int(ckpt.get("images_trained", 0))
        run_id = ckpt.get("run_id")

    # ---- MLflow run (rank 0 only) ----------------------------------------------------------
    client = None
    if dist_info.is_main:
        experiment_id = setup_mlflow(tracking_uri, experiment)
        import mlflow

        client = MlflowClient(tracking_uri=mlflow.get_tracking_uri())
        if run_id is None:
            run_tags = {
                "hmer.variant": cfg.name or cfg.model.decoder,
                "hmer.git_commit": git_commit(),
                "hmer.device": _device_description(device),
                "hmer.status": "running",
                **(tags or {}),
            }
            if parent_run_id:
                run_tags["mlflow.parentRunId"] = parent_run_id
            run = client.create_run(experiment_id, run_name=run_name or cfg.name or None, tags=run_tags)
            run_id = run.info.run_id
            _log_params(client, run_id, {**cfg.to_flat_dict(), "num_params": num_params})
            _log_text(client, run_id, json.dumps(cfg.to_dict(), indent=2, sort_keys=True), "config.json")
            # What this run trained and selected on, by name, so anyone can audit the split.
            for split, exprs in (("train", train_set), ("val", val_set)):
                _log_text(client, run_id, "".join(f"{e.name}\n" for e in exprs), f"split/{split}.txt")
        else:
            client.update_run(run_id, status="RUNNING")
            client.set_tag(run_id, "hmer.status", "running")
            client.set_tag(run_id, "hmer.resumed", str(start_epoch))
    run_dir = Path(run_dir) if run_dir else (
        Path(resume).parent if resume and Path(str(resume)).is_file() else default_checkpoint_root() / str(run_id)
    )
    last_path, best_path = run_dir / "last.pt", run_dir / "best.pt"

    status = "FAILED"
    stopped_by = "epochs"
    start_time = time.monotonic()
    try:
        for epoch in range(start_epoch, tc.epochs + 1):
            epoch_start = time.monotonic()
            loss_module.train()
            batches = make_batches(train_set, cfg.data.batch_pixels, cfg.data.max_batch_size,
                                   shuffle=True, seed=tc.seed * 100_003 + epoch)
            batches = ddp.shard(batches, dist_info)
            epoch_batches = train_batches(
                train_set, batches, vocab, cfg.model.direction, device,
                scale_range=(cfg.data.scale_aug_min, cfg.data.scale_aug_max),
                rng=np.random.default_rng([tc.seed, epoch]), prefetch=prefetch, channels_last=tc.channels_last)
            loss_sum = torch.zeros((), device=device)
            n_images, n_steps = 0, 0
            iterator = epoch_batches
            if progress and dist_info.is_main:
                from tqdm.auto import tqdm

                iterator = tqdm(epoch_batches, total=len(batches), desc=f"epoch {epoch}/{tc.epochs}",
                                unit="batch", leave=False)
            for tb in iterator:
                with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                    loss = loss_module(tb.batch.images, tb.batch.image_mask, tb.tgt_in, tb.tgt_out)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if tc.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
                optimizer.step()
                schedule.step_batch()
                loss_sum += loss.detach()
                n_images += len(tb)
                n_steps += 1
                over_budget = tc.time_budget_s > 0 and (
                    elapsed_before + time.monotonic() - start_time >= tc.time_budget_s)
                # The all-reduce is skipped without a budget: it would sync the host every step.
                if tc.time_budget_s > 0 and ddp.any_rank(over_budget, dist_info, device):
                    stopped_by = "budget"
                    break
            epoch_batches.close()  # after a budget break: stops the prefetch thread now, not at GC
            train_seconds_epoch = time.monotonic() - epoch_start
            step_seconds += train_seconds_epoch
            images_trained += n_images * dist_info.world_size
            train_loss = float(loss_sum.item()) / max(n_steps, 1)
            if not math.isfinite(train_loss):
                raise FloatingPointError(f"training loss became {train_loss} in epoch {epoch}")

            metrics: dict[str, float] = {
                "train_loss": train_loss,
                "lr": schedule.lr,
                "images_per_second": n_images * dist_info.world_size / max(train_seconds_epoch, 1e-9),
                "epoch_seconds": train_seconds_epoch,
            }
            val_exprate = -1.0
            if val_set and (epoch % tc.val_every == 0 or epoch == tc.epochs or stopped_by == "budget"):
                if dist_info.is_main:
                    val = evaluate_split(model, val_set, vocab, **decode_options(cfg, device, amp_dtype,
                                                                                 beam=tc.val_beam_size))
                    val_exprate = val.scores.exprate
                    metrics["val_exprate"] = val_exprate
                    metrics["val_le1"] = val.scores.le1
                    metrics["val_loss"] = _mean_loss(model, val_set, vocab, cfg, device, amp_dtype)
                val_exprate = ddp.broadcast_float(val_exprate, dist_info, device)
                schedule.step_validation(val_exprate)
                if val_exprate > best_val:
                    best_val, best_epoch = val_exprate, epoch
                    if dist_info.is_main:
                        atomic_torch_save(_model_artifact(model, cfg, vocab, epoch, val_exprate), best_path)
            elif not val_set and dist_info.is_main:
                best_epoch = epoch  # no validation split: the last weights are the best we know
                atomic_torch_save(_model_artifact(model, cfg, vocab, epoch, -1.0), best_path)

            elapsed = elapsed_before + time.monotonic() - start_time
            if dist_info.is_main:
                assert client is not None
                _log_metrics(client, run_id, metrics, step=epoch)
                atomic_torch_save({
                    "format": 1, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "schedule": schedule.state_dict(), "rng": rng_state(), "epoch": epoch,
                    "best_val_exprate": best_val, "best_epoch": best_epoch, "train_seconds": elapsed,
                    "step_seconds": step_seconds, "images_trained": images_trained,
                    "config": cfg.to_dict(), "run_id": run_id,
                }, last_path)
            ddp.barrier(dist_info)
            if dist_info.is_main and not progress:
                print(_epoch_line(log_prefix, epoch, tc.epochs, metrics, elapsed, start_epoch,
                                  elapsed - elapsed_before), flush=True)
            if epoch_callback is not None and dist_info.is_main:
                epoch_callback(epoch, metrics)
            if stopped_by == "budget":
                break
            if 0 < pause_after_epochs <= epoch - start_epoch + 1 and epoch < tc.epochs:
                stopped_by = "paused"
                break
            if 0 < tc.stop_at_val_exprate <= val_exprate:
                stopped_by = "target"
                break

        train_seconds = elapsed_before + time.monotonic() - start_time
        result = TrainResult(run_id=str(run_id), best_val_exprate=best_val, best_epoch=best_epoch,
                             epochs=epoch if tc.epochs >= start_epoch else start_epoch - 1,
                             stopped_by=stopped_by, checkpoint=best_path, num_params=num_params,
                             train_seconds=train_seconds, step_seconds=step_seconds,
                             images_trained=images_trained)
        if stopped_by == "paused":  # the run goes on with `resume`; it is not over
            status = "KILLED"
            if client is not None:
                client.set_tag(run_id, "hmer.status", "paused")
            return result
        if dist_info.is_main:
            assert client is not None
            _finish(client, run_id, cfg, model, vocab, data, test_years, best_path, device, amp_dtype,
                    result, progress)
        status = "FINISHED"
        return result
    except BaseException as exc:
        if client is not None and run_id is not None:
            pruned = type(exc).__name__ == "TrialPruned"
            client.set_tag(run_id, "hmer.status", "pruned" if pruned else "failed")
            if not pruned:
                client.set_tag(run_id, "hmer.error", f"{type(exc).__name__}: {exc}"[:5000])
            status = "KILLED" if pruned or isinstance(exc, KeyboardInterrupt) else "FAILED"
        raise
    finally:
        if client is not None and run_id is not None:
            if status == "FINISHED":
                client.set_tag(run_id, "hmer.status", "finished")
            client.set_terminated(run_id, status=status)
        ddp.cleanup(dist_info)


# ---- end of training: test years, artifacts ------------------------------------------------

def _finish(client, run_id, cfg: Config, model, vocab: Vocab, data, test_years, best_path: Path,
            device, amp_dtype, result: TrainResult, progress: bool) -> None:
    if best_path.is_file():
        best = load_checkpoint(best_path, map_location=device)
        model.load_state_dict(best["model"])
    model.eval()
    final: dict[str, float] = {
        "best_val_exprate": max(result.best_val_exprate, 0.0),
        "best_epoch": result.best_epoch,
        "train_seconds": result.train_seconds,
        "gpu_minutes": result.train_seconds / 60.0 if device.type == "cuda" else 0.0,
        "num_params": result.num_params,
    }
    if result.step_seconds > 0:  # training steps only; validation passes are not counted
        final["train_images_per_second"] = result.images_trained / result.step_seconds
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "predictions").mkdir()
        # Validation decoded as the test years are (beam, joint search for bi), beside them: how
        # well the split that selected the checkpoint predicts the test years.
        # Its predictions go beside the split's name list (split/), the test years' to predictions/.
        (tmp_path / "split").mkdir()
        splits = [("val", "val_final", data.get("val") or [])] + [(y, f"test_{y}", data[y]) for y in test_years]
        for split, key, exprs in splits:
            if not exprs:
                continue
            t0 = time.monotonic()
            res: SplitResult = evaluate_split(
                model, exprs, vocab,
                **decode_options(cfg, device, amp_dtype, beam=cfg.train.beam_size,
                                 progress=f"{key} decoding" if progress else None))
            if split != "val":
                result.test_scores[split] = res.scores
            final.update(res.scores.as_dict(key))
            final[f"{key}_resized"] = res.resized
            final[f"{key}_decode_seconds"] = time.monotonic() - t0
            csv_path = tmp_path / "split" / "val_predictions.csv" if split == "val" else \
                tmp_path / "predictions" / f"{key}.csv"
            _write_csv(csv_path, res.rows())
        client.log_artifacts(run_id, str(tmp_path / "predictions"), "predictions")
        if any((tmp_path / "split").iterdir()):
            client.log_artifacts(run_id, str(tmp_path / "split"), "split")
        if best_path.is_file():
            # Logged as model/model.pt: what `hmer evaluate RUN_ID` and `hmer predict RUN_ID` fetch.
            model_dir = tmp_path / "model"
            model_dir.mkdir()
            shutil.copyfile(best_path, model_dir / "model.pt")
            client.log_artifacts(run_id, str(model_dir), "model")
        try:
            from ..tracking.artifacts import log_attention_maps

            log_attention_maps(client, run_id, model, data.get("val") or data["train"], vocab, cfg,
                               device, cfg.train.attention_maps)
        except Exception as e:  # a picture must never cost a finished run
            client.set_tag(run_id, "hmer.attention_maps_error", f"{type(e).__name__}: {e}"[:500])
    _log_metrics(client, run_id, final, step=result.epochs)


@torch.inference_mode()
def _mean_loss(model, exprs, vocab: Vocab, cfg: Config, device, amp_dtype) -> float:
    model.eval()
    total, count = torch.zeros((), device=device), 0
    for idx in make_batches(exprs, cfg.data.eval_batch_pixels, cfg.data.eval_max_batch_size,
                            shuffle=False, seed=0, max_image_pixels=cfg.data.max_image_pixels):
        batch = collate([exprs[i] for i in idx], vocab, max_pixels=cfg.data.max_image_pixels).to(device)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            total += model.loss(batch.images, batch.image_mask, batch.token_ids).float() * len(idx)
        count += len(idx)
    return float(total.item()) / max(count, 1)


def _model_artifact(model, cfg: Config, vocab: Vocab, epoch: int, val_exprate: float) -> dict[str, Any]:
    """What `hmer evaluate` / `hmer predict` reload: weights, config and vocabulary, nothing executable."""
    return {"format": 1, "model": model.state_dict(), "config": cfg.to_dict(), "vocab": list(vocab.itos),
            "epoch": epoch, "val_exprate": val_exprate}


def _epoch_line(prefix: str, epoch: int, epochs: int, metrics: dict[str, float], elapsed: float,
                start_epoch: int, elapsed_this_process: float) -> str:
    """One log line per epoch: what a log file of a run without a terminal shows."""
    done = epoch - start_epoch + 1
    eta = elapsed_this_process / done * (epochs - epoch)
    val = f"val ExpRate {metrics['val_exprate']:.2f}" if "val_exprate" in metrics else "val -"
    head = f"{prefix}: " if prefix else ""
    return (f"{head}epoch {epoch}/{epochs}  train loss {metrics['train_loss']:.4f}  {val}  "
            f"{metrics['images_per_second']:.1f} img/s  lr {metrics['lr']:.3g}  "
            f"elapsed {_clock(elapsed)}  ETA {_clock(eta)}")


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _log_params(client, run_id: str, params: dict[str, Any]) -> None:
    from mlflow.entities import Param

    items = [Param(k, str(v)) for k, v in params.items()]
    for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
        client.log_batch(run_id, params=items[i:i + 100])


def _log_metrics(client, run_id: str, metrics: dict[str, float], step: int) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    items = [Metric(k, float(v), now, step) for k, v in metrics.items() if v is not None]
    for i in range(0, len(items), 1000):
        client.log_batch(run_id, metrics=items[i:i + 1000])


def _log_text(client, run_id: str, text: str, artifact_file: str) -> None:
    client.log_text(run_id, text, artifact_file)


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["name", "truth", "prediction", "distance"])
        writer.writeheader()
        writer.writerows(rows)
