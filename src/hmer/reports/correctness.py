"""Which test expressions each run read right, lined up (same expressions, same order) for the
paired tests of `hmer.evaluation.significance`."""

from __future__ import annotations

from functools import reduce
from typing import Callable

import numpy as np
import pandas as pd

from ..registry import METRICS
from .runs import PredictionsNotFound

# (run_id, year) -> a frame with the columns name, correct and (for a metric other than exprate)
# distance, e.g. a bound `load_predictions`
PredictionLoader = Callable[[str, str], pd.DataFrame]


class CorrectnessCache:
    """Per-run correctness per year, each artifact fetched once; right is `metric`'s verdict."""

    def __init__(self, loader: PredictionLoader | None, metric: str = "exprate"):
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
        self.loader = loader
        self.metric_name = metric
        self.metric = METRICS.get(metric)
        self.cache: dict[tuple[str, str], pd.Series | None] = {}
        self.used = False  # whether any pair of runs was aligned: the table carries tests

    def get(self, run_id: str, year: str) -> pd.Series | None:
        """{expression name: read right} of one run and year; None without the artifact."""
        if self.loader is None:
            return None
        key = (run_id, year)
        if key not in self.cache:
            try:
                df = self.loader(run_id, year)
                if self.metric_name == "exprate":
                    right = pd.Series(df["correct"].to_numpy(bool), index=df["name"].astype(str))
                else:
                    # A metric judging the tokens (lgeval) gives NaN where it does not score: unpaired.
                    distances = pd.to_numeric(df["distance"], errors="coerce").to_numpy(float)
                    verdicts = self.metric.verdicts(distances) if getattr(self.metric, "judge", None) is None else \
                        self.metric.verdicts(distances, [str(p).split() for p in df["prediction"]],
                                             [str(t).split() for t in df["truth"]])
                    right = pd.Series(verdicts, index=df["name"].astype(str)).dropna().astype(bool)
                self.cache[key] = right
            except PredictionsNotFound:
                self.cache[key] = None
        return self.cache[key]

    def aligned(self, base_runs: pd.DataFrame, runs: pd.DataFrame, year: str):
        """((baseline [seeds, n], seeds), (variant [seeds, n], seeds)) on the shared expressions, or None."""
        sides = []
        for frame in (base_runs, runs):
            series, seeds = [], []
            for i, (run_id, seed) in enumerate(zip(frame["run_id"], frame.get("seed", [None] * len(frame)))):
                s = self.get(run_id, year)
                if s is not None:
                    series.append(s)
                    seeds.append(int(seed) if seed is not None and not pd.isna(seed) else i)
            if not series:
                return None
            sides.append((series, seeds))
        names = reduce(pd.Index.intersection, (s.index for series, _ in sides for s in series)).sort_values()
        if len(names) == 0:
            return None
        self.used = True
        return tuple((np.stack([s[~s.index.duplicated()].reindex(names).to_numpy(bool) for s in series]), seeds)
                     for series, seeds in sides)
