"""A longer `wsd` run starts where a shorter run of its config began to decay.

Under `train.schedule=wsd` the rate is held until the last `train.decay_epochs`, and nothing else depends on a
run's length (batches and augmentation are drawn from (seed, epoch), the warm-up is in steps). So a 32-epoch run
computes what the 16-epoch run computes until its decay (epoch 13), where the trainer keeps `stable.pt` and
`stable-best.pt` (`resume.keep_stable_phase`). `train(cfg, start_from=...)` (found by
`hmer.studies.resume.find_branch`) takes over that state and curve as a new run tagged `hmer.branched_from`
(`<run id>@<epoch>`) and ends as the longer run would have (tests/test_branch.py: weight for weight). Its
`train_cpu_seconds` counts the shared epochs; the study's own cost is `hmer.branch_cpu_seconds`.

The files stay in `checkpoints/<run id>/` on the machine that trained it (`studies.objective.train_trial`),
never committed; where they are gone the longer run trains from scratch: the same numbers at a higher cost.
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
    """Whether a checkpoint's config (`Config.to_dict()`) is a wsd `cfg` but for its length and machine keys."""
    try:
        other = Config.from_dict(stored).to_flat_dict()
    except (KeyError, TypeError, ValueError):
        return False
    mine = cfg.to_flat_dict()
    ignored = set(LENGTH_KEYS) | set(MACHINE_KEYS)
    return other.get("train.schedule") == "wsd" and all(other.get(k) == v for k, v in mine.items() if k not in ignored)

