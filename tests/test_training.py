"""Training, checkpoints and resume, MLflow records, on tiny real training runs."""

from __future__ import annotations

import mlflow
import pytest
import torch
from mlflow.tracking import MlflowClient

from hmer.config import Config
from hmer.training import train
from hmer.checkpoint import load_checkpoint
from hmer.model_presets import preset_with_recipe
from hmer.training.optim import LRSchedule, build_optimizer
from tiny_dataset import tiny_config, tiny_data


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("HMER_MLRUNS", str(tmp_path / "mlruns"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"


def test_recipes_fill_the_papers_optimisers():
    bttr = preset_with_recipe("bttr").train
    assert (bttr.optimizer, bttr.lr, bttr.rho, bttr.eps, bttr.weight_decay) == ("adadelta", 1.0, 0.9, 1e-6, 1e-4)
    comer = preset_with_recipe("comer-fusion")
    assert (comer.train.optimizer, comer.train.lr, comer.train.momentum, comer.train.weight_decay) == \
        ("sgd", 0.08, 0.9, 1e-4)
    assert (comer.data.scale_aug_min, comer.data.scale_aug_max) == (0.7, 1.4)  # CoMER's scale augmentation
    comer = comer.train
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2))], comer)
    assert isinstance(opt, torch.optim.SGD) and opt.param_groups[0]["momentum"] == 0.9


def test_label_smoothing_spreads_the_target_probability():
    from hmer.model import build_model
    from hmer.model.decoder_base import make_targets
    from hmer.data import Vocab, collate
    from hmer.training.step import LossModule

    torch.manual_seed(0)
    model = build_model("tiny-transformer").eval()
    vocab = Vocab()
    batch = collate(tiny_data()["train"][:2], vocab)
    tgt_in, tgt_out, _ = make_targets(batch.token_ids, "bi", vocab)
    plain, smooth = LossModule(model), LossModule(model, label_smoothing=0.1)
    logits = model(batch.images, batch.image_mask, tgt_in).flatten(0, 1)
    keep = tgt_out.flatten() != vocab.pad_id
    log_p = logits.log_softmax(-1)[keep]
    nll = -log_p.gather(1, tgt_out.flatten()[keep, None]).mean()
    uniform = -log_p.mean()
    args = (batch.images, batch.image_mask, tgt_in, tgt_out)
    assert torch.allclose(plain(*args), nll, atol=1e-5)
    assert torch.allclose(smooth(*args), 0.9 * nll + 0.1 * uniform, atol=1e-5)


def test_plateau_schedule_reduces_on_flat_validation_exprate():
    tc = Config().override({"train.plateau_patience": 1, "train.plateau_factor": 0.5}).train
    p = torch.nn.Parameter(torch.zeros(1))
    opt = build_optimizer([p], tc)
    sched = LRSchedule(opt, tc)
    for score in (10.0, 10.0, 10.0):
        sched.step_validation(score)
    assert sched.lr == pytest.approx(0.5)


def test_warmup_ramps_the_learning_rate():
    tc = Config().override({"train.warmup_steps": 4, "train.optimizer": "sgd", "train.lr": 0.8}).train
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(1))], tc)
    sched = LRSchedule(opt, tc)
    lrs = [sched.lr]
    for _ in range(5):
        sched.step_batch()
        lrs.append(sched.lr)
    assert lrs[0] == pytest.approx(0.2) and lrs[-1] == pytest.approx(0.8)
    assert lrs == sorted(lrs)


def test_lr_scaling_scales_the_recipes_rate_by_how_many_times_fewer_steps_an_epoch_takes():
    import math

    from hmer.config import ConfigError
    from hmer.data import make_batches
    from hmer.training import distributed as ddp
    from hmer.training.setup import build

    data = tiny_data(n_train=16)
    reference = {"train.lr_reference_batch_pixels": 10_000, "train.lr_reference_max_batch_size": 2}
    ref_steps = len(make_batches(data["train"], 10_000, 2, seed=0))
    large_steps = len(make_batches(data["train"], 40_000, 8, seed=0))
    assert ref_steps > large_steps  # the tiny images: 8 a step at most instead of 2
    dist = ddp.DistInfo()
    for rule, factor in (("linear", ref_steps / large_steps), ("sqrt", math.sqrt(ref_steps / large_steps)),
                         ("none", 1.0)):
        cfg = tiny_config(**{"train.lr_scaling": rule, **reference, "data.batch_pixels": 40_000,
                             "data.max_batch_size": 8, "train.warmup_epochs": 1.5})
        setup = build(cfg, data, torch.device("cpu"), dist)
        assert setup.lr == pytest.approx(cfg.train.lr * factor)
        assert setup.batch_scale == pytest.approx(ref_steps / large_steps if rule != "none" else 1.0)
        assert setup.schedule.warmup_steps == math.ceil(1.5 * large_steps)
        # the warm-up starts from the scaled rate's first step
        assert setup.schedule.lr == pytest.approx(setup.lr / setup.schedule.warmup_steps)
    with pytest.raises(ConfigError, match="train.warmup_steps=5, train.warmup_epochs=1.0: give the warm-up in steps"):
        tiny_config(**{"train.warmup_steps": 5, "train.warmup_epochs": 1.0})


def test_the_best_checkpoint_is_the_highest_exprate_then_the_closest_to_right_then_the_latest():
    from hmer.training.resume import TrainState
    from hmer.training.trainer import improves_on_best

    best, chosen = TrainState(), []
    # (ExpRate, within one edit) per epoch, as a short CPU run reads them on 465 expressions
    for epoch, (exprate, le1) in enumerate([(0.0, 0.22), (0.0, 0.65), (3.66, 11.83), (3.44, 12.9),
                                            (3.66, 11.61), (3.66, 13.33), (3.66, 13.33)], start=1):
        if improves_on_best(best, exprate, le1):
            best.best_val_exprate, best.best_val_le1, best.best_epoch = exprate, le1, epoch
            chosen.append(epoch)
    # epoch 2 beats epoch 1 within one edit; a lower ExpRate never wins, however close; a full tie
    # goes to the later epoch
    assert chosen == [1, 2, 3, 6, 7] and best.best_epoch == 7


def test_train_records_everything_in_mlflow(store, tmp_path):
    result = train(tiny_config(), data=tiny_data(), tracking_uri=store, experiment="unit",
                   run_dir=tmp_path / "ckpt")
    assert result.epochs == 2 and result.stopped_by == "epochs"
    assert set(result.test_scores) == {"2014"} and result.test_scores["2014"].n == 4

    mlflow.set_tracking_uri(store)
    runs = mlflow.search_runs(experiment_names=["unit"])
    assert len(runs) == 1
    row = runs.iloc[0]
    assert row["status"] == "FINISHED" and row["tags.hmer.status"] == "finished"
    assert row["params.model.decoder"] == "transformer" and row["params.train.optimizer"] == "adadelta"
    for key in ("test_2014_exprate", "test_2014_le1", "test_2014_le2", "test_2014_n", "best_val_exprate",
                "train_loss", "val_exprate", "lr", "images_per_second"):
        assert f"metrics.{key}" in runs.columns, key
    assert row["metrics.test_2014_n"] == 4
    assert row["tags.hmer.git_commit"] and row["tags.hmer.device"].startswith("cpu")
    from hmer.device import cpu_description
    assert cpu_description() in row["tags.hmer.device"]  # the kind of core its CPU time was spent on
    # What the run cost: training's CPU time plus every final decoding's
    decode_cpu = [row[c] for c in runs.columns if c.endswith("_decode_cpu_seconds")]
    assert len(decode_cpu) == 2 and all(v > 0 for v in decode_cpu)  # validation and 2014
    assert row["metrics.train_cpu_seconds"] > 0
    assert row["metrics.cpu_seconds"] == pytest.approx(row["metrics.train_cpu_seconds"] + sum(decode_cpu))

    client = MlflowClient(store)
    history = client.get_metric_history(result.run_id, "train_loss")
    assert [m.step for m in history] == [1, 2]
    artifacts = {a.path for a in client.list_artifacts(result.run_id)}
    assert {"config.json", "predictions", "model", "attention"} <= artifacts
    preds = client.list_artifacts(result.run_id, "predictions")
    assert [a.path for a in preds] == ["predictions/test_2014.csv"]
    assert client.list_artifacts(result.run_id, "attention")

    # The logged model reloads by run id and is safe to load.
    from hmer.tracking import load_model

    model, cfg, vocab = load_model(result.run_id, tracking_uri=store)
    assert cfg.model.decoder == "transformer" and len(vocab) == 113
    assert not model.training


def test_time_budget_stops_cleanly_and_still_evaluates(store, tmp_path):
    cfg = tiny_config(**{"train.epochs": 50, "train.time_budget_s": 0.5})
    result = train(cfg, data=tiny_data(), tracking_uri=store, run_dir=tmp_path / "ckpt")
    assert result.stopped_by == "budget" and result.epochs < 50
    assert "2014" in result.test_scores
    assert load_checkpoint(tmp_path / "ckpt" / "last.pt")["epoch"] == result.epochs


class _Crash(Exception):
    pass


def _train_killed_after(epoch_killed: int, cfg, data, store, folder) -> None:
    """Train `cfg` in experiment "crashed" with its checkpoints in `folder`, killed right after epoch
    `epoch_killed` (its checkpoint written): what a session's end does to a run."""
    def crash(epoch, metrics):
        if epoch == epoch_killed:
            raise _Crash("killed")

    with pytest.raises(_Crash):
        train(cfg, data=data, tracking_uri=store, experiment="crashed", run_dir=folder, epoch_callback=crash)


def test_resume_gives_the_same_weights_as_an_uninterrupted_run(store, tmp_path):
    cfg = tiny_config(**{"train.epochs": 3, "data.scale_aug_min": 0.8, "data.scale_aug_max": 1.2})
    data = tiny_data()
    train(cfg, data=data, tracking_uri=store, experiment="straight", run_dir=tmp_path / "straight")

    _train_killed_after(1, cfg, data, store, tmp_path / "crashed")
    first = load_checkpoint(tmp_path / "crashed" / "last.pt")
    assert first["epoch"] == 1
    client = MlflowClient(store)
    assert client.get_run(first["run_id"]).info.status == "FAILED"
    experiments = {e.name for e in client.search_experiments()}

    resumed = train(Config(), data=data, tracking_uri=store, resume=tmp_path / "crashed" / "last.pt")
    assert resumed.run_id == first["run_id"] and resumed.epochs == 3
    # the run goes on in its own experiment, and resuming creates none (it used to create "hmer")
    assert client.get_experiment(client.get_run(resumed.run_id).info.experiment_id).name == "crashed"
    assert {e.name for e in client.search_experiments()} == experiments
    assert client.get_run(resumed.run_id).info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(resumed.run_id, "train_loss")] == [1, 2, 3]
    # CPU time is logged each epoch, cumulative across the resumption
    cpu = {m.step: m.value for m in client.get_metric_history(resumed.run_id, "train_cpu_seconds")}
    assert sorted(cpu) == [1, 2, 3] and 0 < cpu[1] < cpu[2] < cpu[3]

    straight = load_checkpoint(tmp_path / "straight" / "last.pt")["model"]
    again = load_checkpoint(tmp_path / "crashed" / "last.pt")["model"]
    for name, tensor in straight.items():
        torch.testing.assert_close(again[name], tensor, rtol=0, atol=0, msg=name)


def test_a_run_resumed_from_last_pt_alone_scores_the_weights_an_uninterrupted_run_scores(store, tmp_path):
    """`hmer runs publish --keep-unfinished` carries `last.pt` without `best.pt` where the last epoch
    is the best so far: the resumed run writes best.pt again from it and ends as the run that was
    never interrupted (its model file, its test scores); best weights it cannot know are refused.
    Here the run is killed after its last epoch, before its final evaluation (which takes minutes
    on the cpu budget): without best.pt the resumed run would log no model at all."""
    from hmer.checkpoint import MODEL_FILE
    from hmer.tracking.portable import download_run_artifact

    cfg = tiny_config(**{"train.epochs": 2})
    data = tiny_data()
    straight = train(cfg, data=data, tracking_uri=store, experiment="straight", run_dir=tmp_path / "straight")

    _train_killed_after(2, cfg, data, store, tmp_path / "crashed")  # after its last epoch
    last = load_checkpoint(tmp_path / "crashed" / "last.pt")
    assert last["epoch"] == 2 and last["best_epoch"] == 2  # (a tie goes to the later epoch)
    (tmp_path / "crashed" / "best.pt").unlink()
    resumed = train(Config(), data=data, tracking_uri=store, resume=tmp_path / "crashed" / "last.pt")
    assert resumed.best_epoch == straight.best_epoch and resumed.test_scores == straight.test_scores
    client = MlflowClient(store)
    models = [load_checkpoint(download_run_artifact(client, r.run_id, f"model/{MODEL_FILE}", str(tmp_path / r.run_id)))
              for r in (straight, resumed)]
    assert models[0]["epoch"] == models[1]["epoch"] and models[0]["val_exprate"] == models[1]["val_exprate"]
    for name, tensor in models[0]["model"].items():
        torch.testing.assert_close(models[1]["model"][name], tensor, rtol=0, atol=0, msg=name)

    # best weights of an earlier epoch than the checkpoint's are not in it: refused before the run reopens
    torch.save({**last, "best_epoch": 1}, tmp_path / "crashed" / "last.pt")
    (tmp_path / "crashed" / "best.pt").unlink()
    with pytest.raises(FileNotFoundError, match=r"best\.pt: missing beside .*epoch 1"):
        train(Config(), data=data, tracking_uri=store, resume=tmp_path / "crashed" / "last.pt")
    assert client.get_run(resumed.run_id).info.status == "FINISHED"


def test_a_run_s_model_file_is_safetensors_with_the_best_checkpoint_s_tensors(store, tmp_path):
    """The model a run logs loads without unpickling (safetensors), holds the very tensors of the
    run's best checkpoint, and the same artifact always writes the same bytes."""
    from safetensors import safe_open

    from hmer.checkpoint import MODEL_FILE, save_model_file
    from hmer.tracking.portable import download_run_artifact

    result = train(tiny_config(**{"train.epochs": 1}), data=tiny_data(), tracking_uri=store, run_dir=tmp_path / "c")
    path = download_run_artifact(MlflowClient(store), result.run_id, f"model/{MODEL_FILE}", str(tmp_path / "dl"))
    with safe_open(path, framework="pt") as f:  # a safetensors file: tensors and a JSON header only
        assert set(f.keys()) == set(load_checkpoint(tmp_path / "c" / "best.pt")["model"])
    best, logged = load_checkpoint(tmp_path / "c" / "best.pt"), load_checkpoint(path)
    assert {k: v for k, v in logged.items() if k != "model"} == {k: v for k, v in best.items() if k != "model"}
    for name, tensor in best["model"].items():
        torch.testing.assert_close(logged["model"][name], tensor, rtol=0, atol=0, msg=name)
    save_model_file(best, tmp_path / "again.safetensors")
    assert (tmp_path / "again.safetensors").read_bytes() == open(path, "rb").read()


def test_prefetching_batches_in_a_thread_trains_the_same_weights(store, tmp_path):
    # data.prefetch only moves collation (and its augmentation draws) to another thread.
    cfg = tiny_config(**{"train.epochs": 2, "data.scale_aug_min": 0.8, "data.scale_aug_max": 1.2})
    data = tiny_data()
    train(cfg.override({"data.prefetch": 0}), data=data, tracking_uri=store, run_dir=tmp_path / "inline")
    train(cfg.override({"data.prefetch": 2}), data=data, tracking_uri=store, run_dir=tmp_path / "ahead")
    inline = load_checkpoint(tmp_path / "inline" / "last.pt")["model"]
    ahead = load_checkpoint(tmp_path / "ahead" / "last.pt")["model"]
    for name, tensor in inline.items():
        torch.testing.assert_close(ahead[name], tensor, rtol=0, atol=0, msg=name)


def test_pruned_trial_is_marked_in_mlflow(store, tmp_path):
    import optuna  # a dependency of the suite: its absence is a failure, not a skip

    def prune(epoch, metrics):
        raise optuna.TrialPruned()

    with pytest.raises(optuna.TrialPruned):
        train(tiny_config(), data=tiny_data(), tracking_uri=store, run_dir=tmp_path / "c",
              epoch_callback=prune)
    run = mlflow.search_runs(experiment_names=["hmer"]).iloc[0]
    assert run["tags.hmer.status"] == "pruned" and run["status"] == "KILLED"


def test_checkpoints_load_weights_only(store, tmp_path):
    train(tiny_config(**{"train.epochs": 1}), data=tiny_data(), tracking_uri=store, run_dir=tmp_path / "c")
    for name in ("last.pt", "best.pt"):
        ckpt = torch.load(tmp_path / "c" / name, weights_only=True)
        assert "model" in ckpt and "config" in ckpt


def test_pause_after_epochs_checkpoints_and_resume_finishes_the_run(store, tmp_path):
    cfg = tiny_config(**{"train.epochs": 3})
    paused = train(cfg, data=tiny_data(), tracking_uri=store, run_dir=tmp_path / "c", pause_after_epochs=1)
    assert paused.stopped_by == "paused" and paused.epochs == 1 and not paused.test_scores
    run = MlflowClient(store).get_run(paused.run_id)
    assert run.info.status == "KILLED" and run.data.tags["hmer.status"] == "paused"
    # The CPU clock goes on from the checkpoint's: give it a value no single process reaches here.
    ckpt = load_checkpoint(tmp_path / "c" / "last.pt")
    # The checkpoint holds the clock at its epoch's end, the result at the run's pause, later: on one
    # shared core CI read 0.04 and 1.84 CPU-seconds (the process's threads summed, as they wait).
    assert 0 < ckpt["train_cpu_seconds"] <= paused.train_cpu_seconds
    torch.save({**ckpt, "train_cpu_seconds": 1000.0}, tmp_path / "c" / "last.pt")
    done = train(cfg, data=tiny_data(), tracking_uri=store, resume=tmp_path / "c" / "last.pt", pause_after_epochs=5)
    assert done.run_id == paused.run_id and done.epochs == 3 and done.stopped_by == "epochs" and done.test_scores
    assert 1000.0 < done.train_cpu_seconds < 1000.0 + 600
    assert MlflowClient(store).get_run(paused.run_id).info.status == "FINISHED"


def test_a_deadline_pauses_before_an_epoch_or_the_test_years_that_would_not_fit(store, tmp_path):
    import time

    cfg = tiny_config(**{"train.epochs": 3})
    far = time.time() + 3600.0
    # Epoch 1 always trains; epoch 2 fits the hour, but epoch 3 (the last) with an hour of test years does not.
    first = train(cfg, data=tiny_data(), tracking_uri=store, run_dir=tmp_path / "c", pause_at=far, final_seconds=3600.0)
    assert first.stopped_by == "paused" and first.epochs == 2 and not first.test_scores
    # Epoch 3 fits, its test years do not: the run pauses with its epochs done ...
    second = train(Config(), data=tiny_data(), tracking_uri=store, resume=tmp_path / "c" / "last.pt",
                   pause_at=far, final_seconds=3600.0)
    assert second.stopped_by == "paused" and second.epochs == 3 and not second.test_scores
    # ... and is resumed for the test years alone: none fit, none trained, nothing logged.
    third = train(Config(), data=tiny_data(), tracking_uri=store, resume=tmp_path / "c" / "last.pt",
                  pause_at=far, final_seconds=7200.0)
    assert third.stopped_by == "paused" and third.epochs == 3
    done = train(Config(), data=tiny_data(), tracking_uri=store, resume=tmp_path / "c" / "last.pt",
                 pause_at=far, final_seconds=60.0)
    assert done.stopped_by == "epochs" and done.test_scores
    client = MlflowClient(store)
    assert [m.step for m in client.get_metric_history(done.run_id, "train_loss")] == [1, 2, 3]
    assert client.get_run(done.run_id).info.status == "FINISHED"


def test_the_pad_ladder_pads_every_training_batch_and_the_run_still_evaluates(store, tmp_path):
    # data.pad_multiple / pad_growth (shapes for a GPU) only add zero padding, masked. They reach the training
    # batches: the DenseNet's batch norm sees the extra zeros, so the weights move differently.
    cfg = tiny_config(**{"train.epochs": 1})
    data = tiny_data()
    train(cfg, data=data, tracking_uri=store, run_dir=tmp_path / "exact")
    result = train(cfg.override({"data.pad_multiple": 16, "data.pad_growth": 1.25}), data=data, tracking_uri=store,
                   run_dir=tmp_path / "padded")
    assert result.test_scores["2014"].n == 4
    exact = load_checkpoint(tmp_path / "exact" / "last.pt")["model"]
    padded = load_checkpoint(tmp_path / "padded" / "last.pt")["model"]
    assert any(not torch.equal(padded[name], tensor) for name, tensor in exact.items())
