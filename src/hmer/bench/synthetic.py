"""Synthetic expressions for the benchmarks without `--data`."""

from __future__ import annotations

import math

import numpy as np

# CROHME train (8,393 expressions after the validation hold-out, standard renderer): means, standard
# deviations and correlations of log height, log width and log caption length.
_LOG_MEAN = np.array([4.576, 5.500, 2.358])
_LOG_STD = np.array([0.352, 0.761, 0.979])
_LOG_CORR = np.array([[1.0, 0.542, 0.704], [0.542, 1.0, 0.821], [0.704, 0.821, 1.0]])


def synthetic_expressions(n: int, seed: int = 0):
    """Stroke-like images and captions whose (height, width, length) follow CROHME train's joint
    log-normal fit (median about 97 x 245 px, 11 tokens; wider images hold longer captions)."""
    from PIL import Image, ImageDraw

    from ..data import Expression
    from ..data.vocab import CROHME_SYMBOLS

    rng = np.random.default_rng(seed)
    cov = _LOG_CORR * np.outer(_LOG_STD, _LOG_STD)
    logs = rng.multivariate_normal(_LOG_MEAN, cov, size=n)
    out = []
    for i in range(n):
        h = int(np.clip(round(math.exp(logs[i, 0])), 24, 488))
        w = int(np.clip(round(math.exp(logs[i, 1])), 24, 2048))
        length = int(np.clip(round(math.exp(logs[i, 2])), 1, 96))
        img = Image.new("L", (w, h), 0)
        draw = ImageDraw.Draw(img)
        for _ in range(max(2, w // 25)):
            pts = [(float(rng.uniform(0, w)), float(rng.uniform(0, h))) for _ in range(4)]
            draw.line(pts, fill=255, width=3)
        tokens = [CROHME_SYMBOLS[j] for j in rng.integers(0, len(CROHME_SYMBOLS), length)]
        out.append(Expression(name=f"synthetic_{i}", tokens=tokens, image=np.asarray(img, dtype=np.uint8)))
    return out
