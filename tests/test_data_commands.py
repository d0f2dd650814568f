"""`data check` lists every problem; `data render` writes a data.zip that reads back the same,
and never leaves a half-written zip."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
from PIL import Image

from hmer.data import load_split
from hmer.data import commands
from hmer.data.commands import check_command, render_command
from hmer.data.render import RenderConfig


def test_check_of_a_clean_dataset_prints_counts_and_returns_0(inkml_dataset):
    root = inkml_dataset({"train": 12, "2014": 3, "2016": 2, "2019": 1})
    out = io.StringIO()
    assert check_command(str(root), out=out, workers=1) == 0
    text = out.getvalue()
    for split, n in (("train", 12), ("2014", 3), ("2016", 2), ("2019", 1)):
        assert any(line.split()[:2] == [split, str(n)] for line in text.splitlines())
    # no writer in these files: whole captions are held out (each caption is written twice here)
    assert "train after the hold-out: 10 train + 2 val (rule caption" in text
    assert "0 error(s)" in text


def test_check_lists_every_problem_and_returns_1(inkml_dataset):
    root = inkml_dataset({"train": 6, "2014": 2})
    train = root / "train"
    lines = (train / "caption.txt").read_text().splitlines()
    lines[0] = "train_000\tx + \\Pi"            # unknown token
    lines[1] = "train_001\t{ x"                 # unbalanced braces (a warning)
    lines.append("ghost\tx")                    # caption without a file
    (train / "caption.txt").write_text("\n".join(lines) + "\n")
    (train / "train_002.inkml").write_text("<ink><trace>1 2,")       # corrupt
    (train / "train_003.inkml").write_bytes(b"")                      # empty
    (train / "orphan.inkml").write_text((train / "train_004.inkml").read_text())  # file without caption
    out = io.StringIO()
    assert check_command(str(root), out=out, workers=1) == 1
    text = out.getvalue()
    caption = train / "caption.txt"
    assert f"error: {caption}:1: token '\\\\Pi' is not in the vocabulary" in text
    assert f"warning: {caption}:2: unbalanced braces" in text
    assert f"error: {caption}:7: no file for 'ghost'" in text
    assert "train_002.inkml:" in text and "not well-formed" in text
    assert "train_003.inkml: empty file" in text
    assert "orphan.inkml: no caption for this file" in text
    assert "split '2016' is missing" in text and "split '2019' is missing" in text
    assert "4 error(s)" in text


@pytest.mark.parametrize("image_format,pil_format,mode", [("bmp", "BMP", "L"), ("png", "PNG", "1")])
def test_render_zip_reads_back_with_the_same_names_tokens_and_pixels(inkml_dataset, isolated_cache, tmp_path,
                                                                     image_format, pil_format, mode):
    root = inkml_dataset({"train": 5, "2014": 3})
    target = tmp_path / "out" / "rendered.zip"
    out = io.StringIO()
    assert render_command(str(root), target, workers=1, out=out, image_format=image_format) == 0
    assert "train: 5 images" in out.getvalue() and "2014: 3 images" in out.getvalue()
    with zipfile.ZipFile(target) as archive:
        names = archive.namelist()
        assert "data/train/caption.txt" in names and f"data/2014/2014_000.{image_format}" in names
        assert "data/train/writers.txt" not in names  # these InkML files name no writer
        with Image.open(io.BytesIO(archive.read(f"data/2014/2014_000.{image_format}"))) as img:
            assert img.format == pil_format and img.mode == mode
    for split in ("train", "2014"):
        original, rendered = load_split(root, split), load_split(target, split)
        assert [e.name for e in rendered] == [e.name for e in original]
        for a, b in zip(original, rendered):
            assert a.tokens == b.tokens
            np.testing.assert_array_equal(a.image, b.image)
    assert [p.name for p in target.parent.iterdir()] == ["rendered.zip"]  # no temporary left


def test_render_limit_keeps_the_first_captions_per_split(inkml_dataset, isolated_cache, tmp_path):
    root = inkml_dataset({"train": 5, "2014": 3})
    target = tmp_path / "small.zip"
    assert render_command(str(root), target, workers=1, out=io.StringIO(), limit=2) == 0
    assert [e.name for e in load_split(target, "train")] == ["train_000", "train_001"]


def test_a_render_that_fails_midway_leaves_no_zip(inkml_dataset, isolated_cache, tmp_path, monkeypatch):
    root = inkml_dataset({"train": 6, "2014": 3})
    target = tmp_path / "out" / "rendered.zip"
    target.parent.mkdir()
    encode, calls = commands.encode_bmp, []

    def failing_encoder(image):
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("simulated crash while writing")
        return encode(image)

    monkeypatch.setattr(commands, "encode_bmp", failing_encoder)
    with pytest.raises(RuntimeError, match="simulated crash"):
        render_command(str(root), target, workers=1, out=io.StringIO())
    assert len(calls) == 4
    assert list(target.parent.iterdir()) == []  # neither the zip nor a temporary file


def test_a_failed_render_keeps_an_earlier_zip_intact(inkml_dataset, isolated_cache, tmp_path, monkeypatch):
    root = inkml_dataset({"2014": 2})
    target = tmp_path / "rendered.zip"
    assert render_command(str(root), target, workers=1, out=io.StringIO()) == 0
    before = target.read_bytes()
    monkeypatch.setattr(commands, "encode_bmp", lambda image: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError):
        render_command(str(root), target, workers=1, out=io.StringIO())
    assert target.read_bytes() == before


def test_png_refuses_a_grey_rendering_and_leaves_no_zip(inkml_dataset, isolated_cache, tmp_path):
    root = inkml_dataset({"train": 2})
    target = tmp_path / "grey.zip"
    with pytest.raises(ValueError, match=r"train_000\.inkml: its rendering is not binary"):
        render_command(str(root), target, RenderConfig(antialias=True), workers=1, out=io.StringIO(),
                       image_format="png")
    assert list(tmp_path.glob("*.zip*")) == [] and list(tmp_path.glob(".grey*")) == []
