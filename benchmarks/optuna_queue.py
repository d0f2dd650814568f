"""Would Optuna's own queue and heartbeat retry run a grid study's cells once each?

    python benchmarks/optuna_queue.py [--storage URL] [--workers 3] [--cells 30] [--rounds 3]

Issue 50 asked whether grid cells could be enqueued with `study.enqueue_trial` and the trials of
dead workers retried with Optuna's heartbeat and `RetryHeartbeatStaleTrialCallback` (formerly
`RetryFailedTrialCallback`), instead of the studies' own bookings (`hmer.studies.bookings`). This
measures the two steps where several workers race, with Optuna's public API alone, on a real
storage (default: a fresh SQLite file, the studies' default storage; give a PostgreSQL URL to
measure a database server):

1. **the queue**: `--cells` trials are enqueued, then `--workers` processes, started at the same
   moment, each run `study.optimize(objective, n_trials=1)` while a WAITING trial is left. Printed:
   the cells whose objective ran in more than one process, and the trials that did not come from
   the queue (the queue emptied between a worker's look and its `optimize`, which then sampled a
   trial of its own);
2. **the retry**: `--cells` RUNNING trials whose heartbeat is past the grace period, and
   `--workers` processes that run `optuna.storages.fail_stale_trials` at the same moment with the
   retry callback. Printed: the stale trials enqueued again more than once.

Either count above zero is a cell trained twice. Run it again before raising the upper bound on
optuna in pyproject.toml (with tests/test_studies_bookings.py and tests/test_servers.py).
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import optuna
from optuna.trial import TrialState

STUDY = "queue"
GRACE_S = 2  # the stale trials' grace period (heartbeat every second)


def storage_for(url: str, retry: bool = False) -> optuna.storages.RDBStorage:
    callback = optuna.storages.RetryHeartbeatStaleTrialCallback() if retry else None
    return optuna.storages.RDBStorage(
        url, engine_kwargs={"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {},
        heartbeat_interval=1, grace_period=GRACE_S, heartbeat_stale_trial_callback=callback)


def wait_until(when: float) -> None:
    while time.time() < when:
        time.sleep(0.001)


def queue_worker(url: str, cells: int, start: float, out: str) -> None:
    """Pop enqueued trials with `optimize` until none is WAITING; write [cell, from the queue] per objective call."""
    study = optuna.load_study(study_name=STUDY, storage=storage_for(url),
                              sampler=optuna.samplers.GridSampler({"cell": list(range(cells))}, seed=0))
    ran = []

    def objective(trial: optuna.Trial) -> float:
        cell = trial.suggest_categorical("cell", list(range(cells)))
        ran.append((cell, trial.number < cells))  # the enqueued trials are the first `cells`
        time.sleep(0.02)
        return 1.0

    wait_until(start)
    while study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        try:
            study.optimize(objective, n_trials=1, catch=(Exception,))
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError):
            pass  # another process ran the same trial and told it first ("Cannot tell a COMPLETE trial")
    Path(out).write_text(json.dumps(ran))


def stale_worker(url: str, start: float) -> None:
    study = optuna.load_study(study_name=STUDY, storage=storage_for(url, retry=True))
    wait_until(start)
    optuna.storages.fail_stale_trials(study)


def fresh_study(url: str) -> optuna.Study:
    try:
        optuna.delete_study(study_name=STUDY, storage=url)
    except KeyError:
        pass
    return optuna.create_study(study_name=STUDY, storage=storage_for(url))


def spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, *args])


def measure_queue(url: str, workers: int, cells: int, folder: Path) -> tuple[int, int]:
    study = fresh_study(url)
    for cell in range(cells):
        study.enqueue_trial({"cell": cell})
    start = time.time() + 5 + workers  # every worker has loaded the study by then
    outs = [folder / f"ran-{i}.json" for i in range(workers)]
    procs = [spawn("--queue-worker", url, str(cells), str(start), str(out)) for out in outs]
    if any(p.wait() != 0 for p in procs):
        raise SystemExit("a queue worker failed (see above)")
    ran = [tuple(r) for out in outs for r in json.loads(out.read_text())]
    twice = sum(1 for n in collections.Counter(cell for cell, _ in ran).values() if n > 1)
    return twice, sum(1 for _, queued in ran if not queued)


def measure_retry(url: str, workers: int, cells: int) -> int:
    study = fresh_study(url)
    storage = storage_for(url)
    study_id = storage.get_study_id_from_name(STUDY)
    for _ in range(cells):
        trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
        storage.record_heartbeat(storage.get_trial_id_from_study_id_trial_number(study_id, trial.number))
    time.sleep(GRACE_S + 1)  # every heartbeat is stale now
    start = time.time() + 5 + workers
    procs = [spawn("--stale-worker", url, str(start)) for _ in range(workers)]
    if any(p.wait() != 0 for p in procs):
        raise SystemExit("a heartbeat worker failed (see above)")
    retried = [optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number(t)
               for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))]
    return sum(1 for n in collections.Counter(retried).values() if n > 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--storage", help="an RDB URL (default: a fresh SQLite file); the study 'queue' is replaced")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--cells", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--queue-worker", nargs=4, help=argparse.SUPPRESS)
    p.add_argument("--stale-worker", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # the heartbeat's API
    warnings.filterwarnings("ignore", message="Heartbeat of storage")  # the stale trials are made with ask()
    if args.queue_worker:
        url, cells, start, out = args.queue_worker
        return queue_worker(url, int(cells), float(start), out)
    if args.stale_worker:
        return stale_worker(args.stale_worker[0], float(args.stale_worker[1]))
    with tempfile.TemporaryDirectory(prefix="hmer-optuna-queue-") as tmp:
        url = args.storage or f"sqlite:///{Path(tmp) / 'optuna.db'}"
        print(f"optuna {optuna.__version__}, {url.split(':', 1)[0]} storage, {args.workers} workers, "
              f"{args.cells} cells, {args.rounds} rounds", flush=True)
        totals = collections.Counter()
        for r in range(args.rounds):
            twice, sampled = measure_queue(url, args.workers, args.cells, Path(tmp))
            retried = measure_retry(url, args.workers, args.cells)
            totals.update(twice=twice, sampled=sampled, retried=retried)
            print(f"round {r + 1}: queue: {twice} cells ran twice, {sampled} trials not from the queue; "
                  f"retry: {retried} of {args.cells} stale trials enqueued twice", flush=True)
        n = args.rounds * args.cells
        print(f"in all: {totals['twice']} of {n} cells ran twice, {totals['sampled']} trials not from the queue, "
              f"{totals['retried']} of {n} stale trials enqueued twice", flush=True)


if __name__ == "__main__":
    main()
