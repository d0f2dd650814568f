"""The validation hold-out (issue 19): whole writers held out, no caption on both sides; the
caption rule for datasets that name no writer; `hmer data split`; the lists every run logs."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from mlflow.tracking import MlflowClient

from hmer.config import DataConfig
from hmer.data.commands import split_command
import editdistance

from hmer.data.splits import MAX_LEFT_OUT, HoldOutError, near_captions, split_validation
from hmer.data.inkml import writer_of
from hmer.data.source import parse_captions
from hmer.data.source import open_source
from hmer.data.splits import read_writers, split_source_validation
from hmer.training import train
from tiny_dataset import tiny_config, tiny_data


def toy_collection(n_writers: int = 40, per_writer: int = 10, unknown: int = 60, seed: int = 0):
    """Writers who each write mostly their own formulas and a few shared ones, plus expressions
    without a writer; names, captions and writers as `split_validation` takes them."""
    rng = np.random.default_rng(seed)
    names, captions, writers = [], {}, {}
    for w in range(n_writers):
        for i in range(per_writer):
            name = f"w{w:02d}_{i}"
            shared = rng.random() < 0.2
            # own captions differ from one another in two tokens: no near twins (data.val_min_edits)
            captions[name] = f"shared {rng.integers(5)}" if shared else f"own {w}-{i} {i}-{w}"
            writers[name] = f"writer{w}"
            names.append(name)
    for i in range(unknown):
        name = f"u{i:03d}"
        captions[name] = f"shared {i % 5}" if i % 3 == 0 else f"anon {i}"
        writers[name] = None
        names.append(name)
    return names, captions, writers


def test_writer_hold_out_shares_no_writer_and_no_caption_and_keeps_unknown_writers_in_training():
    names, captions, writers = toy_collection()
    held = split_validation(names, captions, writers, "writer", 0.1, seed=7)
    assert held.rule == "writer" and len(held.val) >= round(0.1 * len(names))
    train_captions = {captions[n] for n in held.train}
    assert not any(captions[n] in train_captions for n in held.val)
    assert not {writers[n] for n in held.val} & {writers[n] for n in held.train if writers[n]}
    assert all(writers[n] for n in held.val)  # no unknown writer in validation
    assert all(writers[n] in held.val_writers for n in held.left_out)  # only held-out writers are left out
    # every name on exactly one side
    assert sorted(held.train + held.val + held.left_out) == sorted(names)


def test_writer_hold_out_is_seeded_and_independent_of_input_order():
    names, captions, writers = toy_collection()
    a = split_validation(names, captions, writers, "writer", 0.1, seed=7)
    shuffled = [names[i] for i in np.random.default_rng(3).permutation(len(names))]
    b = split_validation(shuffled, captions, writers, "writer", 0.1, seed=7)
    assert set(a.val) == set(b.val) and set(a.train) == set(b.train)
    assert b.val == [n for n in shuffled if n in set(b.val)]  # input order kept
    assert set(split_validation(names, captions, writers, "writer", 0.1, seed=8).val) != set(a.val)


def test_without_writers_whole_captions_are_held_out_and_the_split_says_so():
    names, captions, _ = toy_collection()
    held = split_validation(names, captions, {}, "writer", 0.1, seed=7)
    assert held.rule == "caption" and "no writer" in held.note
    assert not {captions[n] for n in held.val} & {captions[n] for n in held.train}
    assert len(held.val) >= round(0.1 * len(names))


def test_a_hold_out_that_cannot_be_filled_says_so():
    names, captions, writers = toy_collection(n_writers=3)
    with pytest.raises(HoldOutError, match="known writers gives only"):
        split_validation(names, captions, writers, "writer", 0.5, seed=7)
    with pytest.raises(HoldOutError, match="data.val_split='bogus' is not one of writer, random"):
        split_validation(names, captions, writers, "bogus", 0.1, seed=7)


@pytest.mark.parametrize("max_edits", [1, 2])
def test_near_captions_finds_exactly_the_captions_within_the_edits(max_edits):
    rng = np.random.default_rng(max_edits)
    captions = {" ".join(rng.choice(list("ab+x^{}"), size=rng.integers(1, 7))) for _ in range(300)}
    near = near_captions(captions, max_edits)
    for a in captions:
        expected = {b for b in captions if editdistance.eval(a.split(), b.split()) <= max_edits}
        assert near[a] == expected, a
    exact = near_captions(captions, 0)
    assert all(exact[a] == {a} for a in captions)


def near_twin_collection():
    """Forty writers of their own formulas, each with a one-token variant by a writer of the
    other half (x -> y), so a writer hold-out meets near twins; a few expressions without a writer."""
    names, captions, writers = [], {}, {}
    for w in range(40):
        for i in range(10):
            name = f"w{w:02d}_{i}"
            base = w % 20
            captions[name] = (f"own {base}-{i} {i}-{base} {'x' if w < 20 else 'y'}" if i < 3
                              else f"solo {w}-{i} {i}-{w} + z")
            writers[name] = f"writer{w}"
            names.append(name)
    names += [f"u{i}" for i in range(20)]
    captions.update({f"u{i}": f"anon {i}" for i in range(20)})
    writers.update({f"u{i}": None for i in range(20)})
    return names, captions, writers


def test_validation_keeps_no_caption_within_val_min_edits_of_training_and_1_is_the_old_rule():
    names, captions, writers = near_twin_collection()

    def nearest(held, n):
        return min(editdistance.eval(captions[n].split(), captions[t].split()) for t in held.train)

    held = split_validation(names, captions, writers, "writer", 0.1, seed=7)  # min_edits 2, the default
    assert held.val and all(nearest(held, n) >= 2 for n in held.val)
    assert held.left_out and all(nearest(held, n) <= 1 for n in held.left_out)
    old = split_validation(names, captions, writers, "writer", 0.1, seed=7, min_edits=1)
    assert all(nearest(old, n) >= 1 for n in old.val) and any(nearest(old, n) == 1 for n in old.val)
    assert sorted(held.train + held.val + held.left_out) == sorted(names)
    with pytest.raises(HoldOutError, match="data.val_min_edits=0 must be at least 1"):
        split_validation(names, captions, writers, "writer", 0.1, seed=7, min_edits=0)


def test_random_rule_is_the_old_hold_out():
    names, captions, writers = toy_collection()
    held = split_validation(names, captions, writers, "random", 0.05, seed=7)
    assert held.rule == "random" and len(held.val) == round(0.05 * len(names)) and not held.left_out


def test_writer_of_reads_the_header_only_and_ignores_unknown_writers():
    head = b'<ink><traceFormat><channel name="X"/></traceFormat><annotation type="writer">User194</annotation>'
    assert writer_of(head + b'<trace id="0">1 2</trace></ink>') == "User194"
    assert writer_of(b'<ink><annotation type="writer"> Unknown </annotation><trace>1 2</trace></ink>') is None
    assert writer_of(b'<ink><trace>1 2</trace><annotation type="writer">late</annotation></ink>') is None
    assert writer_of(b"<ink><trace>1 2</trace></ink>") is None


def test_a_bad_val_split_exits_2_with_one_line(inkml_dataset):
    root = inkml_dataset({"train": 6, "2014": 2})
    proc = subprocess.run([sys.executable, "-m", "hmer.cli", "data", "split", str(root), "--set",
                           "data.val_split=bogus"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["hmer: error: data.val_split='bogus' is not one of writer, random"]


def test_a_run_logs_the_names_it_trained_and_selected_on(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    data = tiny_data()
    result = train(tiny_config(**{"train.epochs": 1}), data=data, tracking_uri=store, run_dir=tmp_path / "run")
    client = MlflowClient(tracking_uri=store)
    for split in ("train", "val"):
        path = client.download_artifacts(result.run_id, f"split/{split}.txt", str(tmp_path))
        assert open(path).read().split() == [e.name for e in data[split]]
    # the validation split decoded as the test years are, beside them
    metrics = client.get_run(result.run_id).data.metrics
    assert metrics["val_final_n"] == len(data["val"]) and "val_final_exprate" in metrics


def _write_writers_dataset(root):
    """Eight writers of five expressions each, in InkML that names them (no token shared between
    writers, so the writer rule can hold any of them out), and four expressions by nobody."""
    from conftest import glyph_strokes, inkml_document

    letters = "abcdefghijklmnopqrstuvwxyz"
    lines = []
    (root / "train").mkdir(parents=True)
    for w in range(8):
        for i in range(5):
            name = f"w{w}_{i}"
            caption = " ".join(letters[3 * w + k % 3] for k in range(i + 2))
            doc = inkml_document(glyph_strokes(i), truth=f"${caption}$").replace(
                "</traceFormat>", f'</traceFormat><annotation type="writer">W{w}</annotation>', 1)
            (root / "train" / f"{name}.inkml").write_text(doc)
            lines.append(f"{name}\t{caption}\n")
    for i in range(4):
        (root / "train" / f"u{i}.inkml").write_text(inkml_document(glyph_strokes(i), truth="$1$"))
        lines.append(f"u{i}\t{i}\n")
    (root / "train" / "caption.txt").write_text("".join(lines))
    return root


@pytest.mark.parametrize("image_format", ["bmp", "png"])
def test_images_rendered_from_inkml_keep_its_writers_and_so_its_hold_out(tmp_path, isolated_cache, image_format):
    from hmer.data.commands import render_command

    ink = _write_writers_dataset(tmp_path / "ink")
    images = tmp_path / "images.zip"
    assert render_command(str(ink), images, workers=1, out=io.StringIO(), image_format=image_format) == 0
    cfg = DataConfig(val_fraction=0.2)
    with open_source(ink) as a, open_source(images) as b:
        names = [c.name for c in parse_captions(a.caption_text("train"), "train")]
        assert read_writers(b, "train", names) == read_writers(a, "train", names)
        assert read_writers(b, "train", names)["u0"] is None and read_writers(b, "train", names)["w3_1"] == "W3"
        from_ink, from_images = split_source_validation(a, cfg), split_source_validation(b, cfg)
    assert from_images.rule == from_ink.rule == "writer" and from_images.val_writers == from_ink.val_writers
    assert (from_images.train, from_images.val, from_images.left_out) == (from_ink.train, from_ink.val,
                                                                           from_ink.left_out)


def test_a_malformed_writers_file_names_its_file_and_line(tmp_path):
    from hmer.data import WriterFileError

    folder = tmp_path / "data" / "train"
    folder.mkdir(parents=True)
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(folder / "a.png")
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(folder / "b.png")
    (folder / "caption.txt").write_text("a\tx\nb\ty\n")
    (folder / "writers.txt").write_text("a\tW1\n\nb W2\n")
    with open_source(tmp_path / "data") as source, pytest.raises(WriterFileError) as err:
        read_writers(source, "train", ["a", "b"])
    assert str(err.value) == f"{folder / 'writers.txt'}:3: expected <name> TAB <writer>, got 'b W2'"
    (folder / "writers.txt").write_text("a\tW1\nb\tunknown\n")
    with open_source(tmp_path / "data") as source:
        assert read_writers(source, "train", ["a", "b"]) == {"a": "W1", "b": None}
    (folder / "writers.txt").write_text("a\tW1\na\tW2\n")
    with open_source(tmp_path / "data") as source, pytest.raises(WriterFileError, match=r"writers.txt:2: 'a' already"):
        read_writers(source, "train", ["a", "b"])


# ---- the real training split ------------------------------------------------------------------

def _real_split(crohme_data, seed: int):
    with open_source(crohme_data) as source:
        held = split_source_validation(source, DataConfig(val_seed=seed))
        captions = {c.name: c.tokens for c in parse_captions(source.caption_text("train"), "train")}
        writers = read_writers(source, "train", list(captions))
        year_lengths = [len(c.tokens) for y in ("2014", "2016", "2019")
                        for c in parse_captions(source.caption_text(y), y)]
    return held, captions, writers, float(np.mean(year_lengths))


@pytest.mark.shared_data
@pytest.mark.parametrize("seed", [7, 1, 2])
def test_real_split_looks_like_a_test_year(crohme_data, seed):
    held, captions, writers, test_mean = _real_split(crohme_data, seed)
    n = len(captions)
    assert held.rule == "writer"
    assert 0.03 * n <= len(held.val) <= 0.10 * n
    assert len(held.left_out) <= MAX_LEFT_OUT * n
    train_captions = {" ".join(captions[x]) for x in held.train}
    assert not any(" ".join(captions[x]) in train_captions for x in held.val)
    # nor a near twin: no training caption within one token edit (data.val_min_edits=2)
    near = near_captions(train_captions | {" ".join(captions[x]) for x in held.val}, 1)
    assert not any(near[" ".join(captions[x])] & train_captions for x in held.val)
    assert not {writers[x] for x in held.val} & {writers[x] for x in held.train if writers[x]}
    val_mean = float(np.mean([len(captions[x]) for x in held.val]))
    assert abs(val_mean - test_mean) < 2.5, (val_mean, test_mean)  # train's own mean is 15.5


@pytest.mark.shared_data
def test_real_split_is_the_same_for_a_seed_and_differs_for_another(crohme_data, tmp_path):
    first = _real_split(crohme_data, 7)[0]
    again = _real_split(crohme_data, 7)[0]
    other = _real_split(crohme_data, 1)[0]
    assert first.val == again.val and first.train == again.train and set(other.val) != set(first.val)
    out = io.StringIO()
    assert split_command(str(crohme_data), DataConfig(), tmp_path / "lists", out=out) == 0
    assert (tmp_path / "lists" / "val.txt").read_text().split() == first.val
    assert (tmp_path / "lists" / "train.txt").read_text().split() == first.train
    assert "shared between val and train: 0 captions, 0 known writers" in out.getvalue()
