"""`hmer models`: the model presets with their parameter counts, then every registered choice."""

from __future__ import annotations


def add_parser(sub) -> None:
    models = sub.add_parser("models", help="list the model presets with their parameter counts")
    models.set_defaults(func=cmd_models)


def cmd_models(args) -> int:
    """The presets with their parameter counts, then the registered choices a config can name."""
    from ..model import list_presets
    from ..model.factory import parameter_counts
    from ..model_presets import PRESETS, resolve_preset
    from ..registry import catalogue

    rows = [(name, params, counting, PRESETS[name], description)
            for name, description, params, counting in list_presets()]
    columns = ("preset", "family", "size", "recipe")
    width = [max(len(c), *(len(v) for v in values)) for c, values in
             zip(columns, zip(*((name, p.family, p.size, p.recipe) for name, _, _, p, _ in rows)))]
    head = "  ".join(f"{c:<{w}}" for c, w in zip(columns, width))
    # "+counting": what model.counting (CAN's symbol counting, at the default model.counting_channels) adds
    lines = [f"{head}  {'params':>9}  {'+counting':>9}  description"]
    for name, params, counting, preset, description in rows:
        cells = "  ".join(f"{v:<{w}}" for v, w in zip((name, preset.family, preset.size, preset.recipe), width))
        lines.append(f"{cells}  {params / 1e6:>8.2f}M  {counting / 1e6:>8.2f}M  {description}")
    # the CPU budgets' model is a size, not a preset: each CPU family at it
    lines += ["", "at the `swept` size (the cpu and long budgets' model):"]
    for name in ("tiny-transformer", "tiny-comer", "tiny-rnn", "tiny-convs2s"):
        params, counting = parameter_counts(resolve_preset(name, size="swept").config.model)
        lines.append(f"  {name:<{width[0]}}  {params / 1e6:>8.2f}M  {counting / 1e6:>8.2f}M")
    choices = catalogue()
    key_width = max(len(key) for key, _, _ in choices)
    name_width = max(len(name) for _, name, _ in choices)
    lines += ["", f"{'choice of':<{key_width}}  {'name':<{name_width}}  description"]
    previous = None
    for key, name, description in choices:
        lines.append(f"{key if key != previous else '':<{key_width}}  {name:<{name_width}}  {description}")
        previous = key
    print("\n".join(lines))
    return 0
