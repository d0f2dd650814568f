"""A longer `wsd` run starts where a shorter run of its config began to decay.

Before its decay nothing a `wsd` run computes depends on its length, so `train(cfg, start_from=...)`
(found by `hmer.studies.resume.find_branch`) takes over the state the trainer kept there (`stable.pt`,
`stable-best.pt`) and ends as the longer run would have, weight for weight (tests/test_branch.py). Its
`train_cpu_seconds` counts the shared epochs; the study's own cost is `hmer.branch_cpu_seconds`.
See docs/training.md, "Budgets that share a run".
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

