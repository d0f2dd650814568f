"""`hmer config`: the flat config a preset or a study's cell trains with, and the layer of each value;
`hmer models`: the model presets with their parameter counts, then every registered choice.

The layers are `hmer.model_presets.LAYERS` (docs/training.md). A study that exists in its storage
shows its stored base config, as on resume (`--fresh`: a new study's). Nothing is written.
"""

from __future__ import annotations

import argparse
import json

from .options import UserError, preset_resolution


def add_parser(sub) -> None:
    models = sub.add_parser("models", help="list the model presets with their parameter counts")
    models.set_defaults(func=cmd_models)
    p = sub.add_parser("config", help="the config a preset or a study's cell trains with, and where each value "
                                      "comes from")
    p.add_argument("name", metavar="PRESET|STUDY",
                   help="a preset (`hmer models`) or a study (ablate_direction, sweep, ...)")
    p.add_argument("--budget", default=None,
                   help="a study budget (smoke, cpu, long, short, paper): its size, recipe and keys; for a study, "
                        "default as its script (cpu without a GPU)")
    p.add_argument("--recipe", default=None, help="a preset's recipe in place of its own (bttr, comer, swept)")
    p.add_argument("--set", dest="overrides", nargs="+", default=[], metavar="KEY=VALUE",
                   help="config overrides, as `hmer train --set` or a study's --set")
    study = p.add_argument_group("a study's cell")
    study.add_argument("--cell", nargs="+", default=[], metavar="KEY=VALUE",
                       help="a grid cell's axis values (an axis left out: the baseline's; the hmer.cell tag of a "
                            "run, commas and all, is one), or a sweep trial's drawn values")
    study.add_argument("--seed", type=int, default=None, help="the grid cell's seed (default: the first of the axis)")
    study.add_argument("--seeds", default=None, help="the seed axis, as the study's --seeds (default: the budget's)")
    study.add_argument("--variants", default=None,
                       help="the variants trained, as the study's --variants (default: every one)")
    study.add_argument("--n-jobs", type=int, default=None, help="workers, as the study's --n-jobs: a windowed "
                                                                "budget divides its time by them")
    study.add_argument("--trials", type=int, default=None, help="a sweep's trials, as its --trials")
    study.add_argument("--study-name", default=None, help="default: <study>-<budget>")
    study.add_argument("--storage", default=None, help="Optuna storage URL (default: beside the MLflow store)")
    study.add_argument("--tracking-uri", default=None, help="MLflow store (default: sqlite mlruns/mlflow.db)")
    study.add_argument("--fresh", action="store_true", help="what a new study would train: leave a stored one out")
    p.add_argument("--changed", action="store_true", help="only the keys a layer above the defaults sets")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="table (key, value, layer) or JSON ({key: {value, layer}}) (default: table)")
    p.set_defaults(func=cmd_config)


def cmd_models(args) -> int:
    """The presets with their parameter counts, then the registered choices a config can name."""
    from ..model import list_presets
    from ..model.hmer_model import parameter_counts
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


def cmd_config(args) -> int:
    from ..model_presets import PRESETS
    from ..studies.spec import STUDIES

    if args.name in PRESETS:
        notes, resolution = _preset(args)
    elif args.name in STUDIES:
        notes, resolution = _study(args)
    else:
        raise UserError(f"{args.name!r} is neither a preset ({', '.join(PRESETS)}) nor a study "
                        f"({', '.join(STUDIES)})")
    rows = [row for row in resolution.rows() if not args.changed or row[2] != "default"]
    if args.format == "json":
        print(json.dumps({key: {"value": value, "layer": layer} for key, value, layer in rows}, indent=1))
        return 0
    for note in notes:
        print(f"# {note}")
    width = max(len(key) for key, _, _ in rows)
    values = [json.dumps(value) if isinstance(value, str) else str(value) for _, value, _ in rows]
    value_width = max(len(v) for v in values)
    print(f"{'key':<{width}}  {'value':<{value_width}}  layer")
    for (key, _, layer), value in zip(rows, values):
        print(f"{key:<{width}}  {value:<{value_width}}  {layer}")
    return 0


def _preset(args):
    from ..config import parse_overrides
    from ..studies.budgets import get_budget

    study_only = [option for option, given in (("--cell", args.cell), ("--seed", args.seed is not None),
                                               ("--seeds", args.seeds), ("--variants", args.variants),
                                               ("--n-jobs", args.n_jobs is not None),
                                               ("--trials", args.trials is not None), ("--study-name", args.study_name),
                                               ("--storage", args.storage), ("--fresh", args.fresh)) if given]
    if study_only:
        raise UserError(f"{', '.join(study_only)}: options of a study; {args.name!r} is a preset")
    notes = [f"preset {args.name}"]
    resolution = preset_resolution(args.name, args.budget, args.recipe)
    if args.budget:
        notes.append(f"at budget {get_budget(args.budget).name}, as one trial on one worker")
    return notes, resolution.apply("set", "--set", parse_overrides(args.overrides))


def _study(args):
    from ..config import parse_overrides
    from ..studies.budgets import pick_budget
    from .study import parse_seeds, parse_variants
    from ..studies.resolution import cell_resolution, pick_cell, stored_base, study_resolution
    from ..studies.spec import STUDIES, SweepSpec, cell_label

    spec = STUDIES.get(args.name)
    sweep = isinstance(spec, SweepSpec)
    if args.recipe:
        raise UserError("--recipe: a study trains its preset's recipe, or its budget's")
    if isinstance(spec, SweepSpec) and (args.seed is not None or args.seeds or args.variants):
        raise UserError(f"--seed, --seeds, --variants: sweep {spec.name!r} has no grid; it trains every trial with "
                        f"its seed {spec.seed}")
    if not sweep and args.trials is not None:
        raise UserError("--trials: an option of a sweep")
    if args.n_jobs is not None and args.n_jobs < 1:
        raise UserError("--n-jobs must be at least 1")
    budget, why = pick_budget(args.budget)
    n_jobs = max(1, args.n_jobs or budget.default_jobs)
    try:
        asked = parse_seeds(args.seeds)
        variants = parse_variants(args.variants) if args.variants else getattr(spec, "variants", None)
    except argparse.ArgumentTypeError as exc:
        raise UserError(str(exc)) from None
    seeds: tuple[int, ...] = () if sweep else tuple(asked or budget.seeds)
    n_trials = int(args.trials or budget.sweep_trials) if isinstance(spec, SweepSpec) else \
        len(spec.cells(seeds, variants))
    notes = [f"study {spec.name}, using {why}; {n_trials} trials on {n_jobs} worker(s)"]
    resolution = study_resolution(spec, budget, n_trials=n_trials, n_jobs=n_jobs,
                                  overrides=parse_overrides(args.overrides))
    name = args.study_name or f"{spec.name}-{budget.name}"
    if not args.fresh:
        from ..studies.storage import default_storage

        storage = args.storage or default_storage(args.tracking_uri)
        stored = stored_base(storage, name, spec.name)
        if stored is not None:
            resolution = resolution.take_stored(stored, name)
            notes.append(f"study {name} exists: its stored base config wins, as on resume (--fresh: a new study)")
        else:
            notes.append(f"no stored base config of study {name}: a new study's config")
    # a hmer.cell tag, "a=1,b=2", is several pairs
    given = parse_overrides([pair for item in args.cell for pair in item.split(",") if pair.strip()])
    if isinstance(spec, SweepSpec):
        if given:
            resolution = cell_resolution(resolution, spec, given)
        else:
            notes.append("a sweep's base config: --cell KEY=VALUE gives a trial's drawn values "
                         f"({', '.join(p.key for p in spec.params)}, train.epochs)")
        return notes, resolution
    if not given and args.seed is None:
        axes = "; ".join(f"{key} in {', '.join(map(str, values))}" for key, values in spec.axes.items())
        notes.append(f"the study's base config: --cell KEY=VALUE [--seed N] picks a cell ({axes}; seeds "
                     f"{', '.join(map(str, seeds))})")
        return notes, resolution
    cell = pick_cell(spec, given, args.seed if args.seed is not None else seeds[0])
    notes.append(f"cell {cell_label(cell)}, seed {cell['train.seed']}")
    return notes, cell_resolution(resolution, spec, cell)
