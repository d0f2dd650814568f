"""MLflow params (strings) back to Python values: config keys to their `Config` field's type, any
other to an int, float or bool when it is one."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Iterable

import pandas as pd


@lru_cache(maxsize=1)
def config_types() -> dict[str, type]:
    """{dotted config key: its Python type}, e.g. {"train.lr": float}."""
    from typing import get_type_hints

    from ..config import SECTIONS

    return {"name": str, **{f"{section}.{key}": typ for section, cls in SECTIONS.items()
                            for key, typ in get_type_hints(cls).items()}}


def parse_value(text: Any, typ: type | None = None) -> Any:
    """One param string as `typ` (inferred when None); unparseable stays a string: an old run may hold
    a value a newer Config refuses, and a report must still load it."""
    if text is None or (isinstance(text, float) and math.isnan(text)):
        return None
    if not isinstance(text, str) or typ is str:
        return text
    if typ is None:
        return _infer(text)
    try:
        if typ is bool:
            return _BOOLS.get(text.strip().lower(), text)
        if typ is int:
            try:
                return int(text)
            except ValueError:
                return int(float(text))  # "1e3"
        if typ is float:
            return float(text)
    except ValueError:
        return text
    return text


_BOOLS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


def _infer(text: str) -> Any:
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def typed_column(values: Iterable[Any]) -> pd.Series:
    """Parsed values with a fitting (nullable) dtype."""
    series = pd.Series(list(values), dtype=object)
    present = series.dropna()
    if present.empty:
        return series
    kinds = {type(v) for v in present}
    if kinds == {bool}:
        return series.astype("boolean")
    if kinds == {int}:
        return series.astype("Int64")
    if kinds <= {int, float}:
        return series.astype("float64")
    return series
