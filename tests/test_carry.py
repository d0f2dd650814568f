"""A run carried between stores (hmer.training.carry): tiny real runs trained in one MLflow store,
packed, unpacked into another, continued there, and brought back as the same run."""

from __future__ import annotations

import tarfile

import pytest
import torch
from mlflow.tracking import MlflowClient

from hmer.checkpoint import load_checkpoint
from hmer.config import Config
from hmer.training import train
from hmer.training.carry import pack_run, read_carried, unpack_run
from tiny_dataset import tiny_config, tiny_data


def _store(tmp_path, monkeypatch, name: str) -> str:
    """Make the store `name` the MLflow home (its checkpoints too); its tracking URI."""
    monkeypatch.setenv("HMER_MLRUNS", str(tmp_path / name))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return f"sqlite:///{tmp_path / name / 'mlflow.db'}"


def test_a_carried_run_goes_on_elsewhere_and_comes_back_as_one_run_with_its_restart_tagged(tmp_path, monkeypatch):
    data = tiny_data()
    home = _store(tmp_path, monkeypatch, "home")
    first = train(tiny_config(**{"train.epochs": 4}), data=data, tracking_uri=home, experiment="leases",
                  pause_after_epochs=2)
    assert first.stopped_by == "paused" and first.epochs == 2
    packed = pack_run(first.run_id, tmp_path / "out1" / "carried.tar.gz", tracking_uri=home)
    assert (packed.source_run_id, packed.epoch, packed.epochs) == (first.run_id, 2, 4)
    assert not packed.optimizer_state and not packed.best_reset and packed.weights == "last"
    with tarfile.open(tmp_path / "out1" / "carried.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["carried.json", "last.pt", "run.tar.gz"]
    assert read_carried(tmp_path / "out1" / "carried.tar.gz").epoch == 2

    # Another machine: a fresh store, only the file carried.
    away = _store(tmp_path, monkeypatch, "away")
    moved = unpack_run(tmp_path / "out1" / "carried.tar.gz", tracking_uri=away)
    client_away = MlflowClient(away)
    assert moved.run_id != first.run_id
    assert moved.checkpoint == tmp_path / "away" / "checkpoints" / moved.run_id / "last.pt"
    assert client_away.get_run(moved.run_id).data.tags["hmer.source_run_id"] == first.run_id
    ckpt = load_checkpoint(moved.checkpoint)
    assert ckpt["run_id"] == moved.run_id and ckpt["optimizer"]["state"] == {} and ckpt["optimizer_state_dropped"]
    weights_home = load_checkpoint(tmp_path / "home" / "checkpoints" / first.run_id / "last.pt")["model"]
    for name, tensor in weights_home.items():  # fp32 weights, exactly as trained
        assert ckpt["model"][name].dtype == tensor.dtype
        torch.testing.assert_close(ckpt["model"][name], tensor, rtol=0, atol=0, msg=name)
    again = train(Config(), data=data, tracking_uri=away, resume=moved.checkpoint, pause_after_epochs=1)
    assert again.run_id == moved.run_id and again.epochs == 3 and again.stopped_by == "paused"
    assert client_away.get_run(moved.run_id).data.tags["hmer.warm_restart"] == "3"
    back = pack_run(moved.run_id, tmp_path / "out2" / "carried.tar.gz", tracking_uri=away)
    assert back.source_run_id == first.run_id and back.epoch == 3

    # Home again: the same run, its curve continued; then finished there.
    home = _store(tmp_path, monkeypatch, "home")
    returned = unpack_run(tmp_path / "out2" / "carried.tar.gz", tracking_uri=home)
    assert returned.run_id == first.run_id
    done = train(Config(), data=data, tracking_uri=home, resume=returned.checkpoint)
    assert done.run_id == first.run_id and done.epochs == 4 and done.stopped_by == "epochs" and done.test_scores
    client = MlflowClient(home)
    runs = client.search_runs([client.get_experiment_by_name("leases").experiment_id])
    assert [r.info.run_id for r in runs] == [first.run_id]
    run = client.get_run(first.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["hmer.warm_restart"] == "3,4"
    assert [m.step for m in client.get_metric_history(first.run_id, "train_loss")] == [1, 2, 3, 4]
    cpu = [m.value for m in sorted(client.get_metric_history(first.run_id, "train_cpu_seconds"), key=lambda m: m.step)]
    assert cpu == sorted(cpu) and cpu[0] > 0  # one clock across the three processes
    assert "test_2014_exprate" in run.data.metrics


def test_with_its_optimiser_state_a_carried_run_is_exact_and_without_it_is_not(tmp_path, monkeypatch):
    data = tiny_data()
    cfg = tiny_config(**{"train.epochs": 3, "data.scale_aug_min": 0.8, "data.scale_aug_max": 1.2})
    home = _store(tmp_path, monkeypatch, "home")
    straight = train(cfg, data=data, tracking_uri=home, experiment="straight")
    reference = load_checkpoint(tmp_path / "home" / "checkpoints" / straight.run_id / "last.pt")["model"]
    paused = train(cfg, data=data, tracking_uri=home, experiment="carried", pause_after_epochs=1)
    for keep, store in ((True, "with"), (False, "without")):
        pack_run(paused.run_id, tmp_path / f"{store}.tar.gz", tracking_uri=home, optimizer_state=keep,
                 checkpoint=tmp_path / "home" / "checkpoints" / paused.run_id / "last.pt")
        away = _store(tmp_path, monkeypatch, store)
        moved = unpack_run(tmp_path / f"{store}.tar.gz", tracking_uri=away)
        train(Config(), data=data, tracking_uri=away, resume=moved.checkpoint)
        tags = MlflowClient(away).get_run(moved.run_id).data.tags
        weights = load_checkpoint(moved.checkpoint)["model"]
        same = all(torch.equal(weights[name], tensor) for name, tensor in reference.items())
        assert same == keep, store
        assert ("hmer.warm_restart" in tags) == (not keep) and tags.get("hmer.warm_restart", "2") == "2"


def test_an_earlier_best_stays_behind_until_only_the_test_years_are_left(tmp_path, monkeypatch):
    data = tiny_data()
    home = _store(tmp_path, monkeypatch, "home")
    paused = train(tiny_config(**{"train.epochs": 3}), data=data, tracking_uri=home, pause_after_epochs=2)
    folder = tmp_path / "home" / "checkpoints" / paused.run_id
    last = load_checkpoint(folder / "last.pt")
    # As after a validation that did not beat epoch 1's: the best weights are an earlier epoch's.
    best = {**load_checkpoint(folder / "best.pt"), "epoch": 1, "val_exprate": 50.0}
    best["model"] = {k: v + 1 if v.is_floating_point() else v for k, v in best["model"].items()}
    torch.save(best, folder / "best.pt")
    torch.save({**last, "best_epoch": 1, "best_val_exprate": 50.0}, folder / "last.pt")

    packed = pack_run(paused.run_id, tmp_path / "mid.tar.gz", tracking_uri=home)
    assert packed.best_reset and packed.weights == "last"
    away = _store(tmp_path, monkeypatch, "away")
    moved = unpack_run(tmp_path / "mid.tar.gz", tracking_uri=away)
    ckpt = load_checkpoint(moved.checkpoint)
    val = {m.step: m.value for m in MlflowClient(away).get_metric_history(moved.run_id, "val_exprate")}
    assert (ckpt["best_epoch"], ckpt["best_val_exprate"]) == (2, val[2])
    for name, tensor in last["model"].items():  # the best is now the carried (last) weights
        torch.testing.assert_close(load_checkpoint(moved.checkpoint.parent / "best.pt")["model"][name], tensor,
                                   rtol=0, atol=0)
    again = train(Config(), data=data, tracking_uri=away, resume=moved.checkpoint, pause_after_epochs=5,
                  pause_at=1.0, final_seconds=0.0)  # a deadline long past: the epochs done, the test years left
    assert again.epochs == 3 and again.stopped_by == "paused" and not again.test_scores
    assert MlflowClient(away).get_run(moved.run_id).data.tags["hmer.best_reset"] == "3"

    # Epochs done: the best weights travel instead of the last.
    folder = moved.checkpoint.parent
    best = {**load_checkpoint(folder / "best.pt"), "epoch": 2}
    best["model"] = {k: v * 0.5 if v.is_floating_point() else v for k, v in best["model"].items()}
    torch.save(best, folder / "best.pt")
    torch.save({**load_checkpoint(folder / "last.pt"), "best_epoch": 2}, folder / "last.pt")
    packed = pack_run(moved.run_id, tmp_path / "end.tar.gz", tracking_uri=away)
    assert packed.weights == "best" and packed.done and not packed.best_reset
    home = _store(tmp_path, monkeypatch, "home")
    returned = unpack_run(tmp_path / "end.tar.gz", tracking_uri=home)
    for name, tensor in best["model"].items():
        torch.testing.assert_close(load_checkpoint(returned.checkpoint)["model"][name], tensor, rtol=0, atol=0)
    assert load_checkpoint(returned.checkpoint.parent / "best.pt")["epoch"] == 2
    done = train(Config(), data=data, tracking_uri=home, resume=returned.checkpoint)
    assert done.epochs == 3 and done.stopped_by == "epochs" and "2014" in done.test_scores


def test_a_file_that_is_not_a_carried_run_or_is_older_than_the_checkpoint_is_refused(tmp_path, monkeypatch):
    home = _store(tmp_path, monkeypatch, "home")
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"not a tar at all")
    with pytest.raises(ValueError, match=r"bad\.tar: not a carried run") as err:
        unpack_run(bad, tracking_uri=home)
    assert "\n" not in str(err.value)
    paused = train(tiny_config(**{"train.epochs": 3}), data=tiny_data(), tracking_uri=home, pause_after_epochs=1)
    pack_run(paused.run_id, tmp_path / "old.tar.gz", tracking_uri=home)
    train(Config(), data=tiny_data(), tracking_uri=home, pause_after_epochs=1,
          resume=tmp_path / "home" / "checkpoints" / paused.run_id / "last.pt")
    with pytest.raises(ValueError, match=r"old\.tar\.gz: run \w+ is at epoch 2 .* past the carried epoch 1"):
        unpack_run(tmp_path / "old.tar.gz", tracking_uri=home)
    assert load_checkpoint(tmp_path / "home" / "checkpoints" / paused.run_id / "last.pt")["epoch"] == 2
