"""Error analysis of the predictions a run logs: where a model fails, and where one run beats another.

    rows = run_expressions(run_id)                  # one row per test expression, every year
    table = breakdown(rows)                         # ExpRate, <=1, <=2 by target length and structure
    edits = confusions(rows)                        # token substitutions, insertions, deletions
    print(format_breakdown(table), format_confusions(top_confusions(edits)))
    both = compare_runs(rows_a, rows_b)             # per bucket: A, B, B - A, only A / only B right

The input is each run's `predictions/test_<year>.csv` (name, truth, prediction, distance),
which every training run logs. `hmer analyze RUN [RUN_B]` prints these tables and with
`--out DIR` writes them (Markdown, CSV) with a plot; `hmer report --analysis` adds them
per variant to a report.

**Buckets.** Target length is the number of tokens of the truth: 1-10, 11-20, 21-40, >40;
these partition a year's expressions. The structure buckets are *not* a partition: an
expression is in `\\frac` when its truth holds a `\\frac` token, in `^ or _` when it holds
`^` or `_`, in `\\sqrt` when it holds `\\sqrt`, and in "none of these" when it holds none
of them. `x ^ { \\frac { 1 } { 2 } }` counts under both `\\frac` and `^ or _`, so the
structure rows add up to at least the year's size; "none of these" plus the expressions
in at least one structure bucket add up to exactly the year's size.

**Alignment.** `align` is a Levenshtein dynamic programme over tokens with a backtrace;
its edit count is the distance `editdistance` gives. Where several alignments are equally
short the backtrace, walking from the ends of both sequences, prefers the diagonal (a
match or a substitution), then a deletion (a truth token the prediction lacks), then an
insertion (a predicted token the truth lacks): the same pair always gives the same edits.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np
import pandas as pd

from .runs import NoRunsError, PredictionsNotFound, client_for, load_predictions, load_runs, resolve_tracking_uri
from .tables import MEASURE_LABELS, MISSING, MEASURES, _markdown, _text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LENGTH_BUCKETS: tuple[tuple[str, int], ...] = (("1-10", 10), ("11-20", 20), ("21-40", 40), (">40", math.inf))
STRUCTURE_TOKENS: tuple[tuple[str, frozenset[str]], ...] = (
    ("\\frac", frozenset({"\\frac"})),
    ("^ or _", frozenset({"^", "_"})),
    ("\\sqrt", frozenset({"\\sqrt"})),
)
NO_STRUCTURE = "none of these"
ALL = "all"
AXES = ("all", "length", "structure")
EDIT_KINDS = ("substitution", "insertion", "deletion")
DEFAULT_TOP = 10
_PREDICTIONS_FILE = re.compile(r"^test_(?P<year>[^/]+)\.csv$")


class AnalysisError(ValueError):
    """A run cannot be analysed (no predictions artifacts); printed by `hmer` as one line, exit 2."""


# ---- the alignment ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Edit:
    """One step of an alignment: `kind` is match, substitution, insertion or deletion.

    `truth` is None for an insertion, `prediction` None for a deletion.
    """

    kind: str
    truth: str | None
    prediction: str | None


def align(truth: Sequence[str], prediction: Sequence[str]) -> list[Edit]:
    """The edits that turn `truth` into `prediction`, in reading order (see the module docstring
    for the tie-breaking). The number of edits other than matches is the Levenshtein distance."""
    n, m = len(truth), len(prediction)
    # cost[i][j]: fewest edits turning truth[:i] into prediction[:j]
    cost = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n + 1):
        cost[i][0] = i
    for j in range(m + 1):
        cost[0][j] = j
    for i in range(1, n + 1):
        row, above, t = cost[i], cost[i - 1], truth[i - 1]
        for j in range(1, m + 1):
            row[j] = min(above[j - 1] + (t != prediction[j - 1]), above[j] + 1, row[j - 1] + 1)
    edits: list[Edit] = []
    i, j = n, m
    while i > 0 or j > 0:
        if i > 0 and j > 0:
            same = truth[i - 1] == prediction[j - 1]
            if cost[i][j] == cost[i - 1][j - 1] + (not same):
                edits.append(Edit("match" if same else "substitution", truth[i - 1], prediction[j - 1]))
                i, j = i - 1, j - 1
                continue
        if i > 0 and cost[i][j] == cost[i - 1][j] + 1:
            edits.append(Edit("deletion", truth[i - 1], None))
            i -= 1
        else:
            edits.append(Edit("insertion", None, prediction[j - 1]))
            j -= 1
    edits.reverse()
    return edits


def edit_count(edits: Iterable[Edit]) -> int:
    """The distance an alignment stands for: its edits other than matches."""
    return sum(e.kind != "match" for e in edits)


# ---- expressions and buckets ------------------------------------------------------------------

def length_bucket(n_tokens: int) -> str:
    """The target-length bucket of a truth of `n_tokens` tokens (an empty truth counts as 1-10)."""
    for label, upper in LENGTH_BUCKETS:
        if n_tokens <= upper:
            return label
    raise AssertionError("unreachable: the last bucket has no upper bound")


def structures(tokens: Iterable[str]) -> list[str]:
    """The structure buckets of a truth: any of \\frac, "^ or _", \\sqrt, else ["none of these"]."""
    present = set(tokens)
    found = [label for label, marks in STRUCTURE_TOKENS if present & marks]
    return found or [NO_STRUCTURE]


def expressions(predictions: pd.DataFrame, year: str, label: str, run_id: str = "") -> pd.DataFrame:
    """One row per predicted expression: label, run_id, year, name, truth and prediction
    (token lists), length, length_bucket, structures, distance, correct.

    `predictions` is a `load_predictions` frame (or any frame with name, truth, prediction and
    optionally distance). A missing distance is computed from the alignment.
    """
    truth = [str(t).split() for t in predictions["truth"]]
    pred = [str(p).split() for p in predictions["prediction"]]
    if "distance" in predictions.columns:
        distance = pd.to_numeric(predictions["distance"], errors="coerce").to_numpy(dtype=float)
    else:
        distance = np.full(len(truth), np.nan)
    distance = [int(d) if not np.isnan(d) else edit_count(align(t, p)) for d, t, p in zip(distance, truth, pred)]
    return pd.DataFrame({
        "label": label, "run_id": run_id, "year": str(year), "name": predictions["name"].astype(str).to_numpy(),
        "truth": truth, "prediction": pred, "length": [len(t) for t in truth],
        "length_bucket": [length_bucket(len(t)) for t in truth], "structures": [structures(t) for t in truth],
        "distance": distance, "correct": [d == 0 for d in distance],
    })


def prediction_years(run_id: str, tracking_uri: str | None = None) -> list[str]:
    """The years of the run's `predictions/test_<year>.csv` artifacts, sorted."""
    client = client_for(tracking_uri)
    try:
        files = client.list_artifacts(run_id, "predictions")
    except Exception:  # noqa: BLE001 - an artifact store without that folder: no years
        return []
    years = [m.group("year") for f in files if (m := _PREDICTIONS_FILE.match(Path(f.path).name))]
    return sorted(years)


def run_expressions(run_id: str, tracking_uri: str | None = None, label: str | None = None,
                    years: Sequence[str] | None = None) -> pd.DataFrame:
    """`expressions` for every test year the run logged predictions for (or only `years`).

    Raises `AnalysisError` when the run has none of them.
    """
    years = list(years) if years is not None else prediction_years(run_id, tracking_uri)
    frames = []
    for year in years:
        try:
            frames.append(expressions(load_predictions(run_id, year, tracking_uri), year, label or run_id, run_id))
        except PredictionsNotFound:
            continue
    if not frames:
        raise AnalysisError(f"run {run_id} has no predictions/test_<year>.csv artifacts to analyse "
                            "(it failed, was pruned, or has not finished)")
    return pd.concat(frames, ignore_index=True)


# ---- the breakdown -----------------------------------------------------------------------------

def _rates(group: pd.DataFrame) -> dict[str, float]:
    distance = group["distance"].to_numpy()
    if len(distance) == 0:
        return {m: math.nan for m in MEASURES}
    return {"exprate": 100.0 * float(np.mean(distance == 0)), "le1": 100.0 * float(np.mean(distance <= 1)),
            "le2": 100.0 * float(np.mean(distance <= 2))}


def breakdown(rows: pd.DataFrame) -> pd.DataFrame:
    """ExpRate, <=1 and <=2 (percent) per label and year, over all expressions and per bucket.

    Columns: label, year, axis ("all", "length" or "structure"), bucket, n (test
    expressions in the bucket), runs (runs pooled: seeds of a variant), exprate, le1, le2.
    Every bucket appears, with n = 0 and empty rates when no expression falls in it. Rates
    pool the runs of a label: with the same test set for each, that is the mean over runs.
    """
    out = []
    exploded = rows.explode("structures")
    for (label, year), group in rows.groupby(["label", "year"], sort=False):
        runs = group["run_id"].nunique()
        base = {"label": label, "year": year, "runs": runs}
        out.append({**base, "axis": "all", "bucket": ALL, "n": group["name"].nunique(), **_rates(group)})
        for bucket, _ in LENGTH_BUCKETS:
            part = group[group["length_bucket"] == bucket]
            out.append({**base, "axis": "length", "bucket": bucket, "n": part["name"].nunique(), **_rates(part)})
        flat = exploded[(exploded["label"] == label) & (exploded["year"] == year)]
        for bucket in [s for s, _ in STRUCTURE_TOKENS] + [NO_STRUCTURE]:
            part = flat[flat["structures"] == bucket]
            out.append({**base, "axis": "structure", "bucket": bucket, "n": part["name"].nunique(), **_rates(part)})
    return pd.DataFrame(out, columns=["label", "year", "axis", "bucket", "n", "runs", *MEASURES])


def confusions(rows: pd.DataFrame) -> pd.DataFrame:
    """Every edit of every wrong expression, counted: label, year, kind, truth, prediction, count.

    `kind` is substitution (truth -> prediction), insertion (prediction only) or deletion
    (truth only); the missing side is the empty string. Sorted by count, most frequent first.
    """
    counts: dict[tuple[str, str, str, str, str], int] = {}
    wrong = rows[rows["distance"] > 0]
    for label, year, truth, pred in zip(wrong["label"], wrong["year"], wrong["truth"], wrong["prediction"]):
        for edit in align(truth, pred):
            if edit.kind != "match":
                key = (label, year, edit.kind, edit.truth or "", edit.prediction or "")
                counts[key] = counts.get(key, 0) + 1
    df = pd.DataFrame([(*k, v) for k, v in counts.items()],
                      columns=["label", "year", "kind", "truth", "prediction", "count"])
    return df.sort_values(["label", "kind", "count", "year", "truth", "prediction"],
                          ascending=[True, True, False, True, True, True], kind="stable").reset_index(drop=True)


def top_confusions(edits: pd.DataFrame, top: int = DEFAULT_TOP) -> pd.DataFrame:
    """The `top` most frequent edits of each label and kind over all years, with a count per year.

    Columns: label, kind, truth, prediction, count (all years), then one column per year.
    Ties are broken by the tokens, so the list is reproducible.
    """
    if edits.empty:
        return pd.DataFrame(columns=["label", "kind", "truth", "prediction", "count"])
    wide = edits.pivot_table(index=["label", "kind", "truth", "prediction"], columns="year", values="count",
                             aggfunc="sum", fill_value=0)
    wide.columns = [str(c) for c in wide.columns]
    wide.insert(0, "count", wide.sum(axis=1))
    wide = wide.reset_index()
    kind_order = {k: i for i, k in enumerate(EDIT_KINDS)}
    wide["_kind"] = wide["kind"].map(kind_order)
    wide = wide.sort_values(["label", "_kind", "count", "truth", "prediction"],
                            ascending=[True, True, False, True, True], kind="stable")
    wide = wide.groupby(["label", "kind"], sort=False).head(top).drop(columns="_kind")
    return wide.reset_index(drop=True)


# ---- two runs --------------------------------------------------------------------------------------

def compare_runs(rows_a: pd.DataFrame, rows_b: pd.DataFrame) -> pd.DataFrame:
    """Where run B beats run A, per year and bucket, on the expressions both were scored on.

    Columns: year, axis, bucket, n (shared expressions), a_exprate, b_exprate, delta
    (B - A, percentage points), both, only_a, only_b, neither (expressions read right by
    both, only A, only B, neither), and a_le1, b_le1, a_le2, b_le2. Each side must be one
    run (one row per expression and year).
    """
    for side, rows in (("A", rows_a), ("B", rows_b)):
        if rows.duplicated(["year", "name"]).any():
            raise ValueError(f"compare_runs: side {side} has several rows per expression; give one run per side")
    keep = ["year", "name", "length_bucket", "structures", "distance"]
    pair = rows_a[keep].merge(rows_b[["year", "name", "distance"]], on=["year", "name"], suffixes=("_a", "_b"))
    out = []
    years = [y for y in dict.fromkeys(rows_a["year"]) if y in set(pair["year"])]
    for year in years:
        group = pair[pair["year"] == year]
        exploded = group.explode("structures")
        parts = [("all", ALL, group)]
        parts += [("length", b, group[group["length_bucket"] == b]) for b, _ in LENGTH_BUCKETS]
        parts += [("structure", b, exploded[exploded["structures"] == b])
                  for b in [s for s, _ in STRUCTURE_TOKENS] + [NO_STRUCTURE]]
        for axis, bucket, part in parts:
            a_ok, b_ok = part["distance_a"].to_numpy() == 0, part["distance_b"].to_numpy() == 0
            n = len(part)

            def pct(mask: np.ndarray) -> float:
                return 100.0 * float(mask.mean()) if n else math.nan

            out.append({
                "year": year, "axis": axis, "bucket": bucket, "n": n,
                "a_exprate": pct(a_ok), "b_exprate": pct(b_ok), "delta": pct(b_ok) - pct(a_ok),
                "both": int((a_ok & b_ok).sum()), "only_a": int((a_ok & ~b_ok).sum()),
                "only_b": int((~a_ok & b_ok).sum()), "neither": int((~a_ok & ~b_ok).sum()),
                "a_le1": pct(part["distance_a"].to_numpy() <= 1), "b_le1": pct(part["distance_b"].to_numpy() <= 1),
                "a_le2": pct(part["distance_a"].to_numpy() <= 2), "b_le2": pct(part["distance_b"].to_numpy() <= 2),
            })
    return pd.DataFrame(out, columns=["year", "axis", "bucket", "n", "a_exprate", "b_exprate", "delta", "both",
                                      "only_a", "only_b", "neither", "a_le1", "b_le1", "a_le2", "b_le2"])


# ---- formatting ----------------------------------------------------------------------------------

def _pct(value: float) -> str:
    return MISSING if value is None or pd.isna(value) else f"{float(value):.1f}"


def _row_name(axis: str, bucket: str) -> str:
    if axis == "all":
        return "all"
    return f"{'length' if axis == 'length' else 'has'} {bucket}" if bucket != NO_STRUCTURE else bucket


def _render(fmt: str):
    if fmt not in ("text", "markdown"):
        raise ValueError(f"fmt must be 'text' or 'markdown', got {fmt!r}")
    return _markdown if fmt == "markdown" else _text


def format_breakdown(table: pd.DataFrame, fmt: str = "markdown") -> str:
    """One table per label: a row per bucket; per year n, ExpRate, ≤1, ≤2 (percent)."""
    render = _render(fmt)
    blocks = []
    for label, part in table.groupby("label", sort=False):
        years = list(dict.fromkeys(part["year"]))
        runs = int(part["runs"].max())
        head = ["bucket"] + [f"{y} {c}" for y in years for c in ("n", *(MEASURE_LABELS[m] for m in MEASURES))]
        body = []
        for (axis, bucket), rows in part.groupby(["axis", "bucket"], sort=False):
            cells = [_row_name(axis, bucket)]
            for year in years:
                r = rows[rows["year"] == year]
                if r.empty:
                    cells += [MISSING] * 4
                    continue
                r = r.iloc[0]
                cells += [str(int(r["n"]))] + [_pct(r[m]) for m in MEASURES]
            body.append(cells)
        pooled = f" (pooled over {runs} runs)" if runs > 1 else ""
        title = f"**{label}**" if fmt == "markdown" else str(label)
        blocks.append(f"{title}: ExpRate, ≤1 and ≤2 (%) by target length and structure{pooled}\n\n"
                      + render(head, body))
    blocks.append("Length buckets partition each year. Structure buckets overlap: an expression holding "
                  "\\frac and ^ counts under both, so those rows add up to more than the year's n.")
    return "\n\n".join(blocks) + "\n"


def format_confusions(top: pd.DataFrame, fmt: str = "markdown") -> str:
    """The most frequent substitutions, insertions and deletions of each label, with counts per year."""
    render = _render(fmt)
    if top.empty:
        return "No token edits: every expression was read right.\n"
    years = [c for c in top.columns if c not in ("label", "kind", "truth", "prediction", "count")]
    blocks = []
    for label, part in top.groupby("label", sort=False):
        head = ["edit", "truth", "prediction", "count", *years]
        body = [[r["kind"], r["truth"] or MISSING, r["prediction"] or MISSING, str(int(r["count"])),
                 *[str(int(r[y])) for y in years]] for _, r in part.iterrows()]
        title = f"**{label}**" if fmt == "markdown" else str(label)
        blocks.append(f"{title}: the most frequent token edits (alignment of truth to prediction)\n\n"
                      + render(head, body))
    return "\n\n".join(blocks) + "\n"


def format_comparison(table: pd.DataFrame, label_a: str, label_b: str, fmt: str = "markdown") -> str:
    """Per year and bucket: A's and B's ExpRate, B − A, and the expressions only one read right."""
    render = _render(fmt)
    head = ["year", "bucket", "n", "A ExpRate", "B ExpRate", "Δ (B − A)", "only A", "only B", "both", "neither"]
    body = [[str(r["year"]), _row_name(r["axis"], r["bucket"]), str(int(r["n"])), _pct(r["a_exprate"]),
             _pct(r["b_exprate"]), MISSING if pd.isna(r["delta"]) else f"{r['delta']:+.1f}",
             str(r["only_a"]), str(r["only_b"]), str(r["both"]), str(r["neither"])] for _, r in table.iterrows()]
    bold = (lambda s: f"**{s}**") if fmt == "markdown" else (lambda s: s)
    intro = (f"A = {bold(label_a)}, B = {bold(label_b)}: ExpRate (%) on the expressions both were scored on; "
             "Δ in percentage points; only A / only B = expressions one read right and the other did not")
    return f"{intro}\n\n{render(head, body)}\n"


# ---- plot ---------------------------------------------------------------------------------------

def plot_breakdown(table: pd.DataFrame, title: str | None = None) -> "Figure":
    """ExpRate by bucket: a row of panels per axis (length, structure), a column per year,
    a bar per label (run or variant)."""
    import seaborn as sns
    from matplotlib.figure import Figure

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
        order = [b for b, _ in LENGTH_BUCKETS] if axis == "length" else \
            [s for s, _ in STRUCTURE_TOKENS] + [NO_STRUCTURE]
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


# ---- writing --------------------------------------------------------------------------------------

@dataclass
class Analysis:
    """The tables of one analysis: a breakdown, the top edits, and for two runs their comparison."""

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
        """The table `--format csv` prints: the comparison of two runs, else the breakdown."""
        table = self.comparison if self.comparison is not None else self.breakdown
        return table.to_csv(index=False, float_format="%.4f")

    def write(self, out_dir: str | Path, title: str) -> list[Path]:
        """analysis.md, breakdown.csv, confusions.csv, (comparison.csv) and analysis.png into `out_dir`."""
        from .plots import save_figure

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        written = [save_figure(plot_breakdown(self.breakdown, title), out / "analysis.png")]
        (out / "analysis.md").write_text(f"# Error analysis: {title}\n\n{self.markdown()}\n"
                                         "![ExpRate by target length and structure](analysis.png)\n")
        self.breakdown.to_csv(out / "breakdown.csv", index=False)
        self.confusions.to_csv(out / "confusions.csv", index=False)
        written += [out / "analysis.md", out / "breakdown.csv", out / "confusions.csv"]
        if self.comparison is not None:
            self.comparison.to_csv(out / "comparison.csv", index=False)
            written.append(out / "comparison.csv")
        return written


def analyse(rows: pd.DataFrame, rows_b: pd.DataFrame | None = None, top: int = DEFAULT_TOP) -> Analysis:
    """The analysis of `rows` (any labels), and with `rows_b` (one run each) their comparison."""
    both = rows if rows_b is None else pd.concat([rows, rows_b], ignore_index=True)
    edits = confusions(both)
    labels = tuple(dict.fromkeys(both["label"]))
    comparison = compare_runs(rows, rows_b) if rows_b is not None else None
    return Analysis(breakdown(both), edits, top_confusions(edits, top), comparison, labels)


def run_label(run: pd.Series) -> str:
    """How a run is named in the tables: its variant and the first 8 characters of its id."""
    return f"{run['variant']} ({str(run['run_id'])[:8]})"


def analyze_command(run_ids: Sequence[str], tracking_uri: str | None = None, fmt: str = "markdown",
                    out_dir: str | Path | None = None, top: int = DEFAULT_TOP) -> int:
    """`hmer analyze RUN [RUN_B]`: the tables on stdout (`fmt` markdown or csv), and with
    `out_dir` every table and the plot as files. An unknown run or one without predictions
    raises a ValueError (`hmer` prints it as one line and exits 2)."""
    if fmt not in ("markdown", "csv"):
        raise ValueError(f"--format must be markdown or csv, got {fmt!r}")
    if not 1 <= len(run_ids) <= 2:
        raise ValueError(f"give one run to analyse or two to compare, not {len(run_ids)}")
    if len(run_ids) == 2 and run_ids[0] == run_ids[1]:
        raise ValueError("the two runs to compare are the same run")
    uri = resolve_tracking_uri(tracking_uri)
    runs = load_runs(uri, run_ids=list(run_ids), include_parents=True)
    if runs.empty:
        raise NoRunsError(f"no run {', '.join(run_ids)} in the MLflow store {uri}")
    labels = [run_label(runs.iloc[i]) for i in range(len(runs))]
    sides = [run_expressions(run_id, uri, label) for run_id, label in zip(run_ids, labels)]
    result = analyse(sides[0], sides[1] if len(sides) == 2 else None, top=top)
    print(result.main_csv() if fmt == "csv" else result.markdown("markdown"), end="")
    if out_dir is not None:
        written = result.write(out_dir, " vs ".join(labels))
        print(f"wrote {len(written)} files to {out_dir}", file=sys.stderr)
    return 0


def variant_analysis(runs: pd.DataFrame, tracking_uri: str | None = None,
                     order: Sequence[str] | None = None, top: int = DEFAULT_TOP) -> Analysis | None:
    """The analysis per variant of a report's runs, seeds pooled; None when no run has predictions."""
    from .tables import scored

    good = runs[scored(runs)] if not runs.empty else runs
    frames = []
    variants = list(order) if order is not None else list(dict.fromkeys(good["variant"]))
    for variant in variants:
        for run_id in good.loc[good["variant"] == variant, "run_id"]:
            try:
                frames.append(run_expressions(run_id, tracking_uri, str(variant)))
            except AnalysisError:
                continue
    if not frames:
        return None
    return analyse(pd.concat(frames, ignore_index=True), top=top)
