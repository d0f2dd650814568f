"""One training run's lifecycle in MLflow (hmer.tracking.run), and the layers it keeps apart."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from hmer.tracking import keys
from hmer.tracking.run import NullRun, TrainingRun

SRC = Path(__file__).resolve().parents[1] / "src" / "hmer"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mlruns")
    return f"sqlite:///{folder / 'mlflow.db'}"


def _start(store, **kwargs) -> TrainingRun:
    return TrainingRun.start(tracking_uri=store, experiment="lifecycle", variant="tiny", device="cpu (test)",
                             **kwargs)


class TrialPruned(Exception):
    """Named as Optuna's: the run recognises pruning by the exception's name."""


def test_a_run_that_returns_is_finished_with_its_start_tags(store):
    parent = _start(store, run_name="parent")
    with parent:
        pass
    run = _start(store, run_name="child", parent_run_id=parent.run_id, tags={keys.TRIAL: "3"})
    with run:
        run.log_params({f"p{i}": i for i in range(150)})  # more than one MLflow batch
        run.log_metrics({"train_loss": 1.5, "skipped": None}, step=1)
        run.log_metrics({"train_loss": 1.0}, step=2)
        run.log_text("{}", "config.json")
    got = MlflowClient(store).get_run(run.run_id)
    assert got.info.status == "FINISHED" and got.info.run_name == "child"
    tags = got.data.tags
    assert tags[keys.STATUS] == "finished" and tags[keys.VARIANT] == "tiny" and tags[keys.DEVICE] == "cpu (test)"
    assert tags[keys.GIT_COMMIT] and tags[keys.TRIAL] == "3" and tags[keys.MLFLOW_PARENT_RUN_ID] == parent.run_id
    assert len(got.data.params) == 150 and "skipped" not in got.data.metrics
    history = MlflowClient(store).get_metric_history(run.run_id, "train_loss")
    assert [(m.step, m.value) for m in history] == [(1, 1.5), (2, 1.0)]


@pytest.mark.parametrize("exc, status, tag, error", [
    (TrialPruned("pruned at epoch 2"), "KILLED", "pruned", None),
    (KeyboardInterrupt(), "KILLED", "failed", "KeyboardInterrupt: "),
    (FloatingPointError("training loss became nan"), "FAILED", "failed",
     "FloatingPointError: training loss became nan"),
])
def test_an_exception_ends_the_run_with_its_status_and_goes_on(store, exc, status, tag, error):
    run = _start(store)
    with pytest.raises(type(exc)):
        with run:
            raise exc
    got = MlflowClient(store).get_run(run.run_id)
    assert got.info.status == status and got.data.tags[keys.STATUS] == tag
    assert got.data.tags.get(keys.ERROR) == error


def test_a_paused_run_is_killed_and_resumes_in_place(store):
    run = _start(store)
    with run:
        run.pause()
    client = MlflowClient(store)
    got = client.get_run(run.run_id)
    assert got.info.status == "KILLED" and got.data.tags[keys.STATUS] == "paused"
    before = got.data.tags[keys.DEVICE]
    again = TrainingRun.resume(run.run_id, tracking_uri=store, from_epoch=4, device=before)
    got = client.get_run(run.run_id)
    assert got.info.status == "RUNNING" and got.data.tags[keys.STATUS] == "running"
    assert got.data.tags[keys.RESUMED] == "4"
    assert got.data.tags[keys.DEVICE] == before  # the same host: named once
    with again:
        again.pause()
    # continued on another host: both trained it, in the order first used, each named once
    for host in ("cpu (another CPU, AVX2, 1 threads)", before, "cpu (another CPU, AVX2, 1 threads)"):
        with TrainingRun.resume(run.run_id, tracking_uri=store, from_epoch=6, device=host) as again:
            again.pause()
    assert client.get_run(run.run_id).data.tags[keys.DEVICE] == f"{before}; cpu (another CPU, AVX2, 1 threads)"
    with TrainingRun.resume(run.run_id, tracking_uri=store, from_epoch=8, device=before):
        pass
    assert client.get_run(run.run_id).info.status == "FINISHED"


def test_a_null_run_records_nothing_and_lets_exceptions_through(store, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)  # where anything it did log would land
    rank0 = _start(store, run_name="rank 0")  # the run the other ranks' NullRun stands for
    with rank0:
        pass
    client = MlflowClient(store)

    def everything() -> list:
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        return sorted((r.info.run_id, r.info.status, sorted(r.data.params.items()), sorted(r.data.metrics.items()),
                       sorted(r.data.tags.items()), [a.path for a in client.list_artifacts(r.info.run_id)])
                      for r in runs)

    before = everything()
    (tmp_path / "attention.png").write_bytes(b"not logged")
    run = NullRun(rank0.run_id)
    with pytest.raises(ValueError, match="through"):
        with run:
            run.log_params({"a": 1})
            run.log_metrics({"x": 1.0}, step=1)
            run.log_text("{}", "config.json")
            run.log_artifacts(str(tmp_path), "attention")
            run.set_tag(keys.STATUS, "x")
            run.pause()
            raise ValueError("through")
    assert run.run_id == rank0.run_id
    assert everything() == before


def _imports(path: Path) -> set[str]:
    """The absolute module names `path` imports (relative imports resolved within hmer)."""
    package = ".".join(path.relative_to(SRC.parent).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found |= {module} | {f"{module}.{a.name}" for a in node.names}
    return found


def test_training_never_imports_mlflow_and_tracking_never_imports_training():
    for path in sorted((SRC / "training").glob("*.py")):
        assert not any(m.split(".")[0] == "mlflow" for m in _imports(path)), path.name
    for path in [*sorted((SRC / "tracking").glob("*.py")), SRC / "checkpoint.py", SRC / "device.py"]:
        upward = {m for m in _imports(path) if m.startswith(("hmer.training", "hmer.studies", "hmer.reports"))}
        assert not upward, f"{path.name} imports {upward}"


SETTERS = {"set_tag", "set_user_attr", "set_trial_user_attr", "set_study_user_attr", "set_study_system_attr",
           "set_trial_system_attr"}  # each takes (..., key, value)
READ_FROM = {"tags", "user_attrs", "system_attrs"}
NOT_RECORD_KEYS = {"hmer.allowed"}  # config.py's dataclass field metadata key, never written to a store


def _spelled_keys(path: Path) -> list[str]:
    """Tag and attribute keys `path` spells out instead of naming from `keys`: `hmer.` strings, and
    literal keys given to a setter or read from `.tags` / `.user_attrs` / `.system_attrs`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        key = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("hmer.") \
                and node.value not in NOT_RECORD_KEYS:
            key = node
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if node.func.attr in SETTERS and len(node.args) >= 2:
                key = node.args[-2]
            elif node.func.attr == "get" and isinstance(node.func.value, ast.Attribute) \
                    and node.func.value.attr in READ_FROM:
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                and node.value.attr in READ_FROM:
            key = node.slice
        if isinstance(key, (ast.Constant, ast.JoinedStr)):
            found.append(f"line {node.lineno}: {ast.unparse(key)}")
    return sorted(found)


def test_tag_keys_are_named_once():
    """Every module of the package (studies, reports and the CLI included) names its tag and
    attribute keys from `hmer.tracking.keys`."""
    for path in sorted(SRC.rglob("*.py")):
        if path != SRC / "tracking" / "keys.py":
            assert not _spelled_keys(path), f"{path.relative_to(SRC)}: {_spelled_keys(path)}"


def test_the_key_check_sees_a_spelled_key(tmp_path):
    spelled = tmp_path / "spelled.py"
    spelled.write_text('trial.set_user_attr("mlflow_run_id", 1)\nclient.set_tag(run, keys.STATUS, "x")\n'
                       'run.data.tags.get("hmer.study")\nstudy.user_attrs[f"claim{n}"]\n')
    assert _spelled_keys(spelled) == ["line 1: 'mlflow_run_id'", "line 3: 'hmer.study'", "line 3: 'hmer.study'",
                                      "line 4: f'claim{n}'"]


def test_one_place_builds_the_mlflow_client():
    """`tracking.store.mlflow_client` opens every store the package reads or writes."""
    builders = [f"{path.relative_to(SRC)}:{node.lineno}" for path in sorted(SRC.rglob("*.py"))
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Call) and "MlflowClient" in ast.unparse(node.func)]
    assert len(builders) == 1 and builders[0].startswith("tracking/store.py:"), builders


def test_runs_of_dead_processes_are_closed_in_the_named_experiment_only(store):
    """A study opening, or `hmer train --resume`, closes its own experiment's runs whose process is
    gone. Another experiment's RUNNING runs stay as they are: a committed study unfinished on
    another machine keeps them, and a host name may be shared (CI found one)."""
    import socket
    import subprocess
    import sys

    from hmer.tracking.run import fail_runs_of_dead_processes

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    client = MlflowClient(store)
    runs = {}
    for experiment in ("ours", "theirs"):
        experiment_id = client.create_experiment(experiment)
        runs[experiment] = client.create_run(experiment_id, tags={keys.HOST: socket.gethostname(),
                                                                  keys.PID: str(dead.pid)}).info.run_id
    assert fail_runs_of_dead_processes("ours", store) == [runs["ours"]]
    assert client.get_run(runs["ours"]).info.status == "FAILED"
    assert "killed outright" in client.get_run(runs["ours"]).data.tags[keys.ERROR]
    assert client.get_run(runs["theirs"]).info.status == "RUNNING"
    assert fail_runs_of_dead_processes("absent", store) == []


def test_search_all_runs_reads_every_page_of_a_real_store(tmp_path):
    """Seven runs in pages of two: every page is read, in start order when asked, the deleted ones
    only with `deleted_too`, and the filter applies to every page."""
    from hmer.tracking.store import search_all_runs

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    first = client.create_experiment("first", artifact_location=str(tmp_path / "a"))
    second = client.create_experiment("second", artifact_location=str(tmp_path / "b"))
    made = []
    for i in range(7):
        run = client.create_run(first if i < 5 else second, start_time=1_000 + i, tags={"n": str(i)})
        made.append(run.info.run_id)
    client.delete_run(made[1])
    client.delete_experiment(second)

    active = search_all_runs(client, page_size=2, oldest_first=True)
    assert [r.info.run_id for r in active] == [made[0], *made[2:5]]
    every = search_all_runs(client, page_size=2, deleted_too=True)
    assert sorted(r.info.run_id for r in every) == sorted(made)
    kept = search_all_runs(client, [first], "tags.n != '2'", page_size=1, deleted_too=True)
    assert sorted(r.data.tags["n"] for r in kept) == ["0", "1", "3", "4"]
