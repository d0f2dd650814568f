"""Dataset folders and zips, the error policy for bad input, the rendered cache, and the vocabulary."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import glyph_strokes, inkml_document
from hmer.data import (CaptionError, DataError, DatasetNotFoundError, ImageReadError, InkMLError, MissingSplitError,
                       UnknownTokenError, Vocab, load_split, open_source, read_expression_file, read_image)
from hmer.data.cache import cache_dir, read_cache_file
from hmer.data.source import resolve_data_path


def zip_folder(folder: Path, target: Path, top: str = "") -> Path:
    with zipfile.ZipFile(target, "w") as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                archive.write(path, f"{top}{path.relative_to(folder).as_posix()}")
    return target


def test_a_folder_split_loads_in_caption_order(inkml_dataset, isolated_cache):
    root = inkml_dataset({"train": 5})
    exprs = load_split(root, "train")
    assert [e.name for e in exprs] == [f"train_{i:03d}" for i in range(5)]
    assert exprs[1].tokens == ["a", "^", "{", "2", "}"]
    assert all(e.image.dtype == np.uint8 and e.image.max() == 255 for e in exprs)


def test_a_zip_with_a_top_folder_reads_like_the_folder(inkml_dataset, isolated_cache, tmp_path):
    root = inkml_dataset({"train": 4, "2014": 2})
    archive = zip_folder(root, tmp_path / "data.zip", top="crohme/")
    with open_source(archive) as source:
        assert source.split_names() == ["train", "2014"]
    from_zip, from_folder = load_split(archive, "2014"), load_split(root, "2014")
    assert [e.name for e in from_zip] == [e.name for e in from_folder]
    for a, b in zip(from_zip, from_folder):
        assert a.tokens == b.tokens and a.image.tobytes() == b.image.tobytes()


def test_a_folder_with_one_top_folder_is_found(inkml_dataset, isolated_cache, tmp_path):
    inkml_dataset({"2016": 2}, root=tmp_path / "outer" / "crohme")
    assert len(load_split(tmp_path / "outer", "2016")) == 2


def test_images_are_read_as_grey_and_inverted_when_black_on_white(tmp_path, isolated_cache):
    folder = tmp_path / "data" / "2019"
    folder.mkdir(parents=True)
    ink = np.zeros((20, 30), dtype=np.uint8)
    ink[5:15, 10:12] = 255
    Image.fromarray(ink).save(folder / "white_ink.png")
    Image.fromarray(255 - ink).convert("RGB").save(folder / "paper.bmp")
    Image.fromarray(255 - ink).save(folder / "photo.jpg", quality=95)
    (folder / "caption.txt").write_text("white_ink\t1\npaper\t1\nphoto\t1\n")
    exprs = {e.name: e.image for e in load_split(tmp_path / "data", "2019")}
    np.testing.assert_array_equal(exprs["white_ink"], ink)
    np.testing.assert_array_equal(exprs["paper"], ink)
    assert np.abs(exprs["photo"].astype(int) - ink).max() < 40  # jpeg is lossy, but inverted
    np.testing.assert_array_equal(read_image(folder / "paper.bmp"), ink)


# ---- finding the dataset -------------------------------------------------------------------------

def test_missing_dataset_names_the_path(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="nowhere"):
        load_split(tmp_path / "nowhere", "train")


def test_hmer_data_environment_variable_is_used(inkml_dataset, monkeypatch, isolated_cache):
    root = inkml_dataset({"2014": 2})
    monkeypatch.setenv("HMER_DATA", str(root))
    assert resolve_data_path(None) == root
    assert len(load_split(None, "2014")) == 2
    monkeypatch.setenv("HMER_DATA", str(root / "gone"))
    with pytest.raises(DatasetNotFoundError, match="HMER_DATA"):
        resolve_data_path(None)


def test_missing_split_names_the_split_and_the_path(inkml_dataset, tmp_path):
    root = inkml_dataset({"train": 2})
    with pytest.raises(MissingSplitError) as info:
        load_split(root, "2019")
    assert "'2019'" in str(info.value) and str(root) in str(info.value) and "train" in str(info.value)
    archive = zip_folder(root, tmp_path / "d.zip")
    with pytest.raises(MissingSplitError, match="2019"):
        load_split(archive, "2019")


# ---- structure errors always raise ---------------------------------------------------------------

def test_unknown_token_names_file_line_and_token(inkml_dataset):
    root = inkml_dataset({"train": 3})
    caption = root / "train" / "caption.txt"
    lines = caption.read_text().splitlines()
    lines[1] = lines[1].split("\t")[0] + "\tx + \\Pi"
    caption.write_text("\n".join(lines) + "\n")
    with pytest.raises(UnknownTokenError) as info:
        load_split(root, "train")
    message = str(info.value)
    assert f"{caption}:2" in message and "'\\\\Pi'" in message
    assert info.value.token == "\\Pi"


def test_caption_without_its_file_names_the_name_and_line(inkml_dataset):
    root = inkml_dataset({"train": 3})
    (root / "train" / "train_002.inkml").unlink()
    with pytest.raises(CaptionError) as info:
        load_split(root, "train")
    assert "caption.txt:3" in str(info.value) and "train_002" in str(info.value)


@pytest.mark.parametrize("text, expected", [
    ("a\tx\na\ty\n", "already has a caption on line 1"),
    ("a\n", "no tokens"),
])
def test_malformed_caption_lines_raise(tmp_path, text, expected):
    folder = tmp_path / "d" / "train"
    folder.mkdir(parents=True)
    (folder / "caption.txt").write_text(text)
    with pytest.raises(CaptionError, match=expected):
        load_split(tmp_path / "d", "train")


# ---- unusable files: strict raises, bulk skips with a count --------------------------------------

def test_corrupt_image_raises_in_strict_mode_and_is_skipped_in_bulk(tmp_path, isolated_cache):
    folder = tmp_path / "d" / "2014"
    folder.mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(folder / "good.png")
    (folder / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    (folder / "caption.txt").write_text("good\tx\nbad\ty\n")
    with pytest.raises(ImageReadError, match="bad.png"):
        load_split(tmp_path / "d", "2014", strict=True)
    with pytest.warns(UserWarning, match="skipped 1 of 2") as record:
        exprs = load_split(tmp_path / "d", "2014")
    assert [e.name for e in exprs] == ["good"] and "bad.png" in str(record[0].message)
    with pytest.raises(ImageReadError, match="bad.png"):
        read_image(folder / "bad.png")


def test_empty_inkml_raises_in_strict_mode_and_is_skipped_in_bulk(inkml_dataset, isolated_cache):
    root = inkml_dataset({"train": 4})
    (root / "train" / "train_001.inkml").write_bytes(b"")
    with pytest.raises(InkMLError, match="train_001.inkml"):
        load_split(root, "train", strict=True)
    with pytest.warns(UserWarning, match="skipped 1 of 4"):
        assert len(load_split(root, "train")) == 3
    # The cache remembers the failure, so a warm load warns the same.
    with pytest.warns(UserWarning, match="skipped 1 of 4"):
        assert len(load_split(root, "train")) == 3


# ---- the cache -------------------------------------------------------------------------------------

def test_second_load_comes_from_the_cache_and_changes_invalidate_it(inkml_dataset, isolated_cache):
    root = inkml_dataset({"2016": 3})
    first = load_split(root, "2016")
    entries = sorted(isolated_cache.glob("2016-*.npz"))
    assert cache_dir() == isolated_cache and len(entries) == 1
    cached = read_cache_file(entries[0])
    assert cached.from_cache and list(cached.images) == [e.name for e in first]
    for e in first:
        assert cached.images[e.name].tobytes() == e.image.tobytes()

    again = load_split(root, "2016")
    assert [e.image.tobytes() for e in again] == [e.image.tobytes() for e in first]
    assert len(list(isolated_cache.glob("2016-*.npz"))) == 1

    # A changed file is a different source: a new entry, rendered from the new ink.
    (root / "2016" / "2016_000.inkml").write_text(inkml_document(glyph_strokes(9)))
    changed = load_split(root, "2016")
    assert len(list(isolated_cache.glob("2016-*.npz"))) == 2
    assert changed[0].image.tobytes() != first[0].image.tobytes()
    # Other render settings are another entry too.
    from hmer.data import RenderConfig

    load_split(root, "2016", RenderConfig(stroke_width=5))
    assert len(list(isolated_cache.glob("2016-*.npz"))) == 3


def test_a_failing_cache_write_leaves_nothing_behind(inkml_dataset, isolated_cache, monkeypatch):
    root = inkml_dataset({"2019": 2})

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez_compressed", fail)
    with pytest.raises(OSError, match="disk full"):
        load_split(root, "2019")
    assert not any(isolated_cache.iterdir())


def test_the_worker_pool_renders_the_same_as_one_process(inkml_dataset, isolated_cache, one_thread):
    root = inkml_dataset({"train": 70})  # above the size at which a pool is used
    pooled = load_split(root, "train", workers=2, use_cache=False)
    single = load_split(root, "train", workers=1, use_cache=False)
    assert [e.name for e in pooled] == [e.name for e in single]
    assert all(a.image.tobytes() == b.image.tobytes() for a, b in zip(pooled, single))
    assert not isolated_cache.exists()  # use_cache=False writes nothing


def test_limit_keeps_the_first_captions(inkml_dataset, isolated_cache):
    root = inkml_dataset({"train": 6})
    assert [e.name for e in load_split(root, "train", limit=2)] == ["train_000", "train_001"]


# ---- single files (hmer predict) -------------------------------------------------------------------

def test_read_expression_file_reads_ink_and_images_strictly(tmp_path):
    ink = tmp_path / "one.inkml"
    ink.write_text(inkml_document(glyph_strokes(1)))
    expr = read_expression_file(ink)
    assert expr.name == "one" and expr.tokens == [] and expr.image.max() == 255
    png = tmp_path / "two.png"
    Image.fromarray(expr.image).save(png)
    # an image file is read as the standard images are (cropped to its ink with their margins, then
    # scaled to the model's height): the renderer's own padding comes back to within a pixel
    again = read_expression_file(png).image
    assert again.max() == 255 and all(abs(a - b) <= 1 for a, b in zip(again.shape, expr.image.shape)), again.shape
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    with pytest.raises(DataError, match="notes.txt"):
        read_expression_file(notes)
    (tmp_path / "empty.inkml").write_text("")
    with pytest.raises(InkMLError, match="empty.inkml"):
        read_expression_file(tmp_path / "empty.inkml")
    with pytest.raises(DataError, match="absent.png"):
        read_expression_file(tmp_path / "absent.png")


# ---- vocabulary ------------------------------------------------------------------------------------

def test_vocabulary_round_trip():
    vocab = Vocab()
    tokens = "\\frac { a ^ { 2 } } { \\sqrt { x } } \\leq \\infty".split()
    ids = vocab.encode(tokens)
    assert min(ids) > 2 and vocab.decode([vocab.sos_id, *ids, vocab.eos_id, vocab.pad_id]) == tokens
    assert len(vocab) == 113 and vocab.pad_id == 0
    with pytest.raises(UnknownTokenError, match="caption.txt:4"):
        vocab.encode(["x", "\\Pi"], source="caption.txt:4")


def test_nothing_is_written_into_the_source(inkml_dataset, isolated_cache):
    root = inkml_dataset({"train": 2})
    before = sorted(p.name for p in (root / "train").iterdir())
    load_split(root, "train")
    assert sorted(p.name for p in (root / "train").iterdir()) == before
