"""What a run logs besides metrics: per-token attention maps and their pictures, prediction files.

A run keeps the predictions behind each split's scores (`predictions/test_2014.csv`,
`split/val_predictions.csv`); `predictions_artifact` and `scored_key` map files to splits for
`training.final` (which writes them) and `tracking.rescore` (which scores them again).

`token_maps` computes where the model looks for each token, for the run's `attention/*.png` (an image,
then a panel per decoded token: over- and under-parsing at a glance) and `tracking.attention`.
"""

from __future__ import annotations

import csv
import tempfile
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw

KINDS = ("attention", "coverage")
PREDICTION_COLUMNS = ["name", "truth", "prediction", "distance"]
PREDICTIONS = "predictions"  # the test splits' predictions: predictions/test_<split>.csv
SPLIT = "split"  # the training's own splits (name lists; validation's predictions, split/<split>_predictions.csv)
_FINAL = "_final"  # the metric prefix of a validation split decoded at the end: val_final_*
_PREDICTIONS_FILE = "_predictions.csv"


@torch.inference_mode()
def token_maps(model: Any, vocab: Any, image: np.ndarray, tokens: Sequence[str], *, direction: str | None = None,
               kind: str = "attention", device: str | torch.device = "cpu") -> np.ndarray:
    """float [len(tokens), H, W]: where `model` looks (or its coverage) to emit each of `tokens`, in
    reading order, over the uint8 `image` (255 = ink); `direction` defaults to the model's."""
    from ..data import Expression, collate
    from ..model.direction import make_targets

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    height, width = image.shape[:2]
    if not tokens:
        return np.zeros((0, height, width), dtype=np.float32)
    model.eval()
    batch = collate([Expression(name="", tokens=list(tokens), image=image)], vocab).to(device)
    # the direction the maps are computed in (a bidirectional model reads l2r)
    reading = "r2l" if (direction or getattr(getattr(model, "cfg", None), "direction", "l2r")) == "r2l" else "l2r"
    tgt_in, _, _ = make_targets(batch.token_ids, reading, vocab, device=batch.images.device)
    maps = model.attention_maps(batch.images, batch.image_mask, tgt_in, coverage=kind == "coverage")
    maps = maps[0, : len(tokens)].float()  # row t emits token t; the last row would emit <eos>
    if reading == "r2l":
        maps = maps.flip(0)
    padded_h, padded_w = batch.images.shape[-2:]
    # Each pixel gets its feature cell's weight (bilinear between centres), not a density: the maps
    # summed over tokens read as how many times a place was attended (1 = once).
    up = F.interpolate(maps[:, None], size=(padded_h, padded_w), mode="bilinear", align_corners=False)[:, 0]
    up = up[:, :height, :width].clamp_min(0)
    return up.cpu().numpy()


def attention_grid(image: np.ndarray, maps: np.ndarray, tokens: Sequence[str], columns: int = 4) -> Image.Image:
    """image: uint8 [H, W]; maps: float [L, h, w] (one per token); -> an RGB panel grid."""
    h, w = image.shape
    label_h = 14
    panels = [_panel(image, None, "input")] + [_panel(image, m, tok) for tok, m in zip(tokens, maps)]
    rows = (len(panels) + columns - 1) // columns
    grid = Image.new("RGB", (columns * w, rows * (h + label_h)), "white")
    for i, p in enumerate(panels):
        grid.paste(p, ((i % columns) * w, (i // columns) * (h + label_h)))
    return grid


def _panel(image: np.ndarray, attn: np.ndarray | None, label: str) -> Image.Image:
    h, w = image.shape
    base = np.stack([image] * 3, axis=-1).astype(np.float32) * 0.6
    if attn is not None:
        grey = Image.fromarray((attn / max(float(attn.max()), 1e-8) * 255).astype(np.uint8))
        a = np.asarray(grey.resize((w, h), Image.Resampling.BILINEAR), dtype=np.float32) / 255.0
        base[..., 0] = np.clip(base[..., 0] + 255 * a, 0, 255)  # attention in red over grey ink
    panel = Image.new("RGB", (w, h + 14), "white")
    panel.paste(Image.fromarray(base.astype(np.uint8)), (0, 14))
    ImageDraw.Draw(panel).text((2, 1), label, fill="black")
    return panel


def log_attention_maps(run, model, exprs: Sequence[Any], vocab: Any, cfg: Any, device, count: int) -> None:
    """`attention/<name>.png` for the first `count` of `exprs`, into `run` (anything with `log_artifacts`),
    each showing what the model reads, decoded greedily in one batch (cheap: pictures only)."""
    from ..data import collate
    from ..decoding import decode_batch

    if count <= 0 or not exprs or not hasattr(model, "attention_maps"):
        return
    chosen = list(exprs[:count])
    model.eval()
    batch = collate(chosen, vocab).to(device)
    with torch.inference_mode():
        hyps = decode_batch(model, batch.images, batch.image_mask, "l2r" if cfg.model.direction == "bi" else
                            cfg.model.direction, beam_size=1, max_len=cfg.train.max_decode_len, sos_id=vocab.sos_id,
                            eos_id=vocab.eos_id)
    with tempfile.TemporaryDirectory() as tmp:
        for expr, tokens in zip(chosen, [vocab.decode(ids) for ids in hyps]):
            maps = token_maps(model, vocab, expr.image, tokens, direction=cfg.model.direction, device=device)
            attention_grid(expr.image, maps, tokens).save(Path(tmp) / f"{expr.name}.png")
        run.log_artifacts(tmp, "attention")


def write_predictions_csv(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    """A predictions file as runs log them (`predictions/test_<year>.csv`): name, truth, prediction, distance."""
    with Path(path).open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=PREDICTION_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def log_test_predictions(client, run_id: str, results: dict[str, Any]) -> None:
    """`predictions/test_<split>.csv` of each {split: evaluation.SplitResult} into the run."""
    with tempfile.TemporaryDirectory(prefix="hmer-predictions-") as tmp:
        for split, res in results.items():
            write_predictions_csv(Path(tmp) / f"test_{split}.csv", res.rows())
        client.log_artifacts(run_id, tmp, PREDICTIONS)


def predictions_artifact(key: str) -> str:
    """The predictions behind a run's metrics `<key>_*`: `test_2014` -> `predictions/test_2014.csv`,
    `val_final` -> `split/val_predictions.csv`."""
    if key.endswith(_FINAL):
        return f"{SPLIT}/{key.removesuffix(_FINAL)}{_PREDICTIONS_FILE}"
    return f"{PREDICTIONS}/{key}.csv"


def scored_key(artifact: str) -> str | None:
    """The inverse of `predictions_artifact`; None for any other artifact."""
    folder, _, name = artifact.partition("/")
    if folder == PREDICTIONS and name.startswith("test_") and name.endswith(".csv") and "/" not in name:
        return name.removesuffix(".csv")
    if folder == SPLIT and name.endswith(_PREDICTIONS_FILE) and len(name) > len(_PREDICTIONS_FILE) and "/" not in name:
        return name.removesuffix(_PREDICTIONS_FILE) + _FINAL
    return None


def read_predictions_csv(path: str | Path) -> list[dict[str, str]]:
    """The rows of a predictions file, each {column: text}; ValueError naming the file when it is not
    one (not UTF-8 CSV, a column missing, a row of another length than its header)."""
    try:
        with Path(path).open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = [c for c in PREDICTION_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise ValueError(f"{path}: not a predictions file (no column {', '.join(missing)})")
            rows = []
            for row in reader:
                if None in row or None in row.values():  # more cells than the header names, or fewer
                    raise ValueError(f"{path}: line {reader.line_num} is not a row of its header's columns")
                rows.append(row)
            return rows
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"{path}: not a predictions file ({type(exc).__name__}: {exc})") from None
