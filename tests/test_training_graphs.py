"""The GPU's shape work rehearsed on the CPU: the planning pass over the pad ladder leaves a training
as it was, the static-shape step (`train.cuda_graphs`, eager on a CPU) gives the ordinary step's
losses and weights, and the 1x1 convolutions as matrix products keep every parameter."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from hmer.checkpoint import load_checkpoint
from hmer.config import ConfigError
from hmer.data import Vocab, make_batches
from hmer.device import CUDNN_PLAN_CACHE, size_cudnn_plan_cache
from hmer.model import build_model
from hmer.model.accelerations import PointwiseConv, use_matmul
from hmer.model_presets import preset_with_recipe
from hmer.training import train
from hmer.training.graphs import LENGTH_LADDER, GraphedStep, pad_targets
from hmer.training.loader import TrainBatch, train_batches
from hmer.training.optim import build_optimizer
from hmer.training.planning import cache_plans, plan, plans_per_shape, training_shapes
from hmer.training.setup import prepare_model
from hmer.training.step import LossModule, train_step
from tiny_dataset import tiny_config, tiny_data

LADDER = {"data.pad_multiple": 16, "data.pad_growth": 1.25}


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("HMER_MLRUNS", str(tmp_path / "mlruns"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"


def test_planning_every_ladder_shape_leaves_the_training_as_it_was(store, tmp_path, one_thread):
    # eval mode with gradients: the convolutions of the training step, no BatchNorm statistics moved,
    # no dropout drawn, no gradient kept
    cfg = tiny_config(**{"train.epochs": 1, "data.scale_aug_min": 0.8, "data.scale_aug_max": 1.2, **LADDER})
    data = tiny_data()
    train(cfg, data=data, tracking_uri=store, run_dir=tmp_path / "plain")
    planned = train(cfg.override({"train.plan_shapes": True}), data=data, tracking_uri=store,
                    run_dir=tmp_path / "planned")
    plain = load_checkpoint(tmp_path / "plain" / "last.pt")["model"]
    after = load_checkpoint(tmp_path / "planned" / "last.pt")["model"]
    assert all(torch.equal(after[name], tensor) for name, tensor in plain.items())
    from mlflow.tracking import MlflowClient

    logged = MlflowClient(store).get_run(planned.run_id).data.metrics
    assert logged["planned_shapes"] == logged["ladder_shapes"] == len(training_shapes(cfg, data["train"])) > 1
    assert logged["plan_seconds"] > 0


def test_the_planned_shapes_are_the_shapes_the_epochs_collate(one_thread):
    cfg = tiny_config(**{"data.scale_aug_min": 0.7, "data.scale_aug_max": 1.4, **LADDER})
    exprs = tiny_data(n_train=12)["train"]
    planned = training_shapes(cfg, exprs)
    seen = set()
    for epoch in range(6):
        batches = make_batches(exprs, cfg.data.batch_pixels, cfg.data.max_batch_size, shuffle=True, seed=epoch)
        for tb in train_batches(exprs, batches, Vocab(), "bi", torch.device("cpu"), scale_range=(0.7, 1.4),
                                rng=np.random.default_rng(epoch), ladder=cfg_ladder(cfg)):
            seen.add((len(tb), *tb.batch.images.shape[-2:]))
    assert seen <= planned and len(seen) > 1


def cfg_ladder(cfg):
    from hmer.data.batching import PadLadder

    return PadLadder.from_data_config(cfg.data)


def test_plan_runs_the_encoder_at_every_shape_and_keeps_no_gradient(one_thread):
    torch.manual_seed(0)
    model = build_model("tiny-transformer").train()
    before = copy.deepcopy(model.state_dict())
    n, seconds = plan(model, {(2, 32, 64), (3, 48, 80)}, torch.device("cpu"), None, True)
    assert n == 2 and seconds > 0 and model.training
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_the_plan_cache_is_sized_to_the_shapes_once_and_before_any_convolution(monkeypatch):
    model = build_model("tiny-transformer")
    convs = sum(1 for m in model.modules() if isinstance(m, torch.nn.Conv2d))
    assert plans_per_shape(model) == 3 * convs - 1
    use_matmul(model, True)  # a 1x1 convolution as a matrix product needs no plan
    pointwise = sum(1 for m in model.modules() if isinstance(m, PointwiseConv))
    assert plans_per_shape(model) == 3 * (convs - pointwise) - 1
    assert cache_plans(model, 100, 40) > 100 * plans_per_shape(model)
    monkeypatch.delenv(CUDNN_PLAN_CACHE, raising=False)
    assert size_cudnn_plan_cache(50_000) == (50_000, "sized to the ladder")
    assert size_cudnn_plan_cache(80_000) == (50_000, "environment")  # torch has read the first one
    monkeypatch.delenv(CUDNN_PLAN_CACHE)
    assert size_cudnn_plan_cache(10) == (10_000, "sized to the ladder")  # never below torch's default


def _tiny_batches(cfg, n: int) -> list[TrainBatch]:
    exprs = tiny_data(n_train=12)["train"]
    batches = make_batches(exprs, cfg.data.batch_pixels, cfg.data.max_batch_size, shuffle=True, seed=0)
    order = [batches[k % len(batches)] for k in range(n)]  # shapes repeat, as in training
    return list(train_batches(exprs, order, Vocab(), cfg.model.direction, torch.device("cpu"),
                              scale_range=(0.8, 1.2), rng=np.random.default_rng(0), channels_last=True,
                              ladder=cfg_ladder(cfg)))


def _stepper(cfg, seed=0):
    torch.manual_seed(seed)
    model = prepare_model(build_model(cfg.model), cfg.train).train()
    opt = build_optimizer(model.parameters(), cfg.train)
    return model, LossModule(model, cfg.train.label_smoothing), opt


def test_the_static_shape_step_gives_the_ordinary_steps_losses_and_weights(one_thread):
    # on a CPU the graphed step runs its recorded part eagerly on its static tensors: padded
    # captions, gradients zeroed in place, clipping and the optimiser outside
    # SGD: an update proportional to its gradient, so that the rounding of padded captions' sums stays
    # as small in the weights as in the losses (Adadelta's normalised steps turn a gradient's last bits
    # near zero into a step of the rate's size: 1.6e-3 in a stem weight on an AVX2 EPYC, 2026-12-02)
    cfg = tiny_config(**{"model.dropout": 0.0, "model.encoder_dropout": 0.0, "train.optimizer": "sgd",
                         "train.lr": 0.05, **LADDER})
    batches = _tiny_batches(cfg, 8)
    assert len({tuple(tb.batch.images.shape) for tb in batches}) < len(batches)  # some shapes come again
    model_a, loss_a, opt_a = _stepper(cfg)
    model_b, loss_b, opt_b = _stepper(cfg)
    step = GraphedStep(loss_b, opt_b, model_b, cfg.train.grad_clip)
    plain, padded, graphed = [], [], []
    for tb in batches:
        tgt_in, tgt_out = pad_targets(tb.tgt_in, tb.tgt_out)
        assert tgt_in.shape[1] == LENGTH_LADDER.rung(tb.tgt_in.shape[1])
        with torch.no_grad():  # on a copy: a training-mode forward moves BatchNorm's running statistics
            padded.append(float(copy.deepcopy(loss_a)(tb.batch.images, tb.batch.image_mask, tgt_in, tgt_out)))
        plain.append(float(train_step(loss_a, opt_a, model_a, tb, cfg.train.grad_clip)))
        graphed.append(float(step(tb)))
    assert graphed == pytest.approx(plain, rel=1e-5) and padded == pytest.approx(plain, rel=1e-5)
    for (name, a), b in zip(model_a.state_dict().items(), model_b.state_dict().values()):
        assert torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-6), name
    assert len(step.statics) == len({(tuple(tb.batch.images.shape),
                                      tuple(pad_targets(tb.tgt_in, tb.tgt_out)[0].shape)) for tb in batches})
    assert step.graphs == 0 and not step.failures  # no graph on a CPU


def test_the_static_shape_step_on_padded_captions_is_the_ordinary_step_to_the_bit(one_thread):
    cfg = tiny_config(**LADDER)
    batches = [TrainBatch(tb.batch, *pad_targets(tb.tgt_in, tb.tgt_out)) for tb in _tiny_batches(cfg, 5)]
    model_a, loss_a, opt_a = _stepper(cfg, seed=3)
    model_b, loss_b, opt_b = _stepper(cfg, seed=3)
    step = GraphedStep(loss_b, opt_b, model_b, cfg.train.grad_clip)
    torch.manual_seed(11)
    plain = [float(train_step(loss_a, opt_a, model_a, tb, cfg.train.grad_clip)) for tb in batches]
    torch.manual_seed(11)  # dropout draws the same masks on both sides
    graphed = [float(step(tb)) for tb in batches]
    assert graphed == plain
    assert all(torch.equal(a, b) for a, b in zip(model_a.state_dict().values(), model_b.state_dict().values()))


def test_the_1x1_convolutions_as_matrix_products_keep_every_parameter_and_the_outputs(one_thread):
    cfg = preset_with_recipe("bttr")
    torch.manual_seed(0)
    conv = build_model(cfg.model).eval()
    matmul = copy.deepcopy(conv)
    assert use_matmul(matmul, True) == 51  # the bottlenecks (48), the transitions (2), the projection
    assert list(conv.state_dict()) == list(matmul.state_dict())  # checkpoints load either way
    x = torch.rand(2, 1, 64, 160).contiguous(memory_format=torch.channels_last)
    mask = torch.zeros(2, 64, 160, dtype=torch.bool)
    mask[1, :, 120:] = True
    with torch.no_grad():
        a, _ = conv.encode(x, mask)
        b, _ = matmul.encode(x, mask)
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)  # the same products, summed in another order


def test_graphs_and_planning_need_the_ladder_and_graphs_exclude_compile():
    cfg = tiny_config()
    for key in ("train.plan_shapes", "train.cuda_graphs"):
        with pytest.raises(ConfigError, match="pad ladder"):
            cfg.override({key: True})
        cfg.override({key: True, **LADDER})
    with pytest.raises(ConfigError, match="one of them"):
        cfg.override({"train.cuda_graphs": True, "train.compile": True, **LADDER})
