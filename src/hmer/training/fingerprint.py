"""A fingerprint of what the training code computes: equal fingerprints, the same numbers
(docs/studies.md, "The training-code fingerprint": what it trains and why the commit cannot say it).

    fingerprint = code_fingerprint()            # this checkout's code, cached by its source (seconds once)
    fingerprint_of_source("/tmp/wt/src")        # another commit's code, in a worktree of it

The training (`fingerprint_training.py`, a script run against any commit's `src/` on PYTHONPATH) runs in
a child process with the portable kernels, so that one code has one fingerprint on every x86-64 machine
with the same torch: the training runs themselves use the fast kernels, whose roundings differ from one
CPU to the next, and that is no change of code. The torch version and the architecture are hashed with
the rest: another torch is another computation. Every run records it as the tag `hmer.fingerprint`.
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

# The kernels that give the same roundings on every x86-64 CPU (see the module docstring).
PORTABLE_KERNELS = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41",
                    "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# Set in the child process that measures a fingerprint: the runs it trains are the measurement, and
# fingerprinting them in turn would start the measurement again inside itself, without end.
MEASURING = "HMER_FINGERPRINT_MEASURING"
TAG_LENGTH = 16  # hex digits kept in the tag: 64 bits
# The variables of this process that the measuring child does not inherit (nor any TORCHELASTIC_
# one): a tracking store, since it writes none, and torchrun's, which would make it a rank.
NOT_INHERITED = frozenset({
    "HMER_MLRUNS", "MLFLOW_TRACKING_URI", "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME",
    "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCH_ELASTIC_WORKER_IDENTIFIER"})
# The fixed training, run as a script by its path (never imported: see its docstring).
TRAINING_SCRIPT = Path(__file__).with_name("fingerprint_training.py")


def digest(measured: dict) -> str:
    """The fingerprint of a measurement: the hash of everything in it, as `TAG_LENGTH` hex digits."""
    return hashlib.sha256(json.dumps(measured, sort_keys=True).encode()).hexdigest()[:TAG_LENGTH]


def fingerprint_of_source(src: str | os.PathLike[str], timeout: float = 900) -> tuple[str, dict]:
    """(fingerprint, measurement) of the `hmer` package under the folder `src` (a checkout's or a
    worktree's `src/`), trained in a child process with the portable kernels; from the cache when
    those sources and the training that measures them are unchanged."""
    import torch

    src = Path(src).resolve()
    cached = _cache_folder() / f"{source_key(src)}-{torch.__version__}-{platform.machine()}.json"
    if cached.is_file():
        try:
            entry = json.loads(cached.read_text())
            return str(entry["fingerprint"]), dict(entry["measured"])
        except (ValueError, KeyError):
            pass  # a damaged cache entry is measured again
    # One process, whatever launched this one: a rank of torchrun passes its WORLD_SIZE, RANK and
    # MASTER_PORT on, and a child that read them would wait for ranks that never come.
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
    value = digest(measured)
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_name(cached.name + f".{os.getpid()}.tmp")
    partial.write_text(json.dumps({"fingerprint": value, "measured": measured}, sort_keys=True))
    os.replace(partial, cached)
    return value, measured


def source_key(src: Path) -> str:
    """A hash of the package's Python sources under `src` and of the training that measures them:
    the cache key of their fingerprint."""
    h = hashlib.sha256(TRAINING_SCRIPT.read_bytes())
    for path in sorted((src / "hmer").rglob("*.py")):
        h.update(path.relative_to(src).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:32]


def _cache_folder() -> Path:
    """`.cache/fingerprints/` of the checkout (else `~/.cache/hmer/fingerprints/`), not `$HMER_CACHE`,
    whose renderings a test or a machine may keep anywhere: one code has one fingerprint, wherever
    its images are."""
    from ..data.source import repo_root

    root = repo_root()
    return (root / ".cache" if root else Path.home() / ".cache" / "hmer") / "fingerprints"


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """The fingerprint of the code this process runs (`fingerprint_of_source` of its own `src/`):
    about fifteen seconds on one core the first time, then read from the cache."""
    if os.environ.get(MEASURING):
        return "unknown: the fingerprint's own training"
    return fingerprint_of_source(Path(__file__).resolve().parents[2])[0]
