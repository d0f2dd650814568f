"""Plots of the runs: ExpRate by variant and year (`plot_exprate`), the claims, and
the training curves against the epoch and the training's time (`plot_training_curves(load_history(runs))`).

Figures use matplotlib's object-oriented API, never `pyplot`: no global state (no figure leaks in
a long study), inline in a notebook all the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from ..atomic import save_figure
from ..evaluation.significance import DEFAULT_CONFIDENCE
from .markup import metric_label
from .tables import scores_long, variant_order

PALETTE = "colorblind"


def variant_colors(order: Sequence[str]) -> dict[str, str]:
    """Each variant's colour (#rrggbb), also in the MLflow UI (`store.study_run`)."""
    import seaborn as sns

    return dict(zip(order, sns.color_palette(PALETTE, len(order)).as_hex()))


def plot_exprate(runs: pd.DataFrame, *, order: Sequence[str] | None = None, years: Sequence[str] | None = None,
                 metrics: Sequence[str] = ("exprate",), title: str | None = None, path: str | Path | None = None,
                 jitter: float = 0.08) -> Figure:
    """Test scores by year and variant: bars at the mean, whiskers ± 1 std, a dot per seed; a panel
    per metric. `jitter` spreads the dots with numpy's global generator; 0 makes the figure the same
    pixel for pixel from the same runs."""
    import seaborn as sns

    data = scores_long(runs, years, metrics)
    if data.empty:
        raise ValueError("no run with test scores to plot")
    present = set(data["variant"].unique())
    hue_order = [v for v in (order if order is not None else variant_order(runs)) if v in present]
    year_order = sorted(data["year"].unique())
    panel_width = max(4.0, 1.5 + 0.35 * len(year_order) * len(hue_order))  # room for every bar
    fig = Figure(figsize=(panel_width * len(metrics) + 1.5, 4.2), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    colors = variant_colors(hue_order)
    for ax, metric in zip(axes, metrics):
        sub = data[data["metric"] == metric]
        sns.barplot(data=sub, x="year", y="value", hue="variant", order=year_order, hue_order=hue_order,
                    palette=colors, errorbar="sd", capsize=0.15, err_kws={"linewidth": 1.2}, alpha=0.85, ax=ax)
        sns.stripplot(data=sub, x="year", y="value", hue="variant", order=year_order, hue_order=hue_order,
                      palette={v: "0.15" for v in hue_order}, dodge=True, size=4, jitter=jitter, legend=False, ax=ax)
        ax.set_xlabel("CROHME test year")
        ax.set_ylabel(f"{metric_label(metric)} (%)")
        stats = sub.groupby(["variant", "year"])["value"].agg(["mean", "std"]).fillna(0.0)
        top = max(float(sub["value"].max()), float((stats["mean"] + stats["std"]).max()))
        ax.set_ylim(0, max(5.0, top * 1.15))  # room for the highest seed and whisker
        ax.grid(axis="y", alpha=0.3)
        if ax is not axes[-1] and ax.get_legend() is not None:
            ax.get_legend().remove()
    legend = axes[-1].get_legend()
    if legend is not None:
        legend.set_title("variant")
        sns.move_legend(axes[-1], "upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    seeds = data.groupby("variant")["run_id"].nunique()
    spread = f"mean ± std over {seeds.min()}–{seeds.max()} seeds" if seeds.min() != seeds.max() \
        else f"mean ± std over {seeds.min()} seed{'s' if seeds.min() != 1 else ''}"
    fig.suptitle(f"{title + ': ' if title else ''}{', '.join(metric_label(m) for m in metrics)} by variant "
                 f"and year ({spread}; dots: seeds)")
    if path is not None:
        save_figure(fig, path)
    return fig


def plot_claims(claims: pd.DataFrame, *, max_columns: int = 3, title: str | None = None,
                path: str | Path | None = None) -> Figure:
    """A panel per comparison: the difference per year with its interval, coloured by `verdict`; the
    paper's own difference, where it gives both figures, as a hollow diamond."""
    import seaborn as sns

    from .paper_claims import NOT_SIGNIFICANT, REPRODUCED, REVERSED

    if claims.empty:
        raise ValueError("no claims to plot")
    metric = claims.attrs.get("metric", "exprate")
    verdicts = (REPRODUCED, NOT_SIGNIFICANT, REVERSED)
    green, grey, red = (sns.color_palette(PALETTE)[i] for i in (2, 7, 3))
    colors = dict(zip(verdicts, (green, grey, red)))
    comparisons = list(dict.fromkeys(zip(claims["claim"], claims["winner"], claims["loser"])))
    columns = min(max_columns, len(comparisons))
    rows = -(-len(comparisons) // columns)
    fig = Figure(figsize=(3.6 * columns + 1.5, 3.0 * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    for ax in axes[len(comparisons):]:
        ax.set_visible(False)
    for ax, (claim, winner, loser) in zip(axes, comparisons):
        rows_of = claims[(claims["claim"] == claim) & (claims["winner"] == winner) & (claims["loser"] == loser)]
        part = rows_of[rows_of["year"].astype(str) != ""].sort_values("year")  # a year-less row: nothing to draw
        years = list(part["year"].astype(str))
        x = np.arange(len(years))
        ax.axhline(0.0, color="0.3", linewidth=0.8)
        measured = part["delta"].notna().to_numpy()
        for xi, (_, row) in zip(x, part.iterrows()):
            if not pd.notna(row["delta"]):
                continue
            color = colors.get(row["verdict"], grey)
            low, high = row["delta_low"], row["delta_high"]
            if pd.notna(low) and pd.notna(high):
                ax.errorbar([xi], [row["delta"]], yerr=[[row["delta"] - low], [high - row["delta"]]], fmt="o",
                            color=color, capsize=4, markersize=6)
            else:
                ax.plot([xi], [row["delta"]], "o", color=color, markersize=6)
        paper = part["paper_winner"] - part["paper_loser"]
        if paper.notna().any():
            ax.plot(x[paper.notna().to_numpy()] + 0.2, paper[paper.notna()], "D", markerfacecolor="none",
                    markeredgecolor="0.2", markersize=6)
        if not measured.any():
            ax.text(0.5, 0.5, rows_of["verdict"].iloc[0], transform=ax.transAxes, ha="center", va="center",
                    color="0.4")
            if not paper.notna().any():
                ax.set_yticks([])  # nothing drawn: no scale to read
        ax.set_xticks(x, years)
        ax.set_xlim(-0.6, max(len(years) - 0.4, 0.6))
        ax.set_title(f"{claim}: {winner} > {loser}", fontsize=10)
        ax.set_ylabel(f"Δ {metric_label(metric)} (points)")
        ax.grid(axis="y", alpha=0.3)
    handles = [Line2D([], [], marker="o", linestyle="", color=colors[v], label=f"{v} (all seeds)") for v in verdicts]
    handles.append(Line2D([], [], marker="D", linestyle="", markerfacecolor="none", markeredgecolor="0.2",
                          label="the paper's difference"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), frameon=False)
    budget = " and ".join(dict.fromkeys(claims["budget"]))
    fig.suptitle(f"{title + ': ' if title else ''}the papers' claims at the {budget} budget\n"
                 f"claimed winner − claimed loser in {metric_label(metric)}, means over seeds, "
                 f"{DEFAULT_CONFIDENCE:.0%} paired-bootstrap intervals")
    if path is not None:
        save_figure(fig, path)
    return fig


METRIC_LABELS = {
    "val_exprate": "validation ExpRate (%)",
    "val_loss": "validation loss",
    "train_loss": "training loss",
    "lr": "learning rate",
    "images_per_second": "training images / s",
    "epoch_seconds": "seconds per epoch",
}
CURVE_METRICS = ("val_exprate", "train_loss", "val_loss")


def _per_epoch(history: pd.DataFrame, metric: str, points: pd.DataFrame) -> pd.DataFrame | None:
    """`metric` per (run_id, step), or None unless logged at every step of `points`."""
    logged = history[history["metric"] == metric].drop_duplicates(["run_id", "step"], keep="last")
    have = set(zip(logged["run_id"], logged["step"]))
    if not all(key in have for key in zip(points["run_id"], points["step"])):
        return None
    return logged[["run_id", "step", "value"]]


def _training_cpu_seconds(history: pd.DataFrame, points: pd.DataFrame) -> tuple[pd.DataFrame, bool] | None:
    """Cumulative `train_cpu_seconds` at every (run_id, step) of `points`, and whether a run's total
    is spread evenly (runs before `dafb8e0` log it once; their epochs cost the same arithmetic, so
    this beats wall-clock time); None unless every run logged it."""
    logged = history[history["metric"] == "train_cpu_seconds"].drop_duplicates(["run_id", "step"], keep="last")
    frames, spread = [], False
    for run_id, steps in points.groupby("run_id")["step"]:
        run = logged[logged["run_id"] == run_id]
        wanted = set(steps)
        if wanted <= set(run["step"]):
            frames.append(run[["run_id", "step", "value"]])
            continue
        last = int(steps.max())
        total = run.loc[run["step"] == last, "value"]
        if total.empty or last <= 0:
            return None
        per_step = float(total.iloc[-1]) / last
        frames.append(pd.DataFrame({"run_id": run_id, "step": sorted(wanted),
                                    "value": [per_step * s for s in sorted(wanted)]}))
        spread = True
    if not frames:
        return None
    return pd.concat(frames, ignore_index=True), spread


def _with_time_axis(history: pd.DataFrame, points: pd.DataFrame) -> tuple[pd.DataFrame, str, str]:
    """`points` with `minutes`, the axis label and title words: CPU time, else the training steps'
    wall-clock time (`epoch_seconds`: pauses and other jobs count), else time since the start."""
    found = _training_cpu_seconds(history, points)
    if found is not None:
        cpu, spread = found
        data = points.merge(cpu.rename(columns={"value": "time_s"}), on=["run_id", "step"], how="left")
        words = "against the training's CPU time, validation included"
        if spread:
            words += "; runs that logged only its total: spread evenly over their epochs"
        return data.assign(minutes=data["time_s"] / 60.0), "CPU minutes of training", words
    steps = _per_epoch(history, "epoch_seconds", points)
    if steps is not None:
        steps = steps.sort_values(["run_id", "step"])
        steps = steps.assign(time_s=steps.groupby("run_id")["value"].cumsum())[["run_id", "step", "time_s"]]
        data = points.merge(steps, on=["run_id", "step"], how="left")
        return (data.assign(minutes=data["time_s"] / 60.0),
                "minutes in training steps", "against wall-clock time in training steps, validation excluded")
    return (points.assign(minutes=points["seconds"] / 60.0),
            "wall-clock minutes since the start", "against wall-clock time since each run started")


def plot_training_curves(history: pd.DataFrame, *, metrics: Sequence[str] = CURVE_METRICS,
                         order: Sequence[str] | None = None, title: str | None = None,
                         path: str | Path | None = None) -> Figure:
    """A column per metric: against the epoch (mean ± std over seeds) and below against time (a line
    per run); `history` a `load_history` frame with `variant`."""
    import seaborn as sns

    if "variant" not in history.columns:
        raise ValueError("the history needs a variant column: call load_history(runs_frame, ...)")
    metrics = [m for m in metrics if m in set(history["metric"])]
    if not metrics:
        raise ValueError("none of the requested metrics was logged by these runs")
    data, time_label, time_title = _with_time_axis(history, history[history["metric"].isin(metrics)])
    variants = list(dict.fromkeys(order or data["variant"].dropna().unique()))
    colors = variant_colors(variants)
    fig = Figure(figsize=(4.2 * len(metrics) + 1.5, 7.0), layout="constrained")
    axes = fig.subplots(2, len(metrics), squeeze=False)
    for j, metric in enumerate(metrics):
        sub = data[data["metric"] == metric]
        sns.lineplot(data=sub, x="step", y="value", hue="variant", hue_order=variants, palette=colors,
                     errorbar="sd", marker="o", markersize=4, ax=axes[0, j], legend=j == len(metrics) - 1)
        sns.lineplot(data=sub, x="minutes", y="value", hue="variant", hue_order=variants, palette=colors,
                     units="run_id", estimator=None, marker="o", markersize=3, alpha=0.85, ax=axes[1, j],
                     legend=False)
        for i, xlabel in enumerate(("epoch", time_label)):
            axes[i, j].set_xlabel(xlabel)
            axes[i, j].set_ylabel(METRIC_LABELS.get(metric, metric))
            axes[i, j].grid(alpha=0.3)
        axes[0, j].xaxis.set_major_locator(MaxNLocator(integer=True))
    legend_ax = axes[0, len(metrics) - 1]
    if legend_ax.get_legend() is not None:
        sns.move_legend(legend_ax, "upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.suptitle(f"{title + ': ' if title else ''}training curves by variant "
                 f"(top: per epoch, mean ± std over seeds; bottom: per run, {time_title})")
    if path is not None:
        save_figure(fig, path)
    return fig
