"""`tools/gpu_campaign.py home` with what a lease brought back cut short, missing or mixed up: each
time one line naming the file, exit status 2, and the committed store (its databases, artifacts and
the kept carried run) byte-identical. Then the whole $OUT merges, and merging it again changes no
run.

The lease's $OUT is a real one, made by the lease's own wrap-up pieces (`Lease.finish`, `pack_run`,
`export_runs` in pieces) from a tiny run trained here, two epochs of three, with small pieces so
that each archive comes back in several, as a real run's do in pieces of 15 MiB."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from hmer.training import train
from hmer.training.carry import pack_run
from hmer.tracking.transfer import split_file
from hmer.tracking.transfer import export_runs, import_runs
from tiny_dataset import tiny_config, tiny_data

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import gpu_campaign  # noqa: E402
from lease import Lease, Step  # noqa: E402



@pytest.fixture(scope="module")
def lease(tmp_path_factory):
    """A committed store holding the campaign's run at epoch 1 (and its carried file), and the
    $OUT of the lease that trained it to epoch 2."""
    root = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.setenv("HMER_MLRUNS", str(root / "machine" / "mlruns"))
        away = f"sqlite:///{root / 'machine' / 'mlruns' / 'mlflow.db'}"
        first = train(tiny_config(**{"train.epochs": 3}), data=tiny_data(), tracking_uri=away,
                      experiment="gpu-campaign", pause_after_epochs=1)
        mlruns = root / "repo" / "mlruns"  # the committed store, as the first lease's `home` left it
        mlruns.mkdir(parents=True)
        store = f"sqlite:///{mlruns / 'mlflow.db'}"
        export_runs(root / "first.tar.gz", tracking_uri=away)
        import_runs(root / "first.tar.gz", tracking_uri=store)
        keep = mlruns / "carried" / "gpu-campaign.tar.gz"
        pack_run(first.run_id, keep, tracking_uri=away)

        checkpoint = root / "machine" / "mlruns" / "checkpoints" / first.run_id / "last.pt"
        second = train(tiny_config(), data=tiny_data(), tracking_uri=away, resume=checkpoint, pause_after_epochs=1)
        assert second.run_id == first.run_id and second.epochs == 2

        out = root / "out"

        def wrap_up(cap: float) -> str:  # what the lease's wrap-up step sends back, each archive in 3 pieces
            pack_run(first.run_id, out / "carried.tar.gz", tracking_uri=away)
            export_runs(out / "runs.tar.gz", tracking_uri=away)
            for name in ("carried.tar.gz", "runs.tar.gz"):
                split_file(out / name, (out / name).stat().st_size // 3 + 1)
            return "done"

        Lease(root / "machine", out, 600, 60).finish(
            Step("wrap-up", 0, wrap_up), {"train": {"run_id": first.run_id, "finished": False}, "device": "cpu"})
    assert len(list(out.glob("*.part-*"))) == 6 and not json.loads((out / "status.json").read_text())["out_problems"]
    return {"root": root, "out": out, "mlruns": mlruns, "store": store, "keep": keep, "run_id": first.run_id}


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file and folder under `folder`, with each file's SHA-256."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


def _home(lease, files: Path, capsys) -> tuple[int, str, str]:
    rc = gpu_campaign.main(["home", str(files), "--keep", str(lease["keep"]), "--tracking-uri", lease["store"]])
    out, err = capsys.readouterr()
    return rc, out, err.strip()


def _damaged(lease, folder: Path, name: str, how: str) -> Path:
    """A copy of the lease's $OUT in `folder` with the file `name` cut to half ("truncate"), removed
    ("remove"), or (for "status without sizes") status.json without the sizes and `name` short by a
    few bytes."""
    files = folder
    shutil.copytree(lease["out"], files)
    target = files / name
    if how == "truncate":
        data = target.read_bytes()
        target.write_bytes(data[: len(data) // 2])
    elif how == "remove":
        target.unlink()
    elif how == "status without sizes":
        status = json.loads((files / "status.json").read_text())
        del status["sizes"]
        (files / "status.json").write_text(json.dumps(status))
        target.write_bytes(target.read_bytes()[:-8])  # gzip's trailer: tarfile alone reads on without it
    return files


def test_each_input_cut_short_or_missing_is_named_and_the_store_is_unchanged(lease, tmp_path, capsys):
    before = _snapshot(lease["mlruns"])
    cases = [(name, "truncate") for name in sorted(p.name for p in lease["out"].iterdir())]
    pieces = sorted(p.name for p in lease["out"].glob("*.part-*"))
    cases += [(name, "remove") for name in ("status.json", *pieces)]
    last = [max(p for p in pieces if p.startswith(base)) for base in ("carried.", "runs.")]
    cases += [(name, "status without sizes") for name in (*last, "runs.tar.gz.part-000")]
    for i, (name, how) in enumerate(cases):
        files = _damaged(lease, tmp_path / str(i), name, how)
        rc, out, err = _home(lease, files, capsys)
        assert rc == 2, (name, how, rc, out, err)
        # (a last piece cut short shows only once the pieces are joined: the archive is named)
        named = name.split(".part-")[0] + ":" if how == "status without sizes" and name in last else name
        assert len(err.splitlines()) == 1 and named in err, (name, how, err)
        assert _snapshot(lease["mlruns"]) == before, (name, how)
    # a piece of another lease among the files, and a folder that is not one
    files = tmp_path / "mixed"
    shutil.copytree(lease["out"], files)
    shutil.copyfile(files / pieces[0], files / (pieces[0].rsplit("-", 1)[0] + "-099"))
    rc, _, err = _home(lease, files, capsys)
    assert rc == 2 and "part-099" in err and "another lease" in err, err
    rc, _, err = _home(lease, tmp_path / "nowhere", capsys)
    assert rc == 2 and str(tmp_path / "nowhere") in err, err
    assert _snapshot(lease["mlruns"]) == before


def test_a_carried_run_older_than_the_kept_one_merges_nothing(lease, tmp_path, capsys):
    # a store whose kept file is already at epoch 2, and a $OUT that brings epoch 1 back
    mlruns = tmp_path / "mlruns"
    shutil.copytree(lease["mlruns"], mlruns)
    keep = mlruns / "carried" / "gpu-campaign.tar.gz"
    keep.write_bytes(b"".join(p.read_bytes() for p in sorted(lease["out"].glob("carried.tar.gz.part-*"))))
    files = tmp_path / "older"
    shutil.copytree(lease["out"], files, ignore=shutil.ignore_patterns("carried.tar.gz.part-*"))
    shutil.copyfile(lease["keep"], files / "carried.tar.gz")
    status = json.loads((files / "status.json").read_text())
    status["files"] = sorted(p.name for p in files.iterdir())
    status["sizes"] = {p.name: p.stat().st_size for p in files.iterdir() if p.name != "status.json"}
    (files / "status.json").write_text(json.dumps(status))
    before = _snapshot(mlruns)
    rc = gpu_campaign.main(["home", str(files), "--keep", str(keep), "--tracking-uri",
                            f"sqlite:///{mlruns / 'mlflow.db'}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "carried.tar.gz: epoch 1, older than" in err and "nothing merged" in err, err
    assert _snapshot(mlruns) == before


def test_the_whole_out_merges_and_merging_it_again_changes_no_run(lease, capsys):
    client = MlflowClient(lease["store"])
    rc, out, err = _home(lease, lease["out"], capsys)
    assert rc == 0, err
    assert "kept run" in out and "at epoch 2 of 3" in out
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.data.tags["hmer.source_run_id"] for r in runs] == [lease["run_id"]]
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "train_loss")] == [1, 2]
    kept = lease["keep"].read_bytes()
    assert kept == b"".join(p.read_bytes() for p in sorted(lease["out"].glob("carried.tar.gz.part-*")))
    rc, out, err = _home(lease, lease["out"], capsys)  # again, as after a failure: nothing doubled
    assert rc == 0 and "0 created, 1 brought up to date" in out, (out, err)
    assert len(client.search_runs([e.experiment_id for e in client.search_experiments()])) == 1
    assert lease["keep"].read_bytes() == kept
    assert not list(lease["mlruns"].glob(".*.lock")) and not list(lease["mlruns"].rglob("*.tmp"))


def test_the_command_line_names_a_folder_without_status_json(lease, tmp_path):
    files = tmp_path / "no-status"
    shutil.copytree(lease["out"], files)
    (files / "status.json").unlink()
    before = _snapshot(lease["mlruns"])
    done = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_campaign.py"), "home", str(files), "--keep",
                           str(lease["keep"]), "--tracking-uri", lease["store"]], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = done.stderr.strip().splitlines()
    assert str(files / "status.json") in line and "missing" in line, line
    assert _snapshot(lease["mlruns"]) == before
