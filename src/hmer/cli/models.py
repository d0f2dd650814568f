"""`hmer models`: the model presets, with their parameter counts."""

from __future__ import annotations


def add_parser(sub) -> None:
    models = sub.add_parser("models", help="list the model presets with their parameter counts")
    models.set_defaults(func=cmd_models)


def cmd_models(args) -> int:
    from ..model import list_presets

    rows = list_presets()
    width = max(len(r[0]) for r in rows)
    print(f"{'preset':<{width}}  {'params':>9}  description")
    for name, description, params in rows:
        print(f"{name:<{width}}  {params / 1e6:>8.2f}M  {description}")
    return 0
