"""The options many commands share, said once: what each takes and its default; and how a command says
the user asked for something wrong: one line on stderr, exit status 2 (`UserError`)."""

from __future__ import annotations

EXIT_USAGE = 2


class UserError(Exception):
    """An error in what the user asked for; printed as one line, exit status 2."""


DEVICE = "auto, cpu, cuda, cuda:N or mps (default: auto, a GPU where there is one)"
TRACKING_URI = "the MLflow store (default: $MLFLOW_TRACKING_URI, else $HMER_MLRUNS, else the checkout's mlruns/)"
DATA = ("the CROHME dataset, a folder or zip in the <split>/caption.txt layout (default: $HMER_DATA, else "
        "data/crohme(.zip) in the checkout, else ../shared/crohme/crohme-inkml.zip beside it)")
RUN_OR_CHECKPOINT = ("a run id (or its first 8 characters at least, as the README and `hmer runs show` print them), "
                     "whose model artifact is read, or a checkpoint or model file")
SET = "config overrides such as train.lr=0.5 model.direction=l2r (default: none)"


def preset_resolution(preset: str, budget: str | None, recipe: str | None):
    """`preset` as a study's `budget` trains it (its size and recipe), else with `recipe`: what `hmer train`
    trains and `hmer config` shows."""
    if budget and recipe:
        raise UserError("--budget names its recipe; give --budget or --recipe")
    if budget:
        from ..studies.budgets import get_budget
        from ..studies.resolution import budget_resolution

        return budget_resolution(preset, get_budget(budget))
    from ..model_presets import resolve_preset

    return resolve_preset(preset, recipe=recipe, named_by="--recipe")
