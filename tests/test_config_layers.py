"""What a run trains with, layer by layer (issue 50): presets are a family at a size with their
recipe, a named size or recipe replaces the preset's own, and `hmer config` prints every value with
the layer that set it, for a preset and for a real study's cell (a real Optuna storage and MLflow
store, the stored base config winning as on resume). The committed runs are replayed through the
same layers in tests/test_config_replay.py."""

from __future__ import annotations

import json

import optuna
import pytest
import torch
from mlflow.tracking import MlflowClient
from tiny_dataset import tiny_data

from hmer.cli import main
from hmer.config import Config
from hmer.model_presets import FAMILIES, LAYERS, PRESETS, SIZES, resolve_preset
from hmer.recipes import RECIPES
from hmer.studies import STUDIES, StudySpec, run_grid_study

# Held equal in every cell: a one-epoch tiny model, short decoding, one test year (as tests/test_studies.py).
TINY = {"train.epochs": 1, "train.beam_size": 2, "train.max_decode_len": 12, "train.attention_maps": 0,
        "train.device": "cpu", "data.batch_pixels": 20_000, "data.max_batch_size": 8, "data.test_years": "2014"}


def _config(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert main(["config", *argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_preset_is_a_family_at_a_size_with_its_recipe_stated():
    for name, preset in PRESETS.items():
        assert preset.family in FAMILIES and preset.size in SIZES and preset.recipe in RECIPES, name
        resolution = resolve_preset(name)
        assert resolution.sources["train.optimizer"] == f"recipe {preset.recipe}"
        assert resolution.sources["name"] == f"preset {name}" and resolution.config.name == name
    assert PRESETS["comer-fusion"].recipe == "comer" and PRESETS["tiny-comer"].recipe == "bttr"


def test_hmer_config_prints_each_value_with_the_layer_that_set_it(capsys):
    tiny_comer = _config(capsys, "tiny-comer")
    assert tiny_comer["model.coverage"] == {"value": "fusion", "layer": "family comer-fusion"}
    assert tiny_comer["model.d_model"] == {"value": 64, "layer": "size tiny"}
    # the CoMER family's reference encoder gives way to the CPU size's own, as the tiny presets have always had it
    assert tiny_comer["model.mask_padding"] == {"value": True, "layer": "size tiny"}
    assert tiny_comer["train.optimizer"] == {"value": "adadelta", "layer": "recipe bttr"}
    assert tiny_comer["data.scale_aug_max"] == {"value": 0.0, "layer": "default"}
    convs2s = _config(capsys, "convs2s")  # its decoder's registration brings these, stated nowhere else
    assert convs2s["model.conv_attention"] == {"value": "scaled", "layer": "family convs2s"}
    assert convs2s["model.token_pos"] == {"value": "learned", "layer": "family convs2s"}
    assert _config(capsys, "comer-fusion")["data.scale_aug_min"] == {"value": 0.7, "layer": "recipe comer"}


def test_a_named_recipe_or_size_replaces_the_presets_own(capsys):
    comer = _config(capsys, "tiny-comer", "--recipe", "comer", "--set", "train.lr=0.04")
    assert comer["data.scale_aug_max"] == {"value": 1.4, "layer": "recipe comer (--recipe)"}
    assert comer["train.lr"] == {"value": 0.04, "layer": "set --set"}
    assert comer["train.rho"]["layer"] == "default" and comer["train.eps"]["layer"] == "default"  # none of bttr's
    cpu = _config(capsys, "tiny-comer", "--budget", "cpu")
    assert cpu["model.d_model"] == {"value": 192, "layer": "size swept (budget cpu)"}
    assert cpu["model.coverage_kernel"]["layer"] == "family comer-fusion"
    assert cpu["train.optimizer"] == {"value": "adamw", "layer": "recipe swept (budget cpu)"}
    assert cpu["train.epochs"] == {"value": 13, "layer": "budget cpu"}
    with pytest.raises(ValueError, match="comes before"):  # the layers apply in their order only
        resolve_preset("tiny-transformer").apply("family", "bttr", {})
    assert LAYERS.index("cell") == len(LAYERS) - 1  # a cell's own values are the last word in a study


def test_a_set_of_a_studys_fixed_key_holds_in_its_cells(capsys, tmp_path, monkeypatch):
    """The frontier holds `model.coverage` and `data.test_years` fixed in its spec; a user's `--set`
    of either is the study's word for every cell, and the cell's own axis values stay its own."""
    monkeypatch.setenv("HMER_MLRUNS", str(tmp_path / "mlruns"))
    cell = ["--cell", "model.d_model=256", "data.render_scale=0.5", "train.ema_decay=0.0", "train.epochs=8"]
    plain = _config(capsys, "frontier", "--budget", "cpu", "--fresh", *cell)
    assert plain["model.coverage"] == {"value": "fusion", "layer": "study frontier"}
    assert plain["data.test_years"] == {"value": "", "layer": "study frontier"}
    changed = _config(capsys, "frontier", "--budget", "cpu", "--fresh", *cell,
                      "--set", "model.coverage=self", "data.test_years=2014", "model.d_model=128")
    assert changed["model.coverage"] == {"value": "self", "layer": "set --set"}
    assert changed["data.test_years"] == {"value": "2014", "layer": "set --set"}
    assert changed["model.d_model"]["value"] == 256 and changed["model.d_model"]["layer"].startswith("cell ")


def test_hmer_config_shows_a_studys_cell_with_its_stored_base_config_winning(capsys, tmp_path, monkeypatch):
    """A real study (one cell, which fails in its first step: quick) stores its base config; the
    stored value of a key wins over today's, as the study's next worker would train it, and the
    printed cell is what the study's trial run was logged with."""
    torch.set_num_threads(1)
    monkeypatch.setenv("HMER_MLRUNS", str(tmp_path / "mlruns"))
    monkeypatch.setenv("HMER_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "mlruns").mkdir()
    tracking = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    storage = f"sqlite:///{tmp_path / 'mlruns' / 'optuna.db'}"
    spec = StudySpec(name="layered", description="one cell that diverges", axes={"train.lr": (1e30,)},
                     model_presets={"tiny": "tiny-rnn"})
    STUDIES.register(spec.name, spec)
    try:
        run_grid_study(spec, "smoke", storage=storage, tracking_uri=tracking, data=tiny_data(), seeds=(1,),
                       overrides=TINY)
        argv = ["layered", "--budget", "smoke", "--seeds", "1", "--storage", storage, "--tracking-uri", tracking,
                "--cell", "train.lr=1e30", "--seed", "1", "--set", *(f"{k}={v}" for k, v in TINY.items())]
        printed = _config(capsys, *argv)
        run = MlflowClient(tracking).search_runs(
            [MlflowClient(tracking).get_experiment_by_name("layered-smoke").experiment_id],
            filter_string="tags.`hmer.trial` = '0'")[0]
        keys = Config().to_flat_dict()
        logged = Config.from_flat_dict({k: v for k, v in run.data.params.items() if k in keys}).to_flat_dict()
        assert {key: entry["value"] for key, entry in printed.items()} == logged
        assert printed["train.lr"]["layer"] == "cell train.lr=1e+30, seed 1"
        assert printed["data.render_height"] == {"value": 48, "layer": "budget smoke"}
        assert printed["model.image_pos"] == {"value": "none", "layer": "family wap-rnn"}

        rdb = optuna.storages.RDBStorage(storage)  # as if the code's default had changed since the study began
        study_id = rdb.get_study_id_from_name("layered-smoke")
        base = dict(rdb.get_study_system_attrs(study_id)["hmer.config"])
        base["train.channels_last"] = not base["train.channels_last"]
        rdb.set_study_system_attr(study_id, "hmer.config", base)
        again = _config(capsys, *argv)
        assert again["train.channels_last"] == {"value": base["train.channels_last"], "layer": "stored layered-smoke"}
        assert _config(capsys, *argv, "--fresh")["train.channels_last"]["layer"] == "default"
    finally:
        STUDIES.unregister(spec.name)


def test_bad_options_say_what_is_wrong_in_one_line_and_write_nothing(capsys, tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    cases = [(["nope"], "neither a preset"),
             (["ablate_direction", "--budget", "smoke", "--storage", storage, "--cell", "model.direction=up"],
              "model.direction='up' is not one of"),
             (["ablate_direction", "--budget", "smoke", "--storage", storage, "--cell", "train.lr=1"],
              "not an axis of study 'ablate_direction'"),
             (["ablate_direction", "--budget", "smoke", "--storage", storage, "--cell", "model.direction=bi",
               "--seeds", "x"], "--seeds 'x'"),
             (["sweep", "--budget", "smoke", "--storage", storage, "--cell", "model.decoder=rnn"],
              "not a parameter of sweep 'sweep'"),
             (["tiny-transformer", "--cell", "model.direction=bi"], "options of a study"),
             (["tiny-transformer", "--budget", "cpu", "--recipe", "comer"], "give --budget or --recipe"),
             (["tiny-transformer", "--recipe", "adam"], "unknown recipe 'adam'"),
             (["tiny-transformer", "--budget", "huge"], "unknown study budget 'huge'")]
    for argv, says in cases:
        capsys.readouterr()
        assert main(["config", *argv]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and says in err, (argv, err)
    assert not (tmp_path / "optuna.db").exists()  # a study that does not exist is read, not created


def test_hmer_config_prints_what_a_committed_study_cell_trained_with(capsys, tmp_path):
    """`hmer config` on the committed store's study prints, key for key, the `config.json` its cell's
    run trained with (what `hmer runs show` prints): both come from `resolution.cell_resolution`."""
    import shutil

    from package_imports import ROOT

    shutil.copy(ROOT / "mlruns" / "optuna.db", tmp_path / "optuna.db")  # read as a copy: nothing written
    path = sorted((ROOT / "mlruns" / "artifacts" / "ablate_direction-cpu").glob("*/artifacts/config.json"))[0]
    trained = Config.from_dict(json.loads(path.read_text())).to_flat_dict()
    printed = _config(capsys, "ablate_direction", "--budget", "cpu", "--storage", f"sqlite:///{tmp_path / 'optuna.db'}",
                      "--cell", f"model.direction={trained['model.direction']}", "--seed", str(trained["train.seed"]))
    assert {key: entry["value"] for key, entry in printed.items()} == trained
    assert printed["train.seed"]["layer"].startswith("cell model.direction=")
