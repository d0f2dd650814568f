"""Error analysis of the predictions a run logs: where a model fails, and where one run beats another.

The input is each run's `predictions/test_<year>.csv`; `hmer analyze RUN [RUN_B]` and `hmer report
--analysis` print these tables (docs/reports.md, "Error analysis"). Expressions are bucketed by target
length (truth tokens: 1-10, 11-20, 21-40, >40), which partitions a year, and by structure (`\\frac`,
`^ or _`, `\\sqrt`: the truth holds that token; "none of these"), which does not:
`x ^ { \\frac { 1 } { 2 } }` is under both `\\frac` and `^ or _`.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..evaluation.metrics import EDIT_KINDS, align, edit_count
from ..registry import METRICS
from .markup import MISSING, bold, difference, layout, metric_label, metric_list, number
from ..tracking.store import mlflow_client
from .runs import PredictionsNotFound, load_predictions

LENGTH_BUCKETS: tuple[tuple[str, float], ...] = (("1-10", 10), ("11-20", 20), ("21-40", 40), (">40", math.inf))
STRUCTURE_TOKENS: tuple[tuple[str, frozenset[str]], ...] = (
    ("\\frac", frozenset({"\\frac"})),
    ("^ or _", frozenset({"^", "_"})),
    ("\\sqrt", frozenset({"\\sqrt"})),
)
NO_STRUCTURE = "none of these"
ALL = "all"  # the bucket of every expression (axis "all")
LENGTH_LABELS = [label for label, _ in LENGTH_BUCKETS]
STRUCTURE_LABELS = [label for label, _ in STRUCTURE_TOKENS] + [NO_STRUCTURE]
DEFAULT_TOP = 10
_PREDICTIONS_FILE = re.compile(r"^test_(?P<year>[^/]+)\.csv$")


class AnalysisError(ValueError):
    """A run has no predictions artifacts; `hmer` prints it as one line, exit 2."""


# ---- expressions ------------------------------------------------------------------------------

def length_bucket(n_tokens: int) -> str:
    """The target-length bucket of `n_tokens` (an empty truth is 1-10)."""
    return next(label for label, upper in LENGTH_BUCKETS if n_tokens <= upper)  # the last has no bound


def structures(tokens: Iterable[str]) -> list[str]:
    present = set(tokens)
    found = [label for label, marks in STRUCTURE_TOKENS if present & marks]
    return found or [NO_STRUCTURE]


def expressions(predictions: pd.DataFrame, year: str, label: str, run_id: str = "") -> pd.DataFrame:
    """One row per expression of a `load_predictions` frame, truth and prediction as token lists."""
    truth = [str(t).split() for t in predictions["truth"]]
    pred = [str(p).split() for p in predictions["prediction"]]
    distance = pd.to_numeric(predictions.reindex(columns=["distance"])["distance"], errors="coerce").to_numpy(float)
    distance = [int(d) if not np.isnan(d) else edit_count(align(t, p)) for d, t, p in zip(distance, truth, pred)]
    return pd.DataFrame({
        "label": label, "run_id": run_id, "year": str(year), "name": predictions["name"].astype(str).to_numpy(),
        "truth": truth, "prediction": pred, "length": [len(t) for t in truth],
        "length_bucket": [length_bucket(len(t)) for t in truth], "structures": [structures(t) for t in truth],
        "distance": distance, "correct": [d == 0 for d in distance],
    })


def prediction_years(run_id: str, tracking_uri: str | None = None) -> list[str]:
    from ..tracking.portable import list_run_artifacts

    try:  # (a committed store's runs are listed from any working directory, the notebooks' too)
        names = list_run_artifacts(mlflow_client(tracking_uri), run_id, "predictions")
    except Exception:  # noqa: BLE001 - an artifact store without that folder: no years
        return []
    return sorted(m.group("year") for name in names if (m := _PREDICTIONS_FILE.match(name)))


def run_expressions(run_id: str, tracking_uri: str | None = None, label: str | None = None) -> pd.DataFrame:
    """`expressions` of every test year the run has predictions for."""
    frames = []
    for year in prediction_years(run_id, tracking_uri):
        try:
            frames.append(expressions(load_predictions(run_id, year, tracking_uri), year, label or run_id, run_id))
        except PredictionsNotFound:
            continue
    if not frames:
        raise AnalysisError(f"run {run_id} has no predictions/test_<year>.csv artifacts to analyze "
                            "(it failed, was pruned, or has not finished)")
    return pd.concat(frames, ignore_index=True)


# ---- the breakdown -----------------------------------------------------------------------------

def token_metrics() -> tuple[str, ...]:
    """The registered metrics on the token edit distance (not lgeval's, which judge the tokens)."""
    return tuple(m for m in METRICS.names() if getattr(METRICS.get(m), "judge", None) is None)


def _rates(group: pd.DataFrame) -> dict[str, float]:
    distance = group["distance"].to_numpy(float)
    if len(distance) == 0:
        return {m: math.nan for m in token_metrics()}
    return {m: 100.0 * float(np.mean(METRICS.get(m).read_right(distance))) for m in token_metrics()}


def breakdown(rows: pd.DataFrame) -> pd.DataFrame:
    """Every token metric (%) per label, year and bucket (n = 0 when empty), pooling a label's runs."""
    out = []
    for (label, year), group in rows.groupby(["label", "year"], sort=False):
        base = {"label": label, "year": year, "runs": group["run_id"].nunique()}
        out += [{**base, "axis": axis, "bucket": bucket, "n": part["name"].nunique(), **_rates(part)}
                for axis, bucket, part in _buckets(group)]
    return pd.DataFrame(out, columns=["label", "year", "axis", "bucket", "n", "runs", *token_metrics()])


def _buckets(group: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    exploded = group.explode("structures")
    return ([("all", ALL, group)] + [("length", b, group[group["length_bucket"] == b]) for b in LENGTH_LABELS]
            + [("structure", b, exploded[exploded["structures"] == b]) for b in STRUCTURE_LABELS])


def confusions(rows: pd.DataFrame) -> pd.DataFrame:
    """Every edit of every wrong expression, counted, most frequent first."""
    wrong = rows[rows["distance"] > 0]
    counts = Counter((label, year, edit.kind, edit.truth or "", edit.prediction or "")
                     for label, year, truth, pred in zip(wrong["label"], wrong["year"], wrong["truth"],
                                                         wrong["prediction"])
                     for edit in align(truth, pred) if edit.kind != "match")
    df = pd.DataFrame([(*k, v) for k, v in counts.items()],
                      columns=["label", "year", "kind", "truth", "prediction", "count"])
    return df.sort_values(["label", "kind", "count", "year", "truth", "prediction"],
                          ascending=[True, True, False, True, True, True], kind="stable").reset_index(drop=True)


def top_confusions(edits: pd.DataFrame, top: int = DEFAULT_TOP) -> pd.DataFrame:
    """The `top` edits of each label and kind over all years, a column per year; ties by the tokens."""
    if edits.empty:
        return pd.DataFrame(columns=["label", "kind", "truth", "prediction", "count"])
    wide = edits.pivot_table(index=["label", "kind", "truth", "prediction"], columns="year", values="count",
                             aggfunc="sum", fill_value=0)
    wide.columns = [str(c) for c in wide.columns]
    wide.insert(0, "count", wide.sum(axis=1))
    kind_order = {k: i for i, k in enumerate(EDIT_KINDS)}
    wide = wide.reset_index().sort_values(["label", "kind", "count", "truth", "prediction"],
                                          ascending=[True, True, False, True, True], kind="stable",
                                          key=lambda col: col.map(kind_order) if col.name == "kind" else col)
    return wide.groupby(["label", "kind"], sort=False).head(top).reset_index(drop=True)


# ---- two runs --------------------------------------------------------------------------------------

def compare_runs(rows_a: pd.DataFrame, rows_b: pd.DataFrame) -> pd.DataFrame:
    """Per year and bucket, on the expressions both scored: ExpRate of A, B and B - A, the counts read
    right by both / only A / only B / neither, and the other token metrics. One run a side."""
    others = [m for m in token_metrics() if m != "exprate"]

    def pct(mask: np.ndarray) -> float:
        return 100.0 * float(mask.mean()) if mask.size else math.nan

    for side, rows in (("A", rows_a), ("B", rows_b)):
        if rows.duplicated(["year", "name"]).any():
            raise ValueError(f"compare_runs: side {side} has several rows per expression; give one run per side")
    keep = ["year", "name", "length_bucket", "structures", "distance"]
    pair = rows_a[keep].merge(rows_b[["year", "name", "distance"]], on=["year", "name"], suffixes=("_a", "_b"))
    out = []
    years = [y for y in dict.fromkeys(rows_a["year"]) if y in set(pair["year"])]
    for year in years:
        for axis, bucket, part in _buckets(pair[pair["year"] == year]):
            distance_a, distance_b = part["distance_a"].to_numpy(float), part["distance_b"].to_numpy(float)
            a_ok, b_ok = METRICS.get("exprate").read_right(distance_a), METRICS.get("exprate").read_right(distance_b)
            out.append({
                "year": year, "axis": axis, "bucket": bucket, "n": len(part),
                "a_exprate": pct(a_ok), "b_exprate": pct(b_ok), "delta": pct(b_ok) - pct(a_ok),
                "both": int((a_ok & b_ok).sum()), "only_a": int((a_ok & ~b_ok).sum()),
                "only_b": int((~a_ok & b_ok).sum()), "neither": int((~a_ok & ~b_ok).sum()),
                **{f"{side}_{m}": pct(METRICS.get(m).read_right(distance))
                   for m in others for side, distance in (("a", distance_a), ("b", distance_b))},
            })
    return pd.DataFrame(out, columns=["year", "axis", "bucket", "n", "a_exprate", "b_exprate", "delta", "both",
                                      "only_a", "only_b", "neither",
                                      *(f"{side}_{m}" for m in others for side in ("a", "b"))])


# ---- writing --------------------------------------------------------------------------------------

@dataclass
class Analysis:
    """The tables of one analysis; `comparison` for two runs."""

    breakdown: pd.DataFrame
    confusions: pd.DataFrame
    top: pd.DataFrame
    comparison: pd.DataFrame | None = None
    labels: tuple[str, ...] = ()

    def markdown(self, fmt: str = "markdown") -> str:
        parts = []
        if self.comparison is not None:
            parts.append(format_comparison(self.comparison, self.labels[0], self.labels[1], fmt))
        parts += [format_breakdown(self.breakdown, fmt), format_confusions(self.top, fmt)]
        return "\n".join(parts)

    def main_csv(self) -> str:
        """What `--format csv` prints: the comparison, else the breakdown."""
        table = self.comparison if self.comparison is not None else self.breakdown
        return table.to_csv(index=False, float_format="%.4f")

    def write(self, out_dir: str | Path, title: str) -> list[Path]:
        from ..atomic import save_figure

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        written = [save_figure(plot_breakdown(self.breakdown, title), out / "analysis.png"), out / "analysis.md"]
        written[-1].write_text(f"# Error analysis: {title}\n\n{self.markdown()}\n"
                               "![ExpRate by target length and structure](analysis.png)\n")
        tables = {"breakdown": self.breakdown, "confusions": self.confusions, "comparison": self.comparison}
        for name, table in tables.items():
            if table is not None:
                table.to_csv(out / f"{name}.csv", index=False)
                written.append(out / f"{name}.csv")
        return written


def analyze(rows: pd.DataFrame, rows_b: pd.DataFrame | None = None, top: int = DEFAULT_TOP) -> Analysis:
    both = rows if rows_b is None else pd.concat([rows, rows_b], ignore_index=True)
    edits = confusions(both)
    labels = tuple(dict.fromkeys(both["label"]))
    comparison = compare_runs(rows, rows_b) if rows_b is not None else None
    return Analysis(breakdown(both), edits, top_confusions(edits, top), comparison, labels)


def run_label(run: pd.Series) -> str:
    return f"{run['variant']} ({str(run['run_id'])[:8]})"


def variant_analysis(runs: pd.DataFrame, tracking_uri: str | None = None,
                     order: Sequence[str] | None = None) -> Analysis | None:
    """The analysis per variant, seeds pooled; None when no run has predictions."""
    from .tables import scored

    good = runs[scored(runs)]
    frames = []
    variants = list(order) if order is not None else list(dict.fromkeys(good["variant"]))
    for variant in variants:
        for run_id in good.loc[good["variant"] == variant, "run_id"]:
            try:
                frames.append(run_expressions(run_id, tracking_uri, str(variant)))
            except AnalysisError:
                continue
    return analyze(pd.concat(frames, ignore_index=True)) if frames else None


def _row_name(axis: str, bucket: str) -> str:
    if axis == "all":
        return "all"
    return f"{'length' if axis == 'length' else 'has'} {bucket}" if bucket != NO_STRUCTURE else bucket


def plot_breakdown(table: pd.DataFrame, title: str | None = None) -> Figure:
    """ExpRate of a `breakdown` frame: a row per axis, a column per year, a bar per label."""
    import seaborn as sns

    data = table[table["axis"].isin(["length", "structure"])].copy()
    if data.empty:
        raise ValueError("nothing to plot: the breakdown is empty")
    years = list(dict.fromkeys(data["year"]))
    axes_names = ["length", "structure"]
    labels = list(dict.fromkeys(data["label"]))
    fig = Figure(figsize=(4.2 * len(years), 6.4), layout="constrained")
    grid = fig.subplots(len(axes_names), len(years), squeeze=False, sharey=True)
    palette = dict(zip(labels, sns.color_palette("colorblind", len(labels))))
    for r, axis in enumerate(axes_names):
        order = LENGTH_LABELS if axis == "length" else STRUCTURE_LABELS
        for c, year in enumerate(years):
            ax = grid[r][c]
            part = data[(data["axis"] == axis) & (data["year"] == year)]
            sns.barplot(part, x="bucket", y="exprate", hue="label", order=order, hue_order=labels,
                        palette=palette, ax=ax, legend=(r == 0 and c == len(years) - 1))
            ax.set_title(f"{year}: by {'target length' if axis == 'length' else 'structure'}", fontsize=10)
            ax.set_xlabel("tokens" if axis == "length" else "")
            ax.set_ylabel("ExpRate (%)" if c == 0 else "")
            ax.set_ylim(0, 100)
            ax.tick_params(axis="x", labelsize=8)
    if title:
        fig.suptitle(title)
    return fig


def format_breakdown(table: pd.DataFrame, fmt: str = "markdown") -> str:
    """A table per label: a row per bucket; per year n and every registered metric."""
    render = layout(fmt)
    blocks = []
    for label, part in table.groupby("label", sort=False):
        years = list(dict.fromkeys(part["year"]))
        runs = int(part["runs"].max())
        shown = [m for m in METRICS.names() if m in part.columns]
        head = ["bucket"] + [f"{y} {c}" for y in years for c in ("n", *(metric_label(m) for m in shown))]
        body = []
        for (axis, bucket), rows in part.groupby(["axis", "bucket"], sort=False):
            cells = [_row_name(axis, bucket)]
            for year in years:
                r = rows[rows["year"] == year]
                if r.empty:
                    cells += [MISSING] * (1 + len(shown))
                    continue
                r = r.iloc[0]
                cells += [str(int(r["n"]))] + [number(r[m]) for m in shown]
            body.append(cells)
        pooled = f" (pooled over {runs} runs)" if runs > 1 else ""
        blocks.append(f"{bold(fmt)(str(label))}: {metric_list(shown)} (%) by target length and structure{pooled}\n\n"
                      + render(head, body))
    blocks.append("Length buckets partition each year. Structure buckets overlap: an expression holding "
                  "\\frac and ^ counts under both, so those rows add up to more than the year's n.")
    return "\n\n".join(blocks) + "\n"


def format_confusions(top: pd.DataFrame, fmt: str = "markdown") -> str:
    render = layout(fmt)
    if top.empty:
        return "No token edits: every expression was read right.\n"
    years = [c for c in top.columns if c not in ("label", "kind", "truth", "prediction", "count")]
    blocks = []
    for label, part in top.groupby("label", sort=False):
        head = ["edit", "truth", "prediction", "count", *years]
        body = [[r["kind"], r["truth"] or MISSING, r["prediction"] or MISSING, str(int(r["count"])),
                 *[str(int(r[y])) for y in years]] for _, r in part.iterrows()]
        blocks.append(f"{bold(fmt)(str(label))}: the most frequent token edits (alignment of truth to prediction)\n\n"
                      + render(head, body))
    return "\n\n".join(blocks) + "\n"


def format_comparison(table: pd.DataFrame, label_a: str, label_b: str, fmt: str = "markdown") -> str:
    render = layout(fmt)
    head = ["year", "bucket", "n", "A ExpRate", "B ExpRate", "Δ (B − A)", "only A", "only B", "both", "neither"]
    body = [[str(r["year"]), _row_name(r["axis"], r["bucket"]), str(int(r["n"])), number(r["a_exprate"]),
             number(r["b_exprate"]), difference(r["delta"]),
             str(r["only_a"]), str(r["only_b"]), str(r["both"]), str(r["neither"])] for _, r in table.iterrows()]
    strong = bold(fmt)
    intro = (f"A = {strong(label_a)}, B = {strong(label_b)}: ExpRate (%) on the expressions both were scored on; "
             "Δ in percentage points; only A / only B = expressions one read right and the other did not")
    return f"{intro}\n\n{render(head, body)}\n"
