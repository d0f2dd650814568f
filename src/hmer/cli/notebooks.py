"""`hmer notebooks`: the report notebooks executed against a store, saved with their outputs.

Each notebook of `notebooks/` runs in a kernel (nbclient) with its store and study in environment
variables, and is written, atomically and only when every cell ran, with its outputs and what produced
them (`metadata.hmer`: the store, the study, the commit, the time; tests/test_notebooks.py reads it).
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass
from pathlib import Path

from .options import UserError

NAMES = ("exprate_tables", "training_curves", "attention_maps", "sweep", "paper_claims", "frontier")
METADATA_KEY = "hmer"  # notebook.metadata["hmer"]: what produced the outputs
CELL_TIMEOUT_S = 600


@dataclass(frozen=True)
class ExecutedNotebook:
    name: str
    path: Path
    seconds: float


def run_notebooks(*, notebooks_dir: str | Path = "notebooks", out_dir: str | Path | None = None,
                  tracking_uri: str | None = None, study: str | None = None, names: tuple[str, ...] = NAMES,
                  env: dict[str, str] | None = None, timeout_s: int = CELL_TIMEOUT_S) -> list[ExecutedNotebook]:
    """Execute `names` from `notebooks_dir` against `tracking_uri` (None: the project's store) and `study`
    (None: each one's own) into `out_dir` (None: in place); `env` adds kernel variables (`HMER_YEAR`, ...)."""
    import time

    import nbformat
    from nbclient import NotebookClient

    from ..tracking.store import git_commit

    source_dir = Path(notebooks_dir)
    target_dir = Path(out_dir) if out_dir is not None else source_dir
    missing = [n for n in names if not (source_dir / f"{n}.ipynb").is_file()]
    if missing:
        raise FileNotFoundError(f"{source_dir}: no notebook {', '.join(f'{n}.ipynb' for n in missing)} "
                                f"(run from the project's checkout, or give --notebooks DIR)")
    target_dir.mkdir(parents=True, exist_ok=True)
    # no progress bars in a stored notebook: MLflow's, nor tqdm's complaint (printing a local path) that
    # a headless kernel has no ipywidgets; the environment goes to the kernel's start, not this process
    warnings = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), "ignore:IProgress not found"]))
    kernel_env = {**os.environ, "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false", "PYTHONWARNINGS": warnings,
                  **(env or {})}
    if tracking_uri:
        kernel_env["MLFLOW_TRACKING_URI"] = tracking_uri
    if study:
        kernel_env["HMER_STUDY"] = study
    record = {"tracking_uri": tracking_uri or "mlruns/mlflow.db (the project's store)", "study": study,
              "git_commit": git_commit(),
              "executed": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
              "env": dict(env or {})}
    done = []
    for name in names:
        nb = _without_outputs(nbformat.read(source_dir / f"{name}.ipynb", as_version=4))
        t0 = time.monotonic()
        NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                       resources={"metadata": {"path": str(source_dir.resolve())}}).execute(env=kernel_env)
        nb.metadata[METADATA_KEY] = record
        path = target_dir / f"{name}.ipynb"
        _write(nb, path)
        done.append(ExecutedNotebook(name=name, path=path, seconds=time.monotonic() - t0))
    return done


def _without_outputs(nb):
    """`nb` with no output and no execution count in any code cell (changed in place)."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


def _write(nb, path: Path) -> None:
    """Validate, then replace the file whole (a failure leaves it as it was)."""
    import nbformat

    from ..atomic import write_text_atomically

    nbformat.validate(nb)
    write_text_atomically(path, nbformat.writes(nb))


def add_parser(sub) -> None:
    nb = sub.add_parser("notebooks", help="run the report notebooks against a store and keep their outputs")
    nb.add_argument("names", nargs="*", metavar="NAME", help=f"{', '.join(NAMES)} (default: all {len(NAMES)})")
    nb.add_argument("--study", default=None, help="the study the notebooks show (default: each notebook's own)")
    nb.add_argument("--tracking-uri", default=None, help="the store (default: the project's mlruns/mlflow.db)")
    nb.add_argument("--notebooks", default="notebooks", help="where the notebooks are (default: ./notebooks)")
    nb.add_argument("--out", default=None, help="write the executed notebooks here (default: in place)")
    nb.add_argument("--set", nargs="*", default=[], metavar="VAR=VALUE",
                    help="kernel variables, e.g. HMER_YEAR=2016 HMER_RUNS=RUN_A,RUN_B")
    nb.add_argument("--clear", action="store_true", help="strip the outputs instead: the notebooks as sources")
    nb.set_defaults(func=cmd_notebooks)


def cmd_notebooks(args) -> int:
    unknown = [n for n in args.names if n not in NAMES]
    if unknown:
        raise UserError(f"unknown notebook {', '.join(unknown)}: choose from {', '.join(NAMES)}")
    names = tuple(args.names) or NAMES
    if args.clear:  # every output, execution count and the run record stripped: the notebooks as sources
        import nbformat

        for name in names:
            path = Path(args.notebooks) / f"{name}.ipynb"
            nb = _without_outputs(nbformat.read(path, as_version=4))
            nb.metadata.pop(METADATA_KEY, None)
            _write(nb, path)
            print(f"cleared {path}")
        return 0
    env = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--set {item!r}: expected VAR=VALUE")
        env[key] = value
    from ..tracking.store import existing_store

    existing_store(args.tracking_uri)  # the notebooks read it: a mistyped path is named, not made a new store
    for done in run_notebooks(notebooks_dir=args.notebooks, out_dir=args.out, tracking_uri=args.tracking_uri,
                              study=args.study, names=names, env=env):
        print(f"{done.path}: executed in {done.seconds:.0f} s")
    return 0
