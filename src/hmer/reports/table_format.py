"""`format_table`: a variant table (see `hmer.reports.tables`) as aligned text or Markdown.

    print(format_table(study_table("ablate_direction-smoke")))            # text
    Path("table.md").write_text(format_table(df, "markdown"))             # for a README

Blocks, in order: the scores; the differences against the baseline beside the training
cost; validation beside the test years and the papers' published figures beside ours (each
when there is any); then one paragraph of notes.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import pandas as pd

from .markup import (MISSING, Layout, bold, count, is_missing, layout, mean_pm_std, measure_label, measure_list,
                     measures,
                     number, p_value, parameter_count)
from ..evaluation.significance import DEFAULT_CONFIDENCE


def format_table(df: pd.DataFrame, fmt: str = "text") -> str:
    """The table as aligned text (`fmt="text"`) or GitHub Markdown (`fmt="markdown"`).

    Two tables: the scores (mean ± std over seeds, per year) and, against the baseline,
    the ExpRate difference with its confidence interval and p-values, beside the training
    cost; then notes (test set sizes, excluded runs, how the tests were made). A missing
    number (the std of one seed, a year a variant was not scored on) shows as "–".
    """
    render = layout(fmt)
    strong = bold(fmt)
    title = df.attrs.get("title") or "runs"
    years = _years_of(df)
    if df.empty:
        return f"{title}: no runs to tabulate" + _excluded_note(df)
    baseline = df.attrs.get("baseline")
    if baseline is None and "baseline" in df.columns and df["baseline"].any():
        baseline = str(df.index[df["baseline"].astype(bool)][0])

    def name(variant: Any, row: pd.Series) -> str:
        return f"{variant} (baseline)" if bool(row.get("baseline", False)) else str(variant)

    shown = _measures(df)
    head1 = ["variant", "seeds"] + [f"{y} {measure_label(m)}" for y in years for m in shown]
    body1 = [[name(v, r), str(int(r["seeds"]))]
             + [mean_pm_std(r.get(f"{y}_{m}_mean"), r.get(f"{y}_{m}_std")) for y in years for m in shown]
             for v, r in df.iterrows()]
    tested = measure_label(df.attrs.get("measure", "exprate"))
    # CPU time of the whole trial (training and final decoding), for the runs that record it
    cpu = _has_any(df, ["cpu_minutes"])
    head2 = ["variant"] + [c for y in years for c in (f"{y} Δ {tested}", f"{y} p")] + [
        "GPU min", "train min"] + (["CPU min"] if cpu else []) + ["img/s", "params"]
    body2 = [[name(v, r)]
             + [c for y in years for c in (_delta(r, y), _pair_p(r, y))]
             + [number(r.get("gpu_minutes")), number(r.get("train_minutes"))]
             + ([number(r.get("cpu_minutes"))] if cpu else [])
             + [number(r.get("images_per_second"), 0), parameter_count(r.get("num_params"))]
             for v, r in df.iterrows()]
    confidence = float(df.attrs.get("confidence", DEFAULT_CONFIDENCE))
    intro1 = f"{strong(title)}: {measure_list(shown)} edits (%) per test year, mean ± std over seeds"
    intro2 = (f"Against the baseline {strong(str(baseline))}: Δ {tested} in percentage points "
              f"[{confidence:.0%} CI, paired bootstrap over test expressions], p = paired bootstrap / exact "
              f"McNemar; training cost (means over seeds)")
    blocks = [intro1, render(head1, body1), intro2, render(head2, body2)]
    blocks += _validation_block(df, years, render, strong) + _published_block(df, years, render, strong)
    blocks.append(" ".join(_notes(df, years)))
    return "\n\n".join(blocks) + "\n"


def _years_of(df: pd.DataFrame) -> list[str]:
    years = df.attrs.get("years")
    if years:
        return [str(y) for y in years]
    return sorted({c.split("_", 1)[0] for c in map(str, df.columns) if c.endswith("_exprate_mean")})


def _delta(row: pd.Series, year: str) -> str:
    if bool(row.get("baseline", False)):
        return "baseline"
    d = row.get(f"{year}_delta")
    if is_missing(d):
        return MISSING
    low, high = row.get(f"{year}_delta_low"), row.get(f"{year}_delta_high")
    if is_missing(low):
        return f"{d:+.1f}"
    return f"{d:+.1f} [{low:+.1f}, {high:+.1f}]"


def _pair_p(row: pd.Series, year: str) -> str:
    if bool(row.get("baseline", False)):
        return MISSING
    boot, mcn = row.get(f"{year}_p_bootstrap"), row.get(f"{year}_p_mcnemar")
    if is_missing(boot) and is_missing(mcn):
        return MISSING
    return f"{p_value(boot)} / {p_value(mcn)}"


def _notes(df: pd.DataFrame, years: Sequence[str]) -> list[str]:
    """Test set sizes, the runs left out, and how the tests were made."""
    notes = []
    sizes = ", ".join(f"{y}: {int(df[f'{y}_n'].max())}" for y in years
                      if f"{y}_n" in df.columns and df[f"{y}_n"].notna().any())
    if sizes:
        notes.append(f"Test expressions per year: {sizes}.")
    excluded = _excluded_note(df).strip()
    if excluded:
        notes.append(excluded)
    baseline = df.attrs.get("baseline")
    if baseline in df.index and "seeds" in df.columns and df.loc[baseline, "seeds"] == 0:
        notes.append(f"The baseline {baseline} has no finished run yet: nothing is measured against it.")
    elif not df.attrs.get("tested", True):
        notes.append("No predictions artifacts: differences come from the metrics, without tests.")
    elif "seeds" in df.columns and df["seeds"].max() > 1:
        notes.append("Several seeds: the bootstrap averages correctness over seeds per expression; McNemar "
                     "shows the largest p over seed-matched pairs.")
    return notes


def _excluded_note(df: pd.DataFrame) -> str:
    excluded = df.attrs.get("excluded") or {}
    total = sum(excluded.values())
    if not total:
        return ""
    parts = ", ".join(f"{n} {state}" for state, n in sorted(excluded.items()))
    return f" Runs without test scores, left out: {total} ({parts})."


def _measures(df: pd.DataFrame) -> list[str]:
    """The registered metrics the table has values for (a table read back from CSV may predate one, and
    runs scored before a metric was registered have no value for it: `lgeval_*` until re-scored)."""
    return [m for m in measures() if _has_any(df, [str(c) for c in df.columns if str(c).endswith(f"_{m}_mean")])]


def _has_any(df: pd.DataFrame, columns: Sequence[str]) -> bool:
    return any(c in df.columns and df[c].notna().any() for c in columns)


def _validation_block(df: pd.DataFrame, years: Sequence[str], render: Layout,
                      strong: Callable[[str], str]) -> list[str]:
    """Validation beside the test years, when any run has validation scores."""
    if not _has_any(df, ["val_exprate_mean", "best_val_exprate_mean"]):
        return []
    shown = _measures(df)
    restyled = _has_any(df, ["val_alt_exprate_mean"])
    head = (["variant", "val n"] + [f"val {measure_label(m)}" for m in shown]
            + (["val-alt ExpRate"] if restyled else []) + ["val ExpRate (selection)"]
            + [f"{y} ExpRate" for y in years])
    body = [[str(v), count(r.get("val_n"))]
            + [mean_pm_std(r.get(f"val_{m}_mean"), r.get(f"val_{m}_std")) for m in shown]
            + ([mean_pm_std(r.get("val_alt_exprate_mean"), r.get("val_alt_exprate_std"))] if restyled else [])
            + [mean_pm_std(r.get("best_val_exprate_mean"), r.get("best_val_exprate_std"))]
            + [mean_pm_std(r.get(f"{y}_exprate_mean"), r.get(f"{y}_exprate_std")) for y in years]
            for v, r in df.iterrows()]
    intro = (f"{strong('Validation beside the test years')}: the validation split decoded as the test years are "
             f"(val {', '.join(measure_label(m) for m in shown)}), "
             + ("the same writers drawn in the other rendering style (val-alt, `data.val_alt`), " if restyled else "")
             + "and as it was when it picked the checkpoint (selection); mean ± std over seeds")
    blocks = [intro, render(head, body)]
    ranks = _rank_agreement(df, years)
    if ranks:
        blocks.append("Spearman rank correlation of validation and test ExpRate over the variants: " + ranks + ".")
    return blocks


def _rank_agreement(df: pd.DataFrame, years: Sequence[str]) -> str:
    """How well validation orders the variants as each test year does (three variants or more)."""
    parts = []
    for y in years:
        col = f"{y}_exprate_mean"
        if col not in df.columns or "val_exprate_mean" not in df.columns:
            continue
        pair = df[["val_exprate_mean", col]].dropna()
        if len(pair) >= 3 and pair.nunique().min() > 1:
            parts.append(f"{y} {pair['val_exprate_mean'].corr(pair[col], method='spearman'):+.2f}")
    return ", ".join(parts)


def _published_block(df: pd.DataFrame, years: Sequence[str], render: Layout,
                     strong: Callable[[str], str]) -> list[str]:
    """The papers' published ExpRate beside ours, for the variants that train a paper's model."""
    if "paper" not in df.columns or not (df["paper"].fillna("") != "").any():
        return []
    head = ["variant", "paper"] + [c for y in years for c in (f"{y} measured", f"{y} published", f"{y} Δ")]
    body = []
    for v, r in df[df["paper"].fillna("") != ""].iterrows():
        cells = [str(v), str(r["paper"])]
        for y in years:
            mean, pub = r.get(f"{y}_exprate_mean"), r.get(f"{y}_published")
            delta = MISSING if is_missing(mean) or is_missing(pub) else f"{mean - pub:+.1f}"
            cells += [mean_pm_std(mean, r.get(f"{y}_exprate_std")), number(pub, 2), delta]
        body.append(cells)
    intro = (f"{strong('Published beside measured')}: ExpRate (%) measured here (mean ± std over seeds) and as "
             "published by the paper whose model the variant trains; Δ = measured − published "
             "(sources: `hmer report --published`)")
    return [intro, render(head, body)]
