"""Integration on the real CROHME data (where every command finds it: $HMER_DATA, data/,
../shared/crohme): counts, the hold-out, the rendering statistics against the standard 2014 images,
and the rendered-zip round trip.

Nothing derived from the data is stored: the standard images' sizes are read from the tarball
here, and the rendered cache lives in a session temporary folder.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

from hmer.config import DataConfig
from hmer.data import load_dataset, load_split
from hmer.data.commands import check_command, render_command
from hmer.data.standard import iter_standard_images

pytestmark = pytest.mark.shared_data

EXPECTED = {"train": 8835, "2014": 986, "2016": 1147, "2019": 1199}


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("hmer-cache")


@pytest.fixture
def shared_cache(session_cache, monkeypatch):
    """One rendered cache for every shared-data test of the session (each split renders once)."""
    monkeypatch.setenv("HMER_CACHE", str(session_cache))
    return session_cache


def test_check_counts_every_split_and_finds_no_error(crohme_data):
    out = io.StringIO()
    assert check_command(str(crohme_data), out=out) == 0
    text = out.getvalue()
    table = [line.split() for line in text.splitlines() if len(line.split()) == 4]
    rows = {fields[0]: fields[1:] for fields in table if fields[0] in EXPECTED}
    for split, n in EXPECTED.items():
        assert rows[split] == [str(n)] * 3, f"{split}: {rows.get(split)}"
    assert "train after the hold-out: 8251 train + 465 val, 119 left out (rule writer" in text
    assert "0 error(s)" in text


def size_statistics(shapes: list[tuple[int, int]]) -> dict[str, float]:
    """Median height, median width and largest area of a list of (H, W)."""
    arr = np.asarray(shapes, dtype=np.int64)
    return {"median_height": float(np.median(arr[:, 0])), "median_width": float(np.median(arr[:, 1])),
            "max_area": float((arr[:, 0] * arr[:, 1]).max())}


def test_rendered_2014_sizes_match_the_standard_images_within_15_percent(crohme_data, standard_2014_images,
                                                                           shared_cache):
    ours = {e.name: e.image.shape for e in load_split(crohme_data, "2014")}
    theirs = {name: image.shape for name, image in iter_standard_images(standard_2014_images)}
    assert set(ours) == set(theirs) and len(ours) == 986
    ours_stats = size_statistics(list(ours.values()))
    theirs_stats = size_statistics(list(theirs.values()))
    for key in ("median_height", "median_width", "max_area"):
        assert ours_stats[key] == pytest.approx(theirs_stats[key], rel=0.15), (key, ours_stats, theirs_stats)
    # Not only the summary: expression by expression, heights agree closely.
    ratios = np.array([ours[n][0] / theirs[n][0] for n in ours])
    assert np.median(np.abs(ratios - 1)) < 0.05


def test_load_dataset_holds_out_val_from_train(crohme_data, shared_cache):
    cfg = DataConfig(path=str(crohme_data))
    ds = load_dataset(None, cfg, splits=("train", "val"))
    # whole writers held out; 119 expressions of theirs have their caption, or one a token edit
    # away, in training and sit out (data.val_min_edits=2)
    assert (len(ds["train"]), len(ds["val"])) == (8251, 465)
    first_rule = load_dataset(None, DataConfig(path=str(crohme_data), val_min_edits=1), splits=("train", "val"))
    assert (len(first_rule["train"]), len(first_rule["val"])) == (8379, 453)  # exact twins only: 3 sit out
    old_rule = load_dataset(None, DataConfig(path=str(crohme_data), val_split="random"), splits=("val",))
    assert len(old_rule["val"]) == 442
    assert not {e.name for e in ds["train"]} & {e.name for e in ds["val"]}
    # Warm: from the cache, and the same hold-out.
    again = load_dataset(None, cfg, splits=("val",))
    assert [e.name for e in again["val"]] == [e.name for e in ds["val"]]
    assert all(a.image.tobytes() == b.image.tobytes() for a, b in zip(again["val"], ds["val"]))


def test_render_zip_round_trip_on_a_subset(crohme_data, shared_cache, tmp_path):
    target = tmp_path / "crohme-rendered.zip"
    out = io.StringIO()
    assert render_command(str(crohme_data), target, out=out, limit=24, workers=1) == 0
    for split in EXPECTED:
        original = load_split(crohme_data, split, limit=24, workers=1)
        rendered = load_split(target, split)
        assert len(rendered) == 24 and [e.name for e in rendered] == [e.name for e in original]
        for a, b in zip(original, rendered):
            assert a.tokens == b.tokens and a.image.tobytes() == b.image.tobytes()
