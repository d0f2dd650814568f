"""Which grid cell a worker runs next, so that no cell runs twice and none is lost.

Optuna's `GridSampler` counts a FAIL trial as visited and hands out cells still running elsewhere, and
its queue breaks "no cell runs twice" on SQLite (docs/studies.md, "Several workers"). So the runner
picks the cell, and the Optuna storage is all the workers share: dead workers' trials are failed first
(`reap`: by pid on this host, by Optuna's heartbeat elsewhere); a cell is open when none of its trials
is COMPLETE or RUNNING and no other live worker books it; booking is write-then-read (a worker writes
its booking, then reads every booking and trial, and withdraws if anyone else has the cell: of two
racers the later reader sees the other); the trial is tagged with its cell before the booking is
released, and readers read bookings before trials. A booking that never became a trial expires after
`booking_ttl_s` (at once when its worker here is gone). A sweep's dead trials are booked the same way.
The trial takes its booked cell through its sampler (`BookedCellSampler`); a sweep's other trials take
what its proposer (TPE) proposes.
"""

from __future__ import annotations

import json
import os
import random
import socket
import time
import uuid
import warnings
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from ..tracking import keys
from ..tracking.run import process_alive
from .spec import SEED_KEY, cell_key
from .storage import StaleTrials

_Booked = TypeVar("_Booked")  # what a booking key stands for: a grid cell, a dead trial
BOOKING_ATTEMPTS = 50  # races a worker may lose in a row before booking fails


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (state first), or [] where unknown; the name
    may hold spaces, so they start after the last ")"."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return []
    return stat[stat.rfind(")") + 2:].split()


def _start_time(fields: list[str]) -> str:
    """The process start time (clock ticks since boot), or an empty string where unknown."""
    return fields[19] if len(fields) > 19 else ""


@dataclass(frozen=True)
class Worker:
    """One worker process: where it runs, so that others can tell whether it still does."""

    host: str
    pid: int
    started: str
    token: str

    @classmethod
    def current(cls) -> "Worker":
        pid = os.getpid()
        return cls(host=socket.gethostname(), pid=pid, started=_start_time(_stat_fields(pid)),
                   token=f"{socket.gethostname()}:{pid}:{uuid.uuid4().hex[:8]}")

    def as_attr(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def worker_alive(attr: Mapping[str, Any] | None) -> bool | None:
    """Whether the worker `attr` describes still runs; None where this machine cannot tell."""
    if not attr or attr.get("host") != socket.gethostname():
        return None
    pid = int(attr.get("pid", -1))
    if pid <= 0:
        return None
    if os.path.isdir("/proc"):
        fields = _stat_fields(pid)  # one read: state, then start time
        if not fields or fields[0] in ("Z", "X"):  # gone, or a zombie not yet reaped
            return False
        started = attr.get("started") or ""
        return not started or _start_time(fields) == started  # a reused pid is another process
    return process_alive(pid)


def mark_failed(storage: optuna.storages.BaseStorage, trial_id: int, reason: str) -> bool:
    """Mark a RUNNING trial FAIL with `reason` (`hmer.failed_by`); False if it was finished first."""
    try:
        storage.set_trial_user_attr(trial_id, keys.FAILED_BY, reason)
        return storage.set_trial_state_values(trial_id, TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False


NO_ERROR = "no error recorded (its worker died or was interrupted)"


def failure_reason(trial: FrozenTrial, chars: int = 300) -> str:
    """Why a FAIL trial failed, on one line: its error, who marked it FAIL (`mark_failed`), or NO_ERROR."""
    why = str(trial.user_attrs.get(keys.ERROR) or trial.user_attrs.get(keys.FAILED_BY) or "")
    return why.splitlines()[0][:chars] if why.strip() else NO_ERROR


@dataclass
class GridStatus:
    """Where every cell stands, as one worker sees it now."""

    complete: set[str]
    running: set[str]
    booked: set[str]  # booked by other live workers, not yet a trial

    def open_cells(self, cells: Iterable[Mapping[str, Any]], skip: set[str]) -> list[dict[str, Any]]:
        busy = self.complete | self.running | self.booked | skip
        return [dict(c) for c in cells if cell_key(c) not in busy]


class CellBookings:
    """Books grid cells for one worker in one study; see the module docstring."""

    def __init__(self, study: optuna.Study, worker: Worker, storage: optuna.storages.RDBStorage,
                 booking_ttl_s: float = 120.0, rng: random.Random | None = None):
        self.study = study
        self.worker = worker
        self.storage = storage  # the study's: its public methods read and write what the workers share
        self.study_id = storage.get_study_id_from_name(study.study_name)
        self.booking_ttl_s = booking_ttl_s
        self.rng = rng or random.Random(worker.token)
        self.booking_key = keys.BOOKING_PREFIX + worker.token

    def trial_id(self, trial: FrozenTrial) -> int:
        return self.storage.get_trial_id_from_study_id_trial_number(self.study_id, trial.number)

    # -- dead workers ---------------------------------------------------------------------------
    def vouch_for_live_workers(self) -> None:
        """A heartbeat for every RUNNING trial whose worker runs on this host: one starved of CPU past the
        grace period is alive, and Optuna's heartbeat check must not fail its trial."""
        if self.storage.get_heartbeat_interval() is None:
            return  # a storage opened without Optuna's heartbeat
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if worker_alive(trial.user_attrs.get(keys.WORKER)):
                self.storage.record_heartbeat(self.trial_id(trial))

    def reap(self) -> list[FrozenTrial]:
        """Mark FAIL every RUNNING trial whose worker is gone (by pid on this host, by Optuna's heartbeat
        elsewhere); the trials it failed."""
        stale = self.storage.get_heartbeat_stale_trial_callback()
        self.vouch_for_live_workers()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)
        # (a finished trial takes no attributes: these have no `hmer.failed_by`)
        failed = stale.take() if isinstance(stale, StaleTrials) else []
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            worker = trial.user_attrs.get(keys.WORKER)
            alive = worker_alive(worker)
            age_s = time.time() - trial.datetime_start.timestamp() if trial.datetime_start else 0.0
            orphan = worker is None and age_s > self.booking_ttl_s  # died before tagging it
            if alive is False or orphan:
                tid = self.trial_id(trial)
                gone = f"worker {worker.get('token') if worker else '?'} is gone; marked FAIL by {self.worker.token}"
                if mark_failed(self.storage, tid, gone):
                    failed.append(self.storage.get_trial(tid))
        return failed

    # -- status ----------------------------------------------------------------------------------
    def status(self) -> GridStatus:
        """Bookings first, then trials: a booking released after our read shows as its trial."""
        booked = self._live_bookings()
        cells = [(t.state, t.user_attrs[keys.CELL_KEY]) for t in self.study.get_trials(deepcopy=False)
                 if keys.CELL_KEY in t.user_attrs]
        return GridStatus(complete={key for state, key in cells if state == TrialState.COMPLETE},
                          running={key for state, key in cells if state == TrialState.RUNNING}, booked=booked)

    def errored_since(self, since: float) -> set[str]:
        """Cells whose trial raised an error in a live worker since `since` (Unix time): not retried in this
        session; a rerun does."""
        return {t.user_attrs[keys.CELL_KEY] for t in self.study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
                if t.user_attrs.get(keys.CELL_KEY) and keys.ERROR in t.user_attrs and t.datetime_start
                and t.datetime_start.timestamp() >= since}

    def _live_bookings(self) -> set[str]:
        out = set()
        now = time.time()
        for key, value in self.storage.get_study_system_attrs(self.study_id).items():
            if not key.startswith(keys.BOOKING_PREFIX) or key == self.booking_key or not isinstance(value, dict) \
                    or not value.get("cell"):  # another worker's booking, not released
                continue
            alive = worker_alive(value.get("worker"))
            if alive is False or (alive is None and now - float(value.get("at", 0.0)) > self.booking_ttl_s):
                continue  # its worker died before it became a trial
            out.add(value["cell"])
        return out

    # -- booking --------------------------------------------------------------------------------
    def book(self, cells: Sequence[Mapping[str, Any]], skip: set[str]) -> dict[str, Any] | None:
        """Book an open cell: the first in `cells` order, or after a lost race a random one of the lowest open
        seed; None when none is open. `started` or `release` releases it."""
        def open_cells() -> dict[str, dict[str, Any]]:
            return {cell_key(c): c for c in self.status().open_cells(cells, skip)}

        def of_the_lowest_seed(candidates: dict[str, dict[str, Any]]) -> str:
            first_seed = next(iter(candidates.values()))[SEED_KEY]
            return self.rng.choice([key for key, c in candidates.items() if c[SEED_KEY] == first_seed])

        return self._book_open(open_cells, of_the_lowest_seed, "a grid cell", before=self.reap)

    def open_continuations(self) -> list[FrozenTrial]:
        """A sweep's trials that died with their configuration complete, that no later trial continues and
        no other live worker books (bookings read first, as `status` does)."""
        booked = self._live_bookings()
        trials = self.study.get_trials(deepcopy=False)
        taken = {t.user_attrs[keys.CONTINUES] for t in trials if keys.CONTINUES in t.user_attrs}
        return [t for t in trials if t.state == TrialState.FAIL and keys.CELL_KEY in t.user_attrs
                and keys.ERROR not in t.user_attrs and t.number not in taken
                and continuation_key(t.number) not in booked]

    def book_continuation(self) -> FrozenTrial | None:
        """Book a dead sweep trial to continue (the oldest, or after a lost race a random one), as `book` does;
        None when none is open. Released by `continuing` or `release`."""
        def open_trials() -> dict[str, FrozenTrial]:
            return {continuation_key(t.number): t for t in self.open_continuations()}

        return self._book_open(open_trials, lambda candidates: self.rng.choice(list(candidates)),
                                "a dead trial to continue")

    def _book_open(self, open_now: Callable[[], dict[str, _Booked]],
                    after_a_lost_race: Callable[[dict[str, _Booked]], str], what: str,
                    before: Callable[[], Any] | None = None) -> _Booked | None:
        """Book the first of `open_now()` ({booking key: what it books}), or after a lost race the key
        `after_a_lost_race` picks; keep it if still open on reading again, else withdraw and pause."""
        for attempt in range(BOOKING_ATTEMPTS):
            if before is not None:
                before()
            candidates = open_now()
            if not candidates:
                return None
            key = next(iter(candidates)) if attempt == 0 else after_a_lost_race(candidates)
            self._write_booking(key)
            if key in open_now():
                return candidates[key]
            self.release()
            time.sleep(self.rng.uniform(0.05, 1.0))  # two workers raced for it: separate them
        raise RuntimeError(f"could not book {what} in {BOOKING_ATTEMPTS} attempts")

    def continuing(self, trial: FrozenTrial, dead_number: int) -> None:
        """Record the worker and the dead trial it continues on the new trial, then release."""
        self._record(trial, {keys.CONTINUES: dead_number})

    def started(self, trial: FrozenTrial, cell: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> None:
        """Record the cell and worker on the new trial, then release the booking."""
        self._record(trial, {keys.CELL_KEY: cell_key(cell), **(extra or {})})

    def _record(self, trial: FrozenTrial, attrs: Mapping[str, Any]) -> None:
        tid = self.trial_id(trial)
        for key, value in {keys.WORKER: self.worker.as_attr(), **attrs}.items():
            self.storage.set_trial_user_attr(tid, key, value)
        self.release()

    def release(self) -> None:
        self._write_booking(None)

    def _write_booking(self, key: str | None) -> None:
        self.storage.set_study_system_attr(self.study_id, self.booking_key,
                                           {"cell": key, "at": time.time(), "worker": self.worker.as_attr()})


def continuation_key(number: int) -> str:
    """What a worker books to continue dead trial `number` (no cell key looks like it)."""
    return f"continues trial {number}"


def describe_cell_key(key: str) -> str:
    """A cell key as "model.direction=bi, train.seed=1"."""
    return ", ".join(f"{k}={v}" for k, v in json.loads(key).items())


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
