"""An export of runs as a file (`hmer runs export`): its layout, its pieces, and reading it back.

A gzipped tar: `hmer-runs.json` (experiments; per run its info, params, tags and every metric's
full history) followed by `artifacts/<run id>/...`. `--part-mb N` splits it into `FILE.part-000`,
... of at most N MiB (a GPU machine returns files of at most 16 MiB); naming the file or any part
finds them all (`resolve_parts`). Before an import touches a store, the file is read to its end
(a file cut short is refused), unpacked and its manifest checked (`unpack_parts`); `read_export`
does the same without a store. Writing and merging are `tracking.transfer`'s.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

MANIFEST = "hmer-runs.json"
FORMAT = 1
PART_SUFFIX = ".part-"


def split_file(path: Path, part_bytes: int) -> list[Path]:
    """`path` as is when it is at most `part_bytes`, else `path.part-000`, ... (and `path` removed)."""
    if part_bytes <= 0 or path.stat().st_size <= part_bytes:
        return [path]
    parts: list[Path] = []
    with path.open("rb") as src:
        while chunk := src.read(part_bytes):
            part = path.with_name(f"{path.name}{PART_SUFFIX}{len(parts):03d}")
            part.write_bytes(chunk)
            parts.append(part)
    path.unlink()
    return parts


def part_files(path: Path) -> list[Path]:
    """The pieces `path.part-NNN` beside `path`, in order (none when it was not split)."""
    return sorted(path.parent.glob(f"{path.name}{PART_SUFFIX}[0-9][0-9][0-9]"))


def resolve_parts(path: str | os.PathLike[str]) -> list[Path]:
    """The file itself, or its parts `FILE.part-NNN` (naming any one part finds them all)."""
    p = Path(path)
    base, sep, number = p.name.rpartition(PART_SUFFIX)
    if sep and number.isdigit():
        p = p.with_name(base)
    if p.is_file():
        return [p]
    parts = part_files(p)
    if not parts:
        raise FileNotFoundError(f"{p}: no such export (nor {p.name}{PART_SUFFIX}000, ...)")
    expected = [p.with_name(f"{p.name}{PART_SUFFIX}{i:03d}") for i in range(len(parts))]
    if parts != expected:
        raise FileNotFoundError(f"{p}: parts are missing (found {', '.join(x.name for x in parts)})")
    return parts


def read_export(path: str | os.PathLike[str]) -> dict:
    """The manifest of the export at `path` (or its parts), checked as `import_runs` checks it, with
    no store: ValueError naming the file when it is not a whole export."""
    with tempfile.TemporaryDirectory(prefix="hmer-import-") as tmp:
        return unpack_parts(resolve_parts(path), Path(tmp) / "unpacked", Path(path))


def read_to_end(archive: Path, named: str | os.PathLike[str], what: str) -> None:
    """Read the gzip stream of `archive` to its end; ValueError naming `named` when it stops short or
    fails its checksum: tarfile alone stops at the tar's end blocks, before a cut in gzip's trailer."""
    import gzip
    import zlib

    try:
        with gzip.open(archive, "rb") as stream:
            while stream.read(1 << 20):
                pass
    except (EOFError, zlib.error, OSError) as exc:  # (gzip.BadGzipFile is an OSError)
        if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
            raise
        reason = ("cut short, it ends before its compressed stream does" if isinstance(exc, EOFError)
                  else f"{type(exc).__name__}: {exc}")
        raise ValueError(f"{named}: not {what}: {reason}") from None


def unpack_parts(parts: list[Path], folder: Path, named: Path) -> dict:
    """The export in `parts` (joined beside `folder` when several) read to its end, unpacked into
    `folder`; its checked manifest, or ValueError naming `named` (the file given) and what is wrong."""
    import zlib

    archive = parts[0]
    if len(parts) > 1:
        archive = folder.parent / "joined.tar.gz"
        with archive.open("wb") as joined:
            for part in parts:
                with part.open("rb") as src:
                    shutil.copyfileobj(src, joined)
    read_to_end(archive, named, "an hmer runs export (a .tar.gz from `hmer runs export`)")

    try:
        with tarfile.open(archive, "r:gz") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(folder, filter="data")
            else:  # Python < 3.11.4: no extraction filters; refuse paths that leave the folder
                for member in tar.getmembers():
                    if member.name.startswith("/") or ".." in Path(member.name).parts:
                        raise ValueError(f"{named}: unsafe path {member.name!r}")
                tar.extractall(folder)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        if isinstance(exc, (FileNotFoundError, PermissionError)):
            raise
        raise ValueError(f"{named}: not an hmer runs export (a .tar.gz from `hmer runs export`): "
                         f"{type(exc).__name__}: {exc}") from None
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        raise ValueError(f"{named}: a tar.gz without {MANIFEST}, so not an hmer runs export") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{named}: {MANIFEST} is not JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise ValueError(f"{named}: export format {found!r}, this hmer reads {FORMAT}")
    experiments, runs = manifest.get("experiments"), manifest.get("runs")
    if not isinstance(experiments, list) or not isinstance(runs, list):
        raise ValueError(f"{named}: {MANIFEST} lacks its experiments or runs lists")
    for i, rec in enumerate(runs):
        missing = [k for k in ("run_id", "experiment", "tags", "params", "metrics")
                   if not isinstance(rec, dict) or k not in rec]
        if missing:
            raise ValueError(f"{named}: run record {i} of {MANIFEST} lacks {', '.join(missing)}")
        if rec["experiment"] not in experiments:
            raise ValueError(f"{named}: run {rec['run_id']} names experiment {rec['experiment']!r}, "
                             f"which the export does not list")
    return manifest
