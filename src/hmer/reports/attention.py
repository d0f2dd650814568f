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
from ..tracking import keys
from ..tracking.artifacts import KINDS, token_maps

__all__ = ["KINDS", "AttentionResult", "attend", "compare_models", "coverage_variants", "decode_tokens",
           "load_test_expressions", "model_label", "pick_expressions", "study_variants", "token_maps",
           "tokens_from_predictions"]


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
    from ..device import autocast_dtype
    from ..evaluation.evaluate import decode_options, predict

    device = torch.device(device)
    preds, _ = predict(model, [Expression(name="", tokens=[], image=image)], vocab,
                       **decode_options(cfg, device, autocast_dtype(cfg.train.precision, device), beam=beam_size))
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


def pick_expressions(*predictions: pd.DataFrame, k: int = 3) -> list[str]:
    """Up to `k` expression names worth looking at, from several runs' predictions on one test year.

    First those some models read and others do not, where a wrong one has too many or too few
    tokens (over- or under-parsing), then any other disagreement, then expressions every model
    misread, then the rest; shorter expressions first within each group (their maps are
    readable). Names present in every frame only.
    """
    if not predictions:
        raise ValueError("give the predictions of at least one run")
    merged = predictions[0][["name", "truth"]]
    for i, frame in enumerate(predictions):
        merged = merged.merge(frame[["name", "prediction", "distance"]].rename(
            columns={"prediction": f"prediction_{i}", "distance": f"distance_{i}"}), on="name")
    if merged.empty:
        return []
    truth_len = merged["truth"].str.split().str.len().to_numpy()
    right = np.stack([merged[f"distance_{i}"].eq(0).fillna(False).astype(bool).to_numpy()
                      for i in range(len(predictions))], axis=1)
    lengths = np.stack([merged[f"prediction_{i}"].fillna("").str.split().str.len().to_numpy()
                        for i in range(len(predictions))], axis=1)
    disagree = right.any(axis=1) & ~right.all(axis=1)
    misparsed = (~right & (lengths != truth_len[:, None])).any(axis=1)  # a wrong reading of the wrong length
    rank = np.select([disagree & misparsed, disagree, ~right.any(axis=1)], [0, 1, 2], default=3)
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
    # the image positional encoding is named where it is not the 2-D sinusoids most presets use
    position = "" if m.image_pos.startswith("sin2d") else f", image positions {m.image_pos}"
    return (f"{name}{m.decoder} d {m.d_model}, {coverage}{position}, {m.direction}"
            + (f" ({run_id[:8]})" if run_id else ""))


def study_variants(runs: pd.DataFrame) -> list[str]:
    """Run ids to compare attention across the variants of one study (its `load_runs` frame): one
    finished, scored run per variant, of the seed most variants share (the lowest on a tie), else
    each variant's most recent; the baseline variant first (`hmer.baseline` where its
    runs carry the tag), then the others in the order their first runs started."""
    from .tables import scored

    done = runs[scored(runs)] if not runs.empty else runs
    if "state" in done.columns:
        done = done[done["state"] == "finished"]
    if done.empty or "variant" not in done.columns:
        raise ValueError("no finished run of a study variant with test scores to take attention maps from")
    done = done.sort_values("start_time")
    seeds = done["seed"] if "seed" in done.columns else pd.Series(pd.NA, index=done.index)
    variants_of_seed = {seed: set(done.loc[seeds.eq(seed).fillna(False), "variant"])
                        for seed in seeds.dropna().unique()}
    seed = min(variants_of_seed, key=lambda s: (-len(variants_of_seed[s]), s)) if variants_of_seed else None
    order = list(dict.fromkeys(done["variant"]))
    marked = done.get(f"tags.{keys.BASELINE}", pd.Series("", index=done.index)).fillna("") == "true"
    if marked.any():
        baseline = done.loc[marked, "variant"].iloc[0]
        order.remove(baseline)
        order.insert(0, baseline)
    chosen = []
    for variant in order:
        group = done[done["variant"] == variant]
        of_seed = group[seeds[group.index].eq(seed).fillna(False)]
        chosen.append(str((of_seed if not of_seed.empty else group)["run_id"].iloc[-1]))
    return chosen


# The order in which coverage variants are shown: none first, then CoMER's refinements from the
# simplest, then WAP's coverage attention (the GRU decoder) and any other decoder.
_COVERAGE_ORDER = ("none", "self", "cross", "fusion")


def coverage_variants(runs: pd.DataFrame) -> list[str]:
    """Run ids to compare attention across coverage: one finished, scored run per kind of
    coverage (none, self, cross, fusion; the GRU's WAP coverage; any other decoder), in that order.

    The runs are of one seed where the kinds share one (the seed most of them have, the lowest on
    a tie), else each kind's most recent. With a single kind, the two most recent finished runs of
    different variants (or simply the two most recent) stand in, so a figure still compares two models.
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
    # The GRU's coverage attention is its decoder's own, whatever model.coverage says.
    kind = pd.Series(np.where(decoder == "transformer", coverage, decoder), index=done.index)
    if kind.nunique() == 1:
        first = done.iloc[0]
        others = done[done["variant"] != first["variant"]] if "variant" in done.columns else done.iloc[1:]
        if others.empty:
            others = done.iloc[1:]
        if others.empty:
            raise ValueError("need two finished runs to compare attention maps")
        return [str(first["run_id"]), str(others["run_id"].iloc[0])]
    seeds = done["seed"] if "seed" in done.columns else pd.Series(pd.NA, index=done.index)
    kinds_of_seed = {seed: set(kind[seeds.eq(seed).fillna(False)]) for seed in seeds.dropna().unique()}
    seed = min(kinds_of_seed, key=lambda s: (-len(kinds_of_seed[s]), s)) if kinds_of_seed else None

    def order(k: str) -> tuple[int, str]:
        return (_COVERAGE_ORDER.index(k) if k in _COVERAGE_ORDER else len(_COVERAGE_ORDER), k)

    chosen = []
    for k in sorted(set(kind), key=order):
        group = done[kind == k]
        of_seed = group[seeds[group.index].eq(seed).fillna(False)]
        chosen.append(str((of_seed if not of_seed.empty else group)["run_id"].iloc[0]))
    return chosen


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
