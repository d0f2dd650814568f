"""Checkpoint I/O lives in `hmer.checkpoint` (below training and tracking); kept importable here."""

from ..checkpoint import atomic_torch_save, load_checkpoint, model_artifact, rng_state, set_rng_state

__all__ = ["atomic_torch_save", "load_checkpoint", "model_artifact", "rng_state", "set_rng_state"]
