"""The `scaled` budget (issue 66) is the frontier study's 64-epoch cell at 0.7 of the standard images' scale:
`hmer config` prints, for the coverage study's fusion cell at that budget, the config the frontier's cell
trains, but for the test years it decodes at the end (the frontier decodes none)."""

from __future__ import annotations

import json
import subprocess
import sys


def _config(tmp_path, *args: str) -> dict:
    stores = ["--storage", f"sqlite:///{tmp_path / 'optuna.db'}",
              "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    command = [sys.executable, "-m", "hmer.cli", "config", *args, *stores, "--seed", "1", "--format", "json"]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return {key: entry["value"] for key, entry in json.loads(done.stdout).items()}


def test_the_scaled_budget_trains_the_frontiers_64_epoch_cell_at_0_7(tmp_path):
    frontier = _config(tmp_path, "frontier", "--budget", "cpu", "--cell", "model.d_model=192",
                       "data.render_scale=0.7", "train.ema_decay=0.0", "train.epochs=64")
    scaled = _config(tmp_path, "ablate_coverage", "--budget", "scaled", "--cell", "model.coverage=fusion")
    differing = {key: (frontier.get(key), scaled.get(key)) for key in frontier.keys() | scaled.keys()
                 if frontier.get(key) != scaled.get(key)}
    assert differing == {"data.test_years": ("", "2014,2016,2019")}
    assert (scaled["data.render_scale"], scaled["train.epochs"], scaled["train.schedule"]) == (0.7, 64, "wsd")
