"""The training curves of a study's runs against the epoch and the training's time, one colour per
variant: `plot_training_curves(load_history(runs))`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..atomic import save_figure
from .plots import variant_colors

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
