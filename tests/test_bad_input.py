"""Every user-facing command, fed the mistakes users make, through the real command line.

Each mistake must end with exit status 2 and one line on stderr naming the file, the line,
the token or the URL; and nothing half-written may be left: no partial cache file, no MLflow
run left RUNNING (or created at all), no half-created Optuna study.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient
from PIL import Image

from conftest import glyph_strokes, inkml_document
from tiny_dataset import write_dataset

REPO = Path(__file__).resolve().parents[1]
STUDY_SCRIPT = REPO / "studies" / "ablate_direction.py"
TINY = ["--preset", "tiny", "--device", "cpu", "--no-progress", "--epochs", "1", "--set", "train.beam_size=2",
        "train.max_decode_len=12", "data.batch_pixels=20000", "data.max_batch_size=8", "train.attention_maps=0"]
MISSING_RUN = "0123456789abcdef0123456789abcdef"

pytestmark = pytest.mark.slow


def _closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A private MLflow home and cache, a tiny dataset, and one trained run to predict with."""
    root = tmp_path_factory.mktemp("bad-input")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(HMER_MLRUNS=str(root / "mlruns"), HMER_CACHE=str(root / "cache"), OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    data = write_dataset(root / "data")
    done = subprocess.run([sys.executable, "-m", "hmer.cli", "train", *TINY, "--data", str(data)], env=env,
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    store = f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"
    runs = MlflowClient(store).search_runs([MlflowClient(store).get_experiment_by_name("hmer").experiment_id])
    return {"root": root, "env": env, "data": data, "store": store, "run_id": runs[0].info.run_id}


def _run(home, *args: str, script: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(script)] if script else [sys.executable, "-m", "hmer.cli"]
    return subprocess.run([*cmd, *args], env=home["env"], capture_output=True, text=True, cwd=REPO, timeout=600)


def _one_line(done: subprocess.CompletedProcess, *names: str) -> str:
    """Exit status 2 and exactly one line on stderr, naming every one of `names`."""
    err = done.stderr.strip()
    assert done.returncode == 2, f"status {done.returncode}:\n{done.stdout[-2000:]}\n{err[-3000:]}"
    assert len(err.splitlines()) == 1, err
    for name in names:
        assert name in err, (name, err)
    return err


def _runs(home) -> list:
    client = MlflowClient(home["store"])
    experiments = client.search_experiments()
    return client.search_runs([e.experiment_id for e in experiments], max_results=1000) if experiments else []


def _no_partial_files(folder: Path) -> None:
    leftovers = [str(p) for p in folder.rglob("*") if ".tmp" in p.name or p.name.endswith(".partial")]
    assert not leftovers, leftovers


# ---- files given to hmer predict ------------------------------------------------------------------

def test_unreadable_inkml_and_images_name_the_file(home, tmp_path):
    good = inkml_document(glyph_strokes(1))
    files = {
        "empty.inkml": b"",
        "truncated.inkml": good[: len(good) // 2].encode(),
        "notxml.inkml": b"x,y\n1,2\n3,4\n",
        "zero.png": b"",
    }
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    for name in files:
        err = _one_line(_run(home, "predict", home["run_id"], str(tmp_path / name), "--device", "cpu"), name)
        if name in ("truncated.inkml", "notxml.inkml"):
            assert re.search(rf"{re.escape(name)}:\d+:", err), err  # file:line where the XML breaks


def test_a_100_megapixel_image_is_refused_before_decoding(home, tmp_path):
    huge = tmp_path / "huge.png"
    Image.new("L", (10_000, 10_000), 255).save(huge)
    err = _one_line(_run(home, "predict", home["run_id"], str(huge), "--device", "cpu"), "huge.png")
    assert "10000" in err, err


# ---- datasets given to hmer train, hmer data check and the study scripts ---------------------------

def _zip_without(data: Path, split: str, out: Path) -> Path:
    with zipfile.ZipFile(out, "w") as z:
        for path in sorted(data.rglob("*")):
            if path.is_file() and path.relative_to(data).parts[0] != split:
                z.write(path, path.relative_to(data).as_posix())
    return out


def test_a_zip_without_a_split_names_the_zip_and_the_split(home, tmp_path):
    archive = _zip_without(home["data"], "2019", tmp_path / "no2019.zip")
    before = len(_runs(home))
    _one_line(_run(home, "train", *TINY, "--data", str(archive)), "no2019.zip", "2019")
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    _one_line(_run(home, "--budget", "smoke", "--data", str(archive), "--storage", storage, "--tracking-uri",
                   home["store"], "--study-name", "no-split", "--set", "train.epochs=1", script=STUDY_SCRIPT),
              "no2019.zip", "2019")
    assert len(_runs(home)) == before  # no run, not even the study's parent run
    assert not optuna.get_all_study_names(storage)  # and no study
    _no_partial_files(home["root"] / "cache")


def test_a_caption_with_an_unknown_token_names_file_line_and_token(home, tmp_path):
    data = write_dataset(tmp_path / "data")
    caption = data / "train" / "caption.txt"
    lines = caption.read_text().splitlines()
    lines[2] = lines[2].split("\t")[0] + "\tx + \\Pi"
    caption.write_text("\n".join(lines) + "\n")
    before = len(_runs(home))
    _one_line(_run(home, "train", *TINY, "--data", str(data)), f"{caption}:3", "\\Pi")
    assert len(_runs(home)) == before
    _no_partial_files(home["root"] / "cache")


def test_a_caption_whose_file_is_missing_names_the_line_and_the_name(home, tmp_path):
    data = write_dataset(tmp_path / "data")
    name = (data / "2016" / "caption.txt").read_text().splitlines()[1].split("\t")[0]
    next((data / "2016").glob(f"{name}.*")).unlink()
    before = len(_runs(home))
    _one_line(_run(home, "train", *TINY, "--data", str(data)), "caption.txt:2", name)
    assert len(_runs(home)) == before
    _no_partial_files(home["root"] / "cache")


# ---- run ids, storages and tracking servers ----------------------------------------------------------

def test_a_run_id_that_does_not_exist_is_named(home):
    image = next((home["data"] / "2014").glob("*.png"))
    for args in (["evaluate", MISSING_RUN, "--data", str(home["data"])],
                 ["predict", MISSING_RUN, str(image)],
                 ["report", "--runs", MISSING_RUN],
                 ["train", "--resume", MISSING_RUN]):
        _one_line(_run(home, *args), MISSING_RUN)


def test_a_storage_whose_server_is_down_is_named_without_its_password(home, tmp_path):
    url = f"postgresql://hmer:pw-not-shown@127.0.0.1:{_closed_port()}/studies"
    pytest.importorskip("psycopg", reason="the psycopg module (PostgreSQL driver) is not installed")
    before = len(_runs(home))
    err = _one_line(_run(home, "--budget", "smoke", "--data", str(home["data"]), "--storage", url,
                         "--tracking-uri", home["store"], "--study-name", "down", script=STUDY_SCRIPT),
                    url.replace("pw-not-shown", "***"))
    assert "pw-not-shown" not in err
    assert len(_runs(home)) == before  # the parent run is not created before the storage opens


def test_a_tracking_server_that_is_down_is_named(home, tmp_path):
    uri = f"http://127.0.0.1:{_closed_port()}"
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    _one_line(_run(home, "train", *TINY, "--data", str(home["data"]), "--tracking-uri", uri), uri)
    _one_line(_run(home, "report", "--tracking-uri", uri), uri)
    _one_line(_run(home, "evaluate", home["run_id"], "--tracking-uri", uri), uri)
    _one_line(_run(home, "--budget", "smoke", "--data", str(home["data"]), "--storage", storage, "--tracking-uri",
                   uri, "--study-name", "no-tracking", script=STUDY_SCRIPT), uri)
    assert not optuna.get_all_study_names(storage)  # refused before the study was created
