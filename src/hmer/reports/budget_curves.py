"""The same cells trained at two budgets: does a claim's gap grow, shrink or hold as training
lengthens, and did the longer runs stop learning?

`budget_history` reads the runs; `format_budgets` prints `budget_summary` and `gap_summary`, as `hmer
report --claims` does. A claim's cells are those of its comparisons that its LAST budget's study trains
(two each). Both rules (`PLATEAU_EPOCHS`, `PLATEAU_POINTS`, `GAP_POINTS`) read means, not single epochs:
docs/reports.md, "The same cells at two budgets".
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .markup import layout, number
from .paper_claims import CLAIMS, DEFAULT_BUDGETS, Claim
from ..atomic import save_figure
from .plots import variant_colors
from .runs import curve_runs, load_history, load_runs, scored_years

SMOOTH_EPOCHS = 5
PLATEAU_EPOCHS = 20
PLATEAU_POINTS = 1.0
GAP_POINTS = 1.0
_LINES = ("--", "-", ":", "-.")  # one line style per budget, in the order given


def _claim(claim: Claim | str) -> Claim:
    if isinstance(claim, Claim):
        return claim
    found = [c for c in CLAIMS if c.name == claim]
    if not found:
        raise ValueError(f"no claim {claim!r}; the claims: {', '.join(c.name for c in CLAIMS)}")
    return found[0]


def claim_cells(claim: Claim, variants: Sequence[str]) -> tuple[str, str] | None:
    """The claim's first comparison with both sides in `variants`, else (the long studies train the
    baseline first) the first with either."""
    both = [pair for pair in claim.comparisons if pair[0] in variants and pair[1] in variants]
    either = [pair for pair in claim.comparisons if pair[0] in variants or pair[1] in variants]
    return next(iter(both or either), None)


def budget_history(claims: Sequence[Claim | str] = ("direction", "coverage"),
                   budgets: Sequence[str] = DEFAULT_BUDGETS, tracking_uri: str | None = None) -> pd.DataFrame:
    """Per (run, step): validation ExpRate, training CPU hours and the run's `test_<year>_exprate`,
    of each claim's two cells at every budget (claims without a last-budget study left out)."""
    frames = []
    for claim in map(_claim, claims):
        runs = {b: load_runs(tracking_uri, study=claim.study_name(b)) for b in budgets}
        last = runs[budgets[-1]]
        if last.empty:
            continue
        pair = claim_cells(claim, list(last["variant"].dropna().unique()))
        if pair is None:
            continue
        for budget, frame in runs.items():
            frame = curve_runs(frame)
            frame = frame[frame["variant"].isin(pair)] if not frame.empty else frame
            if frame.empty:
                continue
            history = load_history(frame, ["val_exprate", "train_cpu_seconds"], tracking_uri)
            wide = (history.drop_duplicates(["run_id", "metric", "step"], keep="last")
                    .pivot_table(index=["run_id", "step"], columns="metric", values="value").reset_index())
            if "val_exprate" not in wide.columns:
                continue
            wide["cpu_hours"] = wide["train_cpu_seconds"] / 3600.0 if "train_cpu_seconds" in wide else np.nan
            tests = [f"metrics.test_{y}_exprate" for y in scored_years(frame)]
            meta = frame[["run_id", "variant", "seed", "state", *tests]].rename(
                columns={t: t.removeprefix("metrics.") for t in tests})
            wide = wide.merge(meta, on="run_id").assign(claim=claim.name, budget=budget, winner=pair[0], loser=pair[1])
            frames.append(wide.dropna(subset=["val_exprate"]))
    first = ["claim", "budget", "variant", "seed", "run_id", "state", "step", "val_exprate", "cpu_hours",
             "winner", "loser"]
    if not frames:
        return pd.DataFrame(columns=first)
    out = pd.concat(frames, ignore_index=True)
    out = out[first + sorted(c for c in out.columns if c.startswith("test_"))]
    return out.sort_values(["claim", "budget", "variant", "seed", "step"]).reset_index(drop=True)


def plateau(curve: pd.Series) -> str:
    """One run's validation curve read as `plateau`, `still rising`, `falling` or `too short to tell`."""
    if len(curve) < 2 * PLATEAU_EPOCHS:
        return "too short to tell"
    gain = curve.iloc[-PLATEAU_EPOCHS:].mean() - curve.iloc[-2 * PLATEAU_EPOCHS:-PLATEAU_EPOCHS].mean()
    return "plateau" if abs(gain) <= PLATEAU_POINTS else "still rising" if gain > 0 else "falling"


def budget_summary(history: pd.DataFrame) -> pd.DataFrame:
    """Per claim, budget and variant: the best validation ExpRate and epoch, the last epochs' spread,
    the plateau reading per run, CPU-hours and test ExpRate (means over seeds)."""
    rows = []
    tests = sorted(c for c in history.columns if c.startswith("test_"))
    for (claim, budget, variant), group in history.groupby(["claim", "budget", "variant"], sort=False):
        per_run = []
        for _, run in group.groupby("run_id", sort=False):
            run = run.sort_values("step")
            best, last = run.loc[run["val_exprate"].idxmax()], run["val_exprate"].iloc[-PLATEAU_EPOCHS:]
            spread = float(last.max() - last.min()) if len(run) >= PLATEAU_EPOCHS else np.nan
            per_run.append({"best": best["val_exprate"], "best_epoch": int(best["step"]),
                            "epochs": int(run["step"].max()), "spread": spread,
                            "plateau": plateau(run["val_exprate"]), "cpu_hours": run["cpu_hours"].max(),
                            "state": run["state"].iloc[0], **{t: run[t].iloc[0] for t in tests}})
        runs = pd.DataFrame(per_run)
        rows.append({"claim": claim, "budget": budget, "variant": variant, "seeds": len(runs),
                     "epochs": int(runs["epochs"].max()), "state": ", ".join(sorted(set(runs["state"]))),
                     "best_val_exprate": runs["best"].mean(), "best_epoch": int(runs["best_epoch"].median()),
                     "last_spread": runs["spread"].mean(), "plateau": ", ".join(sorted(set(runs["plateau"]))),
                     "cpu_hours": runs["cpu_hours"].mean(), **{t: runs[t].mean() for t in tests}})
    return pd.DataFrame(rows)


def _gaps(history: pd.DataFrame) -> pd.DataFrame:
    frames = []
    for (claim, budget), group in history.groupby(["claim", "budget"], sort=False):
        winner, loser = group["winner"].iloc[0], group["loser"].iloc[0]
        side = group.pivot_table(index=["seed", "step"], columns="variant", values="val_exprate")
        if winner not in side or loser not in side:
            continue
        gap = (side[winner] - side[loser]).dropna().rename("gap").reset_index()
        frames.append(gap.assign(claim=claim, budget=budget))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["seed", "step", "gap", "claim", "budget"])


def gap_summary(history: pd.DataFrame) -> pd.DataFrame:
    """Per claim and budget: the validation gap over the last `SMOOTH_EPOCHS` shared epochs, the test
    gap per year (means over seeds), and for a later budget its trend against the first's."""
    tests = sorted(c for c in history.columns if c.startswith("test_"))
    gaps = _gaps(history)
    rows = []
    for (claim, budget), group in history.groupby(["claim", "budget"], sort=False):
        winner, loser = group["winner"].iloc[0], group["loser"].iloc[0]
        finals = group.drop_duplicates("run_id").pivot_table(index="seed", columns="variant", values=tests)
        row = {"claim": claim, "budget": budget, "comparison": f"{winner} > {loser}",
               "seeds": int(group["seed"].nunique())}
        mine = gaps[(gaps["claim"] == claim) & (gaps["budget"] == budget)]
        if not mine.empty:
            last = mine.groupby("seed").apply(lambda g: g.nlargest(SMOOTH_EPOCHS, "step")["gap"].mean(),
                                              include_groups=False)
            row["val_gap_last_epochs"] = float(last.mean())
        for test in tests:
            sides = [(test, winner), (test, loser)]
            gap = float((finals[sides[0]] - finals[sides[1]]).mean()) if all(s in finals for s in sides) else np.nan
            row[test.removesuffix("_exprate") + "_gap"] = gap
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    for _, group in out.groupby("claim", sort=False):
        first = group.iloc[0]
        for index, row in group.iloc[1:].iterrows():
            for column in [c for c in out.columns if c.startswith("test_") and c.endswith("_gap")]:
                change = row[column] - first[column]
                word = ("–" if np.isnan(change) else "grows" if change > GAP_POINTS
                        else "shrinks" if change < -GAP_POINTS else "holds")
                out.loc[index, column.removesuffix("_gap") + "_trend"] = word
    return out


def plot_budget_curves(history: pd.DataFrame, *, title: str | None = None, path: str | Path | None = None) -> Figure:
    """A column per claim: validation ExpRate per epoch (a colour per variant, a line style per budget),
    and the gap below (thin: as measured; thick: its `SMOOTH_EPOCHS` running mean)."""
    if history.empty:
        raise ValueError("no runs to draw: no claim has its study at the last budget")
    claims = list(dict.fromkeys(history["claim"]))
    budgets = list(dict.fromkeys(history["budget"]))
    fig = Figure(figsize=(6.0 * len(claims), 7.5), layout="constrained")
    axes = fig.subplots(2, len(claims), squeeze=False)
    gaps = _gaps(history)
    for j, claim in enumerate(claims):
        mine = history[history["claim"] == claim]
        variants = [mine["winner"].iloc[0], mine["loser"].iloc[0]]
        colors = variant_colors(variants)
        top, bottom = axes[0, j], axes[1, j]
        for b, budget in enumerate(budgets):
            style = _LINES[b % len(_LINES)]
            for variant in variants:
                runs = mine[(mine["budget"] == budget) & (mine["variant"] == variant)]
                if runs.empty:
                    continue
                stats = runs.groupby("step")["val_exprate"].agg(["mean", "std", "count"])
                seeds = runs["seed"].nunique()
                label = f"{variant}, {budget} ({seeds} seed{'s' if seeds > 1 else ''})"
                top.plot(stats.index, stats["mean"], style, color=colors[variant], label=label, lw=1.4)
                if (stats["count"] > 1).any():
                    top.fill_between(stats.index, stats["mean"] - stats["std"].fillna(0),
                                     stats["mean"] + stats["std"].fillna(0), color=colors[variant], alpha=0.15)
            gap = gaps[(gaps["claim"] == claim) & (gaps["budget"] == budget)]
            if not gap.empty:
                per_step = gap.groupby("step")["gap"].mean()
                bottom.plot(per_step.index, per_step.values, style, color="0.6", lw=0.8)
                smoothed = per_step.rolling(SMOOTH_EPOCHS, min_periods=SMOOTH_EPOCHS).mean()
                bottom.plot(per_step.index, smoothed.values, style, color="black", lw=1.8,
                            label=f"{budget}: {SMOOTH_EPOCHS}-epoch running mean")
        bottom.axhline(0.0, color="0.3", lw=0.6)
        top.set_title(f"{claim}: {variants[0]} > {variants[1]}")
        top.set_ylabel("validation ExpRate (%)")
        bottom.set_ylabel(f"gap, {variants[0]} − {variants[1]} (points)")
        for ax in (top, bottom):
            ax.set_xlabel("epoch")
            ax.grid(alpha=0.3)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.legend(frameon=False, fontsize=8)
    fig.suptitle((f"{title}: " if title else "") + "the same cells at " + " and ".join(budgets)
                 + " budgets (validation, 465 expressions of held-out writers)")
    if path is not None:
        save_figure(fig, path)
    return fig


def format_budgets(history: pd.DataFrame, fmt: str = "text") -> str:
    if history.empty:
        return ""
    table = layout(fmt)
    summary, gaps = budget_summary(history), gap_summary(history)
    years = [c.removeprefix("test_").removesuffix("_exprate") for c in summary.columns if c.startswith("test_")]
    head = ["claim", "budget", "variant", "seeds", "epochs", "best val (epoch)",
            f"last {PLATEAU_EPOCHS} spread", "plateau", "CPU-h per run", *(f"{y} ExpRate" for y in years)]
    body = [[r["claim"], r["budget"], r["variant"], str(r["seeds"]),
             str(r["epochs"]) + ("" if r["state"] == "finished" else f" ({r['state']})"),
             f"{number(r['best_val_exprate'])} ({r['best_epoch']})", number(r["last_spread"]), r["plateau"],
             number(r["cpu_hours"], 2), *(number(r[f"test_{y}_exprate"]) for y in years)]
            for _, r in summary.iterrows()]
    gap_head = ["claim", "budget", "comparison", "seeds", f"val gap, last {SMOOTH_EPOCHS} epochs",
                *(f"{y} gap" for y in years)]
    gap_body = []
    for _, r in gaps.iterrows():
        trend = [r.get(f"test_{y}_trend") for y in years]
        gap_body.append([r["claim"], r["budget"], r["comparison"], str(r["seeds"]),
                         number(r.get("val_gap_last_epochs")),
                         *(number(r.get(f"test_{y}_gap")) + (f" {t}" if isinstance(t, str) and t != "–" else "")
                           for y, t in zip(years, trend))])
    return (table(head, body) + "\n\n" + f"Gaps, claimed winner − claimed loser in points (a later budget's test gap "
            f"against the first budget's: grows or shrinks beyond {GAP_POINTS:g} point, else holds):\n\n"
            + table(gap_head, gap_body))
