"""Pictures logged with a run: the decoder's attention over the image, token by token.

Each validation image gets one PNG: the image on top, then one panel per decoded token
with that token's cross-attention (the coverage-refined attention for CoMER models)
over the image, so over-parsing (attending to ink twice) and under-parsing (never
attending to some ink) can be seen at a glance.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from PIL import Image, ImageDraw

from ..config import Config
from ..data import Expression, Vocab, collate
from ..decoding import decode_batch


def attention_grid(image: np.ndarray, maps: np.ndarray, tokens: Sequence[str], columns: int = 4) -> Image.Image:
    """image: uint8 [H, W]; maps: float [L, h, w] (one per token); -> an RGB panel grid."""
    h, w = image.shape
    label_h = 14
    panels = [_panel(image, None, "input")]
    for tok, m in zip(tokens, maps):
        panels.append(_panel(image, m, tok))
    rows = (len(panels) + columns - 1) // columns
    grid = Image.new("RGB", (columns * w, rows * (h + label_h)), "white")
    for i, p in enumerate(panels):
        grid.paste(p, ((i % columns) * w, (i // columns) * (h + label_h)))
    return grid


def _panel(image: np.ndarray, attn: np.ndarray | None, label: str) -> Image.Image:
    h, w = image.shape
    base = np.stack([image] * 3, axis=-1).astype(np.float32) * 0.6
    if attn is not None:
        a = Image.fromarray((attn / max(float(attn.max()), 1e-8) * 255).astype(np.uint8))
        a = np.asarray(a.resize((w, h), Image.BILINEAR), dtype=np.float32) / 255.0
        base[..., 0] = np.clip(base[..., 0] + 255 * a, 0, 255)  # attention in red over grey ink
    panel = Image.new("RGB", (w, h + 14), "white")
    panel.paste(Image.fromarray(base.astype(np.uint8)), (0, 14))
    ImageDraw.Draw(panel).text((2, 1), label, fill="black")
    return panel


@torch.inference_mode()
def attention_for(model, exprs: Sequence[Expression], vocab: Vocab, cfg: Config, device) -> list[tuple]:
    """(expression, decoded tokens, maps [L, h, w]) for each expression, decoded greedily."""
    model.eval()
    batch = collate(list(exprs), vocab).to(device)
    hyps = decode_batch(model, batch.images, batch.image_mask, "l2r" if cfg.model.direction == "bi"
                        else cfg.model.direction, beam_size=1, max_len=cfg.train.max_decode_len,
                        sos_id=vocab.sos_id, eos_id=vocab.eos_id)
    out = []
    for i, (expr, ids) in enumerate(zip(exprs, hyps)):
        ids = list(ids)
        if cfg.model.direction == "r2l":
            start, seq = vocab.eos_id, ids[::-1]
        else:
            start, seq = vocab.sos_id, ids
        tgt_in = torch.tensor([[start] + seq], dtype=torch.long, device=device)
        maps = model.attention_maps(batch.images[i:i + 1], batch.image_mask[i:i + 1], tgt_in)[0]
        h, w = expr.image.shape
        fh = int((~batch.image_mask[i, :, 0]).sum().item())  # unpadded rows/cols of the image
        fw = int((~batch.image_mask[i, 0, :]).sum().item())
        full_h, full_w = batch.image_mask.shape[1:]
        mh = max(1, round(maps.shape[1] * fh / full_h))
        mw = max(1, round(maps.shape[2] * fw / full_w))
        maps = maps[:, :mh, :mw].float().cpu().numpy()
        out.append((expr, vocab.decode(seq), maps[: len(seq)]))
    return out


def log_attention_maps(client, run_id: str, model, exprs: Sequence[Expression], vocab: Vocab,
                       cfg: Config, device, count: int) -> None:
    if count <= 0 or not exprs or not hasattr(model, "attention_maps"):
        return
    chosen = list(exprs[:count])
    with tempfile.TemporaryDirectory() as tmp:
        for expr, tokens, maps in attention_for(model, chosen, vocab, cfg, device):
            attention_grid(expr.image, maps, tokens).save(Path(tmp) / f"{expr.name}.png")
        client.log_artifacts(run_id, tmp, "attention")
