"""What a run logs besides metrics: per-token attention maps and their pictures, prediction files.

A run keeps the predictions behind each split's scores (`predictions/test_2014.csv`,
`split/val_predictions.csv`); `predictions_artifact` and `scored_key` map files to splits for
`training.final` (which writes them) and `tracking.rescore` (which scores them again).

`token_maps` computes where the model looks for each token (`model.attention_maps`, teacher-forced on
the tokens: row t is where the decoder looked to emit token t; `kind="coverage"`: the sum of the steps
before t), upsampled, in reading order: for the run's `attention/*.png` (an image, then a panel per
decoded token) and for `attend` and `plot_attention` (the reports' figures). Over-parsing shows as
summed attention above 1 on ink (`AttentionResult.total`), under-parsing as ink left dark;
`parse_error` names the case from the lengths of prediction and truth.
"""

from __future__ import annotations

import csv
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn, not where a training logs its pictures
    from matplotlib.figure import Figure

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
    from ..model.decoder_base import make_targets

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


@dataclass
class AttentionResult:
    """One model's per-token maps on one expression: `image` float [H, W] in [0, 1] (white ink),
    `maps` [len(tokens), H, W]; `forced`: the tokens are the truth, not what the model read."""

    label: str
    name: str
    image: np.ndarray
    tokens: list[str]
    maps: np.ndarray
    truth: list[str] | None = None
    kind: str = "attention"
    forced: bool = False

    @property
    def total(self) -> np.ndarray:
        """[H, W]: the attention summed over every token (how often each place was read)."""
        if not len(self.tokens):
            return np.zeros_like(self.image)
        return self.maps.sum(axis=0)

    @property
    def distance(self) -> int | None:
        """Edit distance of the tokens to the truth (None without a truth)."""
        if self.truth is None:
            return None
        import editdistance

        return int(editdistance.eval(self.tokens, self.truth))

    @property
    def parse_error(self) -> str:
        """"correct", "over-parsed" (more tokens than the truth), "under-parsed", "misread" (as many,
        some wrong); "" without a truth or when it was forced."""
        if self.truth is None or self.forced:
            return ""
        if self.tokens == self.truth:
            return "correct"
        if len(self.tokens) > len(self.truth):
            return "over-parsed"
        if len(self.tokens) < len(self.truth):
            return "under-parsed"
        return "misread"


def attend(model: Any, vocab: Any, expr: Any, *, tokens: Sequence[str] | None = None, label: str = "",
           cfg: Any = None, kind: str = "attention", device: str | torch.device = "cpu") -> AttentionResult:
    """`model` on an `Expression` and `tokens` (what it read, e.g. from its predictions CSV; when None,
    decoded as its run was scored, with `cfg`)."""
    if tokens is None:
        if cfg is None:
            raise ValueError("give the decoded tokens, or the model's cfg to decode them")
        from ..data import Expression
        from ..device import autocast_dtype
        from ..evaluation.evaluate import decode_options, predict

        dev = torch.device(device)
        tokens = predict(model, [Expression(name="", tokens=[], image=expr.image)], vocab,
                         **decode_options(cfg, dev, autocast_dtype(cfg.train.precision, dev)))[0][0]
    tokens = [t for t in tokens if t in vocab]
    maps = token_maps(model, vocab, expr.image, tokens, kind=kind, device=device)
    return AttentionResult(label=label, name=expr.name, image=expr.image.astype(np.float32) / 255.0,
                           tokens=list(tokens), maps=maps, truth=list(expr.tokens) if expr.tokens else None,
                           kind=kind)


def _overlay(image: np.ndarray, heat: np.ndarray | None, vmax: float | None = None) -> np.ndarray:
    """RGB [H, W, 3]: the grey image under `heat` in inferno colours, opaque at `vmax` (default: its
    maximum), transparent at zero."""
    from matplotlib import colormaps

    base = np.repeat((0.15 + 0.6 * image)[..., None], 3, axis=-1)
    if heat is None:
        return base
    top = float(vmax if vmax is not None else heat.max())
    level = np.clip(heat / top, 0.0, 1.0) if top > 0 else np.zeros_like(heat)
    color = colormaps["inferno"](0.35 + 0.65 * level)[..., :3]
    alpha = (0.8 * level)[..., None]
    return (1 - alpha) * base + alpha * color


_TITLE_CHARS = 34  # characters of a panel title line that fit over a panel 2 inches wide


def _shorten(text: str, limit: int = _TITLE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def plot_attention(results: Sequence[AttentionResult], *, max_columns: int = 12, title: str | None = None,
                   path: str | Path | None = None) -> Figure:
    """One expression read by several models, a block of rows each: the input (the reading, its error
    type), a panel per token, and the summed attention (bright ink read more than once, dark never) on
    one colour scale for all."""
    from matplotlib.figure import Figure

    from ..atomic import save_figure

    if not results:
        raise ValueError("no attention results to plot")
    columns = min(max_columns, max(len(r.tokens) for r in results) + 2)
    rows_per = [int(np.ceil((len(r.tokens) + 2) / columns)) for r in results]
    h, w = results[0].image.shape
    panel_w = 2.0
    panel_h = panel_w * h / max(w, 1) + 0.75  # the image and a title of up to four lines
    fig = Figure(figsize=(panel_w * columns, panel_h * sum(rows_per) + 0.6), layout="constrained")
    axes = fig.subplots(sum(rows_per), columns, squeeze=False)
    for ax in axes.flat:
        ax.set_axis_off()
    # The summed panels share one scale, at least 1 (a place attended once): brighter is read more.
    totals_max = max([1.0] + [float(r.total.max()) for r in results if len(r.tokens)])
    row0 = 0
    for result, n_rows in zip(results, rows_per):
        panels: list[tuple[str, np.ndarray | None, float | None]] = []
        reading = " ".join(result.tokens) or "(nothing)"
        verdict = f" — {result.parse_error}, distance {result.distance}" if result.parse_error else ""
        verb = "forced" if result.forced else "read"
        header = textwrap.fill(f"{result.label}{verdict}", _TITLE_CHARS)
        panels.append((f"{header}\n{_shorten(f'{verb}: {reading}', _TITLE_CHARS)}", None, None))
        panels += [(f"{i + 1}: {tok}", result.maps[i], None) for i, tok in enumerate(result.tokens)]
        panels.append((f"Σ over tokens (max {result.total.max():.2f})" if len(result.tokens) else "Σ (no tokens)",
                       result.total if len(result.tokens) else None, totals_max))
        for k, (label, heat, vmax) in enumerate(panels):
            ax = axes[row0 + k // columns, k % columns]
            ax.imshow(_overlay(result.image, heat, vmax), interpolation="nearest")
            ax.set_title(label, fontsize=8, loc="left")
        row0 += n_rows
    truth = " ".join(results[0].truth) if results[0].truth is not None else None
    fig.suptitle(f"{title or results[0].name}" + (f"   truth: {_shorten(truth, 90)}" if truth else ""), fontsize=10)
    if path is not None:
        save_figure(fig, path)
    return fig
