"""The linter and the type checker, configured in pyproject.toml, run clean: ruff over every Python
folder of the checkout, mypy over the package (which ships `py.typed`). A finding fails the test
with the tool's own report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_ruff_finds_nothing():
    done = _run("ruff", "check", "src", "tests", "tools", "benchmarks", "studies", timeout=120)
    assert done.returncode == 0, f"ruff check:\n{done.stdout}{done.stderr}"


@pytest.mark.slow
def test_mypy_finds_nothing():
    # 45 to 90 s on a 2-core machine from an empty cache, about 5 s once .cache/mypy (pyproject) holds it.
    done = _run("mypy", "src", timeout=600)
    assert done.returncode == 0, f"mypy src:\n{done.stdout}{done.stderr}"
