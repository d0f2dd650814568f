"""Where a model looks for each token it reads: per-token attention (or coverage) over the image.

    model, cfg, vocab = hmer.tracking.load_model(run_id)
    result = attend(model, vocab, expr, tokens=predicted_tokens, label="coverage=cross")
    fig = hmer.reports.plots.plot_attention([result_with, result_without])   # one row block per model

The maps come from `model.attention_maps` with teacher forcing on the given tokens (the
tokens the model decoded, read from its predictions CSV, or decoded here): row t is
where the decoder looked to emit token t. With `kind="coverage"` they are the coverage
instead, the sum of the attention of the steps before t. Maps are upsampled from the
feature grid to the image and returned in reading order (for a right-to-left model the
rows are flipped back).

Over-parsing (a stroke read twice) shows as ink attended by several tokens, i.e. a
summed attention above 1 there; under-parsing (a stroke never read) as ink the summed
attention leaves dark. `AttentionResult.total` is that sum, and `parse_error` names the
case from the lengths of prediction and truth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

# The maps themselves are computed where a run's logged pictures are drawn from them too.
from ..tracking.artifacts import KINDS, token_maps

__all__ = ["KINDS", "AttentionResult", "attend", "compare_models", "coverage_pair", "decode_tokens",
           "load_test_expressions", "model_label", "pick_expressions", "token_maps", "tokens_from_predictions"]


@dataclass
class AttentionResult:
    """The per-token maps of one model on one expression.

    Attributes:
        label: the model's name in a figure ("with coverage", a variant, a run id).
        name: the expression's name.
        image: float [H, W] in [0, 1], white ink on black.
        tokens: the tokens the maps belong to, in reading order.
        maps: float [len(tokens), H, W], upsampled to the image: each pixel holds the
            attention weight of its feature cell (see `token_maps`).
        truth: the ground-truth tokens, when known.
        kind: "attention" or "coverage".
        forced: the tokens are the truth, teacher-forced (not what the model read).
    """

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
        """"correct", "over-parsed" (more tokens than the truth), "under-parsed" (fewer),
        "misread" (as many, some wrong), or "" without a truth or when the truth was forced."""
        if self.truth is None or self.forced:
            return ""
        if self.tokens == self.truth:
            return "correct"
        if len(self.tokens) > len(self.truth):
            return "over-parsed"
        if len(self.tokens) < len(self.truth):
            return "under-parsed"
        return "misread"


def decode_tokens(model: Any, cfg: Any, vocab: Any, image: np.ndarray, *, device: str | torch.device = "cpu",
                  beam_size: int | None = None) -> list[str]:
    """What the model reads in `image`, with the decoding its run was scored with (beam from cfg)."""
    from ..data import Expression
    from ..evaluation.evaluate import predict

    preds, _ = predict(model, [Expression(name="", tokens=[], image=image)], vocab,
                       direction=cfg.model.direction, device=torch.device(device),
                       beam_size=beam_size or cfg.train.beam_size, max_len=cfg.train.max_decode_len,
                       length_penalty=cfg.train.length_penalty, max_image_pixels=cfg.data.max_image_pixels)
    return preds[0]


def attend(model: Any, vocab: Any, expr: Any, *, tokens: Sequence[str] | None = None, label: str = "",
           cfg: Any = None, kind: str = "attention", device: str | torch.device = "cpu") -> AttentionResult:
    """The `AttentionResult` of `model` on an `Expression`.

    `tokens`: what the model read (e.g. from its predictions CSV); decoded here with
    `cfg` when None.
    """
    if tokens is None:
        if cfg is None:
            raise ValueError("give the decoded tokens, or the model's cfg to decode them")
        tokens = decode_tokens(model, cfg, vocab, expr.image, device=device)
    tokens = [t for t in tokens if t in vocab]
    maps = token_maps(model, vocab, expr.image, tokens, kind=kind, device=device)
    return AttentionResult(label=label, name=expr.name, image=expr.image.astype(np.float32) / 255.0,
                           tokens=list(tokens), maps=maps, truth=list(expr.tokens) if expr.tokens else None,
                           kind=kind)


def tokens_from_predictions(predictions: pd.DataFrame) -> dict[str, list[str]]:
    """{expression name: predicted tokens} from a predictions CSV frame (`load_predictions`)."""
    return {str(n): str(p).split() for n, p in zip(predictions["name"], predictions["prediction"])}


def pick_expressions(first: pd.DataFrame, second: pd.DataFrame, k: int = 3) -> list[str]:
    """Up to `k` expression names worth looking at, from two runs' predictions on one test year.

    First those one model reads and the other does not where the wrong one has too many or
    too few tokens (over- or under-parsing), then any other disagreement, then expressions
    both misread, then the rest; shorter expressions first within each group (their maps are
    readable). Names present in both frames only.
    """
    merged = first[["name", "truth", "prediction", "distance"]].merge(
        second[["name", "prediction", "distance"]], on="name", suffixes=("_a", "_b"))
    if merged.empty:
        return []
    truth_len = merged["truth"].str.split().str.len()
    len_a = merged["prediction_a"].str.split().str.len()
    len_b = merged["prediction_b"].str.split().str.len()
    right_a = merged["distance_a"].eq(0).fillna(False).astype(bool).to_numpy()
    right_b = merged["distance_b"].eq(0).fillna(False).astype(bool).to_numpy()
    one_right = right_a != right_b
    wrong_len = np.where(right_a, len_b, len_a) != truth_len.to_numpy()
    rank = np.select([one_right & wrong_len, one_right, ~right_a & ~right_b], [0, 1, 2], default=3)
    merged = merged.assign(_rank=rank, _len=truth_len).sort_values(["_rank", "_len", "name"], kind="stable")
    return list(merged["name"].head(k))


def compare_models(models: Mapping[str, tuple[Any, Any]], exprs: Sequence[Any], *,
                   predictions: Mapping[str, Mapping[str, Sequence[str]]] | None = None,
                   cfgs: Mapping[str, Any] | None = None, truth: bool = False, kind: str = "attention",
                   device: str | torch.device = "cpu") -> list[list[AttentionResult]]:
    """For each expression, one `AttentionResult` per model (in the order of `models`).

    Args:
        models: label -> (model, vocab).
        exprs: the expressions (with images and truths).
        predictions: label -> {name: tokens}, what each model read (its predictions CSV);
            a name missing there is decoded with `cfgs[label]`.
        truth: teacher-force the ground truth instead of what the model read: where the
            model looks for each *right* token, whatever it decoded.
        kind: "attention" or "coverage".
    """
    out = []
    for expr in exprs:
        row = []
        for label, (model, vocab) in models.items():
            tokens = list(expr.tokens) if truth else (predictions or {}).get(label, {}).get(expr.name)
            result = attend(model, vocab, expr, tokens=tokens, label=label, cfg=(cfgs or {}).get(label),
                            kind=kind, device=device)
            if truth:
                result.label, result.forced = f"{label}, on the truth", True
            row.append(result)
        out.append(row)
    return out


def model_label(cfg: Any, run_id: str = "") -> str:
    """A short name of a trained model for a figure: "tiny-comer: transformer d 64, coverage cross, bi
    (1a2b3c4d)". The width is named because a study budget may resize a preset (the `cpu` budget
    trains the tiny presets at the `small` widths)."""
    m = cfg.model
    coverage = "WAP coverage" if m.decoder == "rnn" else f"coverage {m.coverage}"
    name = f"{cfg.name}: " if cfg.name else ""
    return f"{name}{m.decoder} d {m.d_model}, {coverage}, {m.direction}" + (f" ({run_id[:8]})" if run_id else "")


def coverage_pair(runs: pd.DataFrame) -> tuple[str, str]:
    """(run id with coverage, run id without): the most recent finished runs of each kind.

    "With coverage" is `model.coverage != none` (CoMER's refinement) or the GRU decoder
    (WAP's coverage attention). Without one of each kind, the two most recent finished
    runs of different variants (or simply the two most recent) stand in, so a notebook
    still shows two models side by side.
    """
    from .tables import scored

    done = runs[scored(runs)] if not runs.empty else runs
    if "state" in done.columns:
        done = done[done["state"] == "finished"]
    if done.empty:
        raise ValueError("no finished run with test scores to take attention maps from")
    done = done.sort_values("start_time", ascending=False)
    coverage = done.get("params.model.coverage", pd.Series("none", index=done.index)).fillna("none")
    decoder = done.get("params.model.decoder", pd.Series("transformer", index=done.index)).fillna("transformer")
    has = (coverage != "none") | (decoder == "rnn")
    if has.any() and (~has).any():
        return str(done.loc[has, "run_id"].iloc[0]), str(done.loc[~has, "run_id"].iloc[0])
    first = done.iloc[0]
    others = done[done["variant"] != first["variant"]] if "variant" in done.columns else done.iloc[1:]
    if others.empty:
        others = done.iloc[1:]
    if others.empty:
        raise ValueError("need two finished runs to compare attention maps")
    return str(first["run_id"]), str(others["run_id"].iloc[0])


def load_test_expressions(cfg: Any, year: str, names: Sequence[str] | None = None) -> list[Any]:
    """The test expressions of `year` a run was scored on (its `data.*` config), optionally only `names`.

    The data is found as the run found it (`data.path`, else `$HMER_DATA`, else the
    default place), with the run's `test_limit` subset, so the names match its
    predictions CSV.
    """
    from ..data import load_dataset

    exprs = load_dataset(cfg.data.path or None, cfg.data, splits=(str(year),))[str(year)]
    if names is None:
        return list(exprs)
    by_name = {e.name: e for e in exprs}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise LookupError(f"expression(s) {', '.join(missing)} not in the {year} test split of {cfg.data.path!r}")
    return [by_name[n] for n in names]
