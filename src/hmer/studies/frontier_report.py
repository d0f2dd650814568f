"""The frontier (issue 66): hold-out ExpRate against training compute, one point a finished run.

The x-axis is host-independent: PFLOP, the FLOPs of a training image at the run's setting
(`benchmarks/frontier_flops.py`, in `benchmarks/results/frontier_flops.csv`) times the images of its
epochs. Beside it: `cpu_hours`, its training clock as if trained alone (a branched run counts its
shared epochs), `study_cpu_hours` (less those), and `cpu`, every CPU that trained it (`hmer.device`). The y-axis:
`val_final_exprate` (final weights, beam 10, joint search for `bi`) beside `best_val_exprate` (best
greedy reading). Running and failed runs are no point: nothing is extrapolated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd
from matplotlib.figure import Figure

from ..tracking import keys
from ..tracking.store import project_root
from ..reports.runs import load_runs

SETTING_KEYS = ("model.d_model", "data.render_scale")  # what an image's FLOPs depend on in the study
# Where today's budgets sit on the frontier: their fusion cells (48 px, the `swept` size, cosine schedule).
BUDGET_STUDIES = {"cpu budget": "ablate_coverage-cpu", "long budget": "ablate_coverage-long"}
BUDGET_VARIANT = "fusion"
BUDGET_SETTING = (192, 0.0)
COLUMNS = ("variant", "width", "input", "ema", "epochs", "val_final_exprate", "best_val_exprate", "pflop",
           "cpu_hours", "study_cpu_hours", "cpu", "warm_restarts", "run_id")


def read_flops(path: str | Path | None = None) -> pd.DataFrame:
    """The measured FLOPs an image of each setting; default the checkout's `frontier_flops.csv`."""
    path = Path(path) if path else project_root() / "benchmarks" / "results" / "frontier_flops.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no FLOP measurement; run python benchmarks/frontier_flops.py")
    return pd.read_csv(path)


def input_label(render_scale: float) -> str:
    """How the input is drawn, in words: a fixed height (scale 0) or a multiple of the standard scale."""
    return "48 px" if not render_scale else f"x{render_scale:g}"


def frontier_points(study: str, flops: pd.DataFrame, tracking_uri: str | None = None) -> pd.DataFrame:
    """One row a finished run of `study`, `COLUMNS`, by width, input, weight average and epochs."""
    runs = load_runs(tracking_uri, study=study)
    runs = runs[runs["state"] == "finished"] if not runs.empty else runs
    if runs.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    rows = []
    for run in runs.to_dict("records"):
        setting = tuple(run[f"params.{k}"] for k in SETTING_KEYS)
        epochs = int(run["params.train.epochs"])
        pflop = training_pflop(flops, setting, epochs)
        if pflop is None:
            raise LookupError(f"run {run['run_id'][:8]} ({run['variant']}): no FLOP measurement of "
                              f"{dict(zip(SETTING_KEYS, setting))}; run python benchmarks/frontier_flops.py")
        shared = run.get(f"tags.{keys.BRANCH_CPU_SECONDS}")
        shared = 0.0 if pd.isna(shared) else float(shared)
        rows.append({
            "variant": run["variant"], "width": int(setting[0]), "input": input_label(setting[1]),
            "ema": float(run["params.train.ema_decay"]), "epochs": epochs,
            "val_final_exprate": run["metrics.val_final_exprate"], "best_val_exprate": run["metrics.best_val_exprate"],
            "pflop": pflop,
            "cpu_hours": run["metrics.train_cpu_seconds"] / 3600,
            "study_cpu_hours": (run["metrics.cpu_seconds"] - shared) / 3600,
            "cpu": run.get(f"tags.{keys.DEVICE}"),
            "warm_restarts": 0 if pd.isna(run.get(f"tags.{keys.WARM_RESTART}")) else 1,
            "run_id": run["run_id"],
        })
    return pd.DataFrame(rows, columns=list(COLUMNS)).sort_values(["width", "input", "ema", "epochs"],
                                                                   ignore_index=True)


def budget_points(flops: pd.DataFrame, tracking_uri: str | None = None) -> pd.DataFrame:
    """Where the `cpu` and `long` budgets sit: the mean over seeds of their fusion cells' finished runs; a
    budget whose study the store lacks, or whose setting has no FLOP measurement, is left out."""
    rows = []
    for budget, study in BUDGET_STUDIES.items():
        runs = load_runs(tracking_uri, study=study)
        if runs.empty:
            continue
        runs = runs[(runs["state"] == "finished") & (runs["variant"] == BUDGET_VARIANT)]
        scored = runs.get("metrics.val_final_exprate", pd.Series(index=runs.index, dtype=float)).notna()
        runs = runs[scored]
        if runs.empty:
            continue
        epochs = int(runs["params.train.epochs"].iloc[0])
        pflop = training_pflop(flops, BUDGET_SETTING, epochs)
        if pflop is None:
            continue
        rows.append({"budget": budget, "epochs": epochs, "seeds": len(runs),
                     "val_final_exprate": runs["metrics.val_final_exprate"].mean(),
                     "pflop": pflop,
                     "cpu_hours": runs["metrics.train_cpu_seconds"].mean() / 3600,
                     "cpu": keys.DEVICE_SEPARATOR.join(hosts(runs[f"tags.{keys.DEVICE}"]))})
    return pd.DataFrame(rows, columns=["budget", "epochs", "seeds", "val_final_exprate", "pflop", "cpu_hours", "cpu"])


def hosts(device_tags: Iterable) -> list[str]:
    """Each CPU named in `hmer.device` tags once, sorted: a tag names every host a run trained on."""
    return sorted({host for tag in device_tags if isinstance(tag, str)
                   for host in tag.split(keys.DEVICE_SEPARATOR) if host})


def training_pflop(flops: pd.DataFrame, setting: Sequence, epochs: int) -> float | None:
    """The PFLOPs of training `epochs` epochs at `setting` (the values of SETTING_KEYS): the FLOPs an image
    times the images an epoch trains, times the epochs; None where the setting is unmeasured."""
    row = flops[(flops[SETTING_KEYS[0]] == setting[0]) & (flops[SETTING_KEYS[1]] == setting[1])]
    if row.empty:
        return None
    return float(row["gflop_per_image"].iloc[0]) * int(row["train_images"].iloc[0]) * epochs / 1e6


def plot_frontier(points: pd.DataFrame, title: str | None = None, budgets: pd.DataFrame | None = None) -> Figure:
    """Hold-out ExpRate against training PFLOP (log): a line per width, input and weight average through
    its lengths, each point marked with its CPU-hours."""
    import seaborn as sns

    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot()
    series = list(points.groupby(["width", "input", "ema"], sort=True))
    colors = sns.color_palette("colorblind", max(len(series), 1)).as_hex()
    for color, ((width, inp, ema), group) in zip(colors, series):
        label = f"d {width}, {inp}" + (f", EMA {ema:g}" if ema else "")
        ax.plot(group["pflop"], group["val_final_exprate"], marker="o", color=color, label=label)
        for x, y, hours in zip(group["pflop"], group["val_final_exprate"], group["cpu_hours"]):
            ax.annotate(f"{hours:.1f} h", (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7,
                        color=color)
    for budget in (budgets if budgets is not None else pd.DataFrame()).to_dict("records"):
        ax.plot(budget["pflop"], budget["val_final_exprate"], marker="s", color="black", linestyle="none")
        seeds = f"{budget['seeds']} seed" + ("s" if budget["seeds"] > 1 else "")
        label = f"{budget['budget']} ({budget['epochs']} epochs, {seeds}): {budget['cpu_hours']:.1f} h"
        ax.annotate(label, (budget["pflop"], budget["val_final_exprate"]), textcoords="offset points",
                    xytext=(4, 4), fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("training compute (PFLOP: FLOPs an image x images trained)")
    ax.set_ylabel("hold-out ExpRate, beam 10 (%)")
    cpus = hosts([*points["cpu"], *(budgets["cpu"] if budgets is not None else [])])
    ax.set_title(title or "What a CPU-hour buys", fontsize=10)
    if cpus:
        fig.text(0.01, -0.02, "CPU-hours on: " + "; ".join(cpus), fontsize=7)
    if series:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def format_frontier(points: pd.DataFrame) -> str:
    """The points as a Markdown table (the weight average's decay as given: 0.999 is not 1.00)."""
    shown = points.drop(columns=["run_id"]).assign(run=points["run_id"].str[:8])
    return shown.to_markdown(index=False, floatfmt=tuple(".3g" if c == "ema" else ".2f" for c in shown.columns))


def frontier_summary(points: pd.DataFrame, planned: Sequence[str]) -> str:
    """One line: the points finished of those planned, and the CPU-hours the study spent on them."""
    return (f"{len(points)} of {len(planned)} planned points finished; the study spent "
            f"{points['study_cpu_hours'].sum():.1f} CPU-hours on them")
