"""The `wsd` schedule, a longer run started where a shorter one began to decay, and the weight
average: on tiny real training runs (issue 66)."""

from __future__ import annotations

import pytest
import torch
from mlflow.tracking import MlflowClient

from hmer.checkpoint import load_checkpoint
from hmer.config import ConfigError
from hmer.training import train
from hmer.training.resume import Branch
from hmer.training.optim import LRSchedule, build_optimizer
from tiny_dataset import tiny_config, tiny_data


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("HMER_MLRUNS", str(tmp_path / "mlruns"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"


def _wsd(epochs: int, decay: int, **more):
    return tiny_config(**{"train.recipe": "custom", "train.optimizer": "adamw", "train.lr": 2e-3,
                          "train.warmup_steps": 2, "train.schedule": "wsd", "train.min_lr": 1e-5,
                          "train.epochs": epochs, "train.decay_epochs": decay, "data.scale_aug_min": 0.8,
                          "data.scale_aug_max": 1.2, **more})


def test_wsd_holds_the_rate_then_decays_it_to_min_lr_over_the_last_epochs():
    cfg = _wsd(5, 2)
    model = torch.nn.Linear(2, 2)
    schedule = LRSchedule(build_optimizer(model.parameters(), cfg.train), cfg.train, total_steps=50, warmup=2)
    rates = []
    for _ in range(50):
        rates.append(schedule.lr)
        schedule.step_batch()
    assert rates[0] < rates[1] == 2e-3  # the warm-up
    assert set(rates[2:31]) == {2e-3}  # held through epoch 3 (steps 0-29) and the first decay step
    assert all(a > b for a, b in zip(rates[30:], rates[31:]))  # then falling, as 1 - sqrt
    assert schedule.lr == pytest.approx(1e-5)  # at min_lr by the last step


@pytest.mark.parametrize("values, key", [({"train.decay_epochs": 0}, "train.decay_epochs"),
                                          ({"train.decay_epochs": 5}, "train.decay_epochs")])
def test_wsd_needs_a_decay_shorter_than_the_run(values, key):
    with pytest.raises(ConfigError, match=key):
        _wsd(5, 2).override(values)
    with pytest.raises(ConfigError, match="train.decay_epochs"):
        tiny_config(**{"train.decay_epochs": 2})  # another schedule has no decay to give


@pytest.mark.parametrize("ema", [0.0, 0.9])
def test_a_longer_run_started_where_a_shorter_one_began_to_decay_ends_as_it_would_alone(store, tmp_path, ema):
    """Run A (4 epochs, the last 1 decaying) keeps its state at epoch 3; run B (6 epochs, the last 2
    decaying) started from it ends with the weights of B trained from scratch, and carries A's curve up
    to epoch 3 as its own."""
    data = tiny_data()
    short = train(_wsd(4, 1, **{"train.ema_decay": ema}), data=data, tracking_uri=store, run_dir=tmp_path / "a")
    stable = load_checkpoint(tmp_path / "a" / "stable.pt")
    assert stable["epoch"] == 3 and (tmp_path / "a" / "stable-best.pt").is_file()
    alone = train(_wsd(6, 2, **{"train.ema_decay": ema}), data=data, tracking_uri=store, run_dir=tmp_path / "b")
    state = Branch(short.run_id, tmp_path / "a" / "stable.pt", tmp_path / "a" / "stable-best.pt", 3)
    branched = train(_wsd(6, 2, **{"train.ema_decay": ema}), data=data, tracking_uri=store, run_dir=tmp_path / "c",
                     start_from=state)
    assert branched.run_id not in (short.run_id, alone.run_id)
    for name in ("last.pt", "best.pt"):
        want, got = (load_checkpoint(tmp_path / folder / name)["model"] for folder in ("b", "c"))
        for key, tensor in want.items():
            torch.testing.assert_close(got[key], tensor, rtol=0, atol=0, msg=f"{name}: {key}")
    assert branched.best_epoch == alone.best_epoch and branched.best_val_exprate == alone.best_val_exprate
    client = MlflowClient(store)
    steps = [m.step for m in client.get_metric_history(branched.run_id, "train_loss")]
    assert steps == [1, 2, 3, 4, 5, 6]
    source = {m.step: m.value for m in client.get_metric_history(short.run_id, "train_loss")}
    copied = {m.step: m.value for m in client.get_metric_history(branched.run_id, "train_loss")}
    assert all(copied[s] == source[s] for s in (1, 2, 3))
    tags = client.get_run(branched.run_id).data.tags
    assert tags["hmer.branched_from"] == f"{short.run_id}@3"
    assert float(tags["hmer.branch_cpu_seconds"]) == pytest.approx(stable["train_cpu_seconds"], abs=0.1)


def test_a_state_of_another_config_is_refused(store, tmp_path):
    data = tiny_data()
    short = train(_wsd(3, 1), data=data, tracking_uri=store, run_dir=tmp_path / "a")
    other = _wsd(5, 2, **{"train.lr": 1e-3})
    with pytest.raises(ValueError, match="another config"):
        train(other, data=data, tracking_uri=store, run_dir=tmp_path / "b",
              start_from=Branch(short.run_id, tmp_path / "a" / "stable.pt", tmp_path / "a" / "stable-best.pt", 2))


def test_the_weight_average_is_what_validation_reads_and_the_run_keeps(store, tmp_path):
    """With train.ema_decay the best weights are the average's, not the last step's; the training
    itself is the run without it, step for step."""
    data = tiny_data()
    plain = train(tiny_config(**{"train.epochs": 2}), data=data, tracking_uri=store, run_dir=tmp_path / "plain")
    averaged = train(tiny_config(**{"train.epochs": 2, "train.ema_decay": 0.9}), data=data, tracking_uri=store,
                     run_dir=tmp_path / "ema")
    assert plain.run_id != averaged.run_id
    last_plain = load_checkpoint(tmp_path / "plain" / "last.pt")
    last_ema = load_checkpoint(tmp_path / "ema" / "last.pt")
    for key, tensor in last_plain["model"].items():  # the trained weights: the same steps
        torch.testing.assert_close(last_ema["model"][key], tensor, rtol=0, atol=0, msg=key)
    average = last_ema["ema"]["average"]
    assert any(not torch.equal(average[key], last_ema["model"][key]) for key in average), "no average"
    best = load_checkpoint(tmp_path / "ema" / "best.pt")
    if best["epoch"] == 2:  # kept at the last epoch: it holds the average, not the trained weights
        assert all(torch.equal(best["model"][key], average[key]) for key in average)
