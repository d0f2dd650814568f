"""A run carried to another machine as one file: its MLflow record and the smallest checkpoint that
continues it (docs/training.md, "One run across machines"; what it leaves out and what that changes):
`pack_run` where it trained, `unpack_run` where it goes on, then `hmer train --resume`.

For machines lent for minutes (a GPU lease: 64 MiB in, 16 MiB files back). One gzipped tar (fp32 weights shrink
by about a twelfth, 24.6 to 22.6 MiB for `comer-fusion`, in about 3 s): `carried.json` (first id, epoch, what was
left out), `run.tar.gz` (`hmer runs export`, artifacts up to 1 MiB) and `last.pt`
(`resume.standalone_continuation`).
"""

from __future__ import annotations

import json
import os
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from ..atomic import write_atomically
from ..checkpoint import atomic_torch_save, load_checkpoint, weights_artifact
from ..data import Vocab
from ..tracking.store import checkpoint_root, mlflow_client, quiet_mlflow
from ..tracking.transfer import export_runs, import_runs, join_parts, read_to_end, resolve_parts, source_id
from .resume import standalone_continuation

FORMAT = 1
MANIFEST = "carried.json"
RUN_EXPORT = "run.tar.gz"
CHECKPOINT = "last.pt"
MAX_ARTIFACT_MB = 1.0  # a run's logs, config and split lists travel; its model files do not


@dataclass
class Carried:
    """What a carried file holds, or where `unpack_run` put it."""

    source_run_id: str   # the run's id where it began: the same on every machine
    run_id: str          # the run's id in the store it was packed from, or unpacked into
    epoch: int           # the last epoch done
    epochs: int          # the epochs the run trains in all
    weights: str         # "last" (training goes on) or "best" (epochs done: the test years remain)
    optimizer_state: bool
    best_reset: bool
    checkpoint: Path | None = None  # unpacked: the checkpoint to resume from

    @property
    def done(self) -> bool:
        return self.epoch >= self.epochs


def pack_run(run_id: str, out_file: str | os.PathLike[str], *, tracking_uri: str | None = None,
             checkpoint: str | os.PathLike[str] | None = None, optimizer_state: bool = False) -> Carried:
    """Write run `run_id` (its record and `checkpoint`, default `checkpoints/<run id>/last.pt`) to `out_file`."""
    quiet_mlflow()
    client = mlflow_client(tracking_uri)
    run = client.get_run(run_id)
    last = Path(checkpoint) if checkpoint else checkpoint_root(tracking_uri) / run_id / CHECKPOINT
    ckpt = load_checkpoint(last)
    epoch, epochs = int(ckpt["epoch"]), int(ckpt["config"]["train"]["epochs"])
    best_path = last.parent / "best.pt"
    best = load_checkpoint(best_path) if best_path.is_file() else None
    ckpt, weights, best_reset = standalone_continuation(ckpt, best, lambda e: epoch_readings(client, run_id, e),
                                                        optimizer_state=optimizer_state)
    carried = Carried(source_run_id=source_id(run), run_id=run_id, epoch=epoch, epochs=epochs, weights=weights,
                      optimizer_state=optimizer_state, best_reset=best_reset)
    out = Path(out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hmer-carry-") as tmp:
        folder = Path(tmp)
        export_runs(folder / RUN_EXPORT, tracking_uri=tracking_uri, run_ids=[run_id], max_artifact_mb=MAX_ARTIFACT_MB)
        torch.save(ckpt, folder / CHECKPOINT)
        fields = {k: v for k, v in vars(carried).items() if k != "checkpoint"}
        (folder / MANIFEST).write_text(json.dumps({"format": FORMAT, **fields}, indent=1))

        def pack(f) -> None:
            with tarfile.open(fileobj=f, mode="w:gz", compresslevel=6) as tar:
                for name in (MANIFEST, RUN_EXPORT, CHECKPOINT):
                    tar.add(folder / name, arcname=name)

        write_atomically(out, pack)
    return carried


def epoch_readings(client, run_id: str, epoch: int) -> tuple[float, float]:
    """Run `run_id`'s validation ExpRate and within-one-edit rate at `epoch` (-1 where not logged)."""
    history = {key: {m.step: m.value for m in client.get_metric_history(run_id, key)}
               for key in ("val_exprate", "val_le1")}
    return history["val_exprate"].get(epoch, -1.0), history["val_le1"].get(epoch, -1.0)


def read_carried(path: str | os.PathLike[str]) -> Carried:
    """What the carried file at `path` (or its `.part-NNN` pieces) holds, without unpacking it."""
    with tempfile.TemporaryDirectory(prefix="hmer-carry-") as tmp:
        return _extract(path, Path(tmp))[0]


def unpack_run(path: str | os.PathLike[str], *, tracking_uri: str | None = None,
               checkpoints: str | os.PathLike[str] | None = None, data_path: str | None = None) -> Carried:
    """Merge the carried run into the store; its `last.pt` and `best.pt` go to `checkpoints`/<its id here>/
    (default `tracking.store.checkpoint_root`). `data_path`: this machine's data (the config names the old one's)."""
    with tempfile.TemporaryDirectory(prefix="hmer-carry-") as tmp:
        folder = Path(tmp)
        carried, ckpt = _extract(path, folder)
        imported = import_runs(folder / RUN_EXPORT, tracking_uri=tracking_uri)
        run_id = imported.id_map[carried.source_run_id]
        target = Path(checkpoints or checkpoint_root(tracking_uri)) / run_id
        here = target / CHECKPOINT
        if here.is_file() and int(load_checkpoint(here)["epoch"]) > carried.epoch:
            raise ValueError(f"{path}: run {run_id} is at epoch {load_checkpoint(here)['epoch']} in {here}, "
                             f"past the carried epoch {carried.epoch}; nothing was changed but the run's record")
        ckpt["run_id"] = run_id
        if data_path:
            ckpt["config"]["data"]["path"] = str(data_path)
        # The carried weights are the best's (see pack_run), so the run's best.pt is them.
        best = ckpt["best_epoch"] if carried.weights == "best" else carried.epoch
        atomic_torch_save(weights_artifact(ckpt["model"], ckpt["config"], list(Vocab().itos), int(best),
                                           float(ckpt["best_val_exprate"])), target / "best.pt")
        atomic_torch_save(ckpt, here)
    carried.run_id, carried.checkpoint = run_id, here
    return carried


def _extract(path: str | os.PathLike[str], folder: Path) -> tuple[Carried, dict]:
    """Unpack the carried file into `folder`: (what it holds, its checkpoint), or a ValueError saying why not."""
    parts = resolve_parts(path)
    joined = join_parts(parts, folder / "joined.tar")
    read_to_end(joined, path, "a carried run (a .tar.gz from pack_run)")
    try:
        with tarfile.open(joined, "r:gz") as tar:  # as pack_run writes it
            tar.extractall(folder, filter="data")
    except (tarfile.TarError, EOFError, OSError) as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{path}: not a carried run (a .tar.gz from pack_run): {reason}") from None
    if joined not in parts:  # the copy the parts were joined into, never the carried file itself
        joined.unlink()
    missing = [name for name in (MANIFEST, RUN_EXPORT, CHECKPOINT) if not (folder / name).is_file()]
    if missing:
        raise ValueError(f"{path}: not a carried run: it lacks {', '.join(missing)}")
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except ValueError as exc:
        raise ValueError(f"{path}: {MANIFEST} is not JSON ({exc})") from None
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: carried-run format {manifest.get('format')!r}, this hmer reads {FORMAT}")
    manifest.pop("format")
    try:
        carried = Carried(**manifest)
    except TypeError as exc:
        raise ValueError(f"{path}: {MANIFEST} does not describe a carried run ({exc})") from None
    return carried, load_checkpoint(folder / CHECKPOINT)
