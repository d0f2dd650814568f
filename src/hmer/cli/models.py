"""`hmer models`: the model presets with their parameter counts, then every registered variant."""

from __future__ import annotations


def add_parser(sub) -> None:
    models = sub.add_parser("models", help="list the model presets with their parameter counts")
    models.set_defaults(func=cmd_models)


def cmd_models(args) -> int:
    from ..model import models_table

    print(models_table())
    return 0
