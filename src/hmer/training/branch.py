"""A longer `wsd` run starts where a shorter run of its config began to decay.

Under `train.schedule=wsd` the rate is held until the last `train.decay_epochs` (hmer.training.optim),
and nothing else a run computes depends on its length: batch order and augmentation are drawn from
(seed, epoch), the warm-up is in steps. So a run of 32 epochs computes, epoch for epoch, what a run
of 16 epochs of the same config computes until the 16-epoch run's decay begins (epoch 13), and the
trainer keeps its state there (`stable.pt`, with the best weights so far in `stable-best.pt`:
`hmer.training.resume.keep_stable_phase`). A longer run then starts from it (`train(cfg,
start_from=...)`; a study finds it with `hmer.studies.branch.find_branch`): a new run that takes over
the shorter run's state and its curve up to that epoch, tagged `hmer.branched_from` (`<run
id>@<epoch>`), and ends as the longer run would have (tests/test_branch.py holds the two weight for
weight). Its clocks count the shared epochs too, so its `train_cpu_seconds` is what it would have cost
alone; what the study spent on it is that less the source's clock at the branch (`hmer.branch_cpu_seconds`).

The shared state lives in the shorter run's checkpoint folder (`checkpoints/<run id>/`) on the machine
that trained it: a study's trial keeps the two files when it ends (`hmer.studies.objective.train_trial`),
and they are never committed. Where they are gone, the longer run trains from scratch: the same
numbers at a higher cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import MACHINE_KEYS, Config

# Keys in which a longer wsd run of the same variant differs from a shorter one: its length alone.
LENGTH_KEYS = ("train.epochs", "train.decay_epochs")


@dataclass(frozen=True)
class Branch:
    """The state a longer wsd run starts from: a shorter run's at the end of its stable phase."""

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
    """Whether a checkpoint's config (`Config.to_dict()`) is `cfg` but for its length (and the keys of
    the machine that ran it): a wsd run whose stable phase `cfg`'s run repeats."""
    try:
        other = Config.from_dict(stored).to_flat_dict()
    except (KeyError, TypeError, ValueError):
        return False
    mine = cfg.to_flat_dict()
    ignored = set(LENGTH_KEYS) | set(MACHINE_KEYS)
    return other.get("train.schedule") == "wsd" and all(other.get(k) == v for k, v in mine.items() if k not in ignored)

