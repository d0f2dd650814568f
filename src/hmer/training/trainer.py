"""Train one configuration end to end: data, model, recipe, checkpoints, the run's record, test scores.

`train(cfg)` is the entry point of `hmer train`, the studies and the tests; one call is one tracked run: per
epoch its metrics (step = epoch) and an atomic checkpoint, at the end the test years (`final.py`). Resumes
(`resume.py`), SIGTERM/SIGINT (`hmer.signals`: the epoch in progress dropped, the run KILLED, `Stopped` raised)
and pauses: docs/training.md.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterator, Literal

import numpy as np
import torch

from ..checkpoint import atomic_torch_save, load_checkpoint, model_artifact
from ..config import Config
from ..data import RenderConfig, Vocab, collate, make_batches
from ..data.augment import AugmentConfig
from ..data.batching import PadLadder
from ..device import device_description, resolve_device
from ..evaluation.evaluate import decode_options, evaluate_split
from ..signals import Stopped, deferred, stop_on_signals
from ..tracking import keys
from ..tracking.run import NullRun, RunLogger, TrainingRun
from . import distributed as ddp
from .final import TrainResult, final_evaluation
from .loader import Redraw, train_batches
from .resume import (Branch, Clock, TrainState, best_weights_recoverable, checkpoint_dir, keep_stable_phase, restore,
                     save_last, shares_stable_phase, stable_end)
from . import planning
from .fingerprint import code_fingerprint
from .setup import Setup, build, seed_everything
from .step import train_step

EpochCallback = Callable[[int, dict[str, float]], None]


def train(cfg: Config, data: dict[str, list] | None = None, *, tracking_uri: str | None = None,
          experiment: str = "hmer", run_name: str | None = None, parent_run_id: str | None = None,
          tags: dict[str, str] | None = None, epoch_callback: EpochCallback | None = None,
          resume: str | Path | Literal[False] | None = False, run_dir: str | Path | None = None, progress: bool = False,
          log_prefix: str = "", pause_after_epochs: int = 0, pause_at: float = 0.0, final_seconds: float = 0.0,
          start_from: Branch | None = None) -> TrainResult:
    """Train `cfg` and score it on every test year; see the module docstring.

    `progress`: progress bars, else one line per epoch after `log_prefix`. `pause_after_epochs` > 0: checkpoint
    and return (stopped_by "paused", no test years) after that many epochs. `pause_at` (a `time.time()`): pause
    after the last epoch that leaves time for the next, counting `final_seconds` for the test years
    (`--pause-within`). `start_from`: a shorter wsd run's state to take over (`hmer.training.resume.Branch`)."""
    with stop_on_signals(), _writing(tracking_uri, run_dir, resume):
        ckpt = load_checkpoint(resume, map_location="cpu") if resume else None
        if ckpt is not None:
            cfg = Config.from_dict(ckpt["config"])
        branch = load_checkpoint(start_from.checkpoint, map_location="cpu") if start_from is not None else None
        cfg.validate()
        tc = cfg.train
        dist, device = ddp.init_distributed(resolve_device(tc.device))
        seed_everything(tc.seed + dist.rank)
        setup = build(cfg, data, device, dist)
        state = restore(ckpt, setup) if ckpt is not None else TrainState()
        if branch is not None:  # a shorter wsd run's state where its decay began, for a new run at this schedule's rate
            if not shares_stable_phase(branch["config"], cfg):
                raise ValueError("the state to start from is another config's, not a shorter run of this one")
            state = restore(branch, setup)
            setup.schedule.refresh()
            state.run_id = None
        if ckpt is not None and dist.is_main:  # before the run reopens: a refusal leaves it as it was
            _restore_best(setup, state, checkpoint_dir(run_dir, resume, state.run_id, tracking_uri) / "best.pt", resume)
        with deferred():  # a run is opened whole: tags, params and config together
            run = _open_run(setup, state, tracking_uri=tracking_uri, experiment=experiment, run_name=run_name,
                            parent_run_id=parent_run_id, tags=tags)
            if start_from is not None and dist.is_main:
                _branch_history(run, start_from, state, tracking_uri)
        state.run_id = run.run_id
        folder = checkpoint_dir(run_dir, resume, state.run_id, tracking_uri)
        if start_from is not None and dist.is_main and start_from.best.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(start_from.best, folder / "best.pt")
        last_path, best_path = folder / "last.pt", folder / "best.pt"
        first_epoch, epoch, stopped_by, finishing = state.epoch + 1, state.epoch, "epochs", False
        clock = Clock(before=state.train_seconds, cpu_before=state.train_cpu_seconds)
        try:
            with run:  # settles the run's status: finished, paused, pruned, killed (a signal) or failed
                try:
                    _prepare_shapes(setup, run, state, log_prefix, progress)
                    if pause_at and state.epoch >= tc.epochs and time.time() + final_seconds > pause_at:
                        stopped_by = "paused"  # resumed for its test years only, and they do not fit
                    for epoch in range(first_epoch, tc.epochs + 1):
                        epoch_start = time.monotonic()
                        metrics, over_budget = _train_epoch(setup, state, epoch, clock, progress)
                        # the weights validation reads and the best checkpoint keeps: the EMA, else the model's own
                        with setup.ema.swapped_in(setup.model) if setup.ema is not None else contextlib.nullcontext():
                            val_exprate = _validate(setup, state, epoch, metrics, best_path, last=over_budget)
                        with deferred():  # the epoch's metrics and its checkpoint, both or neither
                            state.epoch, state.train_seconds = epoch, clock.elapsed()
                            state.train_cpu_seconds = clock.cpu_elapsed()
                            # cumulative: wall time on a shared machine counts other jobs and pauses
                            metrics["train_cpu_seconds"] = state.train_cpu_seconds
                            run.log_metrics(metrics, step=epoch)
                            if dist.is_main:
                                save_last(last_path, setup, state)
                                if epoch == stable_end(cfg):
                                    keep_stable_phase(folder)
                        ddp.barrier(dist)
                        if dist.is_main and not progress:
                            print(_epoch_line(log_prefix, epoch, tc.epochs, metrics, state.train_seconds, first_epoch,
                                              state.train_seconds - clock.before), flush=True)
                        if epoch_callback is not None and dist.is_main:
                            epoch_callback(epoch, metrics)
                        stopped_by = _stop_reason(cfg, epoch, first_epoch, over_budget, val_exprate, pause_after_epochs)
                        # (every rank stops alike: their clocks may disagree by a little)
                        if stopped_by == "epochs" and pause_at and ddp.any_rank(_out_of_time(
                                pause_at, time.monotonic() - epoch_start, final_seconds, epoch, tc.epochs),
                                dist, setup.device):
                            stopped_by = "paused"
                        if stopped_by != "epochs":
                            break
                    result = TrainResult(run_id=str(state.run_id), best_val_exprate=state.best_val_exprate,
                                         best_epoch=state.best_epoch, epochs=epoch, stopped_by=stopped_by,
                                         checkpoint=best_path, num_params=setup.num_params,
                                         train_seconds=clock.elapsed(), train_cpu_seconds=clock.cpu_elapsed(),
                                         step_seconds=state.step_seconds, images_trained=state.images_trained)
                    # All ranks leave the group together before rank 0 decodes alone, or they can hang
                    # (pytorch/pytorch#75097: a CI torchrun job never ended); the DDP wrapper, which holds the
                    # group, is let go first, so no rank frees it alone later (where that CI run's rank 1 hung).
                    setup.loss_module = None
                    ddp.leave(dist)
                    if stopped_by == "paused":  # the run goes on with `resume`; it is not over
                        run.pause()
                    elif dist.is_main:
                        finishing = True
                        final_evaluation(run, setup, result, best_path, progress)
                    return result
                except Stopped as stop:
                    where = (f"in the final evaluation after epoch {state.epoch}" if finishing else
                             f"in epoch {state.epoch + 1} of {tc.epochs}, which is dropped")
                    stop.detail = (f"{where}; continue from the checkpoint of epoch {state.epoch} with "
                                   f"hmer train --resume {state.run_id}" if state.epoch else
                                   f"{where}; no epoch was complete, so there is no checkpoint to continue from")
                    raise
        finally:
            ddp.cleanup(dist)


@contextlib.contextmanager
def _writing(tracking_uri: str | None, run_dir: str | Path | None, resume) -> Iterator[None]:
    """The locks a training holds (hmer.tracking.lock): its store's (shared; a publish is excluded) and, on
    resume, the run's (rank 0 only), so two processes never train one run."""
    from ..tracking.lock import run_lock, training_lock
    from ..tracking.portable import sqlite_path
    from ..tracking.store import default_tracking_uri

    db = sqlite_path(tracking_uri or default_tracking_uri())
    command = f"training (pid {os.getpid()})"
    with contextlib.ExitStack() as held:
        if db is not None:
            held.enter_context(training_lock(db.parent, command))
        if resume and int(os.environ.get("RANK", "0")) == 0:
            folder = checkpoint_dir(run_dir, resume, None, tracking_uri)
            held.enter_context(run_lock(folder, folder.name if not run_dir else str(resume), command))
        yield


def _branch_history(run: RunLogger, start_from: Branch, state: TrainState, tracking_uri: str | None) -> None:
    """The shorter run's curve up to the branch, as this run's own epochs, and the tags that say so."""
    from ..tracking.store import mlflow_client

    client = mlflow_client(tracking_uri)
    epochs: dict[int, dict[str, float]] = {}
    for key in client.get_run(start_from.run_id).data.metrics:
        for metric in client.get_metric_history(start_from.run_id, key):
            if 0 < metric.step <= start_from.epoch:
                epochs.setdefault(metric.step, {})[key] = metric.value
    for step, metrics in sorted(epochs.items()):  # one write an epoch, as the trainer logs them
        run.log_metrics(metrics, step=step)
    run.set_tag(keys.BRANCHED_FROM, start_from.tag)
    run.set_tag(keys.BRANCH_CPU_SECONDS, f"{state.train_cpu_seconds:.1f}")


def _restore_best(setup: Setup, state: TrainState, best_path: Path, resume) -> None:
    """Rewrite a missing `best.pt` from the restored weights; refused where the best is an earlier epoch's."""
    if best_path.is_file():
        return
    if best_weights_recoverable(state.epoch, state.best_epoch):
        atomic_torch_save(model_artifact(setup.model, setup.cfg, setup.vocab, state.epoch, state.best_val_exprate),
                          best_path)
    elif state.best_epoch > 0:
        raise FileNotFoundError(f"{best_path}: missing beside {resume}; it holds the best weights so far "
                                f"(epoch {state.best_epoch}), which the run's final evaluation scores")


def _open_run(setup: Setup, state: TrainState, *, tracking_uri: str | None, experiment: str,
              run_name: str | None, parent_run_id: str | None, tags: dict[str, str] | None) -> RunLogger:
    """The run this process logs to: rank 0's new or resumed run, a NullRun on the other ranks."""
    if not setup.dist.is_main:
        return NullRun(state.run_id)
    try:
        fingerprint = code_fingerprint()
    except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as exc:  # a run is never refused for it
        fingerprint = f"unknown: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    if state.run_id is not None:
        marks = (keys.WARM_RESTART,) * state.optimizer_restarted + (keys.BEST_RESET,) * state.best_reset
        resumed = TrainingRun.resume(state.run_id, tracking_uri=tracking_uri, from_epoch=state.epoch + 1,
                                       device=device_description(setup.device), marks=marks)
        tags_before = resumed.client.get_run(resumed.run_id).data.tags
        if tags_before.get(keys.FINGERPRINT, fingerprint) != fingerprint:
            # the run goes on with other code: say from which epoch, with which
            note, changed = f"epoch {state.epoch + 1}: {fingerprint}", tags_before.get(keys.FINGERPRINT_CHANGED)
            resumed.set_tag(keys.FINGERPRINT_CHANGED, f"{changed}; {note}" if changed else note)
        return resumed
    cfg = setup.cfg
    run = TrainingRun.start(tracking_uri=tracking_uri, experiment=experiment, variant=cfg.name or cfg.model.decoder,
                            device=device_description(setup.device), run_name=run_name or cfg.name or None,
                            parent_run_id=parent_run_id, tags={keys.FINGERPRINT: fingerprint, **(tags or {})})
    scaled = {"lr_scaled": setup.lr, "lr_batch_scale": round(setup.batch_scale, 4)} \
        if cfg.train.lr_scaling != "none" else {}  # what train.lr_scaling made of train.lr
    run.log_params({**cfg.to_flat_dict(), "num_params": setup.num_params, **scaled})
    run.log_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True), "config.json")
    # What this run trained and selected on, by name, so anyone can audit the split.
    for split, exprs in (("train", setup.train_set), ("val", setup.val_set)):
        run.log_text("".join(f"{e.name}\n" for e in exprs), f"split/{split}.txt")
    return run


def _prepare_shapes(setup: Setup, run: RunLogger, state: TrainState, log_prefix: str, progress: bool) -> None:
    """The pad ladder's shapes before this process's first step (hmer.training.planning); its figures logged
    at the last finished epoch's step (its cost is outside every epoch's images/s)."""
    done = planning.prepare(setup)
    if done and setup.dist.is_main:
        run.log_metrics(done, step=state.epoch)
        if not progress:
            head = f"{log_prefix}: " if log_prefix else ""
            print(head + "pad ladder: " + "  ".join(f"{k} {v:.6g}" for k, v in done.items()), flush=True)


def _train_epoch(setup: Setup, state: TrainState, epoch: int, clock: Clock,
                 progress: bool) -> tuple[dict[str, float], bool]:
    """One pass over this rank's share: (the epoch's metrics, whether the time budget ran out on any rank)."""
    cfg, tc, dist = setup.cfg, setup.cfg.train, setup.dist
    epoch_start = time.monotonic()
    loss_module = setup.loss_module
    assert loss_module is not None, "the training is over: its DDP wrapper was let go"
    loss_module.train()
    # The renderer augmentation, seeded by (seed, epoch, 1), apart from the scale draws' (seed, epoch):
    # turning it on leaves the scale stream as it was, and a resumed epoch redraws the same.
    aug = AugmentConfig.from_data_config(cfg.data)
    redraw = (Redraw(setup.train_strokes, RenderConfig.from_data_config(cfg.data), aug,
                     np.random.default_rng([tc.seed, epoch, 1])) if aug.enabled and setup.train_strokes is not None
              else None)
    batches = ddp.shard(make_batches(setup.train_set, cfg.data.batch_pixels, cfg.data.max_batch_size,
                                     shuffle=True, seed=tc.seed * 100_003 + epoch), dist)
    epoch_batches = train_batches(
        setup.train_set, batches, setup.vocab, cfg.model.direction, setup.device,
        scale_range=(cfg.data.scale_aug_min, cfg.data.scale_aug_max),
        rng=np.random.default_rng([tc.seed, epoch]), prefetch=setup.prefetch, channels_last=tc.channels_last,
        redraw=redraw, ladder=PadLadder.from_data_config(cfg.data))
    iterator = epoch_batches
    if progress and dist.is_main:
        from tqdm.auto import tqdm

        iterator = tqdm(epoch_batches, total=len(batches), desc=f"epoch {epoch}/{tc.epochs}", unit="batch", leave=False)
    loss_sum = torch.zeros((), device=setup.device)
    n_images, n_steps, over_budget = 0, 0, False
    try:
        for tb in iterator:
            if setup.graphed is not None:  # train.cuda_graphs: the same step, replayed
                loss = setup.graphed(tb)
            else:
                loss = train_step(loss_module, setup.optimizer, setup.model, tb, tc.grad_clip, setup.amp_dtype)
            loss_sum += loss.detach()
            setup.schedule.step_batch()
            if setup.ema is not None:
                setup.ema.update(setup.model)
            n_images += len(tb)
            n_steps += 1
            # The all-reduce is skipped without a budget: it would sync the host every step.
            if tc.time_budget_s > 0 and ddp.any_rank(clock.elapsed() >= tc.time_budget_s, dist, setup.device):
                over_budget = True
                break
    finally:  # after a budget break or a signal: stops the prefetch thread now, not at GC
        epoch_batches.close()
    seconds = time.monotonic() - epoch_start
    state.step_seconds += seconds
    state.images_trained += n_images * dist.world_size
    train_loss = float(loss_sum.item()) / max(n_steps, 1)
    if not math.isfinite(train_loss):
        raise FloatingPointError(f"training loss became {train_loss} in epoch {epoch}")
    return {"train_loss": train_loss, "lr": setup.schedule.lr,
            "images_per_second": n_images * dist.world_size / max(seconds, 1e-9), "epoch_seconds": seconds}, over_budget


def _validate(setup: Setup, state: TrainState, epoch: int, metrics: dict[str, float], best_path: Path,
              last: bool) -> float:
    """Score validation when due, step the schedule on it, keep the best in `best_path`. ExpRate, or -1."""
    cfg, tc, dist = setup.cfg, setup.cfg.train, setup.dist
    if not setup.val_set:
        if dist.is_main:
            state.best_epoch = epoch  # no validation split: the last weights are the best we know
            atomic_torch_save(model_artifact(setup.model, cfg, setup.vocab, epoch, -1.0), best_path)
        return -1.0
    if not (epoch % tc.val_every == 0 or epoch == tc.epochs or last):
        return -1.0
    val_exprate = val_le1 = -1.0
    if dist.is_main:
        val = evaluate_split(setup.model, setup.val_set, setup.vocab,
                             **decode_options(cfg, setup.device, setup.amp_dtype, beam=tc.val_beam_size))
        val_exprate, val_le1 = val.scores.exprate, val.scores.le1
        metrics.update(val_exprate=val_exprate, val_le1=val_le1, val_loss=_mean_loss(
            setup.model, setup.val_set, setup.vocab, cfg, setup.device, setup.amp_dtype))
    val_exprate = ddp.broadcast_float(val_exprate, dist, setup.device)
    val_le1 = ddp.broadcast_float(val_le1, dist, setup.device)
    setup.schedule.step_validation(val_exprate)
    if improves_on_best(state, val_exprate, val_le1):
        state.best_val_exprate, state.best_val_le1, state.best_epoch = val_exprate, val_le1, epoch
        if dist.is_main:
            atomic_torch_save(model_artifact(setup.model, cfg, setup.vocab, epoch, val_exprate), best_path)
    return val_exprate


def improves_on_best(state: TrainState, val_exprate: float, val_le1: float) -> bool:
    """Whether a validation reading beats the best so far: a higher ExpRate, or the same ExpRate and at
    least as much within one edit, so a full tie goes to the later epoch (docs/training.md: why)."""
    if val_exprate != state.best_val_exprate:
        return val_exprate > state.best_val_exprate
    return val_le1 >= state.best_val_le1


def _out_of_time(pause_at: float, epoch_seconds: float, final_seconds: float, epoch: int, epochs: int) -> bool:
    """Whether the next epoch (as long as this one) and, after the last, the test years would end past `pause_at`."""
    need = (epoch_seconds if epoch < epochs else 0.0) + (final_seconds if epoch + 1 >= epochs else 0.0)
    return time.time() + need > pause_at


def _stop_reason(cfg: Config, epoch: int, first_epoch: int, over_budget: bool, val_exprate: float,
                 pause_after_epochs: int) -> str:
    """Why the loop stops after `epoch`: budget, paused, target; "epochs" = it goes on (or is done)."""
    if over_budget:
        return "budget"
    if 0 < pause_after_epochs <= epoch - first_epoch + 1 and epoch < cfg.train.epochs:
        return "paused"
    if 0 < cfg.train.stop_at_val_exprate <= val_exprate:
        return "target"
    return "epochs"


@torch.inference_mode()
def _mean_loss(model, exprs, vocab: Vocab, cfg: Config, device, amp_dtype) -> float:
    model.eval()
    total, count = torch.zeros((), device=device), 0
    for idx in make_batches(exprs, cfg.data.eval_batch_pixels, cfg.data.eval_max_batch_size,
                            shuffle=False, seed=0, max_image_pixels=cfg.data.max_image_pixels):
        batch = collate([exprs[i] for i in idx], vocab, max_pixels=cfg.data.max_image_pixels,
                        ladder=PadLadder.from_data_config(cfg.data)).to(device)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            total += model.loss(batch.images, batch.image_mask, batch.token_ids).float() * len(idx)
        count += len(idx)
    return float(total.item()) / max(count, 1)


def _epoch_line(prefix: str, epoch: int, epochs: int, metrics: dict[str, float], elapsed: float,
                start_epoch: int, elapsed_this_process: float) -> str:
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
