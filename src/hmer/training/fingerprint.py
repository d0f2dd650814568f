"""A fingerprint of what the training code computes: equal fingerprints, the same numbers
(docs/studies.md, "The training-code fingerprint": what it trains and why the commit cannot say it).

The training (`fingerprint_training.py`, run against any commit's `src/`) runs in a child process with the
portable kernels, so one code has one fingerprint on every x86-64 machine with the same torch (the fast kernels'
roundings differ between CPUs). The torch version and architecture are hashed too. Runs record it as the tag
`hmer.fingerprint`.
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

from ..atomic import write_text_atomically

# The kernels that give the same roundings on every x86-64 CPU (see the module docstring).
PORTABLE_KERNELS = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41",
                    "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# Set in the measuring child: fingerprinting the runs it trains would recurse without end.
MEASURING = "HMER_FINGERPRINT_MEASURING"
TAG_LENGTH = 16  # hex digits kept in the tag: 64 bits
# Not inherited by the measuring child (nor any TORCHELASTIC_ one): a tracking store, and torchrun's (a rank).
NOT_INHERITED = frozenset({
    "HMER_MLRUNS", "MLFLOW_TRACKING_URI", "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME",
    "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCH_ELASTIC_WORKER_IDENTIFIER"})
# The fixed training, run as a script by its path (never imported: see its docstring).
TRAINING_SCRIPT = Path(__file__).with_name("fingerprint_training.py")


def fingerprint_of_source(src: str | os.PathLike[str], timeout: float = 900) -> tuple[str, dict]:
    """(fingerprint, measurement) of the `hmer` package under `src`; cached by `source_key`."""
    import torch

    from ..data.source import repo_root

    src = Path(src).resolve()
    root = repo_root()  # .cache/fingerprints/ in the checkout, else ~/.cache/hmer/; $HMER_CACHE may be anywhere
    cached = ((root / ".cache" if root else Path.home() / ".cache" / "hmer") / "fingerprints"
              / f"{source_key(src)}-{torch.__version__}-{platform.machine()}.json")
    if cached.is_file():
        try:
            entry = json.loads(cached.read_text())
            return str(entry["fingerprint"]), dict(entry["measured"])
        except (ValueError, KeyError):
            pass  # a damaged cache entry is measured again
    # A child that read a torchrun rank's WORLD_SIZE, RANK, MASTER_PORT would wait for ranks that never come.
    env = {key: value for key, value in os.environ.items()
           if key not in NOT_INHERITED and not key.startswith("TORCHELASTIC_")}
    env.update({**PORTABLE_KERNELS, MEASURING: "1", "PYTHONPATH": str(src)})
    with tempfile.TemporaryDirectory(prefix="hmer-fingerprint-") as tmp:
        done = subprocess.run([sys.executable, str(TRAINING_SCRIPT)], cwd=tmp, env=env,
                              capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the fingerprint of the code in {src} failed: {last}")
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    value = hashlib.sha256(json.dumps(measured, sort_keys=True).encode()).hexdigest()[:TAG_LENGTH]  # all of it
    cached.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(cached, json.dumps({"fingerprint": value, "measured": measured}, sort_keys=True))
    return value, measured


def source_key(src: Path) -> str:
    """The fingerprint's cache key: a hash of the Python sources under `src` and of the measuring script."""
    h = hashlib.sha256(TRAINING_SCRIPT.read_bytes())
    for path in sorted((src / "hmer").rglob("*.py")):
        h.update(path.relative_to(src).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:32]


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """The fingerprint of this process's own `src/`: about fifteen seconds on one core once, then cached."""
    if os.environ.get(MEASURING):
        return "unknown: the fingerprint's own training"
    return fingerprint_of_source(Path(__file__).resolve().parents[2])[0]
