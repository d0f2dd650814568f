"""Run the report notebooks against a store and keep their outputs: `hmer notebooks`.

The notebooks in `notebooks/` read their store and study from environment variables. Run
here, each is executed top to bottom in a real kernel (nbclient) with those variables set, and
written with its outputs and a record of what produced them in the notebook's metadata
(`metadata.hmer`: the store as given, the study, the commit, the time). That record is how the
committed notebooks say which results they show, and what `tests/test_notebooks.py` checks them
against.

A notebook is written only when every cell ran: the file is replaced atomically, so a cell
that raises leaves the notebook on disk as it was.
"""

from __future__ import annotations

import datetime as _dt
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

NAMES = ("exprate_tables", "training_curves", "attention_maps")
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
    """Execute `names` from `notebooks_dir` against `tracking_uri` (None: the project's store)
    and `study` (None: each notebook's default), writing them with outputs into `out_dir`
    (None: in place). `env` adds kernel variables (`HMER_YEAR`, `HMER_RUN_WITH_COVERAGE`, ...)."""
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
    # No progress bars in a stored notebook: MLflow's per download, and tqdm's complaint (Optuna
    # imports tqdm.auto) that a headless kernel has no ipywidgets, which prints a local path.
    warnings = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), "ignore:IProgress not found"]))
    kernel_env = {"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false", "PYTHONWARNINGS": warnings, **(env or {})}
    if tracking_uri:
        kernel_env["MLFLOW_TRACKING_URI"] = tracking_uri
    if study:
        kernel_env["HMER_STUDY"] = study
    record = {"tracking_uri": tracking_uri or "mlruns/mlflow.db (the project's store)", "study": study,
              "git_commit": git_commit(),
              "executed": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
              "env": {k: v for k, v in (env or {}).items()}}
    done = []
    saved = {k: os.environ.get(k) for k in kernel_env}
    os.environ.update(kernel_env)  # the kernel inherits this process's environment
    try:
        for name in names:
            nb = nbformat.read(source_dir / f"{name}.ipynb", as_version=4)
            for cell in nb.cells:  # a clean start: no output of an earlier run survives a cell
                if cell.cell_type == "code":
                    cell.outputs, cell.execution_count = [], None
            t0 = time.monotonic()
            NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                           resources={"metadata": {"path": str(source_dir.resolve())}}).execute()
            nb.metadata[METADATA_KEY] = record
            path = target_dir / f"{name}.ipynb"
            _write_atomically(nb, path)
            done.append(ExecutedNotebook(name=name, path=path, seconds=time.monotonic() - t0))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return done


def clear_outputs(*, notebooks_dir: str | Path = "notebooks", names: tuple[str, ...] = NAMES) -> list[Path]:
    """Strip every output, execution count and the run record: the notebooks as sources."""
    import nbformat

    paths = []
    for name in names:
        path = Path(notebooks_dir) / f"{name}.ipynb"
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        nb.metadata.pop(METADATA_KEY, None)
        _write_atomically(nb, path)
        paths.append(path)
    return paths


def _write_atomically(nb, path: Path) -> None:
    import nbformat

    nbformat.validate(nb)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file private; a notebook keeps its mode, a new one gets the umask's.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            nbformat.write(nb, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
