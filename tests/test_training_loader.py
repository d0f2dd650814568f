"""The training input pipeline (hmer.training.loader): prefetching changes nothing but timing."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from hmer.data import Vocab, make_batches
from hmer.model import build_model, make_targets
from hmer.training.loader import auto_prefetch, prefetched, train_batches
from tiny_dataset import tiny_expressions

VOCAB = Vocab()
EXPRS = tiny_expressions(12)
BATCHES = make_batches(EXPRS, 20_000, 4, shuffle=True, seed=3)
CPU = torch.device("cpu")


def epoch(prefetch: int, direction: str = "bi", scale=(0.7, 1.4)):
    return list(train_batches(EXPRS, BATCHES, VOCAB, direction, CPU, scale_range=scale,
                              rng=np.random.default_rng(5), prefetch=prefetch))


@pytest.mark.parametrize("direction", ["l2r", "r2l", "bi"])
def test_prefetched_batches_equal_batches_made_in_the_step_thread(direction):
    plain, ahead = epoch(0, direction), epoch(2, direction)
    assert len(plain) == len(ahead) == len(BATCHES)
    for a, b, idx in zip(plain, ahead, BATCHES):
        assert a.batch.names == b.batch.names == [EXPRS[i].name for i in idx]
        # the same augmentation draw for the same batch, whichever thread drew it
        assert torch.equal(a.batch.images, b.batch.images) and torch.equal(a.batch.image_mask, b.batch.image_mask)
        assert torch.equal(a.tgt_in, b.tgt_in) and torch.equal(a.tgt_out, b.tgt_out)
        tgt_in, tgt_out, _ = make_targets(a.batch.token_ids, direction, VOCAB)
        assert torch.equal(a.tgt_in, tgt_in) and torch.equal(a.tgt_out, tgt_out)
        assert a.tgt_in.shape[0] == len(idx) * (2 if direction == "bi" else 1)


def test_scale_augmentation_resizes_and_none_keeps_sizes():
    unscaled = epoch(0, scale=None)
    scaled = epoch(0, scale=(0.5, 0.5))
    for a, b in zip(unscaled, scaled):
        assert b.batch.images.shape[-1] == pytest.approx(a.batch.images.shape[-1] / 2, abs=1)
    with pytest.raises(ValueError, match="rng"):
        train_batches(EXPRS, BATCHES, VOCAB, "l2r", CPU, scale_range=(0.7, 1.4))


def test_loss_from_prebuilt_targets_is_the_models_loss():
    torch.manual_seed(0)
    model = build_model("tiny-transformer").eval()
    tb = epoch(0, scale=None)[0]
    expected = model.loss(tb.batch.images, tb.batch.image_mask, tb.batch.token_ids)
    got = model.loss_from_targets(tb.batch.images, tb.batch.image_mask, tb.tgt_in, tb.tgt_out)
    assert torch.equal(expected, got)


def test_an_error_while_collating_ahead_reaches_the_consumer():
    def make(i):
        if i == 3:
            raise ValueError("bad batch 3")
        return i

    got = []
    with pytest.raises(ValueError, match="bad batch 3"):
        for item in prefetched(make, iter(range(10)), depth=2):
            got.append(item)
    assert got == [0, 1, 2]


def test_leaving_an_epoch_early_stops_the_prefetch_thread():
    stream = prefetched(lambda i: i, iter(range(1000)), depth=2)
    assert next(stream) == 0
    stream.close()  # what a `break` out of the epoch loop does
    assert not any(t.name == "hmer-prefetch" and t.is_alive() for t in threading.enumerate())


def test_auto_prefetch_is_off_on_cpu_and_on_for_gpu():
    assert auto_prefetch(-1, CPU) == 0
    assert auto_prefetch(-1, torch.device("cuda")) == 2
    assert auto_prefetch(3, CPU) == 3
