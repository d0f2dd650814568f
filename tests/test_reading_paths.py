"""docs/architecture.md's answers to "what a `comer-fusion` model computes in a forward pass", "how
one training step is done", "where a study's cell gets its config" and "how a finished study gets into
the committed store", held to the code: each lists the modules to open (at most 9, 3, 9 and 13), and
running the code in question reaches the functions of those modules and of no other module of `hmer`
(the step: of its own modules and the forward pass's; the publish: of its own modules and of those
that `hmer report --study` reaches to build the table it gives each study)."""

from __future__ import annotations

import ast
import dataclasses
import re
import sys
from pathlib import Path

import torch

import hmer
from hmer.data import Vocab
from hmer.model import build_model, make_targets
from hmer.model_presets import preset_config, preset_with_recipe
from hmer.training.loader import make_train_batch
from hmer.training.optim import build_optimizer
from hmer.training.setup import prepare_model
from hmer.training.step import LossModule, train_step
from package_imports import ROOT
from tiny_dataset import make_images, tiny_data

ARCHITECTURE = ROOT / "docs" / "architecture.md"
FORWARD = "What a `comer-fusion` model computes in a forward pass"
STEP = "How one training step is done"
CELL_CONFIG = "Where a study's cell gets its config"
PUBLISH = "How a finished study gets into the committed store"
PACKAGE = Path(hmer.__file__).resolve().parent
# comer-fusion at a size that runs in a moment: two decoder layers, so that the ARM refines one
SMALL = {"growth_rate": 4, "num_dense_layers": 2, "d_model": 32, "nhead": 4, "dim_feedforward": 64,
         "num_decoder_layers": 2}


def _listed(heading: str) -> list[str]:
    """The modules a section's numbered list opens, as dotted names (`model/encoder.py` -> hmer.model.encoder)."""
    section = ARCHITECTURE.read_text().split(f"### {heading}\n", 1)[1].split("\n#", 1)[0]
    return ["hmer." + path.replace("/", ".") for path in re.findall(r"^\d+\. `([\w/]+)\.py`", section, re.M)]


def _reached(run) -> set[str]:
    """The modules of `hmer` whose Python functions `run()` calls, at any depth."""
    reached: set[str] = set()

    def profile(frame, event, arg):
        if event == "call":
            path = Path(frame.f_code.co_filename)
            if path.is_relative_to(PACKAGE):
                reached.add(".".join(("hmer", *path.relative_to(PACKAGE).with_suffix("").parts)))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return reached


def _comer_fusion():
    cfg = dataclasses.replace(preset_config("tiny-comer"), **SMALL)
    assert cfg.coverage == "fusion" and cfg.decoder == "transformer"
    torch.manual_seed(0)
    return build_model(cfg)


def test_the_forward_pass_opens_the_modules_it_lists(one_thread):
    listed = _listed(FORWARD)
    assert 0 < len(listed) <= 9
    model = _comer_fusion()
    images, mask = make_images([(40, 64), (32, 48)])
    tgt_in, _, _ = make_targets([[5, 6, 7, 8], [9, 10]], "bi")
    for mode in (model.eval, model.train):  # the plain path, evaluating and training
        mode()
        with torch.no_grad():
            reached = _reached(lambda: model(images, mask, tgt_in))
        assert reached == set(listed), f"{mode.__name__}: reached {sorted(reached)}, listed {listed}"


def test_a_training_step_opens_the_modules_it_lists_and_the_forward_passs(one_thread):
    listed, forward = _listed(STEP), _listed(FORWARD)
    assert 0 < len(listed) <= 3
    cfg = preset_with_recipe("tiny-comer").override({f"model.{k}": v for k, v in SMALL.items()})
    torch.manual_seed(0)
    model = prepare_model(build_model(cfg.model), cfg.train).train()  # the accelerations switched on
    assert model.groups_directions
    loss_module = LossModule(model, cfg.train.label_smoothing)
    optimizer = build_optimizer(model.parameters(), cfg.train)
    tb = make_train_batch(tiny_data(n_train=3)["train"], Vocab(), "bi", torch.device("cpu"))
    reached = _reached(lambda: train_step(loss_module, optimizer, model, tb, cfg.train.grad_clip))
    assert reached <= set(listed) | set(forward), f"reached {sorted(reached - set(forward))}, listed {listed}"
    assert {"hmer.training.step", "hmer.model.hmer_model"} <= reached
    # the trainer's epoch calls that step once a batch, then the schedule's rate for the next one
    assert "hmer.training.trainer" in listed
    epoch = next(node for node in ast.walk(ast.parse((PACKAGE / "training" / "trainer.py").read_text()))
                 if isinstance(node, ast.FunctionDef) and node.name == "_train_epoch")
    called = {node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
              for node in ast.walk(epoch) if isinstance(node, ast.Call)}
    assert {"train_step", "step_batch"} <= called


def test_a_study_cells_config_opens_the_modules_it_lists():
    from hmer.studies import STUDIES
    from hmer.studies.budgets import get_budget
    from hmer.studies.resolution import cell_resolution, study_resolution

    listed = _listed(CELL_CONFIG)
    assert 0 < len(listed) <= 9
    budget = get_budget("cpu")
    direction = STUDIES.get("ablate_direction")
    study_resolution(direction, budget, n_trials=9, n_jobs=2)  # the registries imported before the count
    reached = _reached(lambda: cell_resolution(study_resolution(direction, budget, n_trials=9, n_jobs=2), direction,
                                               direction.cells((1,))[0]))
    assert reached == set(listed), f"reached {sorted(reached)}, listed {listed}"


def test_publishing_a_finished_study_opens_the_modules_it_lists(tmp_path_factory, tmp_path):
    from hmer.cli import main
    from hmer.store.publish import publish
    from study_store import STUDY_NAME, study_store

    listed = _listed(PUBLISH)
    assert 0 < len(listed) <= 13
    shared = study_store(tmp_path_factory.getbasetemp() / "report-study-store")  # a finished smoke study

    def checkout(name: str) -> Path:
        mlruns = tmp_path / name / "mlruns"
        mlruns.mkdir(parents=True)
        (tmp_path / name / "pyproject.toml").write_text('[project]\nname = "hmer"\n')
        return mlruns

    publish(shared.root, checkout("first"), keep_unfinished=False)  # every module imported before the count
    reached = _reached(lambda: publish(shared.root, checkout("second"), keep_unfinished=False))
    table = _reached(lambda: main(["report", "--study", STUDY_NAME, "--tracking-uri", shared.tracking_uri,
                                   "--out", str(tmp_path / "report")]))
    assert set(listed) <= reached, f"listed but not reached: {sorted(set(listed) - reached)}"
    unlisted = reached - set(listed)
    assert unlisted <= table, f"reached, neither listed nor the report's: {sorted(unlisted - table)}"
    # what a publish does itself, in the store and tracking layers, is listed, not left to the report
    own = {m for m in reached if m.startswith(("hmer.store.", "hmer.tracking."))}
    assert own <= set(listed), f"not listed: {sorted(own - set(listed))}"
