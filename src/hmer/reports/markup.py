"""The one formatter of every report: numbers as strings, rows as Markdown or aligned text.

Not `DataFrame.to_markdown`: tabulate pads every cell, and the committed README tables are unpadded.
"""

from __future__ import annotations

from typing import Any, Callable

import pandas as pd

from ..evaluation.metrics import label as metric_label

MISSING = "–"  # shown for a number that does not exist (std of one seed, no test, no baseline)
FORMATS = ("text", "markdown")

Layout = Callable[[list[str], list[list[str]]], str]


def metric_list(names: list[str]) -> str:
    labels = [metric_label(m) for m in names]
    return f"{', '.join(labels[:-1])} and {labels[-1]}" if len(labels) > 1 else "".join(labels)


def is_missing(value: Any) -> bool:
    return value is None or pd.isna(value)


def number(value: Any, digits: int = 1) -> str:
    return MISSING if is_missing(value) else f"{float(value):.{digits}f}"


def mean_pm_std(mean: Any, std: Any) -> str:
    """"55.2 ± 0.4"; "55.2 ± –" for one seed; "–" without a mean."""
    if is_missing(mean):
        return MISSING
    return f"{float(mean):.1f} ± {number(std)}"


def difference(value: Any, low: Any = None, high: Any = None) -> str:
    """"+2.1 [+0.4, +3.9]", or "+2.1" without an interval."""
    if is_missing(value):
        return MISSING
    return f"{value:+.1f}" if is_missing(low) else f"{value:+.1f} [{low:+.1f}, {high:+.1f}]"


def p_value(value: Any) -> str:
    if is_missing(value):
        return MISSING
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def count(value: Any) -> str:
    return MISSING if is_missing(value) else str(int(value))


def parameter_count(value: Any) -> str:
    """A model's size: "6.38M", "150k" or the number itself."""
    if is_missing(value):
        return MISSING
    n = int(value)
    if n >= 1_000_000:
        return f"{n / 1e6:.2f}M"
    if n >= 1_000:
        return f"{n / 1e3:.0f}k"
    return str(n)


def markdown(head: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join([":---"] + ["---:"] * (len(head) - 1)) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in body]
    return "\n".join(lines)


def text(head: list[str], body: list[list[str]]) -> str:
    """Aligned text under a dashed rule, like `markdown`: the first column left, the others right."""
    widths = [max(len(str(r[i])) for r in [head, *body]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(head), "  ".join("-" * w for w in widths), *[line(r) for r in body]])


def layout(fmt: str) -> Layout:
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be 'text' or 'markdown', got {fmt!r}")
    return markdown if fmt == "markdown" else text


def bold(fmt: str) -> Callable[[str], str]:
    return (lambda s: f"**{s}**") if fmt == "markdown" else str
