"""Where a longer `wsd` cell of a study starts: the latest state that a shorter cell of its variant kept
where its decay began (`hmer.training.branch` says why the two compute the same)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config import Config
from .mlflow_runs import trial_runs
from .resume import checkpoint_dir, read_checkpoint

if TYPE_CHECKING:  # (the training package imports torch: a study's planning does not need it)
    from ..training.branch import Branch


def find_branch(session, cfg: Config) -> Branch | None:
    """The latest `stable.pt` of the study's runs that `cfg`'s run can start from (the same config, shorter,
    its decay begun at or before `cfg`'s), or None."""
    from ..training.branch import Branch, shares_stable_phase, stable_end
    from ..training.resume import STABLE, STABLE_BEST

    end = stable_end(cfg)
    if end <= 0:
        return None
    best: Branch | None = None
    for run in trial_runs(session.client, session.experiment_id, session.name):
        folder = checkpoint_dir(run.info.run_id, session.tracking_uri)
        path = folder / STABLE
        ckpt = read_checkpoint(path)
        if ckpt is None:
            continue
        epoch = int(ckpt["epoch"])
        if epoch <= end and (best is None or epoch > best.epoch) and shares_stable_phase(ckpt["config"], cfg):
            best = Branch(run_id=run.info.run_id, checkpoint=path, best=folder / STABLE_BEST, epoch=epoch)
    return best
