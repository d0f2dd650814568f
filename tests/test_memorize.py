"""End to end on real CROHME: a small model of each decoder family memorizes 16 training
expressions on CPU, and beam search (beam 10, max length 200, length penalty 1.0; for `bi`, the
joint search) then reads all 16 back exactly, in each reading direction.

A loss that goes down proves little. Reading every formula back proves that rendering,
batching, the model, the training loop, checkpointing of the best model, beam search and
scoring fit together. (This test found a real bug: beam search used to stop as soon as
`beam_size` hypotheses had finished, which lost sure long answers to short junk.)"""

from __future__ import annotations

import mlflow
import pytest

from hmer.data import load_split
from hmer.model_presets import preset_with_recipe
from hmer.training import train

pytestmark = [pytest.mark.shared_data, pytest.mark.slow]


@pytest.fixture(scope="module")
def sixteen_expressions(crohme_data):
    """16 short training expressions, chosen by name so that the set never changes."""
    train_split = load_split(str(crohme_data), "train")
    chosen = sorted((e for e in train_split if 3 <= len(e.tokens) <= 8), key=lambda e: e.name)[:16]
    assert len(chosen) == 16
    return chosen


# bi decodes with the approximate joint search: beams in both directions, each rescored by the other.
# Every decoder family, bidirectional: the transformer in each direction; CoMER's fusion coverage,
# WAP's GRU and ConvS2S (the claims studies' other variants; the GRU takes about 150 epochs).
@pytest.mark.parametrize("preset,direction", [("tiny-transformer", "l2r"), ("tiny-transformer", "r2l"),
                                              ("tiny-transformer", "bi"), ("tiny-comer", "bi"), ("tiny-rnn", "bi"),
                                              ("tiny-convs2s", "bi")])
def test_small_model_memorizes_16_expressions_and_beam_search_reads_them_back(sixteen_expressions, preset,
                                                                            direction, tmp_path):
    chosen = sixteen_expressions
    # Memorizing: the validation set is the training set, decoded every 10 epochs with the same
    # beam search as the test, and training stops once it reads all 16 back. (Greedy validation
    # stops too early for `bi`: greedy l2r can read all 16 back while the r2l half is still unsure,
    # and the joint search then rightly prefers another reading.) The test year then reloads the
    # best checkpoint and decodes again, and MLflow must hold the result. All 16 train as one batch:
    # BatchNorm's statistics are then the same at every step, and the running statistics that
    # evaluation uses converge to them (in batches of 4 the encoder learns each batch's statistics,
    # and which epoch reads all 16 back with the running ones depended on float rounding).
    data = {"train": chosen, "val": chosen, "memorized": chosen}
    cfg = preset_with_recipe(preset).override({
        "train.device": "cpu", "train.optimizer": "adamw", "train.lr": 3e-3, "train.weight_decay": 0.0,
        "train.epochs": 300, "train.val_every": 10, "train.stop_at_val_exprate": 100.0,
        "train.plateau_patience": 1000, "train.attention_maps": 0, "train.val_beam_size": 10,
        "model.dropout": 0.0, "model.encoder_dropout": 0.0, "model.direction": direction,
        "data.test_years": "memorized", "data.batch_pixels": 2_000_000, "data.max_batch_size": 16,
    })
    assert (cfg.train.beam_size, cfg.train.max_decode_len, cfg.train.length_penalty) == (10, 200, 1.0)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = train(cfg, data=data, tracking_uri=uri, run_dir=tmp_path / "run")

    assert result.stopped_by == "target", f"beam search never read all 16 back in {result.epochs} epochs"
    scores = result.test_scores["memorized"]
    assert scores.n == 16
    assert scores.exprate == 100.0, f"beam search read back {scores.exprate:.1f} % after {result.epochs} epochs"
    mlflow.set_tracking_uri(uri)
    logged = mlflow.search_runs(experiment_names=["hmer"]).iloc[0]
    assert logged["metrics.test_memorized_exprate"] == 100.0
    assert logged["metrics.test_memorized_n"] == 16
