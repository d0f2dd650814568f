"""The rendered cache: every split's images, rendered once, so training never waits on InkML.

One `.npz` per split (pixels in one buffer, bit packed when binary), read back as views into one
uint8 buffer; its file name hashes everything the pixels depend on, so stale entries are never read.
Entries are written whole or not at all (`hmer.atomic`). Where, the key and timings: docs/data.md,
"The rendered cache".
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Sequence

import numpy as np

from ..atomic import write_atomically
from .errors import DataError, ImageReadError, InkMLError
from .images import decode_image, file_to_image
from .inkml import parse_inkml
from .render import RenderConfig
from .source import DatasetSource, open_source, repo_root

log = logging.getLogger(__name__)

CACHE_FORMAT = 2  # bump when the .npz layout changes
# Below this many files, starting worker processes costs more than it saves.
_MIN_FILES_FOR_POOL = 64


def cache_dir() -> Path:
    """$HMER_CACHE, else <repo>/.cache/hmer, else ~/.cache/hmer."""
    env = os.environ.get("HMER_CACHE")
    if env:
        return Path(env).expanduser()
    root = repo_root()
    return (root / ".cache" / "hmer") if root else Path.home() / ".cache" / "hmer"


def default_workers() -> int:
    """All the cores this process may run on (all the machine's where the system does not say: not Linux)."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


@dataclass
class LoadedImages:
    """Images by name, and the names whose file could not be read (with the reason)."""

    images: dict[str, np.ndarray]
    failures: dict[str, str] = field(default_factory=dict)
    from_cache: bool = False


def cache_key(source: DatasetSource, split: str, names: Sequence[str], render_cfg: RenderConfig | None) -> str:
    """A hash of everything the split's cached pixels depend on (see the module docstring); with no
    `render_cfg`, of what its strokes depend on (`hmer.data.augment.load_strokes`)."""
    payload = {"format": CACHE_FORMAT, "source": source.identity(split), "split": split,
               "names": hashlib.sha256("\n".join(names).encode()).hexdigest()}
    if render_cfg is not None:
        payload["render"] = render_cfg.key()
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:20]


def load_images(source: DatasetSource, split: str, names: Sequence[str], files: Sequence[str],
                render_cfg: RenderConfig, *, strict: bool = False, use_cache: bool = True,
                workers: int | None = None) -> LoadedImages:
    """The image of each `names[i]` (from `files[i]` of the split), via the cache when allowed;
    unreadable files are collected in `failures`, or raise at the first one when `strict`."""
    path = cache_dir() / f"{split}-{cache_key(source, split, names, render_cfg)}.npz" if use_cache else None
    if path is not None and path.is_file():
        try:
            loaded = read_cache_file(path)
        except (OSError, ValueError, KeyError) as exc:  # unreadable entry: render again
            log.warning("ignoring unreadable cache entry %s (%s)", path, exc)
        else:
            if strict and loaded.failures:
                raise DataError(next(iter(loaded.failures.values())))
            return loaded

    images: dict[str, np.ndarray] = {}
    failures: dict[str, str] = {}
    for index, image, error in _run_files(_render_one, source, split, files, render_cfg, workers, f"rendering {split}"):
        if error is not None:
            if strict:
                raise error
            failures[names[index]] = str(error)
        else:
            images[names[index]] = image
    if path is not None:
        write_cache_file(path, names, images, failures, meta={"split": split, "source": source.identity(split),
                                                             "render": render_cfg.key()})
    return LoadedImages(images=images, failures=failures)


# ---- parallel rendering ---------------------------------------------------------------------------

_worker_state: tuple[DatasetSource, str, RenderConfig] | None = None


def check_files(source: DatasetSource, split: str, files: Sequence[str],
                workers: int | None = None) -> Iterator[tuple[int, str | None, list[str]]]:
    """(index, error or None, notes) for each file, parsed or decoded unrendered (`hmer data check`)."""
    return _run_files(_check_one, source, split, files, RenderConfig(), workers, f"checking {split}")


def _run_files(work, source: DatasetSource, split: str, files: Sequence[str], render_cfg: RenderConfig,
               workers: int | None, desc: str) -> Iterator:
    """`work((index, file))` for each file, in order, with a tqdm bar on an interactive terminal; a
    process pool when there are enough files, each worker reopening the source (a zip handle cannot
    be shared)."""
    from tqdm.auto import tqdm

    workers = workers or default_workers()
    tasks = list(enumerate(files))
    progress = tqdm(total=len(tasks), desc=desc, unit="file", leave=False, disable=None)
    try:
        if workers <= 1 or len(tasks) < _MIN_FILES_FOR_POOL:
            global _worker_state
            saved, _worker_state = _worker_state, (source, split, render_cfg)
            try:
                for task in tasks:
                    yield work(task)
                    progress.update()
            finally:
                _worker_state = saved
            return
        log.info("%s: %d files with %d processes", desc, len(tasks), workers)
        # forkserver where there is one: a plain fork copies the locks the caller's other threads
        # (torch's, MLflow's, logging's) hold, and a worker that needs one waits forever (a test
        # process that had trained and logged runs hung that way).
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        with context.Pool(workers, initializer=_init_worker, initargs=(source.location, split, render_cfg)) as pool:
            chunk = max(1, min(64, len(tasks) // (workers * 8)))
            for result in pool.imap(work, tasks, chunksize=chunk):
                yield result
                progress.update()
    finally:
        progress.close()


def _init_worker(location: Path, split: str, render_cfg: RenderConfig) -> None:
    global _worker_state
    _worker_state = (open_source(location), split, render_cfg)


def _render_one(task: tuple[int, str]) -> tuple[int, np.ndarray | None, DataError | None]:
    """(index, image, None), or (index, None, the error naming the file): errors travel back from the
    worker processes whole, so that a strict load raises the worker's own."""
    index, filename = task
    assert _worker_state is not None
    source, split, cfg = _worker_state
    where = source.describe(split, filename)
    try:
        image = file_to_image(source.read_bytes(split, filename), filename, where, cfg)
    except (InkMLError, ImageReadError) as exc:
        return index, None, exc
    except (DataError, OSError) as exc:
        return index, None, DataError(_naming(where, exc))
    return index, image, None


def _naming(where: str, exc: Exception) -> str:
    """The error's message, naming the file first unless it names it already."""
    return str(exc) if where in str(exc) else f"{where}: {exc}"


def _check_one(task: tuple[int, str]) -> tuple[int, str | None, list[str]]:
    index, filename = task
    assert _worker_state is not None
    source, split, _ = _worker_state
    where = source.describe(split, filename)
    try:
        data = source.read_bytes(split, filename)
        if filename.lower().endswith(".inkml"):
            return index, None, [f"{where}: {note}" for note in parse_inkml(data, source=where).notes]
        decode_image(data, where)
    except (DataError, OSError) as exc:
        return index, _naming(where, exc), []
    return index, None, []


# ---- the .npz entries -------------------------------------------------------------------------------

def write_cache_file(path: Path, names: Sequence[str], images: dict[str, np.ndarray],
                     failures: dict[str, str], meta: dict[str, object] | None = None) -> None:
    """Pack `images` (in `names` order) into one .npz, atomically."""
    kept = [n for n in names if n in images]
    shapes = np.array([images[n].shape for n in kept], dtype=np.int32).reshape(-1, 2)
    sizes = shapes[:, 0].astype(np.int64) * shapes[:, 1]
    offsets = np.zeros(len(kept) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    pixels = np.empty(int(offsets[-1]), dtype=np.uint8)
    for i, name in enumerate(kept):
        pixels[offsets[i]:offsets[i + 1]] = images[name].reshape(-1)
    # The default renderings are binary: 1 bit per pixel makes the entry 8x smaller
    # before compression and a warm load several times faster.
    binary = not np.any((pixels != 0) & (pixels != 255))
    # Any: the checker takes a dict unpacked into savez_compressed for one that may name allow_pickle
    packed: dict[str, Any] = {"bits": np.packbits(pixels == 255)} if binary else {"pixels": pixels}

    def write(f: BinaryIO) -> None:
        np.savez_compressed(f, **packed, n_pixels=np.array(pixels.size), offsets=offsets, shapes=shapes,
                            names=np.array(kept, dtype=str), failed_names=np.array(list(failures), dtype=str),
                            failed_reasons=np.array(list(failures.values()), dtype=str),
                            meta=np.array(json.dumps(meta or {}, sort_keys=True)))
        f.flush()
        os.fsync(f.fileno())

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, write)


def read_cache_file(path: Path) -> LoadedImages:
    with np.load(path, allow_pickle=False) as npz:
        offsets, shapes = npz["offsets"], npz["shapes"]
        if "bits" in npz.files:
            pixels = np.unpackbits(npz["bits"], count=int(npz["n_pixels"]))
            pixels *= 255
        else:
            pixels = npz["pixels"]
        names = npz["names"].tolist()
        failures = dict(zip(npz["failed_names"].tolist(), npz["failed_reasons"].tolist()))
    images = {name: pixels[offsets[i]:offsets[i + 1]].reshape(int(shapes[i, 0]), int(shapes[i, 1]))
              for i, name in enumerate(names)}
    return LoadedImages(images=images, failures=failures, from_cache=True)
