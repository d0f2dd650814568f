"""`hmer runs migrate [STORE]`: a store brought to today's schema, once, so that no code reads an older one.

    changes = migrate_store(Path("mlruns"), repo=Path("."))   # what changed, in words; [] when up to date

A one-off (issue 67). It holds the history that the library no longer does: the value each config
key had before it existed, the old names of a tag, of a param and of the trial attributes, the
preset `tiny` (today `tiny-transformer`), the parent-run layout before issue 49. Nothing imports it
but `hmer runs migrate` and `hmer runs publish` (a study that trains from a commit before the
migration writes the old schema into its workspace, and is migrated when it is published). It goes,
with its command, once no unmigrated store remains: at the latest when issue 67 closes.

Its steps, each writing only what differs (a second migration changes nothing):
- configs: each run's `config.json` and each study's base config (`hmer.config`, and its parent
  run's `study.json`) hold every key of today's `Config`; a key one lacks takes the value that run
  trained with, the one it had before the key existed (`VALUES_THEN`), not today's default;
- names: the tag and study attribute that held a study's budget under its old name is `hmer.budget`,
  a parent run's param `preset` is `budget`; every trial user attribute has the `hmer.` prefix; the
  preset `tiny` is `tiny-transformer` in configs and params (a run's `hmer.variant` and run name
  are its labels, as they were shown, and stay);
- fingerprints: every trained run carries its training code's, measured at its commit in a temporary
  worktree (`fingerprint_of_commit`), or "unknown: why";
- study labels: each study is called by its own name in its Optuna `hmer.experiment`, its parent
  run's name and its `study` param (a study renamed before `hmer runs rename` set them all);
- parent runs in the layout since issue 49: no variant means as metrics, no `hmer.variant` tag.

It rewrites the two databases and the small `config.json` artifacts; no weights file. A checkpoint
keeps the config it was saved with: every key whose value before it existed is not today's default
(`data.val_min_edits`, 8fb14e1) is older than any checkpoint a study continues, and a preset's name
labels a config and trains nothing (`studies.resume.same_config`).

SQL is written where MLflow's and Optuna's APIs cannot: MLflow writes a param once and deletes no
metric; Optuna deletes no study attribute and changes no finished trial's attributes.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import tempfile
from collections import defaultdict
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..atomic import write_text_atomically
from ..config import Config
from ..tracking import keys
from ..tracking.portable import resolve_artifact_uri, set_params
from ..tracking.store import mlflow_client, search_all_runs

# Every key added since the oldest config in the committed store, with the value that reproduces
# what the code did before the key existed (the commit that added it, where one did).
VALUES_THEN: dict[str, Any] = {
    # f3dc35a: the reference presets' options; before them every model computed the project's own
    "model.mask_padding": True,
    "model.encoder_tail": "relu-norm-pos",
    "model.embed_pos_norm": True,  # embed_norm meant both LayerNorms, after the embedding and after the positions
    "train.search_rule": "hmer",
    "data.val_min_edits": 1,  # 8fb14e1: only exact caption twins were kept out of validation
    "train.label_smoothing": 0.0,  # 246d93c: plain cross-entropy
    # be4b31a: renderer augmentation and the second validation style, off
    "data.aug_share": 0.0, "data.aug_width_min": 1.0, "data.aug_width_max": 1.0, "data.aug_pressure": 0.0,
    "data.aug_antialias": 0.0, "data.aug_downscale": 0.0, "data.aug_blur": 0.0, "data.aug_slant": 0.0,
    "data.aug_rotate": 0.0, "data.aug_jitter": 0.0, "data.aug_elastic": 0.0, "data.val_alt": "",
    "data.render_style": "direct",  # 6ff3393: drawn at render_height
    "model.conv_attention": "gehring",  # ffdbb27: Gehring et al.'s unscaled scores (ablate_decoder-cpu-gehring)
    "data.pad_multiple": 1,  # 3e0263a: each batch padded to its own largest image
    # issue 47's shape-cost work: no pad ladder, 1x1 convolutions as convolutions, no planning pass, no graphs
    "data.pad_growth": 1.0, "train.conv1x1_as_matmul": False, "train.plan_shapes": False, "train.cuda_graphs": False,
    # issue 47's large batches: the rate as set (no scaling by the batch), the warm-up in steps
    "train.lr_scaling": "none", "train.lr_reference_batch_pixels": 320_000, "train.lr_reference_max_batch_size": 16,
    "train.warmup_epochs": 0.0,
    # issue 66: images sized by render_height alone, no weight average, the schedules before WSD
    "data.render_scale": 0.0, "train.ema_decay": 0.0, "train.decay_epochs": 0,
    # issue 68: no symbol counting
    "model.counting": False, "model.counting_channels": 32, "train.counting_weight": 1.0,
}
OLD_BUDGET_KEY = "hmer.preset"  # a study's budget, named before budgets had a word of their own
OLD_BUDGET_PARAM, BUDGET_PARAM = "preset", "budget"  # a study's parent run: its budget
PRESET_NAMES = {"tiny": "tiny-transformer"}  # the preset's one name today
PRESET_PARAMS = ("name", "model_preset")  # a run's config name; a study's parent run: its tiny preset
STUDY_PARAM = "study"  # a study's parent run: its name
RETIRED_PARENT_METRIC = re.compile(r"^test_[^/]+_exprate_(mean|std)/")  # before issue 49: `test_2014_exprate_mean/bi`
UNKNOWN = "unknown: "


@dataclass(frozen=True)
class Store:
    """A local store's folder, its MLflow client and its Optuna storage (None where it has none)."""

    folder: Path
    client: Any
    storage: str | None

    @property
    def mlflow_db(self) -> Path:
        return self.folder / "mlflow.db"

    @property
    def optuna_db(self) -> Path:
        return self.folder / "optuna.db"


def migrate_store(folder: str | Path, repo: Path | None, say: Callable[[str], None] = lambda line: None) -> list[str]:
    """Bring the store in `folder` (mlflow.db, optuna.db where it has one, artifacts/) to today's
    schema (module docstring); `repo`: the git clone whose commits measure the fingerprints a run
    lacks (None: such a run is "unknown"). Returns what changed, in words, each also `say`-ed."""
    folder = Path(folder).resolve()
    if not (folder / "mlflow.db").is_file():
        raise FileNotFoundError(f"{folder}: no mlflow.db (not a local MLflow store)")
    storage = f"sqlite:///{folder / 'optuna.db'}" if (folder / "optuna.db").is_file() else None
    store = Store(folder, mlflow_client(f"sqlite:///{folder / 'mlflow.db'}"), storage)
    steps = (run_configs, study_configs, budget_names, preset_params, trial_attributes, study_labels, parent_layout,
             lambda store: fingerprints(store, repo))  # last: it may train, once a commit
    changes: list[str] = []
    for step in steps:
        for change in step(store):
            say(change)
            changes.append(change)
    return changes


# ---- configs ----------------------------------------------------------------------------------------

def full_config(flat: dict[str, Any]) -> Config:
    """A stored config (flat keys) with every key of today's: a key it lacks takes `VALUES_THEN`'s
    value, a key today's config no longer has is dropped, the preset `tiny` is `tiny-transformer`."""
    known = Config().to_flat_dict()
    values = {**VALUES_THEN, **{key: value for key, value in flat.items() if key in known}}
    values["name"] = PRESET_NAMES.get(str(values.get("name", "")), values.get("name", ""))
    return Config.from_flat_dict(values)


def flat_of(nested: dict[str, Any]) -> dict[str, Any]:
    """A `config.json` (nested sections) as flat keys."""
    flat = {"name": nested.get("name", "")}
    for section in ("model", "data", "train"):
        flat.update({f"{section}.{key}": value for key, value in (nested.get(section) or {}).items()})
    return flat


def run_configs(store: Store) -> list[str]:
    """Each run's `config.json` artifact completed (`full_config`), written as `Config.save` does, and
    the base config in each study's parent-run `study.json`, written as `studies.mlflow_runs` does."""
    completed, studies = [], []
    for run in search_all_runs(store.client, deleted_too=True):
        for path in _artifacts(store, run, "config.json"):
            stored = json.loads(path.read_text())
            full = full_config(flat_of(stored)).to_dict()
            if full != stored:
                write_text_atomically(path, json.dumps(full, indent=2, sort_keys=True) + "\n")
                completed.append(run.info.run_id[:8])
        for path in _artifacts(store, run, "study.json"):
            described = json.loads(path.read_text())
            full = full_config(described.get("config", {})).to_flat_dict()
            if "config" in described and full != described["config"]:
                write_text_atomically(path, json.dumps({**described, "config": full}, indent=2, sort_keys=True,
                                                       default=str))
                studies.append(run.data.tags.get(keys.STUDY, run.info.run_id[:8]))
    return ([f"config.json of {len(completed)} run(s) completed to today's keys"] if completed else []) + \
        [f"study {study}: the base config in its study.json completed to today's keys" for study in studies]


def _artifacts(store: Store, run, name: str) -> list[Path]:
    """The run's artifacts called `name` (a run imported from an export holds its own one folder deeper)."""
    from urllib.parse import unquote, urlparse

    root = resolve_artifact_uri(run.info.artifact_uri, store.client.tracking_uri)
    folder = Path(unquote(urlparse(root).path)) if root.startswith("file:") else Path(root)
    return sorted(folder.rglob(name)) if folder.is_absolute() and folder.is_dir() else []


def study_configs(store: Store) -> list[str]:
    """Each study's base config (`hmer.config`, flat) completed (`full_config`)."""
    if store.storage is None:
        return []
    storage = _open(store.storage)
    completed = []
    for study in storage.get_all_studies():
        study_id = storage.get_study_id_from_name(study.study_name)
        stored = storage.get_study_system_attrs(study_id).get(keys.CONFIG)
        if stored is None:
            continue
        full = full_config(dict(stored)).to_flat_dict()
        if full != stored:
            storage.set_study_system_attr(study_id, keys.CONFIG, full)
            completed.append(study.study_name)
    return [f"base config of study {name} completed to today's keys" for name in completed]


def _open(url: str):
    import optuna

    return optuna.storages.RDBStorage(url)


# ---- names ------------------------------------------------------------------------------------------

def budget_names(store: Store) -> list[str]:
    """The old budget tag of runs, attribute of studies and param of parent runs under today's names."""
    changes = []
    with closing(sqlite3.connect(store.mlflow_db)) as db, db:
        # the tag's key renamed in place, a deleted run's too (MLflow's API writes no tag on a deleted run)
        retagged = db.execute("UPDATE tags SET key = ? WHERE key = ? AND run_uuid NOT IN (SELECT run_uuid FROM tags "
                              "WHERE key = ?)", (keys.BUDGET, OLD_BUDGET_KEY, keys.BUDGET)).rowcount
        db.execute("DELETE FROM tags WHERE key = ?", (OLD_BUDGET_KEY,))  # where both were (none so far)
    if retagged:
        changes.append(f"tag {OLD_BUDGET_KEY} of {retagged} run(s) as {keys.BUDGET}")
    with closing(sqlite3.connect(store.mlflow_db)) as db, db:
        # MLflow writes a param once: its key is renamed in place
        renamed = db.execute("UPDATE params SET key = ? WHERE key = ? AND run_uuid IN (SELECT run_uuid FROM tags "
                             "WHERE key = ? AND value = ?) AND run_uuid NOT IN (SELECT run_uuid FROM params "
                             "WHERE key = ?)", (BUDGET_PARAM, OLD_BUDGET_PARAM, keys.ROLE, keys.ROLE_STUDY,
                                                BUDGET_PARAM)).rowcount
    if renamed:
        changes.append(f"param {OLD_BUDGET_PARAM} of {renamed} parent run(s) as {BUDGET_PARAM}")
    if store.storage is not None:
        changes += _budget_attributes(store, store.storage)
    return changes


def _budget_attributes(store: Store, storage: str) -> list[str]:
    import optuna

    changes = []
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        if OLD_BUDGET_KEY in summary.user_attrs:
            study = optuna.load_study(study_name=summary.study_name, storage=storage)
            study.set_user_attr(keys.BUDGET, summary.user_attrs[OLD_BUDGET_KEY])
            changes.append(f"study {summary.study_name}: attribute {OLD_BUDGET_KEY} as {keys.BUDGET}")
    with closing(sqlite3.connect(store.optuna_db)) as db, db:  # Optuna deletes no study attribute
        db.execute("DELETE FROM study_user_attributes WHERE key = ?", (OLD_BUDGET_KEY,))
    return changes


def preset_params(store: Store) -> list[str]:
    """The params that name the preset `tiny` (a run's `name`, a parent run's `model_preset`) renamed."""
    with closing(sqlite3.connect(store.mlflow_db)) as db, db:
        renamed = sum(db.execute(f"UPDATE params SET value = ? WHERE value = ? AND key IN "  # noqa: S608 - fixed
                                 f"({', '.join('?' * len(PRESET_PARAMS))})", (new, old, *PRESET_PARAMS)).rowcount
                      for old, new in PRESET_NAMES.items())
    return [f"{renamed} param(s) naming the preset tiny as tiny-transformer"] if renamed else []


def trial_attributes(store: Store) -> list[str]:
    """Every trial user attribute under the `hmer.` prefix (Optuna changes no finished trial's)."""
    if store.storage is None:
        return []
    with closing(sqlite3.connect(store.optuna_db)) as db, db:
        renamed = db.execute(
            "UPDATE trial_user_attributes SET key = ? || key WHERE key NOT LIKE ? AND NOT EXISTS (SELECT 1 FROM "
            "trial_user_attributes AS a WHERE a.trial_id = trial_user_attributes.trial_id AND a.key = ? || "
            "trial_user_attributes.key)", (keys.PREFIX, f"{keys.PREFIX}%", keys.PREFIX)).rowcount
        left = db.execute("SELECT COUNT(*) FROM trial_user_attributes WHERE key NOT LIKE ?",
                          (f"{keys.PREFIX}%",)).fetchone()[0]
    if left:
        raise ValueError(f"{store.optuna_db}: {left} trial attribute(s) are stored both with and without the "
                         f"{keys.PREFIX} prefix")
    return [f"{renamed} trial attribute(s) under the {keys.PREFIX} prefix"] if renamed else []


# ---- study labels and the parent runs' layout -------------------------------------------------------

def study_labels(store: Store) -> list[str]:
    """Each study called by its own name in its Optuna `hmer.experiment`, its parent run's name and
    its `study` param."""
    changes = _optuna_labels(store.storage) if store.storage is not None else []
    params = {}
    for run in _parent_runs(store.client):
        study = run.data.tags[keys.STUDY]
        if run.info.run_name != study:
            store.client.set_tag(run.info.run_id, keys.MLFLOW_RUN_NAME, study)
            changes.append(f"study {study}: its parent run's name")
        if run.data.params.get(STUDY_PARAM, study) != study:
            params[(run.info.run_id, STUDY_PARAM)] = study
            changes.append(f"study {study}: its parent run's param {STUDY_PARAM}")
    set_params(store.mlflow_db, params)
    return changes


def _optuna_labels(storage: str) -> list[str]:
    import optuna

    changes = []
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        said = summary.user_attrs.get(keys.EXPERIMENT)
        if said is not None and said != summary.study_name:
            optuna.load_study(study_name=summary.study_name, storage=storage).set_user_attr(
                keys.EXPERIMENT, summary.study_name)
            changes.append(f"study {summary.study_name}: its Optuna {keys.EXPERIMENT} (was {said})")
    return changes


def _parent_runs(client) -> list:
    """The studies' parent runs (deleted ones aside: MLflow writes no tag on them, and nothing reads them)."""
    return [run for run in search_all_runs(client, filter_string=f"tags.`{keys.ROLE}` = '{keys.ROLE_STUDY}'")
            if keys.STUDY in run.data.tags]


def parent_layout(store: Store) -> list[str]:
    """Parent runs without the variant means of the layout before issue 49 (their metrics, each its
    own one-bar chart; MLflow deletes no metric) and without a `hmer.variant` tag (it grouped the
    parent as a variant of its own)."""
    changes = []
    for run in _parent_runs(store.client):
        retired = sorted(key for key in run.data.metrics if RETIRED_PARENT_METRIC.match(key))
        if retired:
            with closing(sqlite3.connect(store.mlflow_db)) as db, db:
                for table in ("metrics", "latest_metrics"):
                    db.executemany(f"DELETE FROM {table} WHERE run_uuid = ? AND key = ?",  # noqa: S608 - fixed
                                   [(run.info.run_id, key) for key in retired])
            changes.append(f"study {run.data.tags[keys.STUDY]}: {len(retired)} parent metrics of the old layout")
        if keys.VARIANT in run.data.tags:
            store.client.delete_tag(run.info.run_id, keys.VARIANT)
            changes.append(f"study {run.data.tags[keys.STUDY]}: parent run without the tag {keys.VARIANT}")
    return changes


# ---- fingerprints -----------------------------------------------------------------------------------

def fingerprints(store: Store, repo: Path | None) -> list[str]:
    """Every trained run without a fingerprint tagged with its commit's (`fingerprint_of_commit`)."""
    changes = []
    for commit, runs in sorted(runs_without_fingerprint(store.client).items(), key=lambda item: -len(item[1])):
        fingerprint = fingerprint_of_commit(commit, repo)
        for run_id in runs:
            store.client.set_tag(run_id, keys.FINGERPRINT, fingerprint)
        changes.append(f"fingerprint of {len(runs)} run(s) of {commit[:7]}: {fingerprint}")
    return changes


def runs_without_fingerprint(client) -> dict[str, list[str]]:
    """{commit: run ids} of the runs trained here (a commit tag, not imported with `hmer import`, not a
    study's own parent or summary run) that carry no fingerprint; deleted runs aside, as in `_parent_runs`."""
    by_commit: dict[str, list[str]] = defaultdict(list)
    for run in search_all_runs(client):
        tags = run.data.tags
        if keys.GIT_COMMIT in tags and not {keys.FINGERPRINT, keys.ROLE, keys.IMPORT_SOURCE} & set(tags):
            by_commit[tags[keys.GIT_COMMIT]].append(run.info.run_id)
    return dict(by_commit)


def fingerprint_of_commit(commit: str, repo: Path | None) -> str:
    """The fingerprint of the training code at `commit` of the clone `repo`, measured in a temporary
    detached worktree of it (this checkout's fixed training, that commit's package), or "unknown: why"."""
    from ..training.fingerprint import fingerprint_of_source

    if commit.endswith("-dirty"):
        return f"{UNKNOWN}trained from uncommitted changes to {commit.removesuffix('-dirty')[:7]}"
    if repo is None:
        return f"{UNKNOWN}no git clone to measure commit {commit[:7]} in"
    if subprocess.run(["git", "-C", str(repo), "cat-file", "-e", f"{commit}^{{commit}}"],
                      capture_output=True).returncode != 0:
        return f"{UNKNOWN}commit {commit[:7]} is not in this clone"
    with tempfile.TemporaryDirectory(prefix="hmer-fingerprint-wt-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", "--quiet", str(tree), commit],
                       check=True, capture_output=True)
        try:
            return fingerprint_of_source(tree / "src")[0]
        except RuntimeError as exc:
            return f"{UNKNOWN}{str(exc).splitlines()[0]}"
        finally:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)], capture_output=True)
