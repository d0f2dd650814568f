"""A fingerprint of what the training code computes: equal fingerprints, the same numbers.

Two runs are comparable only where the code that trained them computes the same thing. The commit
(`hmer.git_commit`) cannot say so: most commits change nothing that trains, and a commit that swaps
one kernel for another (AdamW `fused=True`, 1x1 convolutions as matrix products) changes every
number while every config stays the same. So the suite measures it: a short, fixed training on
synthetic images (`PARTS`: each decoder family at a toy size, two epochs, the `cpu` recipe's kind of
optimiser, schedule and augmentation, one seed, one thread), through `hmer.training.train` itself,
data pipeline, batching, step, optimiser, schedule and checkpoint included. Its fingerprint is a hash
of every epoch's training and validation loss and of the final weights, bit for bit, of each part.
A change that moves one rounding anywhere on that path changes it; a change elsewhere (reports,
studies, documentation) does not.

    fingerprint = code_fingerprint()            # this checkout's code, cached by its source (seconds once)
    fingerprint_of_source("/tmp/wt/src")        # another commit's code, in a worktree of it

The training runs in a child process whose kernels are the portable ones
(`ATEN_CPU_CAPABILITY=default`, `MKL_CBWR=COMPATIBLE`, `ONEDNN_MAX_CPU_ISA=SSE41`, one thread), so
that the fingerprint of a code is the same on every x86-64 machine with the same torch, whatever its
vector units: the training runs themselves use the fast kernels, whose roundings differ from one CPU
to the next, and that is no change of code. The torch version and the machine's architecture are
hashed with the rest: another torch is another computation.

This file also runs as a script against any commit's code (`python fingerprint.py` with that
commit's `src/` on PYTHONPATH; `fingerprint_of_source` does so): it uses only what every commit of the
suite has had, `hmer.config.Config`, `hmer.data.Expression` and `hmer.training.train`, and a config
key that a commit does not know is left to that commit's own behaviour (listed in the result).

Every run records the fingerprint of the code that trained it as the tag `hmer.fingerprint`
(`hmer.training.trainer`); `hmer runs fingerprint` computes it for runs trained before that, at
their commits. docs/training.md, "Which code trained what".
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

# What the fingerprint trains: the settings every part shares, then each part's own. Widths are not
# powers of two, so that no scale (1/sqrt(12) of two heads of 12) is exact, and an operation moved
# before or after it rounds differently.
COMMON = {
    "model.d_model": 24, "model.growth_rate": 4, "model.num_dense_layers": 2, "model.num_dense_blocks": 2,
    "model.num_decoder_layers": 1, "model.nhead": 2, "model.dim_feedforward": 64, "model.dropout": 0.1,
    "model.encoder_dropout": 0.1, "model.coverage_channels": 4, "model.rnn_hidden": 32,
    "model.rnn_attention": 32, "model.rnn_embedding": 32, "model.conv_layers": 1,
    "data.batch_pixels": 12_000, "data.max_batch_size": 4, "data.scale_aug_min": 0.7, "data.scale_aug_max": 1.4,
    "data.test_years": "2014",
    "train.recipe": "custom", "train.optimizer": "adamw", "train.lr": 1e-3, "train.weight_decay": 0.01,
    "train.eps": 1e-8, "train.warmup_steps": 2, "train.schedule": "cosine", "train.min_lr": 1e-5,
    "train.label_smoothing": 0.1, "train.epochs": 2, "train.seed": 1, "train.device": "cpu",
    "train.precision": "fp32", "train.beam_size": 2, "train.max_decode_len": 6, "train.attention_maps": 0,
}
PARTS: dict[str, dict] = {
    "transformer-bi": {"model.decoder": "transformer", "model.direction": "bi", "model.coverage": "none"},
    "comer-fusion": {"model.decoder": "transformer", "model.direction": "bi", "model.coverage": "fusion",
                     "model.embed_norm": True},
    "rnn": {"model.decoder": "rnn", "model.direction": "l2r"},
    "convs2s": {"model.decoder": "convs2s", "model.direction": "l2r", "model.token_pos": "learned"},
}
# The kernels that give the same roundings on every x86-64 CPU (see the module docstring).
PORTABLE_KERNELS = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41",
                    "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
FORMAT = 1
# Set in the child process that measures a fingerprint: the runs it trains are the measurement, and
# fingerprinting them in turn would start the measurement again inside itself, without end.
MEASURING = "HMER_FINGERPRINT_MEASURING"
TAG_LENGTH = 16  # hex digits kept in the tag: 64 bits


def _images(n: int, salt: int):
    """`n` synthetic expressions: tokens, and an image drawn from them with NumPy alone (no font, no
    resampling whose rounding could differ between library versions)."""
    import numpy as np

    tokens_pool = ["x", "^", "{", "2", "}", "+", "a", "=", "1", "-", "b", "\\frac", "y"]
    rng = np.random.default_rng(1000 + salt)
    out = []
    for i in range(n):
        length = 3 + (i + salt) % 4
        tokens = [tokens_pool[int(k)] for k in rng.integers(0, len(tokens_pool), size=length)]
        image = np.zeros((32, 14 * length + 6), dtype=np.uint8)
        for j, token in enumerate(tokens):
            code = tokens_pool.index(token)
            image[4 + code % 5 * 3: 28, 3 + 14 * j: 6 + 14 * j] = 255
            image[4 + code % 9 * 2: 9 + code % 9 * 2, 8 + 14 * j: 14 + 14 * j] = 255
        out.append((f"fp{salt}_{i}", tokens, image))
    return out


def _train_part(name: str, folder: Path) -> dict:
    """Train one part in this process; {"losses": ..., "weights": sha256, "unknown": keys} or {"absent": why}."""
    import torch
    from mlflow.tracking import MlflowClient

    from hmer.config import Config
    from hmer.data import Expression
    from hmer.training import train

    torch.set_num_threads(1)
    values = {**COMMON, **PARTS[name]}
    defaults = Config()
    known = {k: v for k, v in values.items() if hasattr(getattr(defaults, k.split(".")[0], None), k.split(".")[1])}
    try:
        cfg = Config().override(known)
        cfg.validate()
    except ValueError as exc:
        return {"absent": str(exc).splitlines()[0]}
    data = {split: [Expression(name=n, tokens=t, image=i) for n, t, i in _images(count, salt)]
            for split, count, salt in (("train", 8, 0), ("val", 2, 1), ("2014", 2, 2))}
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    result = train(cfg, data, tracking_uri=uri, experiment="fingerprint", run_dir=folder / "ckpt")
    client = MlflowClient(uri)
    losses = {key: [m.value for m in sorted(client.get_metric_history(result.run_id, key), key=lambda m: m.step)]
              for key in ("train_loss", "val_loss")}
    state = torch.load(folder / "ckpt" / "last.pt", map_location="cpu", weights_only=False)["model"]
    digest = hashlib.sha256()
    for key in sorted(state):
        digest.update(key.encode())
        digest.update(state[key].detach().cpu().contiguous().numpy().tobytes())
    return {"losses": losses, "weights": digest.hexdigest(), "unknown": sorted(set(values) - set(known))}


def _measure() -> dict:
    """Every part trained, with what the fingerprint hashes besides (torch, architecture)."""
    import torch

    parts = {}
    for name in PARTS:
        with tempfile.TemporaryDirectory(prefix="hmer-fingerprint-") as tmp:
            parts[name] = _train_part(name, Path(tmp))
    return {"format": FORMAT, "torch": torch.__version__, "machine": platform.machine(), "parts": parts}


def digest(measured: dict) -> str:
    """The fingerprint of a measurement: the hash of everything in it, as `TAG_LENGTH` hex digits."""
    return hashlib.sha256(json.dumps(measured, sort_keys=True).encode()).hexdigest()[:TAG_LENGTH]


def fingerprint_of_source(src: str | os.PathLike[str], timeout: float = 900) -> tuple[str, dict]:
    """(fingerprint, measurement) of the `hmer` package under the folder `src` (a checkout's or a
    worktree's `src/`), trained in a child process with the portable kernels."""
    env = {**os.environ, **PORTABLE_KERNELS, MEASURING: "1", "PYTHONPATH": str(Path(src).resolve())}
    env.pop("HMER_MLRUNS", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    with tempfile.TemporaryDirectory(prefix="hmer-fingerprint-") as tmp:
        done = subprocess.run([sys.executable, str(Path(__file__).resolve())], cwd=tmp, env=env,
                              capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the fingerprint of the code in {src} failed: {last}")
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    return digest(measured), measured


def source_key(src: Path) -> str:
    """A hash of the package's Python sources under `src`: the cache key of its fingerprint."""
    h = hashlib.sha256()
    for path in sorted((src / "hmer").rglob("*.py")):
        h.update(path.relative_to(src).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:32]


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """The fingerprint of the code this process runs, from the cache when its sources are unchanged,
    else measured (about fifteen seconds on one core) and cached. The cache is `.cache/fingerprints/`
    of the checkout (else `~/.cache/hmer/fingerprints/`), not `$HMER_CACHE`, whose renderings a test
    or a machine may keep anywhere: one code has one fingerprint, wherever its images are."""
    if os.environ.get(MEASURING):
        return "unknown: the fingerprint's own training"
    import torch

    from ..data.source import repo_root

    src = Path(__file__).resolve().parents[2]
    root = repo_root()
    folder = (root / ".cache" if root else Path.home() / ".cache" / "hmer") / "fingerprints"
    cached = folder / f"{source_key(src)}-{torch.__version__}-{platform.machine()}.json"
    if cached.is_file():
        try:
            return str(json.loads(cached.read_text())["fingerprint"])
        except (ValueError, KeyError):
            pass  # a damaged cache entry is measured again
    value, measured = fingerprint_of_source(src)
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_name(cached.name + f".{os.getpid()}.tmp")
    partial.write_text(json.dumps({"fingerprint": value, "measured": measured}, sort_keys=True))
    os.replace(partial, cached)
    return value


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)
    with open(os.devnull, "w") as quiet:  # train() prints its epochs; the answer is the last line
        stdout, sys.stdout = sys.stdout, quiet
        try:
            measured = _measure()
        finally:
            sys.stdout = stdout
    print(json.dumps(measured, sort_keys=True))
