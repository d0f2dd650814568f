"""Study budgets: how much compute one study may spend, as Config overrides.

A budget is orthogonal to the study. It picks the spec's tiny or full preset, may name another size
and recipe (`hmer.model_presets.SIZES`, `hmer.recipes`), sets its own keys (data subset, epochs, test
decoding), seeds and default workers, and says what the study will cost. How cpu and long were chosen:
docs/cpu_protocol.md. The smoke direction ablation takes 2.8 minutes on an idle 2-core CPU, 5.7 to
7.6 on a shared one (docs/studies.md).

A trial's time limit follows from the window and the grid: 12 cells on 3 workers give each trial
``(window - loading) * 3 / 12`` seconds, less the time reserved for the test years.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

BUDGET_NAMES = ("smoke", "cpu", "long", "scaled", "short", "paper")


@dataclass(frozen=True)
class StudyBudget:
    """The compute a study may spend; see the module docstring."""

    name: str
    summary: str
    preset_size: str  # which of a spec's model presets to start from, "tiny" or "full"
    overrides: Mapping[str, Any]  # the budget's own Config keys (dotted), over the preset's size and recipe
    sweep_trials: int  # a sweep's default finished trials
    hardware: str  # where a trial takes `trial_seconds`, for the printed cost
    seeds: tuple[int, ...] = (1, 2, 3)  # a grid study's default seed axis
    window_s: float = 0.0  # the wall-clock window a study is sized for (0: unbounded)
    load_s: float = 60.0  # reserved for loading the data
    eval_reserve_s: float = 0.0  # per trial, reserved after training for the test years
    default_jobs: int = 1
    trial_seconds: float = 0.0  # what a trial takes without a window, for the printed cost
    size: str | None = None  # a size (`hmer.model_presets.SIZES`) replacing the preset's; None keeps it
    recipe: str | None = None  # a recipe (`hmer.recipes`) replacing the preset's; None keeps it
    notes: tuple[str, ...] = field(default_factory=tuple)
    # A sweep trial's training in CPU-minutes of one thread: it measures its cost per image and trains the
    # epochs that fit (hmer.training.cost); 0: the budget's epochs.
    sweep_trial_cpu_minutes: float = 0.0
    # Its studies try the pipeline: without a store named they are tracked in the scratch store
    # (`tracking.store.scratch_tracking_uri`).
    scratch: bool = False

    def trial_budget_s(self, n_trials: int, n_jobs: int) -> float:
        """Training seconds per trial so that `n_trials` on `n_jobs` workers fit the window (0: none): an equal
        share of the window after loading for each of ceil(n_trials / n_jobs) rounds."""
        if self.window_s <= 0 or n_trials <= 0:
            return 0.0
        rounds = math.ceil(n_trials / max(1, n_jobs))
        per_trial = (self.window_s - self.load_s) / rounds - self.eval_reserve_s
        if per_trial <= 0:
            raise ValueError(
                f"budget {self.name!r}: {n_trials} trials on {n_jobs} worker(s) do not fit its "
                f"{self.window_s / 60:.0f}-minute window; use fewer seeds or more --n-jobs")
        return per_trial

    def config_overrides(self, n_trials: int, n_jobs: int) -> dict[str, Any]:
        """The budget's overrides plus the per-trial wall-clock limit for this grid."""
        values = dict(self.overrides)
        budget = self.trial_budget_s(n_trials, n_jobs)
        if budget > 0:
            values["train.time_budget_s"] = round(budget, 1)
        return values

    def expected_seconds(self, n_trials: int, n_jobs: int) -> float:
        """The expected wall-clock time of the study (0 when unknown)."""
        rounds = math.ceil(n_trials / max(1, n_jobs))
        if self.window_s > 0:
            return min(self.window_s, self.load_s + rounds * self.trial_seconds) if self.trial_seconds \
                else self.window_s
        return self.load_s + rounds * self.trial_seconds

    def describe(self, n_trials: int, n_jobs: int, left: int | None = None) -> str:
        """The start-of-study banner, without the cost where no trial is `left` to train."""
        named = [f"size {self.size}"] * bool(self.size) + [f"recipe {self.recipe}"] * bool(self.recipe)
        settings = ", ".join([*named, *(f"{k}={v}" for k, v in self.overrides.items())])
        lines = [f"budget {self.name}: {self.summary}", f"  settings: {settings}"]
        if left != 0:
            lines.append(self._cost_line(n_trials, n_jobs))
        lines.extend(f"  {note}" for note in self.notes)
        return "\n".join(lines)

    def _cost_line(self, n_trials: int, n_jobs: int) -> str:
        budget = self.trial_budget_s(n_trials, n_jobs)
        cost = _format_duration(self.expected_seconds(n_trials, n_jobs))
        if self.window_s > 0:
            return (f"  expected cost: about {cost} on {self.hardware} for {n_trials} trials on {n_jobs} "
                    f"worker(s) (within the {_format_duration(self.window_s)} window: "
                    f"{_format_duration(budget)} of training per trial at most, "
                    f"{_format_duration(self.eval_reserve_s)} reserved for the test years)")
        if self.trial_seconds > 0:
            # A process knows only its own workers: the others that share the study divide the cost.
            return (f"  expected cost: about {cost} for {n_trials} trials on this process's {n_jobs} worker(s), on "
                    f"{self.hardware} ({_format_duration(self.trial_seconds)} per trial; worker processes started "
                    f"beside it on the same study share the trials)")
        epochs = int(self.overrides.get("train.epochs", 0))
        images = epochs * CROHME_TRAIN_EXPRESSIONS
        return (f"  expected cost: no time limit; each of the {n_trials} trials trains {epochs} epochs over "
                f"{CROHME_TRAIN_EXPRESSIONS:,} expressions ({images / 1e6:.2f} M images): divide by the images per "
                f"second of `hmer bench train` on your GPU for the hours per trial, then by the workers")


def _format_duration(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


# One smoke trial, measured with `python studies/ablate_direction.py --budget smoke` on an idle 2-core
# CPU (22-29 s; 38-117 s on shared cores; docs/studies.md).
_SMOKE_TRIAL_SECONDS = 30.0
# The cpu budget: the sweep's best trial (`sweep-cpu` 25, docs/cpu_protocol.md), for fixed epochs: about
# an hour of training on one thread with greedy validation after each epoch.
_CPU_SWEEP_TRIAL = 25
_CPU_EPOCHS = 13
# The sweep's trials train the epochs that fit this on one core: about half an hour a trial.
_CPU_SWEEP_TRIAL_MINUTES = 25.0
# A cpu trial's time for the banner, from trial 25 (272 CPU-s an epoch with greedy validation, 54 s to
# decode validation with beam 10) and the 4,318 test images; the studies' own trials replace it.
_CPU_TRIAL_SECONDS = 70 * 60.0
# The long budget: the cpu budget's epochs stretched sevenfold, the cosine decay over the whole run, so
# the rate is small for the last twenty epochs where the best checkpoint is picked (a plateau schedule
# would cut on a validation ExpRate that moves by a point an epoch). The warm-up keeps its 163 steps. A
# bi transformer trains about 150 CPU-s an epoch on one thread: 100 epochs are about 4 CPU-hours.
_LONG_EPOCHS = 100
_LONG_TRIAL_SECONDS = _LONG_EPOCHS * 150.0 + 15 * 60.0
# The scaled budget: the frontier study's best point (hmer.studies.suite.frontier; docs/studies.md, "The
# frontier"): images drawn at 0.7 of the standard images' own scale, 64 epochs of the wsd schedule
# decaying over the last 13, fp32 as every frontier cell. On the Xeon of 2026-12-06 a 0.7-scale epoch of
# the fusion model took 760 CPU-s; the test years' decoding at that scale is reserved half an hour.
_SCALED_EPOCHS, _SCALED_DECAY_EPOCHS, _SCALED_RENDER_SCALE = 64, 13, 0.7
_SCALED_TRIAL_SECONDS = _SCALED_EPOCHS * 760.0 + 30 * 60.0
# The papers train 300 epochs over the CROHME training set (8,835 expressions).
_PAPER_EPOCHS = 300
CROHME_TRAIN_EXPRESSIONS = 8835

BUDGETS: dict[str, StudyBudget] = {
    "smoke": StudyBudget(
        name="smoke",
        summary="the tiny model on a CPU-sized subset, images rendered 48 px high, beam 3",
        preset_size="tiny",
        overrides={
            "data.render_height": 48, "data.train_limit": 400, "data.val_limit": 50, "data.test_limit": 50,
            "train.epochs": 8, "train.beam_size": 3, "train.max_decode_len": 40, "train.attention_maps": 1,
        },
        seeds=(1, 2),
        sweep_trials=6,
        window_s=9 * 60.0,
        eval_reserve_s=40.0,
        hardware="a 2-core CPU",
        trial_seconds=_SMOKE_TRIAL_SECONDS,
        notes=("a smoke study shows that the pipeline works end to end, not which variant is better",),
        scratch=True,
    ),
    "cpu": StudyBudget(
        name="cpu",
        summary=(f"the recipe of sweep-cpu's best trial ({_CPU_SWEEP_TRIAL}): a DenseNet of 2x6 layers and a "
                 f"3-layer decoder of width 192, 48 px standard-like renderings with scale and renderer "
                 f"augmentation, {_CPU_EPOCHS} epochs of AdamW with cosine decay on the full training split, "
                 "the full test years with beam 10; one thread per worker"),
        preset_size="tiny",
        size="swept",
        recipe="swept",
        overrides={
            "train.epochs": _CPU_EPOCHS, "train.beam_size": 10, "train.max_decode_len": 200, "train.device": "cpu",
        },
        sweep_trials=24,
        default_jobs=2,
        hardware="a 2-core CPU, one thread per worker",
        trial_seconds=_CPU_TRIAL_SECONDS,
        notes=("epochs are fixed, not a wall-clock budget: the numbers do not depend on how busy the machine "
               "is, only the time does", "how this budget was chosen: docs/cpu_protocol.md"),
        sweep_trial_cpu_minutes=_CPU_SWEEP_TRIAL_MINUTES,
    ),
    "short": StudyBudget(
        name="short",
        summary="full-size model on the full data, a wall-clock budget per trial, beam 10",
        preset_size="full",
        overrides={"train.epochs": _PAPER_EPOCHS},
        sweep_trials=12,
        window_s=25 * 60.0,
        load_s=120.0,
        eval_reserve_s=150.0,
        default_jobs=3,
        hardware="one H200",
        notes=("trials share the GPU side by side (3 workers by default); the budget per trial "
               "follows from the grid size and --n-jobs",),
    ),
    "paper": StudyBudget(
        name="paper",
        summary=f"the papers' full recipes: {_PAPER_EPOCHS} epochs, full data, beam 10 (validation too), 3 seeds",
        preset_size="full",
        overrides={"train.epochs": _PAPER_EPOCHS, "train.val_beam_size": 10},
        sweep_trials=50,
        load_s=120.0,
        hardware="one GPU",
        notes=("run several workers (--n-jobs, or the same command on more machines with a shared "
               "--storage) to divide the wall-clock time",),
    ),
}

BUDGETS["long"] = dataclasses.replace(
    BUDGETS["cpu"],
    name="long",
    summary=(f"the cpu budget's model, recipe and test decoding trained {_LONG_EPOCHS} epochs, cosine decay over "
             "all of them; one seed, one thread per worker, runs that span several sessions"),
    overrides={**BUDGETS["cpu"].overrides, "train.epochs": _LONG_EPOCHS},
    seeds=(1,),
    default_jobs=1,
    hardware="one CPU core per worker",
    trial_seconds=_LONG_TRIAL_SECONDS,
    notes=("epochs are fixed: stop it at any time and run the same command again (in a later session: from "
           "the store published with --keep-unfinished); what continuing costs: docs/cpu_protocol.md, "
           "\"The long budget\"",),
    sweep_trial_cpu_minutes=0.0,
)

BUDGETS["scaled"] = dataclasses.replace(
    BUDGETS["long"],
    name="scaled",
    summary=(f"the cpu budget's model and recipe with images drawn at {_SCALED_RENDER_SCALE} of the standard "
             f"images' own scale (a symbol keeps one size), {_SCALED_EPOCHS} epochs of the wsd schedule decaying "
             f"over the last {_SCALED_DECAY_EPOCHS}, the full test years with beam 10; one seed, one thread per "
             "worker, runs that span several sessions"),
    overrides={**BUDGETS["cpu"].overrides, "data.render_height": 0, "data.render_scale": _SCALED_RENDER_SCALE,
               "train.epochs": _SCALED_EPOCHS, "train.schedule": "wsd", "train.decay_epochs": _SCALED_DECAY_EPOCHS,
               "train.precision": "fp32"},
    trial_seconds=_SCALED_TRIAL_SECONDS,
    notes=("the frontier study's best point (docs/studies.md, \"The frontier\"); epochs are fixed: stop it at "
           "any time and run the same command again",),
)


def get_budget(name: str) -> StudyBudget:
    """The budget called `name`."""
    try:
        return BUDGETS[name]
    except KeyError:
        raise ValueError(f"unknown study budget {name!r}; known budgets: {', '.join(BUDGET_NAMES)}") from None


def pick_budget(requested: str | None = None) -> tuple[StudyBudget, str]:
    """The budget to use and why: `requested`, else short on a GPU and cpu otherwise."""
    if requested:
        return get_budget(requested), f"budget {requested} (--budget)"
    import torch

    if torch.cuda.is_available():
        return BUDGETS["short"], (f"budget short (no --budget given; a GPU is available: "
                                  f"{torch.cuda.get_device_name(0)})")
    return BUDGETS["cpu"], ("budget cpu (no --budget given and no GPU: real results on a CPU; "
                            "--budget smoke is the 3-minute pipeline check)")

