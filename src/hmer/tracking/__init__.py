"""Experiment tracking: the MLflow store, run artifacts, and reloading trained models."""

from .models import RunNotFoundError, load_model, resolve_checkpoint
from .store import default_tracking_uri, mlruns_dir, project_root, setup_mlflow

__all__ = ["RunNotFoundError", "default_tracking_uri", "load_model", "mlruns_dir", "project_root",
           "resolve_checkpoint", "setup_mlflow"]
