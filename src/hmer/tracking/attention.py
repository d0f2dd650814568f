"""Where a model looks for each token it reads: per-token attention (or coverage) over the image.

`model.attention_maps`, teacher-forced on the tokens: row t is where the decoder looked to emit token
t (`kind="coverage"`: the sum of the steps before t), upsampled, in reading order. Over-parsing shows
as summed attention above 1 on ink (`AttentionResult.total`), under-parsing as ink left dark;
`parse_error` names the case from the lengths of prediction and truth.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from matplotlib.figure import Figure

from ..atomic import save_figure
from .artifacts import token_maps  # (where a run's logged pictures are drawn from them too)


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
