"""The error analysis's tables as Markdown or aligned text: the breakdown by bucket, the most
frequent token edits, and two runs compared (see `hmer.reports.analysis` for the frames)."""

from __future__ import annotations

import pandas as pd

from .buckets import NO_STRUCTURE
from .markup import MISSING, bold, is_missing, layout, measure_label, measure_list, measures


def _pct(value: float) -> str:
    return MISSING if is_missing(value) else f"{float(value):.1f}"


def _row_name(axis: str, bucket: str) -> str:
    if axis == "all":
        return "all"
    return f"{'length' if axis == 'length' else 'has'} {bucket}" if bucket != NO_STRUCTURE else bucket


def format_breakdown(table: pd.DataFrame, fmt: str = "markdown") -> str:
    """One table per label: a row per bucket; per year n and every registered metric (ExpRate, ≤1, ≤2; percent)."""
    render = layout(fmt)
    blocks = []
    for label, part in table.groupby("label", sort=False):
        years = list(dict.fromkeys(part["year"]))
        runs = int(part["runs"].max())
        shown = [m for m in measures() if m in part.columns]
        head = ["bucket"] + [f"{y} {c}" for y in years for c in ("n", *(measure_label(m) for m in shown))]
        body = []
        for (axis, bucket), rows in part.groupby(["axis", "bucket"], sort=False):
            cells = [_row_name(axis, bucket)]
            for year in years:
                r = rows[rows["year"] == year]
                if r.empty:
                    cells += [MISSING] * (1 + len(shown))
                    continue
                r = r.iloc[0]
                cells += [str(int(r["n"]))] + [_pct(r[m]) for m in shown]
            body.append(cells)
        pooled = f" (pooled over {runs} runs)" if runs > 1 else ""
        title = f"**{label}**" if fmt == "markdown" else str(label)
        blocks.append(f"{title}: {measure_list(shown)} (%) by target length and structure{pooled}\n\n"
                      + render(head, body))
    blocks.append("Length buckets partition each year. Structure buckets overlap: an expression holding "
                  "\\frac and ^ counts under both, so those rows add up to more than the year's n.")
    return "\n\n".join(blocks) + "\n"


def format_confusions(top: pd.DataFrame, fmt: str = "markdown") -> str:
    """The most frequent substitutions, insertions and deletions of each label, with counts per year."""
    render = layout(fmt)
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
    render = layout(fmt)
    head = ["year", "bucket", "n", "A ExpRate", "B ExpRate", "Δ (B − A)", "only A", "only B", "both", "neither"]
    body = [[str(r["year"]), _row_name(r["axis"], r["bucket"]), str(int(r["n"])), _pct(r["a_exprate"]),
             _pct(r["b_exprate"]), MISSING if pd.isna(r["delta"]) else f"{r['delta']:+.1f}",
             str(r["only_a"]), str(r["only_b"]), str(r["both"]), str(r["neither"])] for _, r in table.iterrows()]
    strong = bold(fmt)
    intro = (f"A = {strong(label_a)}, B = {strong(label_b)}: ExpRate (%) on the expressions both were scored on; "
             "Δ in percentage points; only A / only B = expressions one read right and the other did not")
    return f"{intro}\n\n{render(head, body)}\n"
