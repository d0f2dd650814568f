"""Experiment tracking: the MLflow store, training runs, their artifacts, reloading trained models.

The modules: docs/architecture.md ("The modules, by layer"). The names below load on first use: `from
hmer.tracking import keys` does not import torch.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable

_EXPORTS = {"load_model": "models"}  # the name scripts and notebooks reload a model by

__all__ = sorted(_EXPORTS)


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's `__getattr__` and `__dir__` importing each of `exports` ({name: module}) on first use."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f".{module}", package), name)

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
