"""Files written whole or not at all: bytes, text, and figures as PNG.

A file is written to a temporary file in its own folder and moved into place with
`os.replace`, so a process killed mid-write leaves the previous version (or nothing), never a
half-written file that a later reader takes for a complete one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Callable

FIGURE_DPI = 150  # every figure's resolution: the reports', the attention maps', the MLflow UI's


def write_atomically(path: str | Path, write: Callable[[BinaryIO], object]) -> None:
    """Replace `path` in one step with what `write` writes into the binary file it is given. An
    existing file keeps its mode; a new one gets the mode the umask gives (mkstemp's temporary
    files are private, the result need not be)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomically(path: str | Path, text: str) -> None:
    write_atomically(path, lambda f: f.write(text.encode("utf-8")))


def save_figure(fig: Any, path: str | Path, dpi: float = FIGURE_DPI) -> Path:
    """Write the matplotlib figure `fig` as PNG (folders made as needed, the file whole or not at
    all, `write_atomically`); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda f: fig.savefig(f, format="png", dpi=dpi, bbox_inches="tight", facecolor="white"))
    return path
