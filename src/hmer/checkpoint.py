"""Checkpoints and model files: written atomically (`hmer.atomic`), loaded safely.

A training checkpoint (`last.pt`, `best.pt`) holds only tensors and plain Python values, so it
loads with `torch.load(weights_only=True)`: opening a checkpoint from someone else cannot run code.
The model file a finished run logs (`model/model.safetensors`, what is committed and shared) is
safetensors: the weights as raw tensors and the config, vocabulary, epoch and validation ExpRate as
JSON in its metadata, read without unpickling anything. The tensors are the same bits as the
checkpoint's, so a model reloaded from it decodes exactly as the run's final evaluation did. Runs
logged before it have `model/model.pt`, the checkpoint's own format, and still load.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .atomic import write_atomically


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda f: torch.save(obj, f))


MODEL_FILE = "model.safetensors"  # a run's model artifact, `model/model.safetensors`
LEGACY_MODEL_FILE = "model.pt"  # the model artifact of runs logged before it: the checkpoint format
MODEL_FILES = (MODEL_FILE, LEGACY_MODEL_FILE)  # what a run's `model/` may hold, the preferred first
_METADATA_KEY = "hmer"  # safetensors metadata: one key, so its bytes do not depend on a map's order


def save_model_file(artifact: dict[str, Any], path: str | Path) -> None:
    """Write `artifact` (`model_artifact`'s dict, or a checkpoint holding one) as safetensors: the
    weights as tensors, everything else as JSON in the metadata. The same artifact always gives the
    same bytes (tensors sorted by safetensors, one metadata key), so a store published twice holds
    the file once."""
    from safetensors.torch import save

    weights = {name: tensor.detach().cpu().contiguous() for name, tensor in artifact["model"].items()}
    described = {key: artifact[key] for key in ("format", "config", "vocab", "epoch", "val_exprate") if key in artifact}
    data = save(weights, metadata={_METADATA_KEY: json.dumps(described, sort_keys=True)})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda f: f.write(data))


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """A checkpoint or model file as a dict ("model": the state dict, "config", ...): safetensors
    for a `.safetensors` file, else torch's format loaded with `weights_only=True`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError, safe_open
        from safetensors.torch import load_file

        try:
            weights = load_file(path, device=str(map_location))
            with safe_open(path, framework="pt") as f:
                described = json.loads((f.metadata() or {})[_METADATA_KEY])
        except (SafetensorError, KeyError, ValueError, OSError) as e:
            raise ValueError(f"{path}: not a readable hmer model file ({type(e).__name__}: {e})") from None
        if "config" not in described:
            raise ValueError(f"{path}: not an hmer model file (no config inside)")
        return {**described, "model": weights}
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # corrupt file or foreign pickle
        # torch's message runs over many lines; its last specific one says what is wrong
        lines = [line.strip() for line in str(e).splitlines()
                 if line.strip() and not line.startswith("Check the documentation")]
        raise ValueError(f"{path}: not a readable hmer checkpoint ({type(e).__name__}: "
                         f"{lines[-1][:200] if lines else 'empty message'})") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "config" not in ckpt:
        raise ValueError(f"{path}: not an hmer checkpoint (no model weights and config inside)")
    return ckpt


def model_artifact(model: Any, cfg: Any, vocab: Any, epoch: int, val_exprate: float) -> dict[str, Any]:
    """What `hmer evaluate` / `hmer predict` reload (a run's `model/model.safetensors`, and `best.pt`
    while it trains): weights, config and vocabulary, nothing executable. `cfg` is a Config, `vocab` a Vocab."""
    return weights_artifact(model.state_dict(), cfg.to_dict(), list(vocab.itos), epoch, val_exprate)


def weights_artifact(state_dict: dict[str, Any], config: dict[str, Any], itos: list[str], epoch: int,
                     val_exprate: float) -> dict[str, Any]:
    return {"format": 1, "model": state_dict, "config": config, "vocab": itos, "epoch": epoch,
            "val_exprate": val_exprate}


def rng_state() -> dict[str, Any]:
    """Every random generator the training loop touches, as tensors and plain values."""
    np_state = np.random.get_state(legacy=True)
    assert isinstance(np_state, tuple)  # the legacy form of the global MT19937 generator
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "gauss": float(np_state[4])},
        "python": [version, list(internal), gauss],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"].cpu())
    np_state = state["numpy"]
    np.random.set_state(("MT19937", np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["gauss"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
