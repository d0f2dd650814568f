"""`hmer predict` reads a user's image as the run's own evaluation read the standard 2014 images
(issue 70): a raw standard image, given as a file, gets the prediction the run's committed
`predictions/test_2014-std.csv` holds for it, by the 8-character id the README prints."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hmer.data.standard import iter_standard_images

REPO = Path(__file__).resolve().parents[1]
# A committed run trained on 48 px renderings (the direction study's l2r cell, seed 1): l2r decodes
# fastest with beam 10, and the standard images are about twice its height, so they must be scaled.
RUN = "28e361c7"
PREDICTIONS = REPO / "mlruns/artifacts/ablate_direction-cpu/28e361c7936642b291162ca56ca8f624/artifacts/predictions"

pytestmark = pytest.mark.shared_data


def test_predict_gives_a_raw_standard_image_the_run_s_committed_prediction(standard_2014_images, tmp_path):
    from PIL import Image

    with open(PREDICTIONS / "test_2014-std.csv", newline="") as f:
        committed = {row["name"]: row["prediction"] for row in csv.DictReader(f)}
    names = sorted(committed)[::9][:100]  # every ninth of the 986: 100 images of every size
    files = []
    for name, image in iter_standard_images(standard_2014_images, names):
        files.append(tmp_path / f"{name}.bmp")
        Image.fromarray(image).save(files[-1])  # as the tarball holds it: white on black, its own size
    assert len(files) == 100
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "HMER_MLRUNS")}
    store = f"sqlite:///{REPO / 'mlruns' / 'mlflow.db'}"  # the committed store, read only
    done = subprocess.run([sys.executable, "-m", "hmer.cli", "predict", RUN, *map(str, files), "--device", "cpu",
                           "--tracking-uri", store], capture_output=True, text=True, cwd=REPO, timeout=1200,
                          env={**env, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    printed = dict(line.split("\t", 1) for line in done.stdout.strip().splitlines())
    assert sorted(printed) == sorted(names)
    differ = [name for name in names if printed[name] != committed[name]]
    assert not differ, f"{len(differ)} of 100 differ, e.g. {differ[0]}: {printed[differ[0]]!r} against " \
                       f"{committed[differ[0]]!r}"
