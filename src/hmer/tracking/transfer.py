"""Move MLflow runs between stores as one file: `hmer runs export` and `hmer runs import`.

The file is a gzipped tar: `hmer-runs.json` (experiments; per run its info, params, tags and every
metric's full history) followed by `artifacts/<run id>/...`. `--part-mb N` splits it into
`FILE.part-000`, ... of at most N MiB (a GPU machine returns files of at most 16 MiB); naming the
file or any part finds them all (`resolve_parts`). Before an import touches a store, the file is read
to its end (a file cut short is refused), unpacked and its manifest checked (`unpack_parts`);
`read_export` does the same without a store.

The import uses MLflow's public client API only (SQLite and servers alike), which gives each created
run a new id, so the original is kept as `hmer.source_run_id` (unless already set) and the import
merges by it: a file imported twice, or successive slices of one campaign, never duplicate a run. A
copy at least as recent (end time) as the store's wins (status, tags; tags it lacks are removed, e.g.
the `hmer.error` of an interruption since resumed); an older one only adds what is missing. Parent
links are remapped to the new ids; a parent in neither file nor store is kept only as
`hmer.source_parent_run_id`.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ..atomic import write_atomically
from . import keys
from .store import ensure_experiment, search_all_runs
from .lock import database_store_lock
from .portable import download_run_artifact, list_run_artifacts
from .run import log_batch, log_params, set_tags

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


def join_parts(parts: list[Path], joined: Path) -> Path:
    """The one file the `parts` of a split file make: the first part where it is alone, else `joined`."""
    if len(parts) == 1:
        return parts[0]
    with joined.open("wb") as dst:
        for part in parts:
            with part.open("rb") as src:
                shutil.copyfileobj(src, dst)
    return joined


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

    archive = join_parts(parts, folder.parent / "joined.tar.gz")
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


_TERMINAL = ("FINISHED", "FAILED", "KILLED")


@dataclass
class ExportResult:
    files: list[Path]
    runs: int
    omitted_artifacts: list[str] = field(default_factory=list)  # "<run id>/<path> (<bytes>)"


@dataclass
class ImportResult:
    created: list[str] = field(default_factory=list)   # new run ids
    updated: list[str] = field(default_factory=list)   # run ids already there, brought up to date
    id_map: dict[str, str] = field(default_factory=dict)  # source run id -> run id in this store


def _client(tracking_uri: str | None):
    from .store import mlflow_client, quiet_mlflow

    quiet_mlflow()
    return mlflow_client(tracking_uri)


def source_id(run) -> str:
    """The id a run is known by across stores: its `hmer.source_run_id` tag, else its own id."""
    return run.data.tags.get(keys.SOURCE_RUN_ID) or run.info.run_id


def find_by_source_id(client, run_id: str) -> str | None:
    """The run of this store whose `hmer.source_run_id` is `run_id` (an imported run), or None."""
    found = search_all_runs(client, filter_string=f"tags.`{keys.SOURCE_RUN_ID}` = '{run_id}'")
    return found[0].info.run_id if found else None


def export_runs(out_file: str | os.PathLike[str], *, tracking_uri: str | None = None,
                experiments: Sequence[str] | None = None, run_ids: Sequence[str] | None = None,
                max_artifact_mb: float = 0.0, part_mb: float = 0.0) -> ExportResult:
    """Write the runs of `experiments` (names; default: all), or `run_ids`, to `out_file`: artifacts
    over `max_artifact_mb` (0: no limit) left out and listed, split into parts over `part_mb`."""
    from mlflow.entities import ViewType

    client = _client(tracking_uri)
    exps = {e.experiment_id: e for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)}
    if run_ids:
        runs = [client.get_run(r) for r in run_ids]
    else:
        chosen = list(exps)
        if experiments:
            by_name = {e.name: i for i, e in exps.items()}
            missing = [n for n in experiments if n not in by_name]
            if missing:
                raise ValueError(f"no experiment named {', '.join(missing)} in {client.tracking_uri}")
            chosen = [by_name[n] for n in experiments]
        runs = search_all_runs(client, chosen)
    for run in runs:  # run ids given explicitly may live in experiments the listing did not cover
        if run.info.experiment_id not in exps:
            exps[run.info.experiment_id] = client.get_experiment(run.info.experiment_id)
    out = Path(out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    for old in part_files(out):
        old.unlink()
    limit = int(max_artifact_mb * 2**20) if max_artifact_mb > 0 else 0
    omitted: list[str] = []
    records = []
    with tempfile.TemporaryDirectory(prefix="hmer-export-") as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "artifacts").mkdir()  # an export of no runs is an empty one, not an error
        for run in runs:
            rid = run.info.run_id
            history = {key: [[m.value, m.timestamp, m.step] for m in client.get_metric_history(rid, key)]
                       for key in run.data.metrics}
            folder = tmp_path / "artifacts" / rid
            folder.mkdir(parents=True)
            # (through the portable-store resolution: a committed store is read from any folder)
            for name in list_run_artifacts(client, rid):
                download_run_artifact(client, rid, name, str(folder))
            for f in sorted(p for p in folder.rglob("*") if p.is_file()):
                size = f.stat().st_size
                if limit and size > limit:
                    omitted.append(f"{rid}/{f.relative_to(folder).as_posix()} ({size} bytes)")
                    f.unlink()
            info = run.info
            records.append({
                "run_id": rid, "experiment": exps[info.experiment_id].name, "run_name": info.run_name,
                "status": info.status, "start_time": info.start_time, "end_time": info.end_time,
                "params": dict(run.data.params), "tags": dict(run.data.tags), "metrics": history,
            })
        names = sorted({r["experiment"] for r in records})
        manifest = {
            "format": FORMAT, "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "tracking_uri": client.tracking_uri, "experiments": names,
            "experiment_tags": {e.name: dict(e.tags) for e in exps.values() if e.name in names},
            "runs": records, "omitted_artifacts": omitted,
        }
        (tmp_path / MANIFEST).write_text(json.dumps(manifest, indent=1))

        def pack(f) -> None:
            with tarfile.open(fileobj=f, mode="w:gz") as tar:
                tar.add(tmp_path / MANIFEST, arcname=MANIFEST)  # first: a reader can stop after it
                tar.add(tmp_path / "artifacts", arcname="artifacts")
        write_atomically(out, pack)
    files = split_file(out, int(part_mb * 2**20))
    return ExportResult(files=files, runs=len(records), omitted_artifacts=omitted)


def import_runs(path: str | os.PathLike[str], *, tracking_uri: str | None = None) -> ImportResult:
    """Merge the export at `path` (or its parts) into the store; see the module docstring."""
    client = _client(tracking_uri)
    parts = resolve_parts(path)
    result = ImportResult()
    with tempfile.TemporaryDirectory(prefix="hmer-import-") as tmp:
        unpacked = Path(tmp) / "unpacked"
        manifest = unpack_parts(parts, unpacked, Path(path))  # a bad file fails here, before the store is touched
        with database_store_lock(client.tracking_uri, f"hmer runs import {Path(path).resolve()}"):
            _merge(client, manifest, unpacked, Path(path), result)
    return result


def _merge(client, manifest: dict, unpacked: Path, path: Path, result: ImportResult) -> None:
    """The checked export unpacked in `unpacked` merged into the store (`import_runs`)."""
    label = Path(path).name.split(PART_SUFFIX)[0]
    exp_ids = {name: ensure_experiment(client, name, manifest.get("experiment_tags", {}).get(name, {}))
               for name in manifest["experiments"]}
    existing = {r.data.tags[keys.SOURCE_RUN_ID]: r.info.run_id
                for r in search_all_runs(client, filter_string=f"tags.`{keys.SOURCE_RUN_ID}` != ''")}
    for rec in _parents_first(manifest["runs"]):
        src = rec["tags"].get(keys.SOURCE_RUN_ID) or rec["run_id"]
        target = existing.get(src)
        if target is None and _run_exists(client, src):
            target = src  # the very store it came from
        new_tags = {k: v for k, v in rec["tags"].items()
                    if k not in (keys.MLFLOW_PARENT_RUN_ID, keys.MLFLOW_RUN_NAME)}
        new_tags[keys.SOURCE_RUN_ID] = src
        new_tags[keys.IMPORTED_FROM] = new_tags.get(keys.IMPORTED_FROM) or label
        parent = rec["tags"].get(keys.MLFLOW_PARENT_RUN_ID)
        if parent:
            parent_src = next((r["tags"].get(keys.SOURCE_RUN_ID) or r["run_id"] for r in manifest["runs"]
                               if r["run_id"] == parent), parent)
            mapped = result.id_map.get(parent_src) or existing.get(parent_src) or (
                parent_src if _run_exists(client, parent_src) else None)
            if mapped:
                new_tags[keys.MLFLOW_PARENT_RUN_ID] = mapped
            else:
                new_tags[keys.SOURCE_PARENT_RUN_ID] = parent_src
        if target is None:
            run = client.create_run(exp_ids[rec["experiment"]], start_time=rec.get("start_time"),
                                    tags=new_tags, run_name=rec.get("run_name"))
            target = run.info.run_id
            result.created.append(target)
            newer = True
        else:
            result.updated.append(target)
            have = client.get_run(target)
            newer = (rec.get("end_time") or 0) >= (have.info.end_time or 0)
            if newer:
                set_tags(client, target, new_tags)
                for key in set(have.data.tags) - set(new_tags):
                    if not key.startswith("mlflow.") and key != keys.MLFLOW_PARENT_RUN_ID:
                        client.delete_tag(target, key)  # e.g. hmer.error of an interruption since resumed
            else:
                set_tags(client, target, {k: v for k, v in new_tags.items() if k not in have.data.tags})
        result.id_map[src] = target
        have = client.get_run(target).data.params  # a param keeps the value it has: MLflow params are write-once
        log_params(client, target, {k: v for k, v in rec["params"].items() if k not in have})
        _merge_metrics(client, target, rec["metrics"])
        folder = unpacked / "artifacts" / rec["run_id"]
        if folder.is_dir() and any(folder.iterdir()):
            client.log_artifacts(target, str(folder))
        status = rec.get("status")
        if status in _TERMINAL and newer:
            client.set_terminated(target, status=status, end_time=rec.get("end_time"))


def _run_exists(client, run_id: str) -> bool:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id).info.lifecycle_stage == "active"
    except MlflowException:
        return False


def _parents_first(records: list[dict]) -> list[dict]:
    by_id = {r["run_id"]: r for r in records}
    ordered, seen = [], set()

    def visit(rec, depth=0):
        if rec["run_id"] in seen or depth > len(records):
            return
        parent = by_id.get(rec["tags"].get(keys.MLFLOW_PARENT_RUN_ID, ""))
        if parent is not None:
            visit(parent, depth + 1)
        seen.add(rec["run_id"])
        ordered.append(rec)

    for rec in records:
        visit(rec)
    return ordered


def _merge_metrics(client, run_id: str, history: dict[str, list]) -> None:
    from mlflow.entities import Metric

    have_keys = client.get_run(run_id).data.metrics
    items = []
    for key, points in history.items():
        # repr: NaN != NaN, but its repr equals itself, so a NaN point is not logged twice
        have = {(repr(m.value), m.timestamp, m.step) for m in client.get_metric_history(run_id, key)} \
            if key in have_keys else set()
        items += [Metric(key, float(v), int(ts), int(step)) for v, ts, step in points
                  if (repr(float(v)), int(ts), int(step)) not in have]
    log_batch(client, run_id, "metrics", items)

