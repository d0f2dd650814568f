"""Every user-facing command, fed the mistakes users make, through the real command line.

Each mistake must end with exit status 2 and one line on stderr naming the file, the line,
the token, the config key or the URL; and nothing half-written may be left: no partial cache
file, no MLflow run left RUNNING (or created at all), no half-created Optuna study, no half-merged
import. A config value is refused before any data is loaded, whichever command builds the config.
A training ended by SIGTERM closes its run KILLED and resumes exactly; one ended by SIGKILL is
closed FAILED by the next `hmer train --resume`.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import fields
from pathlib import Path

import numpy as np
import optuna
import pytest
from mlflow.tracking import MlflowClient
from PIL import Image

import torch
from conftest import glyph_strokes, inkml_document
from tiny_dataset import write_dataset

from hmer import cli
from hmer.allowed import allowed_of
from hmer.config import RULES, Config, DataConfig, ModelConfig, TrainConfig
from hmer.model_presets import PRESETS, SIZES, resolve_preset
from hmer.recipes import RECIPES
from hmer.cli import study as study_cli
from hmer.studies.budgets import BUDGETS
from hmer.studies.resolution import check_cells, range_ends, study_resolution
from hmer.studies.sweeps import Sweep
from hmer.studies import STUDIES, SweepParam, SweepSpec, ablations

REPO = Path(__file__).resolve().parents[1]
STUDY_SCRIPT = REPO / "studies" / "ablate_direction.py"
TINY = ["--preset", "tiny-transformer", "--device", "cpu", "--no-progress", "--epochs", "1", "--set",
        "train.beam_size=2", "train.max_decode_len=12", "data.batch_pixels=20000", "data.max_batch_size=8",
        "train.attention_maps=0"]
MISSING_RUN = "0123456789abcdef0123456789abcdef"
DIRECTION, SWEEP = STUDIES.get("ablate_direction"), STUDIES.get("sweep")

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
    # three epochs: the run that the SIGTERM-ed and resumed one must equal
    done = subprocess.run([sys.executable, "-m", "hmer.cli", "train", *TINY, "--epochs", "3", "--data", str(data)],
                          env=env, capture_output=True, text=True, cwd=REPO, timeout=600)
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


def _png_header(width: int, height: int) -> bytes:
    """A PNG file that says it is `width` x `height` (its header whole, its pixels none): what a reader
    sees of a huge image before it decodes a pixel."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit grey
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def test_every_bad_file_given_to_predict_is_named_in_one_line(tmp_path):
    """Issue 70: not an image, an empty file, a 20000 x 20000 image, a 1 x 1 image, a folder: each one
    line naming it, exit status 2, through the real command line."""
    model = _untrained_checkpoint(tmp_path / "tiny.pt")
    (tmp_path / "notes.png").write_text("a shopping list, not a picture\n")
    (tmp_path / "empty.png").write_bytes(b"")
    (tmp_path / "huge.png").write_bytes(_png_header(20_000, 20_000))
    Image.new("L", (1, 1), 0).save(tmp_path / "dot.png")
    (tmp_path / "scans").mkdir()
    (tmp_path / "folder.png").mkdir()  # a folder whose name says image
    # a photograph in a shadow: three fifths of the page darker than the rest, the formula on the light part
    shadow = np.full((100, 200), 220, dtype=np.uint8)
    shadow[:, :120] = 90
    shadow[40:60, 130:190] = 30
    Image.fromarray(shadow).save(tmp_path / "shadow.jpg")
    says = {"notes.png": "not a readable image", "empty.png": "not a readable image", "huge.png": "20 MP",
            "dot.png": "no ink", "scans": "a folder, not a file", "folder.png": "a folder, not a file",
            "shadow.jpg": "uneven light"}
    for name, why in says.items():
        _one_line(_hmer(_env(tmp_path), "predict", str(model), str(tmp_path / name), "--device", "cpu"),
                  str(tmp_path / name), why)


def _untrained_checkpoint(path: Path) -> Path:
    """A tiny model's weights as `hmer predict` reloads them: what it reads does not matter here,
    only which files it reads at all."""
    from hmer.checkpoint import atomic_torch_save, model_artifact
    from hmer.data import Vocab
    from hmer.model import build_model
    from hmer.model_presets import preset_with_recipe

    # untrained: it never ends by itself
    cfg = preset_with_recipe("tiny-transformer").override({"train.max_decode_len": 4})
    atomic_torch_save(model_artifact(build_model(cfg.model), cfg, Vocab(), 1, 0.0), path)
    return path


def _strokes(height: int = 40) -> Image.Image:
    """Black handwriting-like strokes on white paper."""
    from PIL import ImageDraw

    img = Image.new("L", (120, height), 255)
    draw = ImageDraw.Draw(img)
    draw.line([(10, 30), (30, 8), (50, 30)], fill=0, width=3)
    draw.ellipse([70, 10, 95, 32], outline=0, width=3)
    return img


def test_an_image_with_no_ink_is_named_and_gets_no_prediction_while_the_others_do(tmp_path, capsys):
    from hmer.data.images import read_image

    model = _untrained_checkpoint(tmp_path / "tiny.pt")
    ink = _strokes()
    ink.save(tmp_path / "ink.png")
    # white ink on a transparent background: the strokes are the opaque pixels, white
    white = Image.new("LA", ink.size, (255, 0))
    white.putalpha(Image.eval(ink, lambda v: 255 - v))
    white.save(tmp_path / "white-on-clear.png")
    blank = {"one-pixel.png": Image.new("L", (1, 1), 0), "page.png": Image.new("L", (400, 120), 255),
             "grey.jpg": Image.new("L", (200, 60), 90), "clear.png": Image.new("RGBA", (200, 60), (0, 0, 0, 0)),
             "faint.png": Image.eval(ink, lambda v: 255 - (255 - v) // 3)}  # pencil lighter than mid-grey
    for name, img in blank.items():
        img.save(tmp_path / name)
    # read the way a person sees it: the same pixels as the black strokes on white paper
    assert (read_image(tmp_path / "white-on-clear.png") == read_image(tmp_path / "ink.png")).all()

    files = [str(tmp_path / n) for n in ("ink.png", *blank, "white-on-clear.png")]
    assert cli.main(["predict", str(model), *files, "--device", "cpu", "--beam", "1"]) == 2
    out, err = capsys.readouterr()
    assert [line.split("\t")[0] for line in out.splitlines()] == ["ink", "white-on-clear"], out
    lines = [line for line in err.splitlines() if line.startswith("hmer:")]  # (not the progress bar)
    assert len(lines) == len(blank), err
    for name, line in zip(blank, lines):
        assert str(tmp_path / name) in line and "no ink" in line, line
    assert cli.main(["predict", str(model), str(tmp_path / "ink.png"), "--device", "cpu", "--beam", "1"]) == 0
    assert capsys.readouterr().out.strip()  # one file read: its LaTeX alone, exit status 0
    assert cli.main(["predict", str(model), str(tmp_path / "page.png"), "--device", "cpu"]) == 2
    out, err = capsys.readouterr()
    assert not out and len(err.strip().splitlines()) == 1 and "page.png" in err, (out, err)


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


def test_hmer_ui_and_runs_present_refuse_a_folder_without_a_store_and_a_port_in_use(home, tmp_path):
    _one_line(_run(home, "ui", "--store", str(tmp_path)), str(tmp_path), "no mlflow.db")
    _one_line(_run(home, "runs", "present", str(tmp_path)), str(tmp_path), "no mlflow.db")
    store = tmp_path / "store"  # both databases: both servers would start
    store.mkdir()
    (store / "mlflow.db").write_bytes((home["root"] / "mlruns" / "mlflow.db").read_bytes())
    optuna.create_study(storage=f"sqlite:///{store / 'optuna.db'}", study_name="any")
    with socket.socket() as taken:  # another server on the port asked for: refused before either starts
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        _one_line(_run(home, "ui", "--store", str(store), "--mlflow-port", port), port, "--mlflow-port")
        _one_line(_run(home, "ui", "--store", str(store), "--mlflow-port", str(_closed_port()), "--dashboard-port",
                       port), port, "--dashboard-port")


def test_hmer_ui_names_a_damaged_database_in_one_line_and_refuses_a_port_that_is_not_one(tmp_path, capsys):
    from hmer.tracking.store import open_experiment

    good = tmp_path / "good"
    good.mkdir()
    open_experiment(f"sqlite:///{good / 'mlflow.db'}", "results")
    optuna.create_study(storage=f"sqlite:///{good / 'optuna.db'}", study_name="any")
    whole = (good / "mlflow.db").read_bytes()
    damaged = {"truncated": ("mlflow.db", whole[: len(whole) // 2], "a truncated SQLite database"),
               "noise": ("mlflow.db", os.urandom(8192), "cannot be read"),
               "empty": ("mlflow.db", b"", "no table"),
               "optuna-truncated": ("optuna.db", (good / "optuna.db").read_bytes()[:4096], "truncated")}
    for folder, (name, data, says) in damaged.items():
        store = tmp_path / folder
        store.mkdir()
        for db in ("mlflow.db", "optuna.db"):
            (store / db).write_bytes((good / db).read_bytes())
        (store / name).write_bytes(data)
        assert cli.main(["ui", "--store", str(store), "--mlflow-port", str(_closed_port()), "--dashboard-port",
                         str(_closed_port())]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert str(store / name) in line and says in line and "no server was started" in line, line
        assert (store / name).read_bytes() == data and sorted(p.name for p in store.iterdir()) == [
            "mlflow.db", "optuna.db"]  # read-only: no journal, no copy left
    for option, port in (("--mlflow-port", "99999"), ("--dashboard-port", "0"), ("--mlflow-port", "-1")):
        assert cli.main(["ui", "--store", str(good), option, port]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert f"{option} {port}" in line and "1 to 65535" in line, line


def test_a_tracking_server_that_is_down_is_named(home, tmp_path):
    uri = f"http://127.0.0.1:{_closed_port()}"
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    _one_line(_run(home, "train", *TINY, "--data", str(home["data"]), "--tracking-uri", uri), uri)
    _one_line(_run(home, "report", "--tracking-uri", uri), uri)
    _one_line(_run(home, "evaluate", home["run_id"], "--tracking-uri", uri), uri)
    _one_line(_run(home, "--budget", "smoke", "--data", str(home["data"]), "--storage", storage, "--tracking-uri",
                   uri, "--study-name", "no-tracking", script=STUDY_SCRIPT), uri)
    assert not optuna.get_all_study_names(storage)  # refused before the study was created


# ---- config values: every field, before any data is loaded ------------------------------------------

SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}


def _fields() -> list[tuple[str, type, object]]:
    """(dotted key, type, Allowed) of every config field; fails naming each field declared without
    `allowed(...)`, or with nothing that bounds it (see hmer.allowed)."""
    from typing import get_type_hints

    found, undeclared = [], []
    for prefix, cls in [*SECTIONS.items(), ("", Config)]:
        hints = get_type_hints(cls)
        for f in fields(cls):
            if prefix == "" and f.name in SECTIONS:
                continue
            key = f"{prefix}.{f.name}" if prefix else f.name
            try:
                rule = allowed_of(cls, f.name)
            except TypeError:
                undeclared.append(key)
                continue
            typ = hints[f.name]
            bounded = (rule.one_of is not None or rule.check is not None or rule.text or typ is bool
                       or any(b is not None for b in (rule.ge, rule.gt, rule.le, rule.lt)))
            if not bounded:
                undeclared.append(f"{key} (declared without a range)")
            found.append((key, typ, rule))
    assert not undeclared, ("config fields without what they allow; declare each as "
                            f"`name: type = allowed(default, ge=..)` (hmer/config.py): {undeclared}")
    return found


def _out_of_range(typ: type, rule) -> list[str]:
    """Values the declaration refuses, as text for --set (none for free text and bools)."""
    if rule.one_of is not None:
        return ["no-such-choice"]
    if rule.check is not None:
        return [str(rule.bad_example)]
    if typ not in (int, float):
        return []
    step = 1 if typ is int else 0.5
    values = []
    if rule.ge is not None:
        values.append(rule.ge - step)
    if rule.gt is not None:
        values.append(rule.gt)
    if rule.le is not None:
        values.append(rule.le + step)
    if rule.lt is not None:
        values.append(rule.lt)
    return [str(int(v) if typ is int else v) for v in values]


WRONG_TYPE_TEXT = {int: "many", float: "lots", bool: "maybe"}  # as typed after --set


def _train_refuses(capsys, argv: list[str], *names: str) -> str:
    """`hmer train ARGV` in this process: exit 2 and one line on stderr naming every one of `names`."""
    rc = cli.main(["train", *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2, (argv, rc, err)
    assert len(err.splitlines()) == 1, err
    for name in names:
        assert name in err, (name, err)
    return err


@pytest.fixture
def no_data(tmp_path, monkeypatch):
    """A private MLflow home, and a data path that does not exist: an error that names a config key
    instead of this path came before any data was read."""
    monkeypatch.setenv("HMER_MLRUNS", str(tmp_path / "mlruns"))
    monkeypatch.setenv("HMER_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path / "no-such-data.zip"


def test_every_config_field_refuses_out_of_range_and_wrong_type_values_before_loading_data(capsys, tmp_path,
                                                                                          no_data):
    base = ["--preset", "tiny-transformer", "--no-progress", "--data", str(no_data)]  # no option that sets a field
    tried = 0
    for key, typ, rule in _fields():
        section, _, attr = key.rpartition(".")
        values = _out_of_range(typ, rule)
        if typ in WRONG_TYPE_TEXT:
            values.append(WRONG_TYPE_TEXT[typ])
        for value in values:
            if key == "data.path":
                continue  # --data sets it
            err = _train_refuses(capsys, [*base, "--set", f"{key}={value}"], key, value)
            assert str(no_data) not in err, err
            assert "is not one of" in err or "takes" in err, err  # ... and says what is allowed
            tried += 1
        # A wrong JSON type in a config file (as a stored config.json is read back): a number where
        # text belongs, a list where a number or a bool does.
        stored = Config().to_dict()
        wrong = 5 if typ is str else [1]
        if section:
            stored[section][attr] = wrong
        else:
            stored[attr] = wrong
        config = tmp_path / "config.json"
        config.write_text(json.dumps(stored))
        _train_refuses(capsys, ["--config", str(config), "--data", str(no_data)], str(config), key,
                       repr(wrong))
        tried += 1
    assert tried > 2 * len(_fields())
    assert not (tmp_path / "mlruns" / "checkpoints").exists()


# Cases that break each cross-field rule of hmer.config.RULES, by the rule's keys.
RULE_CASES = {
    ("model.d_model", "model.nhead"): {"model.d_model": "36", "model.nhead": "8"},
    ("model.d_model",): {"model.d_model": "6", "model.nhead": "2"},
    ("model.coverage", "model.decoder"): {"model.coverage": "fusion", "model.decoder": "rnn"},
    ("data.scale_aug_min", "data.scale_aug_max"): {"data.scale_aug_min": "2", "data.scale_aug_max": "1"},
    ("data.aug_width_min", "data.aug_width_max"): {"data.aug_width_min": "1.5", "data.aug_width_max": "1.2"},
    ("train.min_lr", "train.lr"): {"train.lr": "1e-4", "train.min_lr": "1e-3"},
    ("train.plan_shapes", "data.pad_multiple", "data.pad_growth"): {"train.plan_shapes": "true"},
    ("train.cuda_graphs", "data.pad_multiple", "data.pad_growth"): {"train.cuda_graphs": "true"},
    ("train.cuda_graphs", "train.compile"): {"train.cuda_graphs": "true", "train.compile": "true",
                                             "data.pad_multiple": "16"},
    ("train.warmup_steps", "train.warmup_epochs"): {"train.warmup_steps": "10", "train.warmup_epochs": "1"},
    ("data.render_scale", "data.render_height"): {"data.render_scale": "0.5", "data.render_height": "48"},
    ("train.schedule", "train.decay_epochs", "train.epochs"): {"train.schedule": "wsd", "train.decay_epochs": "0"},
}


def test_every_cross_field_rule_refuses_before_loading_data(capsys, no_data):
    missing = {rule.keys for rule in RULES} - set(RULE_CASES)
    assert not missing, f"add a case that breaks each new rule to RULE_CASES: {missing}"
    base = ["--preset", "tiny-transformer", "--device", "cpu", "--data", str(no_data)]
    for keys, values in RULE_CASES.items():
        err = _train_refuses(capsys, [*base, "--set", *(f"{k}={v}" for k, v in values.items())], *keys)
        assert str(no_data) not in err
    # scale_aug_min > 0 with max 0 is no augmentation, and allowed: both 0, or min in (0, max]
    with pytest.raises(ValueError, match="scale_aug"):
        Config().override({"data.scale_aug_min": 0.0, "data.scale_aug_max": 1.4})


# The time and pause flags of hmer train, each with what its message must name.
TIME_FLAG_CASES = [
    (["--pause-within", "-5"], "--pause-within -5"), (["--pause-within", "nan"], "--pause-within nan"),
    (["--pause-within", "inf"], "--pause-within inf"), (["--pause-within", "0"], "--pause-within 0"),
    (["--final-seconds", "-1", "--pause-within", "60"], "--final-seconds -1"),
    (["--final-seconds", "100", "--pause-within", "5"], "--final-seconds 100", "--pause-within 5"),
    (["--final-seconds", "30"], "--final-seconds 30", "--pause-within"),
    (["--time-budget", "nan"], "--time-budget nan"), (["--time-budget", "-60"], "--time-budget -60"),
    (["--pause-after-epochs", "0"], "--pause-after-epochs 0"),
    (["--pause-after-epochs", "-2"], "--pause-after-epochs -2"),
]


def test_train_time_flags_are_checked_before_any_work(capsys, no_data, tmp_path):
    for flags, *names in TIME_FLAG_CASES:
        for start in (["--preset", "tiny-transformer", "--device", "cpu", "--data", str(no_data)],
                      ["--resume", MISSING_RUN]):
            err = _train_refuses(capsys, [*start, *flags], *names)
            assert str(no_data) not in err and MISSING_RUN not in err, err  # before the data or the run
    assert not (tmp_path / "mlruns").exists()


def test_every_preset_size_recipe_budget_and_study_is_allowed():
    for name in PRESETS:
        for recipe in RECIPES:
            resolve_preset(name, recipe=recipe)
        for size in SIZES:
            resolve_preset(name, size=size)
    for budget in BUDGETS.values():
        # one trial: whether a whole grid fits a budget's window is the budget's own check, not a value's
        for spec in ablations().values():
            check_cells(study_resolution(spec, budget, n_trials=1, n_jobs=1), spec, spec.cells(budget.seeds))
        if any(param.choices and budget.overrides.get(param.name, param.choices[0]) not in param.choices
               for param in SWEEP.params):  # the scaled budget's schedule and input
            with pytest.raises(ValueError, match=f"budget '{budget.name}' fixes .* outside what the sweep searches"):
                Sweep(SWEEP, n_trials=1, pruner=None).plan(budget)
            continue
        base = study_resolution(SWEEP, budget, n_trials=1, n_jobs=1)
        check_cells(base, SWEEP, range_ends(SWEEP, base.config))


def test_option_for_a_field_and_study_overrides_are_checked_before_anything_runs(capsys, no_data, tmp_path):
    assert cli.main(["evaluate", MISSING_RUN, "--beam", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--beam 0" in err and "train.beam_size" in err, err
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = ["--budget", "smoke", "--data", str(no_data), "--storage", storage, "--tracking-uri", store]
    assert study_cli.main(DIRECTION, [*common, "--set", "train.epochs=-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train.epochs=-1" in err and str(no_data) not in err, err
    # A sweep whose range leaves what its key allows is a bug in the search space, and says so.
    broken = SweepSpec(name="broken-sweep", description="dropout up to 1.5",
                       params=(SweepParam("model.dropout", low=0.0, high=1.5),),
                       model_presets={"tiny": "tiny-transformer"})
    assert study_cli.main(broken, [*common, "--trials", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "search space" in err and "model.dropout=1.5" in err and str(no_data) not in err, err
    assert not (tmp_path / "optuna.db").exists() and not (tmp_path / "mlflow.db").exists()  # no study, no run


def test_a_study_s_variants_are_checked_before_anything_runs(capsys, no_data, tmp_path):
    """--variants names variants of the grid and keeps the baseline, which the paired tables need."""
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = ["--budget", "smoke", "--data", str(no_data), "--storage", storage, "--tracking-uri", store]
    for variants, named in (("l2r,sideways", "no variant 'sideways'; its variants: l2r, r2l, bi"),
                            ("bi,r2l", "leave out the baseline 'l2r'")):
        assert study_cli.main(DIRECTION, [*common, "--variants", variants]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and named in err, err
    with pytest.raises(SystemExit) as exit_status:
        study_cli.main(DIRECTION, [*common, "--variants", "bi,bi"])
    assert exit_status.value.code == 2 and "repeats a variant" in capsys.readouterr().err
    assert not (tmp_path / "optuna.db").exists() and not (tmp_path / "mlflow.db").exists()  # no study, no run
    assert DIRECTION.cells((1, 2), ("l2r", "bi")) == [
        {"model.direction": d, "train.seed": s} for s in (1, 2) for d in ("l2r", "bi")]
    assert DIRECTION.search_space((1,), ("bi", "l2r")) == {"model.direction": ["l2r", "bi"], "train.seed": [1]}


# ---- files that are not what they claim to be -------------------------------------------------------

def _export_with(manifest: dict, out: Path) -> Path:
    with tarfile.open(out, "w:gz") as tar:
        data = json.dumps(manifest).encode()
        info = tarfile.TarInfo("hmer-runs.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return out


def test_bad_exports_and_checkpoints_give_one_line_and_change_nothing(home, tmp_path, capsys):
    store = f"sqlite:///{tmp_path / 'target.db'}"
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a tar file at all\n")
    plain = tmp_path / "plain.tar.gz"
    with tarfile.open(plain, "w:gz") as tar:
        tar.add(home["data"] / "train" / "caption.txt", "caption.txt")
    good_run = {"run_id": "a" * 32, "experiment": "e", "tags": {}, "params": {}, "metrics": {}}
    half = _export_with({"format": 1, "experiments": ["e"], "runs": [good_run, {"run_id": "b" * 32}]},
                        tmp_path / "half.tar.gz")
    for bad in (junk, plain, half):  # in this process: no global MLflow state is set by an import
        assert cli.main(["runs", "import", str(bad), "--tracking-uri", store]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and bad.name in err, err
    client = MlflowClient(store)
    assert [e.name for e in client.search_experiments()] == ["Default"]  # nothing merged, not even "e"
    assert not client.search_runs([e.experiment_id for e in client.search_experiments()])
    capsys.readouterr()  # (MLflow's own log of opening the store above)
    for flag, value in (("--part-mb", "inf"), ("--max-artifact-mb", "nan"), ("--part-mb", "-1")):
        assert cli.main(["runs", "export", str(tmp_path / "out.tar.gz"), "--tracking-uri", store, flag, value]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{flag} {value}" in err, err
    assert not list(tmp_path.glob("out.tar.gz*"))

    checkpoint = tmp_path / "random.ckpt"
    checkpoint.write_bytes(os.urandom(4096))
    image = next((home["data"] / "2014").glob("*.png"))
    before = len(_runs(home))
    _one_line(_run(home, "import", str(checkpoint)), checkpoint.name)
    _one_line(_run(home, "predict", str(checkpoint), str(image)), checkpoint.name)
    assert len(_runs(home)) == before


# ---- signals ----------------------------------------------------------------------------------------

def _start_training(home, *args: str) -> subprocess.Popen:
    """A tiny three-epoch training, read until its first epoch is done."""
    proc = subprocess.Popen([sys.executable, "-m", "hmer.cli", "train", *TINY, "--epochs", "3", "--data",
                             str(home["data"]), *args], env=home["env"], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for line in proc.stdout:
        if line.startswith("epoch 1/3"):
            return proc
    proc.wait(timeout=60)
    raise AssertionError(f"no first epoch (status {proc.returncode}): {proc.stderr.read()[-3000:]}")


def _weights(run_id: str, home) -> dict[str, torch.Tensor]:
    path = home["root"] / "mlruns" / "checkpoints" / run_id / "last.pt"
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def test_sigterm_closes_the_run_killed_and_it_resumes_exactly_and_sigkill_is_closed_failed(home):
    client = MlflowClient(home["store"])
    stopped = _start_training(home, "--run-name", "sigterm")
    stopped.send_signal(signal.SIGTERM)
    out, err = stopped.communicate(timeout=120)
    assert stopped.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "stopped by SIGTERM" in err.strip().splitlines()[-1], err[-3000:]
    run = next(r for r in _runs(home) if r.info.run_name == "sigterm")
    assert run.info.status == "KILLED"
    assert run.data.tags["hmer.status"] == "killed"
    assert re.match(r"stopped by SIGTERM in (epoch [23] of 3, which is dropped|the final evaluation)",
                    run.data.tags["hmer.stopped_by"]), run.data.tags

    killed = _start_training(home, "--run-name", "sigkill")
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=60)
    dead = next(r for r in _runs(home) if r.info.run_name == "sigkill")
    assert dead.info.status == "RUNNING"  # the store says a dead run is alive, until the next resume

    resumed = _run(home, "train", "--resume", run.info.run_id, "--no-progress")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"run {dead.info.run_id}: its process is gone; marked FAILED" in resumed.stderr
    dead = client.get_run(dead.info.run_id)
    assert dead.info.status == "FAILED" and "pid" in dead.data.tags["hmer.error"]
    run = client.get_run(run.info.run_id)
    assert run.info.status == "FINISHED" and "hmer.stopped_by" not in run.data.tags
    # exactly the uninterrupted run: every epoch's loss, the final weights and the test scores
    whole = client.get_run(home["run_id"])
    for key in ("train_loss", "val_exprate"):
        assert [m.value for m in client.get_metric_history(run.info.run_id, key)] == \
            [m.value for m in client.get_metric_history(home["run_id"], key)], key
    mine, theirs = _weights(run.info.run_id, home), _weights(home["run_id"], home)
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert {k: v for k, v in run.data.metrics.items() if k.startswith("test_") and "seconds" not in k} == \
        {k: v for k, v in whole.data.metrics.items() if k.startswith("test_") and "seconds" not in k}


def test_a_publish_into_the_store_a_training_writes_is_refused_and_the_training_ends_in_it(home, tmp_path):
    """Issue 70: a publish into the store a training was writing replaced the store under it, and the
    run was gone. Every training holds the store's training lock; a publish is refused while one does."""
    ws = tmp_path / "ws"
    assert _run(home, "runs", "workspace", str(ws)).returncode == 0
    training = _start_training(home, "--run-name", "under-a-publish")
    training.send_signal(signal.SIGSTOP)  # held between two steps: the publish meets it training
    try:
        refused = _run(home, "runs", "publish", str(ws))
    finally:
        training.send_signal(signal.SIGCONT)
    line = _one_line(refused, str(home["root"] / "mlruns"))
    assert "1 training(s) write this store" in line and f"pid {training.pid}" in line
    out, err = training.communicate(timeout=300)
    assert training.returncode == 0, err[-3000:]
    run = next(r for r in _runs(home) if r.info.run_name == "under-a-publish")
    assert run.info.status == "FINISHED"
    assert not (home["root"] / "mlruns" / ".trainers").exists()  # the last training to end left no record


def test_two_resumes_of_one_run_train_it_once(home):
    """Issue 70: two `hmer train --resume RUN` of one run both ran and logged epochs twice into it."""
    client = MlflowClient(home["store"])
    killed = _start_training(home, "--run-name", "resumed-twice")
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=60)
    run = next(r for r in _runs(home) if r.info.run_name == "resumed-twice")
    first = subprocess.Popen([sys.executable, "-m", "hmer.cli", "train", "--resume", run.info.run_id, "--no-progress"],
                             env=home["env"], cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for line in first.stdout:  # the first resume trains: its first epoch is done
        if line.startswith("epoch 2/3"):
            break
    first.send_signal(signal.SIGSTOP)
    try:
        second = _run(home, "train", "--resume", run.info.run_id, "--no-progress")
    finally:
        first.send_signal(signal.SIGCONT)
    line = _one_line(second, run.info.run_id)
    assert f"pid {first.pid}" in line and "one process trains a run at a time" in line
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")] == [1, 2, 3]


@pytest.mark.parametrize("edit, names", [
    (lambda d: [1, 2], ["not a list"]),
    (lambda d: {**d, "foo": {}}, ["unknown section 'foo'"]),
    (lambda d: {**d, "model": {**d["model"], "bogus": 1}}, ["model.bogus"]),
    (lambda d: {**d, "model": {**d["model"], "bottleneck": "yes"}}, ["model.bottleneck", "true or false"]),
    (lambda d: {**d, "model": {**d["model"], "d_model": "abc"}}, ["model.d_model"]),
])
def test_a_config_file_with_an_unknown_key_or_a_wrong_type_is_refused_before_anything_trains(home, tmp_path, edit,
                                                                                             names):
    """Issue 70: `hmer train --config F.json` trained without a mistyped key, or with "yes" for a boolean."""
    from hmer.model_presets import preset_with_recipe

    path = tmp_path / "my.json"
    path.write_text(json.dumps(edit(preset_with_recipe("tiny-transformer").to_dict())))
    runs_before = len(_runs(home))
    done = _run(home, "train", "--config", str(path), "--data", str(home["data"]), "--no-progress")
    _one_line(done, str(path), *names)
    assert len(_runs(home)) == runs_before


# ---- stores: not there, below a file, damaged, read-only (issue 70) ---------------------------------

def _small_store(folder: Path) -> str:
    """A store of one finished run of `hmer train --preset tiny-transformer` (its config.json) and an Optuna study
    beside it; returns the run's id."""
    from hmer.model_presets import preset_with_recipe
    from hmer.tracking.store import open_experiment

    uri = f"sqlite:///{folder / 'mlflow.db'}"
    client = MlflowClient(uri)
    run = client.create_run(open_experiment(uri, "hmer")[1])
    client.log_text(run.info.run_id, json.dumps(preset_with_recipe("tiny-transformer").to_dict()), "config.json")
    client.set_terminated(run.info.run_id)
    optuna.create_study(storage=f"sqlite:///{folder / 'optuna.db'}", study_name="any")
    return run.info.run_id


def _digests(folder: Path) -> dict[str, str]:
    """Every file under `folder` by its path, with the digest of its bytes: a store as it is."""
    import hashlib

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _hmer(env: dict, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hmer.cli", *args], env=env, capture_output=True, text=True,
                          cwd=cwd, timeout=600)


def _env(tmp_path: Path, store: Path | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "HMER_MLRUNS")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"), HMER_CACHE=str(tmp_path / "cache"))
    if store is not None:
        env["HMER_MLRUNS"] = str(store)
    return env


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    """(its folder, the run's id): copied, never written, by each test below."""
    folder = tmp_path_factory.mktemp("small-store")
    return folder, _small_store(folder)


@pytest.mark.parametrize("damage", ["mlflow.db truncated", "mlflow.db noise", "optuna.db truncated"])
@pytest.mark.parametrize("command", ["show", "present", "rescore"])
def test_a_damaged_database_is_named_in_one_line_and_the_store_is_left_as_it_was(small_store, tmp_path, damage,
                                                                                command):
    """Issue 70: a truncated or garbage database had 70-85 lines and two SQLAlchemy tracebacks."""
    import shutil

    folder, run_id = small_store
    store = tmp_path / "store"
    shutil.copytree(folder, store)
    name, how = damage.split()
    whole = (store / name).read_bytes()
    (store / name).write_bytes(whole[: len(whole) // 2] if how == "truncated" else os.urandom(len(whole)))
    before = _digests(store)
    args = {"show": ["runs", "show", run_id[:8]], "present": ["runs", "present", str(store)],
            "rescore": ["runs", "rescore"]}[command]
    done = _hmer(_env(tmp_path, store), *args)
    if name == "optuna.db" and command in ("rescore", "show"):  # they read the runs alone: its database is whole
        assert done.returncode == 0, done.stderr[-3000:]
    else:
        _one_line(done, str(store / name), "nothing was changed")
    assert _digests(store) == before


def test_a_mistyped_store_path_is_refused_and_creates_nothing(small_store, tmp_path):
    """Issue 70: a store path with no store there became a new empty store, and `hmer runs show` and
    `report --claims` then reported success on it. Each command that reads a store refuses it in one line."""
    folder, run_id = small_store
    typo = tmp_path / "mlrnus"
    image = tmp_path / "x.png"
    _strokes().save(image)
    for args in (["runs", "show", run_id[:8]], ["report", "--claims"], ["report", "--list"],
                 ["report", "--runs", run_id[:8]], ["runs", "rescore"], ["runs", "export", str(tmp_path / "out.tgz")],
                 ["predict", run_id, str(image)], ["train", "--resume", run_id]):
        _one_line(_hmer(_env(tmp_path, typo), *args), str(typo / "mlflow.db"))
        assert not typo.exists(), args
        assert not (tmp_path / "out.tgz").exists()


def test_a_store_below_a_plain_file_is_named_in_one_line(small_store, tmp_path):
    """Issue 70: `--tracking-uri` below a plain file had a FileExistsError traceback."""
    folder, run_id = small_store
    plain = tmp_path / "notes.txt"
    plain.write_text("not a folder\n")
    for args in (["runs", "show", run_id[:8], "--tracking-uri", f"sqlite:///{plain / 'store' / 'mlflow.db'}"],
                 ["runs", "present", str(plain / "store")]):
        _one_line(_hmer(_env(tmp_path), *args), str(plain), "is a file")
    _one_line(_hmer(_env(tmp_path, plain / "store"), "train", *TINY), str(plain), "is a file")  # a writer, too
    assert plain.read_text() == "not a folder\n"


def _read_only(store: Path, argv: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    """`argv` run with the folder `store` read-only: its permission bits taken away for a user, whom they
    bind; for root, whom they do not, a read-only bind mount of it in a mount namespace of its own
    (`unshare -m`, seen by that process alone). Skips where neither can be had."""
    import shutil

    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in [store, *store.rglob("*")]}
        for path in modes:
            path.chmod(modes[path] & ~0o222)
        try:
            return subprocess.run(argv, env=env, capture_output=True, text=True, cwd=cwd, timeout=600)
        finally:
            for path, mode in modes.items():
                path.chmod(mode)
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("root, and no mount namespace (unshare -m) to make a store read-only in")
    mount = 'mount --bind -o ro "$0" "$0" && exec "$@"'
    return subprocess.run(["unshare", "-m", "sh", "-c", mount, str(store), *argv], env=env, capture_output=True,
                          text=True, cwd=cwd, timeout=600)


def test_a_read_only_store_is_read_and_a_command_that_would_write_it_is_refused_in_one_line(small_store, tmp_path):
    """Issue 70: a read-only store gave `hmer runs show` a traceback (it created optuna.db.lock there) and
    `hmer runs publish` into it an OSError traceback from the lock."""
    import shutil

    folder, run_id = small_store
    store = tmp_path / "mlruns"
    shutil.copytree(folder, store)
    before = _digests(store)
    hmer = [sys.executable, "-m", "hmer.cli"]
    shown = _read_only(store, [*hmer, "runs", "show", run_id[:8]], _env(tmp_path, store), REPO)
    assert shown.returncode == 0 and f"run {run_id}" in shown.stdout, shown.stderr[-3000:]
    workspace = tmp_path / "ws"
    shutil.copytree(folder, workspace)
    for args in (["runs", "publish", str(workspace)], ["runs", "rescore"], ["runs", "present", str(store)]):
        done = _read_only(store, [*hmer, *args], _env(tmp_path, store), REPO)
        _one_line(done, str(store), "read-only")
    assert _digests(store) == before


def test_a_resume_is_refused_in_one_line_where_it_would_train_something_else(home, tmp_path):
    """Issue 70: `--resume ''` started a new 300-epoch training; with `--resume RUN` every other flag was
    dropped without a word, even an unknown preset; a checkpoint whose run is not in the store got an
    MlflowException traceback. `--resume` takes a run's first 8 characters, as `runs show` does."""
    import shutil

    runs_before = len(_runs(home))
    checkpoints = home["root"] / "mlruns" / "checkpoints"
    before = _digests(checkpoints)
    _one_line(_run(home, "train", "--resume", ""), "--resume ''")
    _one_line(_run(home, "train", "--resume", home["run_id"], "--preset", "nosuch", "--set", "train.lr=1"),
              "--preset, --set", "would be dropped")
    client = MlflowClient(home["store"])
    bare = client.create_run(client.get_experiment_by_name("hmer").experiment_id).info.run_id  # no checkpoint
    client.set_terminated(bare, "KILLED")
    _one_line(_run(home, "train", "--resume", bare[:8]), f"no checkpoint for run {bare}")
    client.delete_run(bare)
    other = tmp_path / "other"
    other.mkdir()
    _small_store(other)
    elsewhere = shutil.copyfile(checkpoints / home["run_id"] / "last.pt", tmp_path / "last.pt")
    other_before = _digests(other)
    _one_line(_run(home, "train", "--resume", str(elsewhere), "--tracking-uri", f"sqlite:///{other / 'mlflow.db'}"),
              str(elsewhere), home["run_id"], "is not in")
    assert _digests(other) == other_before and _digests(checkpoints) == before
    assert len(_runs(home)) == runs_before
