"""The fixed training a training-code fingerprint hashes (hmer.training.fingerprint): run as a script, it prints
one line of JSON, the measurement.

It runs against whichever `hmer` is first on PYTHONPATH, any commit's, so it uses only what every commit has had
(`Config`, `Expression`, `train`); a key a commit does not know is left to it and listed in the measurement.
Run by its path, never imported: the training it runs records a fingerprint in turn.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

# The settings every part shares, then each part's own. Widths are not powers of two, so no scale (1/sqrt(12))
# is exact and an operation moved across it rounds differently.
COMMON = {
    "model.d_model": 24, "model.growth_rate": 4, "model.num_dense_layers": 2, "model.num_dense_blocks": 2,
    "model.num_decoder_layers": 1, "model.nhead": 2, "model.dim_feedforward": 64, "model.dropout": 0.1,
    "model.encoder_dropout": 0.1, "model.coverage_channels": 4, "model.rnn_hidden": 32,
    "model.rnn_attention": 32, "model.rnn_embedding": 32, "model.conv_layers": 1,
    "data.batch_pixels": 12_000, "data.max_batch_size": 4, "data.scale_aug_min": 0.7, "data.scale_aug_max": 1.4,
    "data.test_years": "2014",
    "train.recipe": "custom", "train.optimizer": "adamw", "train.lr": 1e-3, "train.weight_decay": 0.01,
    "train.eps": 1e-8, "train.warmup_steps": 2, "train.schedule": "cosine", "train.min_lr": 1e-5,
    "train.label_smoothing": 0.1, "train.epochs": 2, "train.seed": 1, "train.device": "cpu",
    "train.precision": "fp32", "train.beam_size": 2, "train.max_decode_len": 6, "train.attention_maps": 0,
}
PARTS: dict[str, dict] = {
    "transformer-bi": {"model.decoder": "transformer", "model.direction": "bi", "model.coverage": "none"},
    "comer-fusion": {"model.decoder": "transformer", "model.direction": "bi", "model.coverage": "fusion",
                     "model.embed_norm": True},
    "rnn": {"model.decoder": "rnn", "model.direction": "l2r"},
    "convs2s": {"model.decoder": "convs2s", "model.direction": "l2r", "model.token_pos": "learned"},
}
FORMAT = 1


def _images(n: int, salt: int):
    """`n` synthetic expressions, drawn with NumPy alone (no font or resampling to round differently)."""
    import numpy as np

    tokens_pool = ["x", "^", "{", "2", "}", "+", "a", "=", "1", "-", "b", "\\frac", "y"]
    rng = np.random.default_rng(1000 + salt)
    out = []
    for i in range(n):
        length = 3 + (i + salt) % 4
        tokens = [tokens_pool[int(k)] for k in rng.integers(0, len(tokens_pool), size=length)]
        image = np.zeros((32, 14 * length + 6), dtype=np.uint8)
        for j, token in enumerate(tokens):
            code = tokens_pool.index(token)
            image[4 + code % 5 * 3: 28, 3 + 14 * j: 6 + 14 * j] = 255
            image[4 + code % 9 * 2: 9 + code % 9 * 2, 8 + 14 * j: 14 + 14 * j] = 255
        out.append((f"fp{salt}_{i}", tokens, image))
    return out


def _train_part(name: str, folder: Path) -> dict:
    """Train one part in this process; {"losses": ..., "weights": sha256, "unknown": keys} or {"absent": why}."""
    import torch

    from hmer.config import Config  # (absolute: the package on PYTHONPATH, whichever commit it is)
    from hmer.data import Expression
    from hmer.training import train

    torch.set_num_threads(1)
    values = {**COMMON, **PARTS[name]}
    defaults = Config()
    known = {k: v for k, v in values.items() if hasattr(getattr(defaults, k.split(".")[0], None), k.split(".")[1])}
    try:
        cfg = Config().override(known)
        cfg.validate()
    except ValueError as exc:
        return {"absent": str(exc).splitlines()[0]}
    data = {split: [Expression(name=n, tokens=t, image=i) for n, t, i in _images(count, salt)]
            for split, count, salt in (("train", 8, 0), ("val", 2, 1), ("2014", 2, 2))}
    losses: dict[str, list[float]] = {"train_loss": [], "val_loss": []}

    def record(epoch: int, metrics: dict) -> None:  # each epoch's losses, as the run logs them
        for key, values in losses.items():
            values.append(float(metrics[key]))

    train(cfg, data, tracking_uri=f"sqlite:///{folder / 'mlflow.db'}", experiment="fingerprint",
          run_dir=folder / "ckpt", epoch_callback=record)
    state = torch.load(folder / "ckpt" / "last.pt", map_location="cpu", weights_only=False)["model"]
    digest = hashlib.sha256()
    for key in sorted(state):
        digest.update(key.encode())
        digest.update(state[key].detach().cpu().contiguous().numpy().tobytes())
    return {"losses": losses, "weights": digest.hexdigest(), "unknown": sorted(set(values) - set(known))}


def _measure() -> dict:
    """Every part trained, with what the fingerprint hashes besides (torch, architecture)."""
    import torch

    parts = {}
    for name in PARTS:
        with tempfile.TemporaryDirectory(prefix="hmer-fingerprint-") as tmp:
            parts[name] = _train_part(name, Path(tmp))
    return {"format": FORMAT, "torch": torch.__version__, "machine": platform.machine(), "parts": parts}


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)
    with open(os.devnull, "w") as quiet:  # train() prints its epochs; the answer is the last line
        stdout, sys.stdout = sys.stdout, quiet
        try:
            measured = _measure()
        finally:
            sys.stdout = stdout
    print(json.dumps(measured, sort_keys=True))
