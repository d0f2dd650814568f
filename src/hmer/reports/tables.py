"""The tables a paper prints: one row per variant, ExpRate / <=1 / <=2 per CROHME year.

`variant_table(runs)` builds the frame from any `load_runs` frame; its columns: docs/reports.md ("Columns
of `table.csv`"). `attrs` carry the title, baseline, years, excluded counts and test settings for
`format_table`.
"""

from __future__ import annotations

import itertools
import json
import math
from functools import partial
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from ..tracking import keys
from ..evaluation.significance import DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES, compare
from ..registry import METRICS
from .markup import (MISSING, Layout, bold, count, difference, is_missing, layout, mean_pm_std, metric_label,
                     metric_list, number, p_value, parameter_count)
from .published import paper_of, published_exprate
from .runs import CorrectnessCache, PredictionLoader, load_predictions, load_runs, scored_years, study_parent

EXCLUDED_STATES = ("failed", "pruned")
SEED_KEY = "train.seed"  # the seed axis of a study grid (hmer.studies.spec.SEED_KEY)
BASELINE_TAG = f"tags.{keys.BASELINE}"
CELL_TAG = f"tags.{keys.CELL}"


# ---- which runs count ----------------------------------------------------------------------------

def scored(runs: pd.DataFrame, years: Sequence[str] | None = None) -> pd.Series:
    """True for the runs scored on a test year, and not failed or pruned."""
    columns = [f"metrics.test_{year}_exprate" for year in (scored_years(runs) if years is None else years)]
    has_scores = runs.reindex(columns=columns).notna().any(axis=1)
    state = runs["state"] if "state" in runs.columns else pd.Series("", index=runs.index)
    return has_scores & ~state.isin(EXCLUDED_STATES)


def variant_order(runs: pd.DataFrame, baseline: str | None = None, preferred: Sequence[str] | None = None) -> list[str]:
    """The variants, the baseline first, then `preferred` (e.g. grid order), then as they first ran."""
    firsts = (runs.assign(_trial=pd.to_numeric(runs.get("trial", np.nan), errors="coerce"),
                          _start=runs.get("start_time", pd.NaT))
              .groupby("variant", sort=False).agg(trial=("_trial", "min"), start=("_start", "min")))
    order = list(firsts.sort_values(["trial", "start"], na_position="last", kind="stable").index)
    if preferred:
        order = [v for v in preferred if v in order] + [v for v in order if v not in set(preferred)]
    if baseline in order:
        order.remove(baseline)
        order.insert(0, baseline)
    return order


def resolve_baseline(runs: pd.DataFrame, baseline: str | Mapping[str, Any] | None = None) -> str | None:
    """The baseline's label, from a variant label ("l2r"), an `hmer.cell` tag ("model.direction=l2r"),
    axis values (a mapping or JSON: the parent run's `baseline` param), or None: the runs tagged
    `hmer.baseline=true`, else the first variant that ran."""
    variants = list(runs["variant"].dropna().unique())
    if not variants:
        return None
    if baseline is None:
        if BASELINE_TAG in runs.columns:
            tagged = runs.loc[runs[BASELINE_TAG].astype(str).str.lower() == "true", "variant"]
            if not tagged.empty:
                return str(tagged.iloc[0])
        return variant_order(runs)[0]
    candidates = _baseline_candidates(baseline)
    for candidate in candidates:
        if candidate in variants:
            return candidate
    if CELL_TAG in runs.columns:
        for candidate in candidates:
            hit = runs.loc[runs[CELL_TAG] == candidate, "variant"]
            if not hit.empty:
                return str(hit.iloc[0])
    raise ValueError(f"baseline {baseline!r} is none of the variants {', '.join(map(str, variants))}")


def _baseline_candidates(baseline: str | Mapping[str, Any]) -> list[str]:
    """Labels a baseline may go by: itself, or for axis values the cell and variant labels."""
    if isinstance(baseline, str):
        try:
            parsed = json.loads(baseline)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, (dict, str)):
            baseline = parsed
    if not isinstance(baseline, Mapping):
        return [str(baseline)]
    return [",".join(f"{k}={v}" for k, v in baseline.items()), "/".join(str(v) for v in baseline.values())]


# ---- the table ------------------------------------------------------------------------------------

def variant_table(runs: pd.DataFrame, baseline: str | Mapping[str, Any] | None = None, *,
                  years: Sequence[str] | None = None, predictions: PredictionLoader | None = None,
                  metric: str = "exprate", order: Sequence[str] | None = None, n_resamples: int = DEFAULT_RESAMPLES,
                  title: str = "") -> pd.DataFrame:
    """One row per variant of a `load_runs` frame (columns: docs/reports.md). Without
    `predictions` (a bound `load_predictions`) the differences come from the metrics, untested;
    `metric` is what they and the tests are on (`le1` / `le2` tell apart models that read few
    formulas exactly); `order` the rows after the baseline."""
    years = [str(y) for y in years] if years is not None else scored_years(runs)
    counts = scored(runs, years)
    good, bad = runs[counts], runs[~counts]
    # A named baseline is looked up among all runs: unscored yet (a study in progress), it stays
    # the baseline, with no seeds, and nothing is measured against another.
    base = resolve_baseline(runs if baseline is not None or good.empty else good, baseline) if not runs.empty else None
    correctness = CorrectnessCache(predictions, metric)
    rows = []
    for variant in variant_order(runs, base, order) if not runs.empty else []:
        mine, base_runs = good[good["variant"] == variant], good[good["variant"] == base]
        row: dict[str, Any] = {"variant": variant, "baseline": variant == base, "seeds": len(mine),
                               "excluded": int((bad["variant"] == variant).sum())}
        for year in years:
            row.update(_year_cells(year, mine, base_runs, variant == base, correctness, metric, n_resamples))
        row.update(_cost_cells(mine))
        row.update(_validation_cells(mine))
        paper = paper_of(mine)
        figures = published_exprate(paper) if paper else {}
        row.update({"paper": paper or "", **{f"{y}_published": figures.get(str(y), math.nan) for y in years}})
        rows.append(row)
    df = pd.DataFrame(rows, columns=_columns(years)).set_index("variant")
    excluded = bad["state"].value_counts() if "state" in bad.columns else pd.Series(dtype=int)
    df.attrs.update({"title": title, "baseline": base, "years": list(years), "metric": metric,
                     "excluded": {str(k): int(v) for k, v in excluded.items()}, "n_resamples": n_resamples,
                     "tested": correctness.used})
    return df


def _columns(years: Sequence[str]) -> list[str]:
    cols = ["variant", "baseline", "seeds", "excluded"]
    for year in years:
        cols.append(f"{year}_n")
        for m in METRICS.names():
            cols += [f"{year}_{m}_mean", f"{year}_{m}_std"]
        cols += [f"{year}_{test}" for test in _TEST_CELLS]
    cols += ["gpu_minutes", "train_minutes", "cpu_minutes", "images_per_second", "num_params", "val_n"]
    cols += [f"val_{m}_{s}" for m in METRICS.names() for s in ("mean", "std")]
    cols += ["val_alt_exprate_mean", "val_alt_exprate_std", "best_val_exprate_mean", "best_val_exprate_std", "paper"]
    return cols + [f"{y}_published" for y in years]


def _mean_std(values: pd.Series) -> tuple[float, float]:
    values = pd.to_numeric(values, errors="coerce").dropna()
    if values.empty:
        return math.nan, math.nan
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else math.nan


def _metric(runs: pd.DataFrame, name: str) -> pd.Series:
    return runs.get(f"metrics.{name}", pd.Series(dtype=float))


# the differences and paired tests per year, columns `Y_<cell>` (docs/reports.md)
_TEST_CELLS = ("delta", "delta_low", "delta_high", "p_bootstrap", "p_mcnemar", "p_mcnemar_pairs", "mcnemar_favours",
               "p_sign_flip", "sign_flip_favours")


def _score_cells(mine: pd.DataFrame, name: str, logged: str) -> dict[str, Any]:
    """`{name}_n` and `{name}_<metric>_mean` / `_std` from the metrics `{logged}_n` and `{logged}_<metric>`."""
    n = pd.to_numeric(_metric(mine, f"{logged}_n"), errors="coerce").dropna()
    cells: dict[str, Any] = {f"{name}_n": int(n.max()) if not n.empty else math.nan}
    for m in METRICS.names():
        cells[f"{name}_{m}_mean"], cells[f"{name}_{m}_std"] = _mean_std(_metric(mine, f"{logged}_{m}"))
    return cells


def _year_cells(year: str, mine: pd.DataFrame, base_runs: pd.DataFrame, is_base: bool,
                correctness: CorrectnessCache, metric: str, n_resamples: int) -> dict[str, Any]:
    cells = _score_cells(mine, year, f"test_{year}")
    mean, _ = _mean_std(_metric(mine, f"test_{year}_{metric}"))
    base_mean, _ = _mean_std(_metric(base_runs, f"test_{year}_{metric}"))
    delta: dict[str, Any] = {k: math.nan for k in _TEST_CELLS}
    delta["delta"] = mean - base_mean
    if is_base:
        delta = {k: (0.0 if k.startswith("delta") and not math.isnan(mean) else math.nan) for k in delta}
    elif not math.isnan(delta["delta"]):
        matrices = correctness.aligned(base_runs, mine, year)
        if matrices is not None:
            (b, b_seeds), (v, v_seeds) = matrices
            result = compare(b, v, baseline_seeds=b_seeds, variant_seeds=v_seeds, n_resamples=n_resamples)
            delta = {"delta": result.difference, "delta_low": result.low, "delta_high": result.high,
                     "p_bootstrap": result.p_bootstrap, "p_mcnemar": result.p_mcnemar,
                     "p_mcnemar_pairs": tuple(t.p_value for t in result.mcnemar),
                     "mcnemar_favours": tuple(t.favours for t in result.mcnemar),
                     "p_sign_flip": result.sign_flip.p_value, "sign_flip_favours": result.sign_flip.favours}
    cells.update({f"{year}_{k}": v for k, v in delta.items()})
    return cells


def _cost_cells(mine: pd.DataFrame) -> dict[str, Any]:
    params = pd.to_numeric(_metric(mine, "num_params"), errors="coerce").dropna()
    if params.empty and "params.num_params" in mine.columns:
        params = pd.to_numeric(mine["params.num_params"], errors="coerce").dropna()
    return {
        "gpu_minutes": _mean_std(_metric(mine, "gpu_minutes"))[0],
        "train_minutes": _mean_std(_metric(mine, "train_seconds") / 60.0)[0],
        "cpu_minutes": _mean_std(_metric(mine, "cpu_seconds") / 60.0)[0],  # training and final decoding
        "images_per_second": _mean_std(_metric(mine, "train_images_per_second"))[0],
        "num_params": int(params.iloc[0]) if not params.empty else math.nan,
    }


def _validation_cells(mine: pd.DataFrame) -> dict[str, Any]:
    """Validation as the test years decode it (`val_final_*`) and as it picked the checkpoint
    (`best_val_exprate`; a run that never validated logs 0 and no curve: missing, not 0)."""
    cells = _score_cells(mine, "val", "val_final")
    # the same writers in the other rendering style (`data.val_alt`, issue 26)
    cells["val_alt_exprate_mean"], cells["val_alt_exprate_std"] = _mean_std(_metric(mine, "val-alt_final_exprate"))
    best = _metric(mine, "best_val_exprate").where(_metric(mine, "val_exprate").notna())
    cells["best_val_exprate_mean"], cells["best_val_exprate_std"] = _mean_std(best)
    return cells


def study_table(study_name: str, tracking_uri: str | None = None, *, runs: pd.DataFrame | None = None,
                metric: str = "exprate", n_resamples: int = DEFAULT_RESAMPLES) -> pd.DataFrame:
    """A study's `variant_table`; the baseline is the parent run's param, else `resolve_baseline`'s. No
    runs give an empty table, so a study script can always end with it."""
    runs = load_runs(tracking_uri, study=study_name) if runs is None else runs
    parent = study_parent(study_name, tracking_uri)
    baseline = parent.get("params.baseline") if parent is not None else None
    if not isinstance(baseline, str):
        baseline = None
    elif not runs.empty:
        try:
            resolve_baseline(runs, baseline)
        except ValueError:
            baseline = None  # the parent names a cell no run has (e.g. all failed): fall back
    return variant_table(runs, baseline, predictions=partial(load_predictions, tracking_uri=tracking_uri),
                         metric=metric, order=grid_order(parent), n_resamples=n_resamples, title=study_name)


def grid_order(parent: pd.Series | None) -> list[str]:
    """A grid study's variant labels in grid order (its parent's `grid` param, seed axis left out,
    values joined with "/" as `hmer.variant`); empty for a sweep or no grid."""
    raw = parent.get("params.grid") if parent is not None else None
    try:
        grid = json.loads(raw) if isinstance(raw, str) else None
    except json.JSONDecodeError:
        return []
    if not isinstance(grid, dict):
        return []
    axes = [values for key, values in grid.items() if key != SEED_KEY and isinstance(values, list)]
    return ["/".join(str(v) for v in cell) for cell in itertools.product(*axes)] if axes else []


def scores_long(runs: pd.DataFrame, years: Sequence[str] | None = None,
                metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per (scored run, year, metric), the tidy form seaborn plots; `metrics` default: all."""
    metrics = tuple(metrics) if metrics is not None else METRICS.names()
    years = list(years) if years is not None else scored_years(runs)
    good = runs[scored(runs, years)]
    rows = []
    for _, run in good.iterrows():
        for year in years:
            for m in metrics:
                value = run.get(f"metrics.test_{year}_{m}")
                if value is not None and not pd.isna(value):
                    rows.append({"variant": run["variant"], "seed": run.get("seed"), "run_id": run["run_id"],
                                 "year": year, "metric": m, "label": metric_label(m), "value": float(value)})
    return pd.DataFrame(rows, columns=["variant", "seed", "run_id", "year", "metric", "label", "value"])


def format_table(df: pd.DataFrame, fmt: str = "text") -> str:
    """The table as text or Markdown: the scores, the differences beside the cost, then notes."""
    render = layout(fmt)
    strong = bold(fmt)
    title = df.attrs.get("title") or "runs"
    years = ([str(y) for y in df.attrs["years"]] if df.attrs.get("years") else  # else from the columns
             sorted({c.split("_", 1)[0] for c in map(str, df.columns) if c.endswith("_exprate_mean")}))
    if df.empty:
        return f"{title}: no runs to tabulate" + _excluded_note(df)
    baseline = df.attrs.get("baseline")
    if baseline is None and "baseline" in df.columns and df["baseline"].any():
        baseline = str(df.index[df["baseline"].astype(bool)][0])

    def name(variant: Any, row: pd.Series) -> str:
        return f"{variant} (baseline)" if bool(row.get("baseline", False)) else str(variant)

    shown = _metrics(df)
    head1 = ["variant", "seeds"] + [f"{y} {metric_label(m)}" for y in years for m in shown]
    body1 = [[name(v, r), str(int(r["seeds"]))]
             + [mean_pm_std(r.get(f"{y}_{m}_mean"), r.get(f"{y}_{m}_std")) for y in years for m in shown]
             for v, r in df.iterrows()]
    tested = metric_label(df.attrs.get("metric", "exprate"))
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
    intro1 = f"{strong(title)}: {metric_list(shown)} edits (%) per test year, mean ± std over seeds"
    intro2 = (f"Against the baseline {strong(str(baseline))}: Δ {tested} in percentage points "
              f"[{DEFAULT_CONFIDENCE:.0%} CI, paired bootstrap over test expressions], p = paired bootstrap / exact "
              f"McNemar; training cost (means over seeds)")
    blocks = [intro1, render(head1, body1), intro2, render(head2, body2)]
    blocks += _validation_block(df, years, render, strong) + _published_block(df, years, render, strong)
    blocks.append(" ".join(_notes(df, years)))
    return "\n\n".join(blocks) + "\n"


def _delta(row: pd.Series, year: str) -> str:
    if bool(row.get("baseline", False)):
        return "baseline"
    return difference(row.get(f"{year}_delta"), row.get(f"{year}_delta_low"), row.get(f"{year}_delta_high"))


def _pair_p(row: pd.Series, year: str) -> str:
    if bool(row.get("baseline", False)):
        return MISSING
    boot, mcn = row.get(f"{year}_p_bootstrap"), row.get(f"{year}_p_mcnemar")
    if is_missing(boot) and is_missing(mcn):
        return MISSING
    return f"{p_value(boot)} / {p_value(mcn)}"


def _notes(df: pd.DataFrame, years: Sequence[str]) -> list[str]:
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


def _metrics(df: pd.DataFrame) -> list[str]:
    """The registered metrics with values (a CSV, or runs, may predate one: `lgeval_*` until re-scored)."""
    return [m for m in METRICS.names() if _has_any(df, [str(c) for c in df.columns if str(c).endswith(f"_{m}_mean")])]


def _has_any(df: pd.DataFrame, columns: Sequence[str]) -> bool:
    return any(c in df.columns and df[c].notna().any() for c in columns)


def _validation_block(df: pd.DataFrame, years: Sequence[str], render: Layout,
                      strong: Callable[[str], str]) -> list[str]:
    if not _has_any(df, ["val_exprate_mean", "best_val_exprate_mean"]):
        return []
    shown = _metrics(df)
    restyled = _has_any(df, ["val_alt_exprate_mean"])
    head = (["variant", "val n"] + [f"val {metric_label(m)}" for m in shown]
            + (["val-alt ExpRate"] if restyled else []) + ["val ExpRate (selection)"]
            + [f"{y} ExpRate" for y in years])
    body = [[str(v), count(r.get("val_n"))]
            + [mean_pm_std(r.get(f"val_{m}_mean"), r.get(f"val_{m}_std")) for m in shown]
            + ([mean_pm_std(r.get("val_alt_exprate_mean"), r.get("val_alt_exprate_std"))] if restyled else [])
            + [mean_pm_std(r.get("best_val_exprate_mean"), r.get("best_val_exprate_std"))]
            + [mean_pm_std(r.get(f"{y}_exprate_mean"), r.get(f"{y}_exprate_std")) for y in years]
            for v, r in df.iterrows()]
    intro = (f"{strong('Validation beside the test years')}: the validation split decoded as the test years are "
             f"(val {', '.join(metric_label(m) for m in shown)}), "
             + ("the same writers drawn in the other rendering style (val-alt, `data.val_alt`), " if restyled else "")
             + "and as it was when it picked the checkpoint (selection); mean ± std over seeds")
    ranks = []  # Spearman of validation against each test year over the variants (three or more)
    for y in years:
        col = f"{y}_exprate_mean"
        if col not in df.columns or "val_exprate_mean" not in df.columns:
            continue
        pair = df[["val_exprate_mean", col]].dropna()
        if len(pair) >= 3 and pair.nunique().min() > 1:
            ranks.append(f"{y} {pair['val_exprate_mean'].corr(pair[col], method='spearman'):+.2f}")
    blocks = [intro, render(head, body)]
    if ranks:
        blocks.append("Spearman rank correlation of validation and test ExpRate over the variants: "
                      + ", ".join(ranks) + ".")
    return blocks


def _published_block(df: pd.DataFrame, years: Sequence[str], render: Layout,
                     strong: Callable[[str], str]) -> list[str]:
    if "paper" not in df.columns or not (df["paper"].fillna("") != "").any():
        return []
    head = ["variant", "paper"] + [c for y in years for c in (f"{y} measured", f"{y} published", f"{y} Δ")]
    body = []
    for v, r in df[df["paper"].fillna("") != ""].iterrows():
        cells = [str(v), str(r["paper"])]
        for y in years:
            mean, pub = r.get(f"{y}_exprate_mean"), r.get(f"{y}_published")
            cells += [mean_pm_std(mean, r.get(f"{y}_exprate_std")), number(pub, 2), difference(mean - pub)]
        body.append(cells)
    intro = (f"{strong('Published beside measured')}: ExpRate (%) measured here (mean ± std over seeds) and as "
             "published by the paper whose model the variant trains; Δ = measured − published "
             "(sources: `hmer report --published`)")
    return [intro, render(head, body)]
