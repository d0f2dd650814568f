"""End to end on real CROHME: a small model memorizes 16 training expressions on CPU and
beam search then reads all 16 back exactly. A loss that goes down proves little; this
proves that rendering, batching, the model, training, decoding and scoring fit together."""

from __future__ import annotations

import pytest

from hmer.data import load_split
from hmer.presets import experiment_config
from hmer.training import train

pytestmark = [pytest.mark.shared_data, pytest.mark.slow]


def test_small_model_memorizes_16_expressions_and_beam_search_reads_them_back(shared_crohme, tmp_path):
    train_split = load_split(str(shared_crohme), "train")
    # 16 short expressions, chosen by name so the set never changes.
    chosen = sorted((e for e in train_split if 3 <= len(e.tokens) <= 8), key=lambda e: e.name)[:16]
    assert len(chosen) == 16
    data = {"train": chosen, "val": chosen, "memorized": chosen}
    cfg = experiment_config("tiny").override({
        "train.device": "cpu", "train.optimizer": "adamw", "train.lr": 3e-3, "train.weight_decay": 0.0,
        "train.epochs": 400, "train.val_every": 10, "train.stop_at_val_exprate": 100.0,
        "train.plateau_patience": 1000, "train.beam_size": 10, "train.val_beam_size": 10, "train.max_decode_len": 40,
        "train.attention_maps": 0, "model.dropout": 0.0, "model.encoder_dropout": 0.0,
        "model.direction": "l2r", "data.test_years": "memorized", "data.batch_pixels": 2_000_000,
        "data.max_batch_size": 16,
    })
    result = train(cfg, data=data, tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", run_dir=tmp_path / "c")
    scores = result.test_scores["memorized"]
    assert scores.n == 16
    assert scores.exprate == 100.0, f"read back {scores.exprate:.1f} % after {result.epochs} epochs"
