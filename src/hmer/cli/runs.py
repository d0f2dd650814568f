"""`hmer runs export | import | publish | workspace | rename | supersede | present | show | rescore`:
MLflow runs moved between stores (a GPU machine's and the committed one in mlruns/), a study renamed
in its store, a store's studies presented for its UIs, what trained a run, and runs given the scores
of metrics registered after them."""

from __future__ import annotations

import contextlib
import sys

from . import options


def add_parser(sub) -> None:
    runs = sub.add_parser("runs", help="export MLflow runs to one file, or merge such a file into the store")
    rsub = runs.add_subparsers(title="runs commands", metavar="COMMAND")
    ex = rsub.add_parser("export", help="write runs (params, metric histories, tags, artifacts) to a .tar.gz")
    ex.add_argument("file", metavar="FILE", help="the export to write (a .tar.gz)")
    ex.add_argument("--experiment", action="append", default=None, help="only this experiment (repeatable)")
    ex.add_argument("--runs", nargs="*", default=None, metavar="RUN_ID", help="only these runs")
    ex.add_argument("--max-artifact-mb", type=float, default=0.0, help="leave out larger artifact files")
    ex.add_argument("--part-mb", type=float, default=0.0, help="split into FILE.part-NNN of at most N MiB")
    ex.set_defaults(func=cmd_runs_export)
    # the tag written out (tracking.keys.SOURCE_RUN_ID): importing hmer.tracking would slow `hmer --help`
    im = rsub.add_parser("import", help="merge an export into the store (idempotent; keeps the source run id "
                         "as tag hmer.source_run_id)")
    im.add_argument("files", nargs="+", metavar="FILE", help="an export, or any of its FILE.part-NNN")
    im.set_defaults(func=cmd_runs_import)
    pub = rsub.add_parser("publish", help="copy a store (FOLDER/mlflow.db, optuna.db, artifacts/) into mlruns/, "
                          "made clean to be committed (unfinished studies, checkpoints, RUNNING states and machine "
                          "paths left out); a copy still not clean is refused, mlruns/ left as it was")
    pub.add_argument("folder", metavar="FOLDER", help="the store to publish: a workspace (hmer runs workspace) "
                     "after its studies ran there")
    pub.add_argument("--keep-unfinished", action="store_true",
                     help="keep the unfinished studies, with the smallest checkpoints that continue each cell "
                          "(last.pt, and best.pt where its weights are not last.pt's), for a later workspace")
    pub.add_argument("--weights-only", action="store_true",
                     help="with --keep-unfinished: of each unfinished trial, last.pt with its fp32 weights, schedule "
                          "and random state alone (a third the size): it continues as a warm restart "
                          "(docs/cpu_protocol.md, \"The long budget\")")
    pub.add_argument("--replace", action="store_true",
                     help="publish FOLDER even when it lacks some of mlruns/'s runs or studies (not made from it "
                          "with `hmer runs workspace`), replacing mlruns/ (default: refused, naming what it lacks)")
    pub.set_defaults(func=cmd_runs_publish)
    ws = rsub.add_parser("workspace", help="copy the committed store in mlruns/ to a new or empty FOLDER to run and "
                         "continue studies there (then `hmer runs publish FOLDER`)")
    ws.add_argument("folder", metavar="FOLDER", help="a new or empty folder for the copy")
    ws.set_defaults(func=cmd_runs_workspace)
    rn = rsub.add_parser("rename", help="rename a study in its store: its MLflow experiment, its runs' hmer.study "
                         "tag and its Optuna study (run again to finish an interrupted rename)")
    rn.add_argument("study", metavar="STUDY", help="the study's name, e.g. ablate_direction-cpu")
    rn.add_argument("new", metavar="NEW_NAME", help="its new name")
    rn.add_argument("--storage", default=None, help="Optuna storage (default: optuna.db beside the MLflow store)")
    rn.set_defaults(func=cmd_runs_rename)
    sp = rsub.add_parser("supersede", help="label a kept study as superseded by another (after `rename`): tag "
                         "hmer.superseded_by, a RUNNING parent run closed; `hmer report --list` shows it")
    sp.add_argument("study", metavar="STUDY", help="the study kept for reference")
    sp.add_argument("by", metavar="NEW_STUDY", help="the study that replaces it")
    sp.set_defaults(func=cmd_runs_supersede)
    sh = rsub.add_parser("show", help="what trained a run: study, cell, seed, commit, progress, fingerprint, "
                         "config, scores and files (hmer.store.provenance)")
    sh.add_argument("run", metavar="RUN", help="a run id, or its first 8 or more characters")
    sh.set_defaults(func=cmd_runs_show)
    pr = rsub.add_parser("present", help="bring every study of the store FOLDER up to date for the MLflow UI and "
                         "optuna-dashboard, as a study that ends now is (hmer.store.present); writes what differs")
    pr.add_argument("folder", metavar="FOLDER", help="the store's folder (its mlflow.db and optuna.db)")
    pr.set_defaults(func=cmd_runs_present)
    rs = rsub.add_parser("rescore", help="give the store's runs (or those named) every registered metric they lack, "
                         "computed from their stored predictions under a new run's keys (hmer.tracking.rescore; "
                         "idempotent)")
    rs.add_argument("runs", nargs="*", metavar="RUN", help="a run id, or its first 8 or more characters")
    rs.add_argument("--study", action="append", default=[], metavar="STUDY",
                    help="the runs of this study (tag hmer.study; repeatable)")
    rs.add_argument("--dry-run", action="store_true", help="say what would be logged, and log nothing")
    rs.set_defaults(func=cmd_runs_rescore)
    for command in (ex, im, rn, sp, sh, rs):  # (publish, workspace and present name a store's folder)
        command.add_argument("--tracking-uri", default=None, help=options.TRACKING_URI)


def cmd_runs_export(args) -> int:
    import math

    from ..tracking.store import existing_store
    from ..tracking.transfer import export_runs

    for flag, value in (("--max-artifact-mb", args.max_artifact_mb), ("--part-mb", args.part_mb)):
        if not (math.isfinite(value) and value >= 0):  # before anything is written (inf had overflowed)
            raise ValueError(f"{flag} {value:g}: give a finite number of MiB, or 0 for no limit")
    res = export_runs(args.file, tracking_uri=existing_store(args.tracking_uri), experiments=args.experiment,
                      run_ids=args.runs, max_artifact_mb=args.max_artifact_mb, part_mb=args.part_mb)
    print(f"exported {res.runs} runs to " + ", ".join(str(f) for f in res.files))
    for item in res.omitted_artifacts:
        print(f"  left out {item}", file=sys.stderr)
    return 0


def cmd_runs_publish(args) -> int:
    from pathlib import Path

    from ..tracking.lock import store_lock
    from ..tracking.store import mlruns_dir

    if args.weights_only and not args.keep_unfinished:
        print("hmer runs publish: error: --weights-only is for --keep-unfinished (what continues an unfinished "
              "trial); without it no checkpoint is published", file=sys.stderr)
        return 2
    # the lock before the seconds of imports: a second publish is refused at once (publish() takes it too)
    with store_lock(mlruns_dir(), f"hmer runs publish {Path(args.folder).resolve()}"):
        from ..reports.runs import study_progress
        from ..store.publish import publish
        from ..tracking.store import quiet_mlflow

        quiet_mlflow()
        done = publish(args.folder, mlruns_dir(), keep_unfinished=args.keep_unfinished,
                       weights_only=args.weights_only, replace=args.replace)
    uri = f"sqlite:///{done.store / 'mlflow.db'}"
    print(f"published {args.folder} to {done.store} (artifact locations relative to the checkout)")
    for study, status in sorted(done.unfinished.items()):
        if args.keep_unfinished:
            print(f"  kept study {study} ({status}), {study_progress(study, uri)}: `hmer runs workspace` continues it")
        else:
            print(f"  left out study {study} ({status}): it is published when it has finished")
    if args.keep_unfinished:
        kept = done.kept_checkpoints
        from ..tracking.portable import CHECKPOINTS

        def sized(run: str, files: list[str]) -> str:
            mb = [(done.store / CHECKPOINTS / run / name).stat().st_size / 1e6 for name in files]
            return f"{run} ({' + '.join(f'{name} {size:.1f} MB' for name, size in zip(files, mb))})"
        print(f"  checkpoints kept of {len(kept)} unfinished run(s)" +
              (": " + ", ".join(sized(run, files) for run, files in kept.items()) if kept else ""))
    if done.closed:
        print(f"  closed in the published copy, where nothing runs: {'; '.join(done.closed)}")
    if done.marked:
        print(f"  experiments marked as model training (tag mlflow.experimentKind): {', '.join(done.marked)}")
    for study, changes in done.annotated.items():
        print(f"  study {study}: {', '.join(changes)}")
    if done.portable:
        print(f"  machine paths written as a clone reads them (mlruns/..., <local>/...): {'; '.join(done.portable)}")
    return 0


def cmd_runs_show(args) -> int:
    from ..store.provenance import run_provenance
    from ..tracking.models import run_by_prefix
    from ..tracking.store import existing_store, mlflow_client, quiet_mlflow
    from ..training.fingerprint import code_fingerprint

    quiet_mlflow()
    uri = existing_store(args.tracking_uri)  # read alone: a mistyped path creates no store
    client = mlflow_client(uri)
    run_id = run_by_prefix(client, args.run)  # (hmer prints a RunNotFoundError as one line)
    for line in run_provenance(client, run_id, code_fingerprint()):
        print(line)
    return 0


def cmd_runs_workspace(args) -> int:
    from pathlib import Path

    from ..tracking.lock import LOCK_FILE, store_lock
    from ..tracking.portable import copy_store
    from ..tracking.store import mlruns_dir

    folder = Path(args.folder)
    if folder.exists() and not folder.is_dir():
        return _not_a_workspace_folder(folder, "is a file")
    with store_lock(args.folder, f"hmer runs workspace {Path(args.folder).resolve()}"):
        if any(path.name != LOCK_FILE for path in folder.iterdir()):
            return _not_a_workspace_folder(folder, "holds a store already" if (folder / "mlflow.db").exists()
                                           else "is not empty")
        db = copy_store(mlruns_dir(), args.folder, portable=False, checkpoints=True)
    print(f"copied {mlruns_dir()} to {db.parent}; run studies with HMER_MLRUNS={db.parent}, "
          f"then `hmer runs publish {db.parent}`")
    return 0


def _not_a_workspace_folder(folder, what: str) -> int:
    from ..tracking.store import mlruns_dir

    print(f"hmer runs workspace: error: {folder} {what}: give a new or empty folder (a workspace is a fresh copy of "
          f"{mlruns_dir()}; to go on with one, set HMER_MLRUNS={folder} and run the studies)", file=sys.stderr)
    return 2


def cmd_runs_import(args) -> int:
    from ..tracking.lock import database_store_lock
    from ..tracking.store import default_tracking_uri
    from ..tracking.transfer import import_runs, read_export

    for f in args.files:  # every file read whole first: a bad one merges none of them
        read_export(f)
    uri = args.tracking_uri or default_tracking_uri()
    with database_store_lock(uri, f"hmer runs import {' '.join(args.files)}"):
        for f in args.files:
            res = import_runs(f, tracking_uri=uri)
            print(f"{f}: {len(res.created)} runs created, {len(res.updated)} already there (brought up to date)")
            for src, rid in res.id_map.items():
                print(f"  {src} -> {rid}")
    return 0


@contextlib.contextmanager
def amending(tracking_uri: str | None, command: str, storage: str | None = None, *, lock: bool = True,
             optuna: bool = True):
    """A command that amends a store: MLflow quiet, the store (and with `optuna` its Optuna storage) read whole
    first (a damaged one is named before anything is written), then the store's lock held while it writes;
    (store URI, storage)."""
    from ..studies.storage import existing_storage
    from ..tracking.lock import database_store_lock
    from ..tracking.store import existing_store, quiet_mlflow

    quiet_mlflow()
    uri = existing_store(tracking_uri)  # MLflow would create an empty store at a mistyped path
    storage = existing_storage(uri, storage) if optuna else None
    with database_store_lock(uri, command) if lock else contextlib.nullcontext():
        yield uri, storage


def cmd_runs_rename(args) -> int:
    from ..store.rename import rename_study

    with amending(args.tracking_uri, f"hmer runs rename {args.study} {args.new}", args.storage) as (uri, _):
        done = rename_study(args.study, args.new, tracking_uri=uri, storage=args.storage)
    print(f"renamed study {done.study} to {done.new}: {done.runs} run(s) retagged, "
          f"{'the experiment renamed' if done.experiment else 'no experiment of that name'}, "
          f"{done.trials} Optuna trial(s) under the new name")
    return 0


def cmd_runs_supersede(args) -> int:
    from ..store.present import present_study
    from ..store.rename import mark_superseded

    with amending(args.tracking_uri, f"hmer runs supersede {args.study} --by {args.by}") as (uri, _):
        print(mark_superseded(args.study, args.by, tracking_uri=uri))
        changes = present_study(args.study, tracking_uri=uri)  # its table, and the mark in Optuna
    if changes:
        print(f"study {args.study}: {', '.join(changes)}")
    return 0


def cmd_runs_present(args) -> int:
    from pathlib import Path

    from ..store.present import present_studies
    from ..tracking.store import check_store_folder

    folder = Path(args.folder)
    check_store_folder(folder.resolve())
    if not (folder / "mlflow.db").is_file():
        raise ValueError(f"{folder} holds no MLflow store (no mlflow.db)")
    store = f"sqlite:///{folder.resolve() / 'mlflow.db'}"
    with amending(store, f"hmer runs present {folder.resolve()}") as (uri, storage):
        done = present_studies(uri, storage)
    for study, changes in done.items():
        print(f"study {study}: {', '.join(changes) if changes else 'up to date'}")
    print(f"presented {len(done)} stud{'y' if len(done) == 1 else 'ies'} of {folder}; "
          f"{sum(bool(c) for c in done.values())} changed")
    return 0


def cmd_runs_rescore(args) -> int:
    from ..tracking.models import run_by_prefix
    from ..tracking.portable import sqlite_path
    from ..tracking.rescore import plan_rescoring, select_runs, write_rescoring
    from ..tracking.store import mlflow_client

    command = " ".join(["hmer runs rescore", *args.runs, *(f"--study {s}" for s in args.study)])
    # planned under the lock, so that no writer changes the runs in between (a dry run takes none); the runs
    # alone are read, so a damaged optuna.db beside them does not stop it
    with amending(args.tracking_uri, command, lock=not args.dry_run, optuna=False) as (uri, _):
        client = mlflow_client(uri)
        run_ids = [run_by_prefix(client, given) for given in args.runs]
        plans = plan_rescoring(client, select_runs(client, run_ids, args.study))
        logged = 0 if args.dry_run else write_rescoring(client, plans)
    added = [plan for plan in plans if plan.added]
    for plan in added:
        print(f"run {plan.run_id[:8]} ({plan.label}): {'would log' if args.dry_run else 'logged'} "
              f"{len(plan.added)} metric(s): {plan.describe()}")
        for key, why in plan.left.items():
            print(f"  {key} left as it is: {why}")
    skipped: dict[str, list[str]] = {}
    for plan in plans:
        if not plan.added:
            skipped.setdefault(plan.why, []).append(plan.run_id[:8])
    if skipped:
        print(f"skipped {len(plans) - len(added)} run(s):")
        for why, ids in skipped.items():
            print(f"  {why}: {' '.join(ids)}")
    if args.dry_run:
        print(f"dry run, nothing written: {len(added)} of {len(plans)} run(s) would be rescored in {uri}, "
              f"{sum(len(plan.added) for plan in added)} metric(s)")
    else:
        print(f"{len(added)} of {len(plans)} run(s) rescored in {uri}, {logged} metric(s) logged")
    studies = sorted({plan.study for plan in added if plan.study})
    # presenting (the UIs' tables, figures and notes) is `hmer runs present`'s: rescoring writes metrics alone
    if studies and not args.dry_run:
        db = sqlite_path(uri)
        print(f"the tables on the parent runs of {', '.join(studies)} (what the UIs show) predate these scores: "
              f"`hmer runs present {db.parent if db is not None else 'FOLDER'}` brings them up to date")
    return 0
