"""End to end on real CROHME: a small model memorizes 16 training expressions on CPU, and beam
search (beam 10, max length 200, length penalty 1.0) then reads all 16 back exactly.

A loss that goes down proves little. Reading every formula back proves that rendering,
batching, the model, the training loop, checkpointing of the best model, beam search and
scoring fit together. (This test found a real bug: beam search used to stop as soon as
`beam_size` hypotheses had finished, which lost sure long answers to short junk.)"""

from __future__ import annotations

import mlflow
import pytest

from hmer.data import load_split
from hmer.presets import experiment_config
from hmer.training import train

pytestmark = [pytest.mark.shared_data, pytest.mark.slow]


def test_small_model_memorizes_16_expressions_and_beam_search_reads_them_back(shared_crohme, tmp_path):
    train_split = load_split(str(shared_crohme), "train")
    # 16 short expressions, chosen by name so that the set never changes.
    chosen = sorted((e for e in train_split if 3 <= len(e.tokens) <= 8), key=lambda e: e.name)[:16]
    assert len(chosen) == 16
    # Memorizing: the validation set is the training set (greedy, every 10 epochs) and training
    # stops once greedy decoding reads all 16 back; the test year scores beam search on them.
    data = {"train": chosen, "val": chosen, "memorized": chosen}
    cfg = experiment_config("tiny").override({
        "train.device": "cpu", "train.optimizer": "adamw", "train.lr": 3e-3, "train.weight_decay": 0.0,
        "train.epochs": 150, "train.val_every": 10, "train.stop_at_val_exprate": 100.0,
        "train.plateau_patience": 1000, "train.attention_maps": 0,
        "model.dropout": 0.0, "model.encoder_dropout": 0.0, "model.direction": "l2r",
        "data.test_years": "memorized", "data.batch_pixels": 2_000_000, "data.max_batch_size": 4,
    })
    assert (cfg.train.beam_size, cfg.train.max_decode_len, cfg.train.length_penalty) == (10, 200, 1.0)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = train(cfg, data=data, tracking_uri=uri, run_dir=tmp_path / "run")

    assert result.stopped_by == "target", f"greedy never read all 16 back in {result.epochs} epochs"
    scores = result.test_scores["memorized"]
    assert scores.n == 16
    assert scores.exprate == 100.0, f"beam search read back {scores.exprate:.1f} % after {result.epochs} epochs"
    mlflow.set_tracking_uri(uri)
    logged = mlflow.search_runs(experiment_names=["hmer"]).iloc[0]
    assert logged["metrics.test_memorized_exprate"] == 100.0
    assert logged["metrics.test_memorized_n"] == 16
