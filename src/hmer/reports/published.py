"""The papers' published ExpRates (`published.csv`, one row per model and year, checked against the
paper: docs/reports.md), beside ours. A variant is a paper's model when every run trained a preset
of `PAPER_OF_PRESET` with its model fields (an ablation cell that changed them is not).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

import pandas as pd

from .markup import MISSING, bold, layout

# preset name -> the model name in published.csv
PAPER_OF_PRESET = {"bttr": "BTTR", "comer-fusion": "CoMER"}
COLUMNS = ["model", "year", "exprate", "paper", "venue", "source", "note"]


def package_csv(name: str, columns: list[str], text: list[str], number: str) -> pd.DataFrame:
    """A CSV of this package: `columns` required, `text` read as strings, `number` as numbers."""
    with resources.files(__package__).joinpath(name).open("r", encoding="utf-8") as f:
        df = pd.read_csv(f, dtype=dict.fromkeys(text, str), keep_default_na=False)
    missing = set(columns) - set(df.columns)
    if missing:
        raise ValueError(f"hmer/reports/{name} lacks the column(s) {', '.join(sorted(missing))}")
    df[number] = pd.to_numeric(df[number], errors="raise")
    return df[columns]


@lru_cache(maxsize=1)
def _load() -> pd.DataFrame:
    return package_csv("published.csv", COLUMNS, ["year", "model"], "exprate")


def published_exprate(model: str) -> dict[str, float]:
    df = _load()
    part = df[df["model"] == model]
    return dict(zip(part["year"], part["exprate"].astype(float)))


def _model_fields_match(run: pd.Series, preset: str) -> bool:
    from ..model_presets import preset_with_recipe
    from .runs import parse_value

    expected = {f"params.model.{k}": v for k, v in vars(preset_with_recipe(preset).model).items()}
    for col, want in expected.items():
        have = run.get(col)
        if have is None or (isinstance(have, float) and pd.isna(have)) or have is pd.NA:
            continue  # an older run without that field
        if isinstance(have, str) and not isinstance(want, str):
            have = parse_value(have, type(want))
        if have != want:
            return False
    return True


def paper_of(runs: pd.DataFrame) -> str | None:
    """The paper model (`BTTR`, `CoMER`) one variant's runs all trained, or None."""
    if runs.empty or "params.name" not in runs.columns:
        return None
    names = set(runs["params.name"].astype(str))
    if len(names) != 1:
        return None
    preset = names.pop()
    model = PAPER_OF_PRESET.get(preset)
    if model is None or not published_exprate(model):
        return None
    return model if all(_model_fields_match(run, preset) for _, run in runs.iterrows()) else None


def format_published(fmt: str = "text") -> str:
    """A row per model, its ExpRate per year, then each figure's source."""
    render = layout(fmt)
    df = _load()
    years = sorted(set(df["year"]))
    head = ["model"] + [f"{y} ExpRate" for y in years]
    body: list[list[Any]] = []
    sources = []
    for model, part in df.groupby("model", sort=False):
        by_year = dict(zip(part["year"], part["exprate"]))
        body.append([model] + [f"{by_year[y]:.2f}" if y in by_year else MISSING for y in years])
        first = part.iloc[0]
        note = f" ({first['note']})" if first["note"] else ""
        sources.append(f"- {model}: {first['paper']}. {first['venue']}. Figures from: {first['source']}{note}.")
    presets = ", ".join(f"`{p}` -> {m}" for p, m in PAPER_OF_PRESET.items())
    return (f"{bold(fmt)('Published ExpRate (%)')}, as the papers report them (not measured here)\n\n"
            + render(head, body) + "\n\n" + "\n".join(sources)
            + f"\n\nReport tables show these beside the variants that train these presets: {presets}.\n")
