"""The GPU campaign's steps that need torch and the project (tools/gpu_campaign.py runs them).

On the leased machine, as subprocesses of the lease, in the project's environment:

    python3 tools/gpu_campaign_steps.py check --device cuda --preset comer-fusion --share 8
    python3 tools/gpu_campaign_steps.py carry-in .gpu/carried.tar.gz --data <home>/data/crohme.zip
    python3 tools/gpu_campaign_steps.py wrap-up --home <home> --out $OUT --device cuda

On the session's machine, through `tools/gpu_campaign.py prepare | home | pack-data`.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_campaign_plan import BENCH_EXPERIMENT, CARRIED, STANDARD_2014  # noqa: E402
from lease import PART_MB  # noqa: E402

if TYPE_CHECKING:
    from hmer.training.carry import Carried

CALL_MB = 64  # what one device call carries: the working tree and the carried paths together
# Taken out of the index for the call (the committed store alone is 340 MB; the notebooks' outputs
# 4 MB that a lease does not read): `prepare` prints the git commands, before and after.
LEFT_OUT = ("mlruns", "notebooks")


# ---- on the leased machine --------------------------------------------------------------------------

def check(args) -> int:
    """CUDA and bf16 there, one training step of the preset, and the memory share of `--share` processes."""
    import torch

    from hmer.bench import run_benchmark
    from hmer.device import GPU_SHARE, share_device

    print(f"torch {torch.__version__}; cuda available: {torch.cuda.is_available()}")
    gpu = args.device != "cpu"
    if gpu:
        if not torch.cuda.is_available():
            print("no CUDA device: nothing else to check")
            return 1
        print(f"device: {torch.cuda.get_device_name(0)}; bf16 supported: {torch.cuda.is_bf16_supported()}")
        print(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip())
    buf = io.StringIO()
    t0 = time.monotonic()
    # One training step (bf16 on a GPU), synthetic batch: the preset builds, runs and steps.
    run_benchmark("train", preset=args.preset, device=args.device, images=1,
                  overrides=["bench.pool=16", "bench.warmup=0", "bench.flop_batches=0"], out=buf)
    print(f"one training step of {args.preset}: ok, {time.monotonic() - t0:.1f} s")
    if gpu:
        # One of --share processes: an allocation past its share of the memory is refused.
        device = torch.device("cuda")
        total = torch.cuda.get_device_properties(device).total_memory
        share_device(device, args.share)
        limit = total * GPU_SHARE / args.share
        fits = torch.empty(int(limit * 0.8), dtype=torch.uint8, device=device)
        del fits
        try:
            torch.empty(int(limit * 1.05), dtype=torch.uint8, device=device)
        except torch.OutOfMemoryError:
            print(f"memory share of 1 in {args.share}: {limit / 2**30:.1f} of {total / 2**30:.1f} GiB; "
                  f"an allocation past it was refused: ok")
        else:
            print(f"memory share of 1 in {args.share}: an allocation past {limit / 2**30:.1f} GiB was NOT refused")
            return 1
    return 0


def carry_in(args) -> int:
    """The carried run merged into this machine's store (the MLflow home), its checkpoint in place."""
    from hmer.training.carry import unpack_run

    carried = unpack_run(args.carried, data_path=args.data)
    print(f"carried run {carried.run_id} (first id {carried.source_run_id}) at epoch {carried.epoch} of "
          f"{carried.epochs}, {carried.weights} weights, optimiser state "
          f"{'carried' if carried.optimizer_state else 'restarted'}: {carried.checkpoint}")
    return 0


def wrap_up(args) -> int:
    """Bench figures as MLflow runs, the campaign's run packed (while unfinished), every run exported."""
    from mlflow.entities import Metric, Param, RunTag

    from hmer.device import device_description, resolve_device
    from hmer.tracking import keys
    from hmer.tracking.store import checkpoint_root, ensure_experiment, git_commit, mlflow_client
    from hmer.tracking.transfer import split_file
    from hmer.tracking.transfer import export_runs
    from hmer.training.carry import pack_run

    home, out = Path(args.home), Path(args.out)
    record = json.loads((home / "campaign.json").read_text())
    client = mlflow_client()
    commit = os.environ.get("HMER_GIT_COMMIT") or git_commit()  # the device's copy has no git history
    device = device_description(resolve_device(args.device))
    for r in record["bench"]:
        if r.get("mlflow_run") or r.get("status") != "done":
            continue
        exp = ensure_experiment(client, BENCH_EXPERIMENT, {})
        run = client.create_run(exp, run_name=f"{r['what']} {r['preset']} {r['setting']}", tags={
            keys.ROLE: "benchmark", keys.DEVICE: device, keys.GIT_COMMIT: commit, keys.VARIANT: r["preset"],
            "hmer.command": r.get("command", "")})
        params = [Param("what", r["what"]), Param("preset", r["preset"]), Param("setting", r["setting"]),
                  Param("overrides", " ".join(r.get("overrides", [])) or "-")]
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, 0) for k, v in r.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)]
        client.log_batch(run.info.run_id, metrics=metrics, params=params)
        client.set_terminated(run.info.run_id)
        r["mlflow_run"] = run.info.run_id
    (home / "campaign.json").write_text(json.dumps(record, indent=1))
    run_id = record["train"].get("run_id")
    if run_id:
        run = client.get_run(run_id)
        if run.data.tags.get(keys.GIT_COMMIT, "unknown").startswith("unknown") and commit:
            client.log_batch(run_id, tags=[RunTag(keys.GIT_COMMIT, commit)])
        checkpoint = checkpoint_root() / run_id / "last.pt"
        if run.info.status != "FINISHED" and checkpoint.is_file():
            carried = pack_run(run_id, out / "carried.tar.gz")
            parts = split_file(out / "carried.tar.gz", PART_MB * 2**20)
            print(f"carried run {run_id} at epoch {carried.epoch} of {carried.epochs}: "
                  + ", ".join(f"{p.name} ({p.stat().st_size / 2**20:.1f} MiB)" for p in parts))
    res = export_runs(out / "runs.tar.gz", part_mb=PART_MB)
    print(f"exported {res.runs} runs: {', '.join(f.name for f in res.files)}")
    return 0


# ---- on the session's machine ---------------------------------------------------------------------

def prepare(args) -> int:
    """Before a lease: the packed data and the carried run in .gpu/, then what the call carries, checked
    against its 64 MiB, and the call to make."""
    gpu = REPO / args.gpu_dir
    gpu.mkdir(exist_ok=True)
    data = gpu / "crohme.zip"
    if not _packed_with_writers(data):  # packed before the data kept its writers: packed again
        pack_data(argparse.Namespace(src=args.data, out=str(data)))
    keep, carried = REPO / args.keep, gpu / CARRIED.name
    for old in carried.parent.glob(carried.name + "*"):
        old.unlink()
    if keep.is_file():
        from hmer.training.carry import read_carried

        shutil.copyfile(keep, carried)
        c = read_carried(carried)
        print(f"carried run {c.source_run_id}: epoch {c.epoch} of {c.epochs} done ({args.keep} -> {carried})")
    else:
        print(f"no {args.keep}: the lease starts the campaign's run")
    standard = Path(args.data).parent / STANDARD_2014
    sizes = {f"working tree ({', '.join(f'{n}/' for n in LEFT_OUT)} out of the index)": _tree_bytes(),
             args.wheels: _folder_bytes(REPO / args.wheels), args.gpu_dir: _folder_bytes(gpu)}
    room = CALL_MB * 2**20 - sum(sizes.values())
    if standard.is_file() and not (gpu / STANDARD_2014).is_file() and standard.stat().st_size < room:
        shutil.copyfile(standard, gpu / STANDARD_2014)  # for test_2014-std, in the lease that finishes the run
        sizes[args.gpu_dir] = _folder_bytes(gpu)
    total = sum(sizes.values())
    for what, size in sizes.items():
        print(f"  {what}: {size / 2**20:.1f} MiB")
    print(f"  the call carries {total / 2**20:.1f} MiB of its {CALL_MB} MiB")
    if not (REPO / args.wheels).is_dir():
        print(f"no {args.wheels}/: run ../shared/device/fetch-wheels.sh first")
        return 1
    if total > CALL_MB * 2**20:
        print(f"over the {CALL_MB} MiB a call carries: leave something out of the working tree or .gpu/")
        return 1
    left_out = " ".join(LEFT_OUT)
    excluded = "".join(f"/{n}/\\n" for n in LEFT_OUT)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    print("the lease, from this checkout:")
    print(f"  git rm -r -q --cached {left_out} && printf '{excluded}' >> .git/info/exclude")
    print(f'  run(command="HMER_GIT_COMMIT={commit} python3 tools/gpu_campaign.py lease", '
          f'carry=["{args.wheels}", "{args.gpu_dir}"], timeout_s=600)')
    print(f"  git reset -q -- {left_out} && sed -i '" + "; ".join(f"\\#^/{n}/$#d" for n in LEFT_OUT)
          + "' .git/info/exclude")
    print("then: python tools/gpu_campaign.py home <files_at>")
    return 0


def _tree_bytes() -> int:
    """The working tree a device call sends, with LEFT_OUT taken out of the index for the call."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.split(b"\0")
    names = {n.decode() for n in listed if n and not n.decode().startswith(tuple(f"{p}/" for p in LEFT_OUT))}
    return sum((REPO / n).stat().st_size for n in names if (REPO / n).is_file())


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else 0


def home(args) -> int:
    """After a lease: its runs merged into the store, the carried run kept for the next lease (or let
    go when the run has finished).

    All or nothing: everything that came back is checked before the store is touched (the status,
    each file it lists there and of the size it left with, no piece of another lease, every archive
    read to its end, the carried run against the kept one); a problem is one line naming the file,
    exit status 2, and nothing changed. The merge then holds the store's lock (a second `home` or a
    publish is refused meanwhile); it is keyed by each run's first id (`hmer runs import`) and the
    kept file is replaced whole after the runs are in, so that `home` run again after a failure or a
    kill finishes the merge without duplicating a run."""
    files = Path(args.files)
    keep = REPO / args.keep if not Path(args.keep).is_absolute() else Path(args.keep)
    back = check_returned(files)
    came, new = back.carried, back.carried_run
    from hmer.atomic import write_atomically
    from hmer.tracking.lock import database_store_lock
    from hmer.tracking.store import default_tracking_uri
    from hmer.tracking.transfer import import_runs, resolve_parts

    if new is not None and keep.is_file():
        from hmer.training.carry import read_carried

        old = read_carried(keep)
        if old.source_run_id != new.source_run_id:
            raise ValueError(f"{came}: run {new.source_run_id}, but {args.keep} holds the campaign's run "
                             f"{old.source_run_id}; nothing merged or kept (remove {args.keep} to start another)")
        if new.epoch < old.epoch:
            raise ValueError(f"{came}: epoch {new.epoch}, older than {args.keep}'s {old.epoch}; nothing merged or kept")
    uri = args.tracking_uri or default_tracking_uri()
    with database_store_lock(uri, f"gpu_campaign.py home {files.resolve()}"):
        res = import_runs(back.runs, tracking_uri=uri)
        print(f"runs: {len(res.created)} created, {len(res.updated)} brought up to date")
        for src, rid in res.id_map.items():
            print(f"  {src} -> {rid}")
        if came is not None and new is not None:
            keep.parent.mkdir(parents=True, exist_ok=True)
            parts = resolve_parts(came)

            def joined(out) -> None:
                for part in parts:
                    with part.open("rb") as src:
                        shutil.copyfileobj(src, out)

            write_atomically(keep, joined)
            print(f"kept run {new.source_run_id} at epoch {new.epoch} of {new.epochs} in {args.keep} "
                  f"({keep.stat().st_size / 2**20:.1f} MiB): commit it; `prepare` carries it to the next lease")
        elif back.status.get("train", {}).get("finished") and keep.is_file():
            keep.unlink()
            print(f"the campaign's run has finished: {args.keep} removed (git rm it)")
        else:
            print(f"no carried run came back; {args.keep} is left as it was")
    return 0


@dataclass
class Returned:
    """What a lease's $OUT brought back, checked whole (`check_returned`)."""

    status: dict  # status.json
    runs: Path  # the runs export (or the name of its pieces)
    carried: Path | None  # the carried run (or the name of its pieces), when one came back
    carried_run: Carried | None  # what it holds


def check_returned(files: Path) -> Returned:
    """What a lease's $OUT brought back to `files`, checked whole without changing anything. A
    ValueError names the first file that is missing, cut short, not listed or not what it should be.
    The cheap checks come first, before the project's modules are imported (torch takes seconds)."""
    if not files.is_dir():
        raise ValueError(f"{files}: no such folder (give the folder that the lease's $OUT came back to)")
    status_path = files / "status.json"
    if not status_path.is_file():
        raise ValueError(f"{status_path}: missing, so not a lease's whole $OUT (the lease writes it last)")
    try:
        status = json.loads(status_path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{status_path}: not JSON, cut short? ({exc})") from None
    listed = status.get("files") if isinstance(status, dict) else None
    if not isinstance(listed, list) or not all(isinstance(n, str) and n and "/" not in n for n in listed) \
            or not isinstance(status.get("train", {}), dict):
        raise ValueError(f"{status_path}: not a lease's status (no list of the files it sent back)")
    for name in listed:
        if not (files / name).is_file():
            raise ValueError(f"{files / name}: missing; {status_path.name} lists it among the lease's files")
    sizes = status.get("sizes") or {}  # (leases before issue 59 recorded none)
    for name, size in sizes.items() if isinstance(sizes, dict) else ():
        if name in listed and (files / name).stat().st_size != size:
            raise ValueError(f"{files / name}: {(files / name).stat().st_size} bytes, but it left the lease with "
                             f"{size} ({status_path.name}): cut short in transfer?")
    from hmer.tracking.transfer import PART_SUFFIX, read_export, resolve_parts

    for piece in sorted(files.glob(f"*{PART_SUFFIX}*")):
        if piece.name not in listed:
            raise ValueError(f"{piece}: not among the files that {status_path.name} lists: another lease's?")
    for base in sorted({name.split(PART_SUFFIX)[0] for name in listed if PART_SUFFIX in name}):
        try:
            pieces = resolve_parts(files / base)
        except FileNotFoundError as exc:
            raise ValueError(str(exc)) from None
        # (what a status without sizes still tells) split_file cuts every piece but the last at
        # one size (lease.PART_MB), and the last is no larger
        cut = pieces[0].stat().st_size
        for piece in pieces[1:]:
            size = piece.stat().st_size
            if size > cut or (size != cut and piece != pieces[-1]):
                raise ValueError(f"{piece if size < cut else pieces[0]}: {min(size, cut)} bytes, where the pieces "
                                 f"of {base} are cut at {max(size, cut)} but the last: cut short in transfer?")

    def came_back(name: str) -> Path | None:
        return files / name if name in listed or f"{name}{PART_SUFFIX}000" in listed else None

    runs = came_back("runs.tar.gz")
    if runs is None:
        steps = status.get("steps")
        wrapup = steps.get("wrap-up", {}).get("status", "unknown") if isinstance(steps, dict) else "unknown"
        raise ValueError(f"{files}: no runs.tar.gz among the lease's files (its wrap-up: {wrapup}): nothing to merge")
    read_export(runs)  # read to its end and checked as the import checks it
    carried, carried_run = came_back("carried.tar.gz"), None
    if carried is not None:
        from hmer.training.carry import read_carried

        carried_run = read_carried(carried)
    return Returned(status=status, runs=runs, carried=carried, carried_run=carried_run)


def _packed_with_writers(data: Path) -> bool:
    from hmer.data.source import WRITER_FILE, open_source

    if not data.is_file():
        return False
    with open_source(data) as source:
        return source.read_optional("train", WRITER_FILE) is not None


def pack_data(args) -> int:
    """The dataset as 1-bit PNGs in the `data/<split>/` layout (`hmer data render --format png`): the
    same pixels as the rendered InkML (the default renderings are binary) and the same writers, in
    11.1 MiB instead of 24.3 MiB of BMP, so that it travels beside the wheels and the carried run within a
    device call's 64 MiB, and nothing is rendered on the GPU."""
    from hmer.data.commands import render_command

    return render_command(args.src, args.out, image_format="png")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="step", required=True)
    ch = sub.add_parser("check")
    ch.add_argument("--device", default="cuda")
    ch.add_argument("--preset", required=True)
    ch.add_argument("--share", type=int, default=8, help="processes side by side whose memory share is checked")
    ci = sub.add_parser("carry-in")
    ci.add_argument("carried")
    ci.add_argument("--data", required=True, help="where this machine has the data")
    wu = sub.add_parser("wrap-up")
    wu.add_argument("--home", required=True)
    wu.add_argument("--out", required=True)
    wu.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    return {"check": check, "carry-in": carry_in, "wrap-up": wrap_up}[args.step](args)


if __name__ == "__main__":
    sys.exit(main())
