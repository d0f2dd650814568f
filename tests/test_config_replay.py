"""Every committed run resolves to what it trained (issue 50).

Each run's stored config (`config.json` among its artifacts, read under the one policy for stored
configs: a key it lacks takes `VALUES_BEFORE_KEY_EXISTED`) is rebuilt from what the store records
about it, through today's layers (hmer.presets.LAYERS), and compared field for field:

- a study's trial run: its study's spec and budget (Optuna user attributes), the study's stored
  base config as a resume takes it, and its cell (the `hmer.cell` and `hmer.seed` tags; a sweep
  trial's drawn values, fitted epochs and warm-up steps);
- a study's stored base config: today's resolution of its spec and budget, unless the study began
  under an earlier definition of its budget (`BEGUN_UNDER_ANOTHER_BUDGET`);
- a run of `hmer train`: the command that trained it (`TRAIN_COMMANDS`: its preset, which the run
  records as its config's `name`, the budget, and the keys its --set gave).

Where a run trained otherwise than today's layers give, the key, the runs and the reason are
written down here (`CELLS_CHANGED_SINCE`, a command's `changed`), and the test holds that exactly those
keys differ. The store is
read only: its two databases are copied, its artifacts read in place.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from hmer.config import VALUES_BEFORE_KEY_EXISTED, Config, stored_config
from hmer.presets import Resolution, resolve_preset
from hmer.studies.budgets import get_budget
from hmer.studies.resolution import (
    budget_resolution,
    cell_resolution,
    stored_base,
    study_resolution,
    sweep_trial_values,
)
from hmer.studies.spec import STUDIES, SweepSpec
from hmer.tracking import keys

REPO = Path(__file__).resolve().parents[1]
MLRUNS = REPO / "mlruns"

pytestmark = pytest.mark.skipif(not (MLRUNS / "mlflow.db").exists() or not (MLRUNS / "optuna.db").exists(),
                                reason="no committed store in mlruns/ (a checkout without results)")

# The `cpu` budget before c13ce17 (issue 24): the tiny presets at small's widths with the pilots'
# AdamW-cosine recipe, 64 px, 4 epochs. Studies begun under it train under their stored base config.
BEGUN_UNDER_ANOTHER_BUDGET = {
    "sweep-cpu": "the cpu budget before c13ce17",
    "ablate_direction-cpu-4ep": "the cpu budget before c13ce17 (superseded by ablate_direction-cpu)",
}

# The grid cells that trained otherwise than today's layers give them: (study, variant) -> {key: why}.
CELLS_CHANGED_SINCE: dict[tuple[str, str], dict[str, str]] = {
    # ConvS2S's attention was Gehring's until ffdbb27, which brought `scaled` with model.decoder=convs2s
    # (hmer.model.convs2s); the study is kept under this name for it, its convs2s cells superseded
    ("ablate_decoder-cpu-gehring", "convs2s"): {"model.conv_attention": "gehring before ffdbb27"},
}
# The defaults that changed since the oldest runs of `hmer train`: key -> why.
BEFORE_ISSUE_24 = {"train.channels_last": "False by default until 246d93c (issue 24): the encoder ran channels-first"}
BEFORE_THE_HOLD_OUT_RULE = {**BEFORE_ISSUE_24, "data.val_min_edits": (
    "the key did not exist before 8fb14e1: validation kept out only exact twins of a training caption (its "
    "value before, 1); the default has been 2 since")}

# The pilots' AdamW-cosine recipe, given with --set (docs/cpu_protocol.md, "The pilot")
_ADAMW_COSINE = ("train.recipe", "train.optimizer", "train.lr", "train.weight_decay", "train.eps",
                 "train.warmup_steps", "train.schedule", "train.min_lr")
# Sweep trial 16's drawn values (docs/cpu_protocol.md, "From the sweep to the budget")
_TRIAL_16 = ("train.lr", "train.warmup_steps", "train.label_smoothing", "model.dropout", "model.encoder_dropout",
             "data.max_batch_size", "data.batch_pixels", "data.aug_share", "model.growth_rate", "model.d_model",
             "model.dim_feedforward", "model.num_decoder_layers")


@dataclass(frozen=True)
class Command:
    """`hmer train --preset P [--budget B] --set KEY=... ...`, the command that trains a run's config
    today: the keys its --set gives (their values are the run's own; a run made before the `cpu`
    budget existed gave that budget's keys one by one), and the keys whose default has changed since
    the run trained."""

    budget: str | None
    set_keys: tuple[str, ...]
    changed: dict[str, str] = field(default_factory=dict)
    where: str = ""  # where the command is written down


# Every committed `hmer train` run, by id.
TRAIN_COMMANDS: dict[str, Command] = {
    # cpu-pilot, at bdc5f49: 5 epochs with the BTTR recipe (stopped while decoding) and with AdamW cosine
    "32d2a680a11e4982a8aa85d891fc295f": Command(
        None, ("data.render_height", "train.epochs", "data.test_years", "data.test_limit"),
        BEFORE_THE_HOLD_OUT_RULE, "docs/cpu_protocol.md, The pilot"),
    "27bc34392cf64d5dbbf9ecab69c5dca0": Command(
        None, ("data.render_height", "train.epochs", "data.test_years", "data.test_limit",
               *(k for k in _ADAMW_COSINE if k != "train.recipe")),
        BEFORE_THE_HOLD_OUT_RULE, "docs/cpu_protocol.md, The pilot"),
    # cpu-protocol, at d4d19dc: tiny 16 epochs, small 8 epochs, tiny on the old random split
    "9d118b309c874c2d8c461508761340b6": Command(
        None, ("data.render_height", "train.epochs", "train.device", *_ADAMW_COSINE),
        BEFORE_THE_HOLD_OUT_RULE, "docs/cpu_protocol.md, The pilot"),
    "aa801a81a3c5419dba07474d275776c0": Command(
        None, ("data.render_height", "train.epochs", "train.device", *_ADAMW_COSINE),
        BEFORE_THE_HOLD_OUT_RULE, "docs/cpu_protocol.md, The pilot"),
    "f155019ea1404734adbd109524e1da41": Command(
        None, ("data.render_height", "train.epochs", "train.device", "data.val_split", *_ADAMW_COSINE),
        BEFORE_THE_HOLD_OUT_RULE, "docs/cpu_protocol.md, The pilot"),
    # cpu-best, at 2880448: small, the same recipe, 24 epochs
    "7ef3f75865114ed5848ddc270842bf0d": Command(
        None, ("data.render_height", "train.epochs", *_ADAMW_COSINE), BEFORE_ISSUE_24,
        "docs/cpu_protocol.md, The best CPU model"),
    # cpu-budget-pilot, at f711c04: sweep trial 16's recipe for 24 epochs, with its constant rate and with cosine
    "dd933152ad084231a2504a194d0574ed": Command(
        "cpu", (*_TRIAL_16, "train.epochs", "train.seed", "train.schedule"), {},
        "docs/cpu_protocol.md, From the sweep to the budget"),
    "2042cd99b6914f59888b3d16924e6cd9": Command(
        "cpu", (*_TRIAL_16, "train.epochs", "train.seed"), {}, "docs/cpu_protocol.md, From the sweep to the budget"),
    # cpu-best, at c13ce17: the cpu budget's recipe for 22 epochs (the warm-up at the same share)
    "f03c6924a6e745589942d333e6e1b42c": Command(
        "cpu", ("train.epochs", "train.warmup_steps"), {}, "docs/cpu_protocol.md, The best CPU model"),
    # cpu-budget-cost, at c6a05c6: the direction study's bi cell, seed 4
    "aed99a4f9d274b8497b05e83902d21d4": Command(
        "cpu", ("train.seed",), {}, "README, What a trial of the budget costs"),
}


@dataclass
class Store:
    client: MlflowClient
    storage: str
    configs: dict[str, Path] = field(default_factory=dict)  # run id -> its config.json


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    folder = tmp_path_factory.mktemp("store")
    for name in ("mlflow.db", "optuna.db"):
        shutil.copy(MLRUNS / name, folder / name)
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    found = Store(client, f"sqlite:///{folder / 'optuna.db'}")
    for experiment in client.search_experiments():
        for run in client.search_runs([experiment.experiment_id], max_results=10_000):
            if run.data.tags.get(keys.ROLE) in ("study", keys.ROLE_SUMMARY):  # they train nothing
                continue
            # the artifacts imported from pilot-export.tar.gz sit one folder deeper than their run's root
            paths = sorted((REPO / run.info.artifact_uri).rglob("config.json"))
            assert len(paths) == 1, f"run {run.info.run_id} ({experiment.name}): config.json {paths}"
            found.configs[run.info.run_id] = paths[0]
    return found


def _stored(path: Path) -> dict:
    return Config.from_dict(json.loads(path.read_text()), stored=True).to_flat_dict()


def _differences(stored: dict, rebuilt: Resolution) -> dict[str, tuple]:
    """Key -> (stored, rebuilt, the layer that set it) where the two differ; the machine keys are this
    process's, as a stored config taken up again has them."""
    mine = stored_config(stored, rebuilt.config).to_flat_dict()
    flat = rebuilt.config.to_flat_dict()
    return {key: (mine[key], flat[key], rebuilt.sources[key]) for key in flat if mine[key] != flat[key]}


def _studies(store: Store) -> dict[str, tuple]:
    """Study name -> (spec, budget, stored base config, its trials by number)."""
    found = {}
    for summary in optuna.get_all_study_summaries(store.storage):
        study = optuna.load_study(study_name=summary.study_name, storage=store.storage)
        attrs = study.user_attrs
        spec = STUDIES.get(attrs[keys.SPEC])
        base = stored_base(store.storage, summary.study_name, spec.name)
        found[summary.study_name] = (spec, get_budget(attrs[keys.BUDGET]), base, {t.number: t for t in study.trials},
                                     attrs)
    return found


def _fresh(spec, budget, attrs) -> Resolution:
    """What a study of `spec` under `budget` begins with today (no --set, the budget's workers)."""
    n_trials = attrs[keys.N_TRIALS] if isinstance(spec, SweepSpec) else len(spec.cells(attrs[keys.GRID]["train.seed"]))
    return study_resolution(spec, budget, n_trials=n_trials, n_jobs=budget.default_jobs)


def test_every_study_began_with_todays_resolution_of_its_spec_and_budget(store):
    studies = _studies(store)
    assert set(BEGUN_UNDER_ANOTHER_BUDGET) <= set(studies)
    for name, (spec, budget, base, _, attrs) in studies.items():
        fresh = _fresh(spec, budget, attrs)
        differences = _differences(Config.from_flat_dict(base, stored=True).to_flat_dict(), fresh)
        if name in BEGUN_UNDER_ANOTHER_BUDGET:
            assert differences, f"{name} begins as today's {budget.name} budget: not BEGUN_UNDER_ANOTHER_BUDGET"
        else:
            assert not differences, f"study {name}: its stored base config and today's layers differ: {differences}"


def test_every_trial_run_of_a_study_resolves_to_its_stored_config(store):
    studies = _studies(store)
    replayed, changed = 0, set()
    for run_id, path in store.configs.items():
        tags = store.client.get_run(run_id).data.tags
        if keys.STUDY not in tags:
            continue
        spec, budget, base, trials, attrs = studies[tags[keys.STUDY]]
        resumed = _fresh(spec, budget, attrs).take_stored(base, tags[keys.STUDY])
        if isinstance(spec, SweepSpec):
            trial = trials[int(tags[keys.TRIAL])]
            drawn = {p.key: trial.params[p.name] for p in spec.params if not p.share_of_training}
            # its warm-up steps, as the trial fitted them to its epochs, are in its label
            label = dict(pair.split("=", 1) for pair in tags[keys.CELL].split(","))
            drawn.update({"train.epochs": trial.user_attrs[keys.TRIAL_FITTED_EPOCHS],
                          **{p.key: int(label[p.key]) for p in spec.params if p.share_of_training}})
            rebuilt = resumed.apply("cell", f"trial {trial.number}", sweep_trial_values(spec, resumed.config, drawn))
            variant = f"trial {trial.number}"
        else:
            grid = attrs[keys.GRID]
            given = dict(pair.split("=", 1) for pair in tags[keys.CELL].split(","))
            cell = {key: next(v for v in grid[key] if str(v) == given[key]) for key in spec.axes}
            cell["train.seed"] = int(tags[keys.SEED])
            rebuilt = cell_resolution(resumed, spec, cell)
            variant = "/".join(str(cell[key]) for key in spec.axes)
        expected = CELLS_CHANGED_SINCE.get((tags[keys.STUDY], variant), {})
        differences = _differences(_stored(path), rebuilt)
        assert set(differences) == set(expected), \
            f"run {run_id} ({tags[keys.STUDY]}, {variant}) trained otherwise than its layers give: {differences}"
        replayed += 1
        if expected:
            changed.add((tags[keys.STUDY], variant))
    assert replayed == sum(1 for run_id in store.configs if keys.STUDY in store.client.get_run(run_id).data.tags)
    assert changed == set(CELLS_CHANGED_SINCE), "an entry of CELLS_CHANGED_SINCE that no run needs"


def test_every_run_of_hmer_train_resolves_to_its_stored_config_from_its_command(store):
    trained = {run_id for run_id in store.configs if keys.STUDY not in store.client.get_run(run_id).data.tags}
    assert trained == set(TRAIN_COMMANDS), "a committed run of `hmer train` needs its command in TRAIN_COMMANDS"
    for run_id, command in TRAIN_COMMANDS.items():
        stored = _stored(store.configs[run_id])
        preset = stored["name"]
        resolved = budget_resolution(preset, get_budget(command.budget)) if command.budget else resolve_preset(preset)
        needed = [key for key in command.set_keys if stored[key] == resolved.config.to_flat_dict()[key]]
        assert not needed, f"run {run_id}: {needed} resolve to the stored values without --set"
        rebuilt = resolved.apply("set", "--set", {key: stored[key] for key in command.set_keys})
        differences = _differences(stored, rebuilt)
        assert set(differences) == set(command.changed), \
            f"run {run_id} ({command.where}) trained otherwise than its command gives today: {differences}"


def test_values_before_key_existed_names_every_key_a_committed_config_lacks(store):
    """The one policy for stored configs holds for the whole store: every key that some committed
    config (a run's config.json, a study's stored base) lacks is in the table, and nothing else."""
    lacking: set[str] = set()
    everything = set(Config().to_flat_dict())
    for path in store.configs.values():
        raw = json.loads(path.read_text())
        lacking |= everything - {"name", *(f"{s}.{k}" for s in ("model", "data", "train") for k in raw.get(s, {}))}
    for _, _, base, _, _ in _studies(store).values():
        lacking |= everything - set(base)
    assert lacking == set(VALUES_BEFORE_KEY_EXISTED), (
        f"missing from the table: {sorted(lacking - set(VALUES_BEFORE_KEY_EXISTED))}; "
        f"never lacking: {sorted(set(VALUES_BEFORE_KEY_EXISTED) - lacking)}")
