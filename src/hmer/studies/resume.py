"""A killed trial continues from its last epoch, not from scratch (docs/studies.md, "Resume").

A cell's new trial looks for a FAIL trial of its cell that did not fail by itself (no `hmer.error`), the
latest first; its MLflow run; that run's `last.pt`; and the checkpoint's config, which must be the cell's.
Found, the new trial adopts the run (tagged with its number, so `fail_dead_trial_runs` leaves it);
otherwise the cell trains from scratch in a new run.

A longer `wsd` cell starts from the latest state that a shorter cell of its variant kept where its decay
began (`find_branch`; `hmer.training.resume` says why the two compute the same).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import optuna
from optuna.trial import TrialState

from ..config import Config, stored_config
from ..tracking import keys
from ..tracking.store import checkpoint_root
from .mlflow_runs import trial_runs

if TYPE_CHECKING:  # (the training package imports torch: a study's planning does not need it)
    from ..training.resume import Branch


@dataclass(frozen=True)
class Resumable:
    """A dead trial's run that the new trial of its cell continues."""

    trial: int  # the dead trial's number
    run_id: str
    checkpoint: Path  # its last.pt
    epoch: int  # the last epoch the checkpoint holds


def checkpoint_dir(run_id: str, tracking_uri: str) -> Path:
    """Where a study's trial keeps its checkpoints while it trains, the study tracked in `tracking_uri`."""
    return checkpoint_root(tracking_uri) / str(run_id)


def dead_trial_runs(trials: list, runs: list, cell_key: str) -> list[tuple[int, str]]:
    """(trial number, run id) of the trials of `cell_key` whose worker died, the latest first, each with its
    run among `runs` (a trial killed before its run existed is left out)."""
    by_trial = {int(r.data.tags[keys.TRIAL]): r.info.run_id for r in runs}
    dead = [t.number for t in trials if t.state == TrialState.FAIL and t.user_attrs.get(keys.CELL_KEY) == cell_key
            and keys.ERROR not in t.user_attrs]
    return [(number, by_trial[number]) for number in sorted(dead, reverse=True) if number in by_trial]


def find_resumable(session, cell_key: str, cfg: Config) -> Resumable | None:
    """The run and checkpoint a new trial of `cell_key` continues, or None."""
    trials = session.study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
    if not any(t.user_attrs.get(keys.CELL_KEY) == cell_key for t in trials):
        return None
    runs = trial_runs(session.client, session.experiment_id, session.name)
    for number, run_id in dead_trial_runs(trials, runs, cell_key):
        path = checkpoint_dir(run_id, session.tracking_uri) / "last.pt"
        ckpt = read_checkpoint(path)  # the run's own, holding `cfg`
        if ckpt is not None and ckpt.get("run_id") == run_id and same_config(ckpt["config"], cfg):
            return Resumable(trial=number, run_id=run_id, checkpoint=path, epoch=int(ckpt["epoch"]))
    return None


def read_checkpoint(path: Path) -> dict | None:
    """The checkpoint at `path`, or None where there is none or it is unreadable (train without it)."""
    from ..checkpoint import load_checkpoint

    if not path.is_file():
        return None
    try:
        return load_checkpoint(path, map_location="cpu")
    except (OSError, ValueError):
        return None


def same_config(stored: dict, cfg: Config) -> bool:
    """Whether a checkpoint's config (`Config.to_dict()`), taken up by this process, trains as `cfg`: equal
    but for its name, which labels the preset and trains nothing (e.g. `tiny` before it was called
    `tiny-transformer`)."""
    try:
        flat = {**Config.from_dict(stored).to_flat_dict(), "name": cfg.name}
        return stored_config(flat, cfg).to_flat_dict() == cfg.to_flat_dict()
    except (KeyError, TypeError, ValueError):
        return False


def adopt(resumable: Resumable, trial: optuna.Trial, session) -> None:
    """Make the dead trial's run the new trial's: its trial number, no error any more."""
    client = session.client
    client.set_tag(resumable.run_id, keys.TRIAL, str(trial.number))
    client.set_tag(resumable.run_id, keys.RESUMED_FROM, str(resumable.trial))
    with contextlib.suppress(Exception):  # no such tag (the run was never marked failed)
        client.delete_tag(resumable.run_id, keys.ERROR)
    trial.set_user_attr(keys.RESUMED_FROM, {"trial": resumable.trial, "run": resumable.run_id,
                                            "epoch": resumable.epoch})


def find_branch(session, cfg: Config) -> Branch | None:
    """The latest `stable.pt` of the study's runs that `cfg`'s run can start from (the same config, shorter,
    its decay begun at or before `cfg`'s), or None."""
    from ..training.resume import Branch, shares_stable_phase, stable_end
    from ..training.resume import STABLE, STABLE_BEST

    end = stable_end(cfg)
    if end <= 0:
        return None
    best: Branch | None = None
    for run in trial_runs(session.client, session.experiment_id, session.name):
        folder = checkpoint_dir(run.info.run_id, session.tracking_uri)
        ckpt = read_checkpoint(folder / STABLE)
        if ckpt is None:
            continue
        epoch = int(ckpt["epoch"])
        if epoch <= end and (best is None or epoch > best.epoch) and shares_stable_phase(ckpt["config"], cfg):
            best = Branch(run_id=run.info.run_id, checkpoint=folder / STABLE, best=folder / STABLE_BEST, epoch=epoch)
    return best
