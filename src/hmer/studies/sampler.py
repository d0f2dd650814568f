"""The sampler of the studies: a grid trial takes the cell its worker booked (`hmer.studies.bookings`),
a sweep's other trials what its proposer (TPE) proposes.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from .spec import cell_key


class BookedCellSampler(optuna.samplers.BaseSampler):
    """A worker's next trial takes the cell it booked; with a `proposer` (a sweep's TPE) every trial but one
    continuing a dead trial (which takes its parameters, `CellBookings.book_continuation`) is proposed.

    The sampler only hands the booked values to the objective's `suggest_*` calls: the distributions stay
    the study's, so `optuna trials` and the dashboard show grid points. Optuna's `GridSampler` cannot be
    told which cell, and `enqueue_trial` leaves a WAITING trial two workers can pop together on SQLite
    (docs/studies.md, "Several workers")."""

    def __init__(self, proposer: optuna.samplers.BaseSampler | None = None) -> None:
        self.proposer = proposer
        self.next_cell: dict[str, Any] | None = None
        self.on_start: Any = None
        self.cell: dict[str, Any] | None = None  # the cell of the trial in progress in this process, if booked

    def assign(self, cell: Mapping[str, Any], on_start) -> None:
        """The next trial of this process takes `cell`; `on_start(study, trial)` runs once it exists."""
        self.next_cell = dict(cell)
        self.on_start = on_start

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        cell, on_start = self.next_cell, self.on_start
        self.next_cell, self.on_start = None, None
        if cell is None and self.proposer is None:
            raise RuntimeError("a grid trial was started without a booked cell; "
                               "studies are run by hmer.studies.run_grid_study")
        self.cell = cell
        if on_start is not None:
            on_start(study, trial)
        if self.proposer is not None:
            self.proposer.before_trial(study, trial)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        if self.cell is not None or self.proposer is None:
            return {}
        return self.proposer.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if self.cell is not None or self.proposer is None:
            return {}
        return self.proposer.sample_relative(study, trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        if self.cell is None and self.proposer is not None:
            return self.proposer.sample_independent(study, trial, param_name, param_distribution)
        cell = self.cell or {}
        if param_name not in cell:
            raise ValueError(f"trial {trial.number} asks for {param_name!r}, which its booked cell "
                             f"{cell_key(cell)} does not set")
        return cell[param_name]

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self.cell = None
        if self.proposer is not None:
            self.proposer.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        if self.proposer is not None:
            self.proposer.reseed_rng()
