"""Runs trained before a metric was registered, as the committed runs were trained before the papers'
lgeval measures: the metrics are taken out of the registry while the runs train, and put back after
(in the order they had, at the end of the registry, where the package registers them)."""

from __future__ import annotations

import contextlib
from typing import Iterator

from hmer.registry import METRICS

LGEVAL = ("lgeval_exprate", "lgeval_le1", "lgeval_le2")


@contextlib.contextmanager
def metrics_absent(names: tuple[str, ...] = LGEVAL) -> Iterator[None]:
    """While the block runs, `names` are not registered metrics: what it trains and scores lacks them."""
    kept = [(name, METRICS.get(name), METRICS.description(name)) for name in names]
    for name in names:
        METRICS.unregister(name)
    try:
        yield
    finally:
        for name, metric, description in kept:
            METRICS.register(name, metric, description=description)
