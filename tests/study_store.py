"""An MLflow store made by a real smoke study, shared by the report and notebook tests.

One grid study (`hmer.studies.run_grid_study`, real training of the tiny CoMER model, then
presented as `hmer study` presents it: `hmer.store.present.present_study`):
coverage none (the baseline) against cross coverage, one seed, one epoch, on a tiny
dataset written to disk (so the runs record `data.path` and the attention notebook can
load the test images back), scored on the 2014, 2016 and 2019 test splits. Coverage
rather than direction is the axis so that the attention-maps notebook has a model with
and one without coverage to put side by side.

The study runs once per test session, whichever test module asks first; pytest would
run a session fixture imported into two modules twice, so the store is cached here.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from tiny_dataset import write_dataset


@contextlib.contextmanager
def studying_into(root: Path) -> Iterator[None]:
    """Run a study in-process into the store at `root`: its MLflow home and rendered-data cache
    there, one torch thread (the test machines' cores are shared); all restored afterwards."""
    import pytest
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("HMER_CACHE", str(root / "cache"))
            mp.setenv("HMER_MLRUNS", str(root))
            yield
    finally:
        torch.set_num_threads(threads)


STUDY_NAME = "report-smoke"
VARIANTS = ("none", "cross")  # model.coverage: the baseline first
TEST_SPLITS = {"train": 12, "2014": 4, "2016": 3, "2019": 3}
# Held equal in every cell: one epoch, short decoding on CPU, every test year.
OVERRIDES = {"train.epochs": 1, "train.beam_size": 2, "train.max_decode_len": 12, "train.attention_maps": 1,
             "train.device": "cpu", "data.batch_pixels": 20_000, "data.max_batch_size": 8,
             "data.test_years": "2014,2016,2019"}


@dataclass(frozen=True)
class StudyStore:
    """Where the smoke study left its runs."""

    root: Path
    tracking_uri: str
    storage: str
    study: str
    data_path: Path
    cache: Path
    parent_run_id: str


_STORE: StudyStore | None = None


def study_store(root: Path) -> StudyStore:
    """Run the smoke study into `root` (first call of the session), or return the store it made."""
    global _STORE
    if _STORE is not None:
        return _STORE
    from hmer.studies import STUDIES, StudySpec, run_grid_study

    spec = StudySpec(name="ablate_coverage", description="coverage: none against cross (report tests)",
                     axes={"model.coverage": VARIANTS}, model_presets=STUDIES.get("ablate_coverage").model_presets)
    root.mkdir(parents=True, exist_ok=True)
    data_path = write_dataset(root / "data", TEST_SPLITS)
    tracking_uri = f"sqlite:///{root / 'mlflow.db'}"
    storage = f"sqlite:///{root / 'optuna.db'}"
    cache = root / "cache"
    with studying_into(root):
        outcome = run_grid_study(spec, "smoke", storage=storage, tracking_uri=tracking_uri, data_path=str(data_path),
                                 seeds=(1,), overrides=OVERRIDES, study_name=STUDY_NAME, print_table=False)
    assert outcome.complete, f"the smoke study did not complete: {outcome.failed}"
    from hmer.store.present import present_study

    # presented, as the command that runs a study leaves it: its figure, table, summary runs and notes
    present_study(STUDY_NAME, tracking_uri=tracking_uri, storage=storage)
    _STORE = StudyStore(root=root, tracking_uri=tracking_uri, storage=storage, study=STUDY_NAME,
                        data_path=data_path, cache=cache, parent_run_id=outcome.parent_run_id)
    return _STORE
