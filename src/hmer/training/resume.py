"""Continuing a killed run exactly: what `last.pt` holds and how it is put back (docs/training.md).

An epoch's batches and augmentation are drawn from (seed, epoch), so with weights, optimiser, schedule, RNGs and
`TrainState` restored, a resumed run takes the same steps. Without the optimiser's state
(`standalone_continuation`) it is a warm restart, tagged `hmer.warm_restart` (cost: docs/benchmarks.md section 5).

A longer `wsd` run starts where a shorter run of its config began to decay (`Branch`): nothing before the decay
depends on the length, so it takes over the state kept there (`stable.pt`, `stable-best.pt`) and ends as the longer
run would have, weight for weight (tests/test_branch.py; docs/training.md, "Budgets that share a run").
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from ..config import MACHINE_KEYS, Config
from ..checkpoint import atomic_torch_save, rng_state, set_rng_state
from ..tracking.store import checkpoint_root
from .setup import Setup


@dataclass
class TrainState:
    """Where a training stands between two epochs (a fresh run: nothing done yet)."""

    epoch: int = 0                   # the last epoch done
    best_val_exprate: float = -1.0
    best_val_le1: float = -1.0        # within one edit at the best epoch: breaks ExpRate ties
    best_epoch: int = 0
    train_seconds: float = 0.0       # wall clock of all epochs so far, validation included
    train_cpu_seconds: float = 0.0   # CPU time of the same (the process's threads summed)
    step_seconds: float = 0.0        # time in training steps only
    images_trained: int = 0          # images seen by training steps, all ranks
    run_id: str | None = None
    # What the checkpoint resumed from left out (never saved: the next checkpoint is whole again):
    optimizer_restarted: bool = False  # its optimiser state, so the optimiser starts afresh
    best_reset: bool = False           # the weights of an earlier best, so the best is chosen from here on


def restore(ckpt: dict[str, Any], setup: Setup) -> TrainState:
    """Put `ckpt` (a `last.pt`) back into the model, optimiser, schedule and RNGs; its TrainState."""
    setup.model.load_state_dict(ckpt["model"])
    setup.optimizer.load_state_dict(ckpt["optimizer"])  # its param_groups hold the lr, also when carried
    setup.schedule.load_state_dict(ckpt["schedule"])
    set_rng_state(ckpt["rng"])
    if setup.ema is not None:
        setup.ema.load_state_dict(ckpt["ema"])
    numbers = {k: type(v)(ckpt.get(k, v)) for k, v in asdict(TrainState()).items() if type(v) in (int, float)}
    return TrainState(**numbers, run_id=ckpt.get("run_id"),
                      optimizer_restarted=bool(ckpt.get(OPTIMIZER_STATE_DROPPED, False)),
                      best_reset=bool(ckpt.get(BEST_RESET, False)))


# Checkpoint keys of a carried checkpoint: what it left out (see the module docstring).
OPTIMIZER_STATE_DROPPED = "optimizer_state_dropped"
BEST_RESET = "best_reset"


def standalone_continuation(ckpt: dict[str, Any], best_weights: dict[str, Any] | None,
                            readings: Callable[[int], tuple[float, float]], *,
                            optimizer_state: bool = False) -> tuple[dict[str, Any], str, bool]:
    """`ckpt` (a `last.pt`) as one file that continues its run with no `best.pt` beside it; the optimiser's
    state only with `optimizer_state`. Where the best so far is an earlier epoch's: with all epochs done, the
    best weights (`best_weights`; only the test years remain); else the best is reset to the checkpoint's epoch,
    with `readings(epoch)` (validation ExpRate, within one edit).

    Returns (the checkpoint, "last" or "best" weights, whether the best was reset)."""
    epoch, epochs = int(ckpt["epoch"]), int(ckpt["config"]["train"]["epochs"])
    weights, best_reset = "last", False
    if not best_weights_recoverable(epoch, int(ckpt["best_epoch"])):
        if epoch >= epochs and best_weights is not None:
            ckpt = {**ckpt, "model": best_weights["model"]}
            weights = "best"
        else:
            exprate, le1 = readings(epoch)
            ckpt = {**ckpt, "best_epoch": epoch, "best_val_exprate": exprate, "best_val_le1": le1, BEST_RESET: True}
            best_reset = True
    if not optimizer_state:  # its param groups stay (they hold the plateau-reduced rate): the same rate, fresh buffers
        ckpt = {**ckpt, "optimizer": {"state": {}, "param_groups": ckpt["optimizer"]["param_groups"]},
                OPTIMIZER_STATE_DROPPED: True}
    return ckpt, weights, best_reset


def save_last(path: Path, setup: Setup, state: TrainState) -> None:
    """Everything `restore` needs, written atomically (a kill mid-write keeps the previous file)."""
    ema = {"ema": setup.ema.state_dict()} if setup.ema is not None else {}
    kept = {k: v for k, v in asdict(state).items() if k not in ("optimizer_restarted", "best_reset")}
    atomic_torch_save({**ema, "format": 1, "model": setup.model.state_dict(), "optimizer": setup.optimizer.state_dict(),
                       "schedule": setup.schedule.state_dict(), "rng": rng_state(), **kept,
                       "config": setup.cfg.to_dict()}, path)


# A wsd run's state where its decay begins (`keep_stable_phase`): a longer run of the same config
# computes the same up to there, and can start from it (`Branch`).
STABLE, STABLE_BEST = "stable.pt", "stable-best.pt"
# Keys in which a longer wsd run of the same variant differs from a shorter one: its length alone.
LENGTH_KEYS = ("train.epochs", "train.decay_epochs")


@dataclass(frozen=True)
class Branch:
    """The state a longer wsd run starts from: a shorter run's at the end of its stable phase. Its
    `train_cpu_seconds` counts the shared epochs; the study's own cost is `hmer.branch_cpu_seconds`."""

    run_id: str  # the shorter run
    checkpoint: Path  # its stable.pt
    best: Path  # its stable-best.pt (the best weights up to that epoch), or a path that does not exist
    epoch: int  # the epoch the state is at

    @property
    def tag(self) -> str:
        return f"{self.run_id}@{self.epoch}"


def stable_end(cfg: Config) -> int:
    """The last epoch before a wsd run's decay (0 for another schedule)."""
    return cfg.train.epochs - cfg.train.decay_epochs if cfg.train.schedule == "wsd" else 0


def shares_stable_phase(stored: dict, cfg: Config) -> bool:
    """Whether a checkpoint's config (`Config.to_dict()`) is a wsd `cfg` but for its length and machine keys."""
    try:
        other = Config.from_dict(stored).to_flat_dict()
    except (KeyError, TypeError, ValueError):
        return False
    mine = cfg.to_flat_dict()
    ignored = set(LENGTH_KEYS) | set(MACHINE_KEYS)
    return other.get("train.schedule") == "wsd" and all(other.get(k) == v for k, v in mine.items() if k not in ignored)


def keep_stable_phase(folder: Path) -> None:
    """Copy `folder`'s `last.pt` and `best.pt` to `stable.pt` and `stable-best.pt`, each written whole."""
    for name, copy in (("last.pt", STABLE), ("best.pt", STABLE_BEST)):
        source = folder / name
        if source.is_file():
            partial = folder / f".{copy}.partial"
            shutil.copyfile(source, partial)
            os.replace(partial, folder / copy)


def checkpoint_dir(run_dir: str | Path | None, resume: bool | str | Path | None, run_id: str | None,
                   tracking_uri: str | None = None) -> Path:
    """Where `last.pt` and `best.pt` go: `run_dir`, else beside the resumed checkpoint, else `checkpoint_root`."""
    if run_dir:
        return Path(run_dir)
    if resume and Path(str(resume)).is_file():
        return Path(str(resume)).parent
    return checkpoint_root(tracking_uri) / str(run_id)


def best_weights_recoverable(epoch: int, best_epoch: int) -> bool:
    """Whether a checkpoint's weights are its best so far, so `best.pt` need not travel: a resume rewrites it."""
    return 0 < best_epoch == epoch


class Clock:
    """A run's wall clock and CPU time across resumes. CPU time (all threads summed) is what a run costs on a
    shared machine, where wall-clock time depends on the neighbours."""

    def __init__(self, before: float = 0.0, cpu_before: float = 0.0):
        self.before = before
        self.cpu_before = cpu_before
        self.start = time.monotonic()
        self.cpu_start = time.process_time()

    def elapsed(self) -> float:
        return self.before + time.monotonic() - self.start

    def cpu_elapsed(self) -> float:
        return self.cpu_before + time.process_time() - self.cpu_start
