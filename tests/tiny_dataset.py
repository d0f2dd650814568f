"""Tiny datasets that tests make themselves: a few rendered "expressions" in the
`<split>/caption.txt` + `<split>/<name>.png` layout, the matching Config, and random padded
image batches for the model tests.

The images are drawn from the caption (one glyph-like mark per token at a position
given by its index), so a tiny model can actually learn to read them back.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from hmer.config import Config
from hmer.data import Expression
from hmer.data.vocab import CROHME_SYMBOLS

CAPTIONS = [
    "x ^ { 2 }", "a + b", "\\frac { 1 } { 2 }", "y = 3", "\\sqrt { x }", "2 x - 1",
    "a _ { n }", "\\sin x", "b - c = 0", "( a + b )", "x \\times y", "\\alpha + 1",
]


def draw_caption(tokens: list[str], height: int = 32) -> np.ndarray:
    """A white-on-black picture in which each token leaves its own mark."""
    width = 16 * len(tokens) + 8
    img = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(img)
    for i, tok in enumerate(tokens):
        code = CROHME_SYMBOLS.index(tok) if tok in CROHME_SYMBOLS else 0
        x0 = 4 + 16 * i
        # The mark encodes the token id: a bar whose height and a dot whose row depend on it.
        draw.rectangle([x0, 4 + code % 7 * 3, x0 + 3, height - 4], fill=255)
        draw.ellipse([x0 + 6, 4 + code % 11 * 2, x0 + 11, 9 + code % 11 * 2], fill=255)
    return np.asarray(img, dtype=np.uint8)


def tiny_expressions(n: int = 8, prefix: str = "t") -> list[Expression]:
    out = []
    for i in range(n):
        tokens = CAPTIONS[i % len(CAPTIONS)].split()
        out.append(Expression(name=f"{prefix}{i}", tokens=tokens, image=draw_caption(tokens)))
    return out


def tiny_data(n_train: int = 8, n_val: int = 4, n_test: int = 4) -> dict[str, list[Expression]]:
    return {
        "train": tiny_expressions(n_train, "tr"),
        "val": tiny_expressions(n_val, "va"),
        "2014": tiny_expressions(n_test, "te"),
    }


def write_dataset(root: Path, splits: dict[str, int] | None = None) -> Path:
    """Write PNGs and caption.txt per split; returns the dataset root."""
    splits = splits or {"train": 12, "2014": 4, "2016": 3, "2019": 3}
    for split, n in splits.items():
        folder = root / split
        folder.mkdir(parents=True, exist_ok=True)
        lines = []
        for e in tiny_expressions(n, f"{split}_"):
            Image.fromarray(e.image).save(folder / f"{e.name}.png")
            lines.append(f"{e.name}\t{' '.join(e.tokens)}\n")
        (folder / "caption.txt").write_text("".join(lines))
    return root


def tiny_config(**overrides) -> Config:
    """A model small enough to train a few steps per second on one CPU core."""
    from hmer.model_presets import preset_with_recipe

    cfg = preset_with_recipe("tiny-transformer")
    values = {
        "train.epochs": 2, "train.device": "cpu", "train.beam_size": 2, "train.max_decode_len": 12,
        "train.attention_maps": 1, "data.test_years": "2014", "data.batch_pixels": 20_000,
        "data.max_batch_size": 8,
    }
    values.update(overrides)
    return cfg.override(values).validate()


def make_images(sizes, canvas=None, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ink on zero background, zero-padded to `canvas` (default: the largest size), for the
    model tests: (images [B, 1, H, W], mask [B, H, W] True at padding)."""
    g = torch.Generator().manual_seed(seed)
    hmax = max(h for h, _ in sizes) if canvas is None else canvas[0]
    wmax = max(w for _, w in sizes) if canvas is None else canvas[1]
    images = torch.zeros(len(sizes), 1, hmax, wmax)
    mask = torch.ones(len(sizes), hmax, wmax, dtype=torch.bool)
    for i, (h, w) in enumerate(sizes):
        images[i, 0, :h, :w] = (torch.rand(h, w, generator=g) > 0.7).float()
        mask[i, :h, :w] = False
    return images, mask
