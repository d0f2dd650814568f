"""The options many commands share, said once: what each takes and its default."""

from __future__ import annotations

DEVICE = "auto, cpu, cuda, cuda:N or mps (default: auto, a GPU where there is one)"
TRACKING_URI = "the MLflow store (default: $MLFLOW_TRACKING_URI, else $HMER_MLRUNS, else the checkout's mlruns/)"
DATA = ("the CROHME dataset, a folder or zip in the <split>/caption.txt layout (default: $HMER_DATA, else "
        "data/crohme(.zip) in the checkout, else ../shared/crohme/crohme-inkml.zip beside it)")
RUN_OR_CHECKPOINT = ("a run id (or its first 8 characters at least, as the README and `hmer runs show` print them), "
                     "whose model artifact is read, or a checkpoint or model file")
SET = "config overrides such as train.lr=0.5 model.direction=l2r (default: none)"
