"""The parts of the studies that need no training: booking grid cells against a real SQLite
storage from several processes, reopening failed cells, presets and the command line."""

from __future__ import annotations

import collections
import subprocess
import sys
import textwrap

import optuna
import pytest
from optuna.trial import TrialState

from hmer.studies import BUDGETS, STUDIES, StudySpec, ablations, get_budget
from hmer.studies.bookings import CellBookings, Worker, worker_alive
from hmer.cli.study import build_parser, parse_seeds
from hmer.studies.bookings import BookedCellSampler
from hmer.studies.storage import open_storage, trial_id
from hmer.tracking.store import mask_password
from hmer.studies.spec import SEED_KEY, cell_key
from hmer.tracking import keys

DIRECTION = STUDIES.get("ablate_direction")
SPEC = StudySpec(name="bookings", description="", axes={"model.direction": ("l2r", "r2l", "bi")}, model_presets={})

# The scripts below start booking together: a worker that imports first must not take every booking
# before the others are up (the tests are about processes that overlap).
START_TOGETHER = textwrap.dedent("""
    def start_together(ready_dir, workers):
        import os, pathlib, time
        ready = pathlib.Path(ready_dir)
        (ready / str(os.getpid())).touch()
        deadline = time.monotonic() + 120
        while len(list(ready.iterdir())) < workers and time.monotonic() < deadline:
            time.sleep(0.05)
""")

# One worker: books cells until none is open; each "trial" checks it got the cell it booked.
WORKER = START_TOGETHER + textwrap.dedent("""
    import sys, time
    import optuna
    from hmer.studies.bookings import CellBookings, Worker
    from hmer.studies.bookings import BookedCellSampler
    from hmer.studies.storage import open_storage
    from hmer.studies.spec import StudySpec, cell_key

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = StudySpec(name="bookings", description="", axes={"model.direction": ("l2r", "r2l", "bi")},
                     model_presets={})
    seeds = tuple(range(1, int(sys.argv[2]) + 1))
    cells, space = spec.cells(seeds), spec.search_space(seeds)
    storage = open_storage(sys.argv[1])
    sampler = BookedCellSampler()
    study = optuna.create_study(study_name="s", storage=storage, sampler=sampler,
                                direction="maximize", load_if_exists=True)
    bookings = CellBookings(study, Worker.current(), storage)
    start_together(sys.argv[3], int(sys.argv[4]))
    while (cell := bookings.book(cells, set())) is not None:
        sampler.assign(cell, lambda study, trial: bookings.started(trial, cell))

        def objective(trial):
            params = {k: trial.suggest_categorical(k, v) for k, v in space.items()}
            assert cell_key(params) == cell_key(cell), (params, cell)
            time.sleep(0.1)
            return 1.0

        study.optimize(objective, n_trials=1)
""")


# One sweep worker: continues dead trials until none is open; each checks it got the parameters and
# the number of the trial it booked.
CONTINUER = START_TOGETHER + textwrap.dedent("""
    import sys, time
    import optuna
    from hmer.studies.bookings import CellBookings, Worker
    from hmer.studies.bookings import BookedCellSampler
    from hmer.studies.storage import open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(sys.argv[1])
    sampler = BookedCellSampler(optuna.samplers.RandomSampler())
    study = optuna.load_study(study_name="sweep", storage=storage, sampler=sampler)
    bookings = CellBookings(study, Worker.current(), storage)
    start_together(sys.argv[2], int(sys.argv[3]))
    while (dead := bookings.book_continuation()) is not None:
        number, params = dead.number, dead.params
        sampler.assign(params, lambda study, trial: bookings.continuing(trial, number))

        def objective(trial):
            x = trial.suggest_float("x", 0.0, 1.0)
            assert x == params["x"], (x, params)
            stored = storage.get_trial(storage.get_trial_id_from_study_id_trial_number(
                storage.get_study_id_from_name("sweep"), trial.number))
            assert stored.user_attrs["hmer.continues"] == number, (stored.user_attrs, number)
            time.sleep(0.05)
            return x

        study.optimize(objective, n_trials=1)
""")


def test_three_processes_continue_every_dead_sweep_trial_exactly_once(tmp_path):
    """Dead sweep trials (FAIL, configuration complete) are booked as grid cells are: three
    workers started together continue each exactly once, with its parameters. A trial that failed
    with an error in a live worker, or died before its configuration was complete, is not continued."""
    storage_url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="sweep", storage=open_storage(storage_url), direction="maximize",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    dead = []
    for n in range(18):
        trial = study.ask()
        trial.suggest_float("x", 0.0, 1.0)
        if n == 16:
            trial.set_user_attr(keys.ERROR, "diverged")  # an outcome, not a death
        if n != 17:  # 17 died before its configuration was complete
            trial.set_user_attr(keys.CELL_KEY, f"x={trial.params['x']}")
        study.tell(trial, state=TrialState.FAIL)
        dead.append(trial.number)
    ready = tmp_path / "ready"
    ready.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", CONTINUER, storage_url, str(ready), "3"]) for _ in range(3)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0]

    trials = optuna.load_study(study_name="sweep", storage=storage_url).trials
    continuing = [t for t in trials if keys.CONTINUES in t.user_attrs]
    assert all(t.state == TrialState.COMPLETE for t in continuing)
    assert sorted(t.user_attrs[keys.CONTINUES] for t in continuing) == dead[:16]  # each once
    params = {t.number: t.params for t in trials}
    assert all(t.params == params[t.user_attrs[keys.CONTINUES]] for t in continuing)
    assert len({t.user_attrs[keys.WORKER]["token"] for t in continuing}) > 1  # they did overlap


def _study(storage: str) -> tuple[optuna.Study, BookedCellSampler, CellBookings]:
    store = open_storage(storage)
    sampler = BookedCellSampler()
    study = optuna.create_study(study_name="s", storage=store, sampler=sampler,
                                direction="maximize", load_if_exists=True)
    return study, sampler, CellBookings(study, Worker.current(), store)


def _run_cell(study, sampler, bookings, cell, fail: bool = False) -> None:
    sampler.assign(cell, lambda s, trial: bookings.started(trial, cell))

    def objective(trial):
        for key, values in SPEC.search_space((cell[SEED_KEY],)).items():
            trial.suggest_categorical(key, values)
        if fail:
            raise RuntimeError("diverged")
        return 1.0

    study.optimize(objective, n_trials=1, catch=(RuntimeError,))


def test_three_processes_book_every_cell_exactly_once(tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    ready = tmp_path / "ready"
    ready.mkdir()
    procs = [subprocess.Popen([sys.executable, "-W", "ignore", str(script), storage, "6", str(ready), "3"],
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
    study = optuna.load_study(study_name="s", storage=storage)
    cells = collections.Counter(t.user_attrs[keys.CELL_KEY] for t in study.trials)
    assert len(study.trials) == 18 and len(cells) == 18 and set(cells.values()) == {1}
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    assert len({t.user_attrs[keys.WORKER]["pid"] for t in study.trials}) >= 2


def test_a_failed_cell_opens_again_but_a_complete_or_running_one_does_not(tmp_path):
    study, sampler, bookings = _study(f"sqlite:///{tmp_path / 'optuna.db'}")
    cells = SPEC.cells((1,))
    _run_cell(study, sampler, bookings, cells[0])
    _run_cell(study, sampler, bookings, cells[1], fail=True)
    status = bookings.status()
    assert status.complete == {cell_key(cells[0])}
    # Optuna's GridSampler counts the FAIL cell as visited; the bookings do not.
    assert {cell_key(c) for c in status.open_cells(cells, set())} == {cell_key(cells[1]), cell_key(cells[2])}

    # A trial RUNNING in a live worker (this process) holds its cell; another worker skips it.
    sampler.assign(cells[2], lambda s, trial: bookings.started(trial, cells[2]))
    study.ask()
    other = CellBookings(study, Worker(host="elsewhere", pid=1, started="", token="other"), bookings.storage)
    assert [cell_key(c) for c in other.status().open_cells(cells, set())] == [cell_key(cells[1])]
    booked = other.book(cells, set())
    assert booked == cells[1]
    # ...and that booking keeps this worker off the cell until it becomes a trial.
    assert bookings.book(cells, set()) is None


def test_a_running_trial_of_a_dead_process_is_failed_and_its_cell_reopened(tmp_path):
    study, sampler, bookings = _study(f"sqlite:///{tmp_path / 'optuna.db'}")
    cells = SPEC.cells((1,))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    sampler.assign(cells[0], None)
    trial = study.ask()
    storage, tid = bookings.storage, trial_id(bookings.storage, study, trial.number)
    storage.set_trial_user_attr(tid, keys.WORKER, Worker(host=Worker.current().host, pid=dead.pid, started="1",
                                                         token="dead").as_attr())
    storage.set_trial_user_attr(tid, keys.CELL_KEY, cell_key(cells[0]))
    assert worker_alive(storage.get_trial(tid).user_attrs[keys.WORKER]) is False
    reaped = bookings.reap()
    assert [t.number for t in reaped] == [trial.number]
    assert storage.get_trial(tid).state == TrialState.FAIL
    assert cell_key(cells[0]) in {cell_key(c) for c in bookings.status().open_cells(cells, set())}
    assert worker_alive(Worker.current().as_attr()) is True


def test_budgets_size_the_trials_to_the_window():
    short = get_budget("short")
    # 12 cells on 3 workers: 4 rounds share the window left after loading.
    assert short.trial_budget_s(12, 3) == pytest.approx((short.window_s - short.load_s) / 4 - short.eval_reserve_s)
    assert short.config_overrides(12, 3)["train.time_budget_s"] == pytest.approx(short.trial_budget_s(12, 3), abs=0.1)
    assert "train.time_budget_s" not in get_budget("paper").config_overrides(9, 1)
    with pytest.raises(ValueError, match="do not fit"):
        short.trial_budget_s(400, 1)
    smoke = BUDGETS["smoke"].describe(len(DIRECTION.cells(BUDGETS["smoke"].seeds)), 1)
    assert "expected cost" in smoke and "2-core CPU" in smoke
    assert all(len(BUDGETS[n].seeds) >= 3 for n in ("short", "paper"))
    with pytest.raises(ValueError, match="unknown study budget"):
        get_budget("huge")


def test_command_line_options():
    assert parse_seeds("3") == (1, 2, 3) and parse_seeds("7,9") == (7, 9) and parse_seeds(None) is None
    args = build_parser(DIRECTION).parse_args(["--budget", "smoke", "--seeds", "2", "--n-jobs", "2", "--storage",
                                               "postgresql://u:secret@db/hmer", "--set", "train.epochs=1"])
    assert (args.budget, args.seeds, args.n_jobs, args.overrides) == ("smoke", (1, 2), 2, ["train.epochs=1"])
    assert "secret" not in mask_password(args.storage) and "db/hmer" in mask_password(args.storage)
    with pytest.raises(SystemExit):  # a preset is a model; a study's compute is its --budget
        build_parser(DIRECTION).parse_args(["--preset", "smoke"])


def test_hmer_study_runs_a_study_by_name_and_refuses_an_unknown_one(capsys):
    """`hmer study NAME [options]`: everything after NAME is the study's own (its parser, its --help);
    an unknown or missing name lists the studies in one line, exit status 2, and runs nothing."""
    from hmer.cli import main

    with pytest.raises(SystemExit) as done:
        main(["study", "ablate_direction", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith("usage: hmer study ablate_direction") and "--seeds" in out
    for argv, said in ((["study", "nope", "--budget", "smoke"], "unknown study 'nope'; "), (["study"], "")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"usage: hmer study NAME [options]: {said}NAME is one of ") and "ablate_direction" in err
        assert len(err.splitlines()) == 1, err


def test_every_ablation_cell_is_a_valid_config():
    from hmer.studies.resolution import cell_resolution, study_resolution

    for spec in ablations().values():
        for name in ("smoke", "cpu", "paper"):
            budget = get_budget(name)
            base = study_resolution(spec, budget, n_trials=9, n_jobs=1)
            for cell in spec.cells(budget.seeds[:1]):
                cfg = cell_resolution(base, spec, cell).config
                for key, value in cell.items():
                    assert cfg.to_flat_dict()[key] == value


def test_past_the_grace_period_a_paused_worker_keeps_its_trial_and_a_silent_one_elsewhere_is_reaped(
        tmp_path, monkeypatch):
    """Optuna's heartbeat cannot tell a worker paused with SIGSTOP (or starved of CPU) from a dead
    one: on this host the process id can, so that trial stays RUNNING. A trial of another host
    whose heartbeat is past the grace period is failed, and the reaping worker gets it back to take
    it up (a sweep continues it), as it gets those whose process it finds gone."""
    import os
    import signal
    import time

    monkeypatch.setenv("HMER_STUDY_HEARTBEAT_S", "1")  # grace period 3 s
    study, sampler, bookings = _study(f"sqlite:///{tmp_path / 'optuna.db'}")
    cells = SPEC.cells((1,))
    paused = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(paused.pid, signal.SIGSTOP)
        here = Worker.current().host
        workers = {here: Worker(host=here, pid=paused.pid, started="", token="paused"),
                   "elsewhere": Worker(host="elsewhere", pid=1, started="", token="elsewhere")}
        storage, trials = bookings.storage, {}
        for cell, (host, worker) in zip(cells, workers.items()):
            sampler.assign(cell, None)
            trial = study.ask()
            tid = trial_id(storage, study, trial.number)
            storage.set_trial_user_attr(tid, keys.WORKER, worker.as_attr())
            storage.set_trial_user_attr(tid, keys.CELL_KEY, cell_key(cell))
            storage.record_heartbeat(tid)
            trials[host] = (trial.number, tid)
        time.sleep(3 + 1.5)  # both silent past the grace period
        reaped = bookings.reap()
        assert [t.number for t in reaped] == [trials["elsewhere"][0]]
        states = {host: storage.get_trial(tid).state for host, (_, tid) in trials.items()}
        assert states == {here: TrialState.RUNNING, "elsewhere": TrialState.FAIL}
        assert bookings.reap() == []  # taken once
    finally:
        paused.kill()
        paused.wait()
