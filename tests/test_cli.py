"""The `hmer` command line end to end: train, evaluate and predict by run id, kill -9 and
resume, and one-line errors with exit status 2 for bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from hmer.cli import main
from tiny_dataset import write_dataset

TINY = ["--preset", "tiny-transformer", "--device", "cpu", "--no-progress", "--set", "train.beam_size=2",
        "train.max_decode_len=12", "data.batch_pixels=20000", "data.max_batch_size=8",
        "train.attention_maps=1"]


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("HMER_MLRUNS", str(tmp_path / "mlruns"))
    monkeypatch.setenv("HMER_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    data = write_dataset(tmp_path / "data")
    return {"data": str(data), "store": f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}", "tmp": tmp_path}


def _run_id(store: str) -> str:
    mlflow.set_tracking_uri(store)
    runs = mlflow.search_runs(experiment_names=["hmer"])
    assert len(runs) == 1
    return runs.iloc[0]["run_id"]


def test_train_evaluate_predict_by_run_id(env, capsys):
    assert main(["train", *TINY, "--data", env["data"], "--epochs", "1"]) == 0
    run_id = _run_id(env["store"])
    out = capsys.readouterr().out
    assert run_id in out and "2014" in out

    short = run_id[:8]  # as the README prints run ids: every command that takes a run takes a unique prefix
    assert main(["evaluate", short, "--data", env["data"], "--beam", "2", "--device", "cpu"]) == 0
    table = capsys.readouterr().out
    for year in ("2014", "2016", "2019"):
        assert year in table

    image = Path(env["data"]) / "2014" / "2014_0.png"
    assert main(["predict", short, str(image), "--beam", "2", "--device", "cpu"]) == 0
    # One line of LaTeX for one file (an untrained model may well predict an empty line).
    assert capsys.readouterr().out.count("\n") == 1

    assert main(["report", "--runs", short, "--out", str(env["tmp"] / "report")]) == 0
    assert capsys.readouterr().out.startswith(f"runs-{short}: ExpRate")  # the report of that run

    assert main(["runs", "show", short]) == 0
    shown = capsys.readouterr().out
    score_lines = [line for line in shown.splitlines() if line.startswith("    20")]  # "    2014: exprate ..."
    assert [line.split(":")[0].strip() for line in score_lines] == ["2014", "2016", "2019"]
    # each year's scores once, the papers' lgeval ones among them, and nowhere else
    assert all(line.count("lgeval_exprate") == 1 for line in score_lines)
    assert shown.count("lgeval_exprate") == len(score_lines)


def test_bad_inputs_give_one_line_and_status_2(env, capsys, tmp_path):
    not_an_image = tmp_path / "notes.txt"
    not_an_image.write_text("hello")
    assert main(["evaluate", "0123456789abcdef0123456789abcdef", "--data", env["data"]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hmer: error:") and "0123456789abcdef" in err and err.count("\n") == 1

    ckpt = tmp_path / "fake.pt"
    ckpt.write_bytes(b"not a checkpoint")
    assert main(["predict", str(ckpt), str(not_an_image)]) == 2
    err = capsys.readouterr().err
    assert "notes.txt" in err and err.count("\n") == 1

    assert main(["train", *TINY, "--data", str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err


def test_models_lists_presets_with_parameter_counts(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for preset in ("bttr", "comer-self", "comer-cross", "comer-fusion", "wap-rnn", "convs2s"):
        assert preset in out
    assert "6.3" in out  # BTTR / CoMER are about 6.4 M parameters


@pytest.mark.slow
def test_kill_9_mid_training_then_resume_in_the_same_run(env):
    env_vars = {**os.environ, "HMER_MLRUNS": str(env["tmp"] / "mlruns"), "HMER_CACHE": str(env["tmp"] / "cache"),
                "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "hmer.cli", "train", *TINY, "--data", env["data"], "--epochs", "40"]
    proc = subprocess.Popen(cmd, env=env_vars, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    ckpt_root = env["tmp"] / "mlruns" / "checkpoints"
    deadline = time.time() + 120
    while time.time() < deadline and not list(ckpt_root.glob("*/last.pt")):
        time.sleep(0.2)
    time.sleep(1.0)  # well into a later epoch
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ckpts = list(ckpt_root.glob("*/last.pt"))
    assert ckpts, "no checkpoint was written before the kill"
    run_id = ckpts[0].parent.name
    client = MlflowClient(env["store"])
    logged_before = [m.step for m in client.get_metric_history(run_id, "train_loss")]
    assert client.get_run(run_id).info.status == "RUNNING"  # killed: nobody closed it

    done = subprocess.run([sys.executable, "-m", "hmer.cli", "train", "--resume", run_id, "--no-progress"],
                          env=env_vars, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    steps = sorted({m.step for m in client.get_metric_history(run_id, "train_loss")})
    assert steps == list(range(1, 41)) and set(logged_before) <= set(steps)
    assert "test_2014_exprate" in run.data.metrics


def test_a_run_s_wall_clock_limit_is_time_budget(capsys):
    from hmer.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["train", "--time-budget", "60"]).time_budget == 60.0
    # "budget" alone is a study's compute budget, by name (its size, recipe and keys), never seconds
    assert main(["train", "--budget", "90"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "unknown study budget '90'" in err, err


def test_every_option_of_every_command_says_what_it_takes_and_its_default():
    """Issue 70: `hmer predict --help` said nothing of --beam, --device or --tracking-uri."""
    import argparse

    from hmer.cli import build_parser

    def actions(parser, path):
        for action in parser._actions:  # argparse keeps a parser's arguments here, and only here
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from actions(sub, [*path, name])
            elif not isinstance(action, argparse._HelpAction):
                yield " ".join(path), action

    found = list(actions(build_parser(), ["hmer"]))
    assert len(found) > 100
    silent = [(command, action.option_strings or action.dest) for command, action in found if not action.help]
    assert not silent
    unsaid = [(command, action.option_strings) for command, action in found if action.option_strings
              and action.default not in (None, False, [], "", 0, 0.0) and "default" not in action.help]
    assert not unsaid


def test_claims_at_a_budget_that_does_not_exist_are_refused_in_one_line(capsys):
    """Issue 70: `hmer report --claims --budget bogus` printed the table as if no budget had been named."""
    from hmer.cli import main

    from pathlib import Path

    committed = f"sqlite:///{Path(__file__).resolve().parents[1] / 'mlruns' / 'mlflow.db'}"  # read only
    assert main(["report", "--claims", "--budget", "cpu,bogus", "--tracking-uri", committed]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "no study of the store was run at budget 'bogus'" in line and "cpu" in line
