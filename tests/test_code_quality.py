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


def test_optuna_s_private_names_are_named_in_one_module():
    """Optuna's private names (an attribute or class it does not document, or a private storage
    method public Optuna calls) appear in hmer.studies.optuna_compat alone, which says why."""
    import ast

    from hmer.studies.optuna_compat import PRIVATE_STORAGE_CALLS

    # what an Optuna object keeps privately that code is tempted to read
    private = {*PRIVATE_STORAGE_CALLS, "_trial_id", "_study_id", "_storage", "_CachedStorage", "_cached_frozen_trial"}
    found = []
    for path in sorted([*(ROOT / "src").rglob("*.py"), *(ROOT / "tools").rglob("*.py")]):
        if path.name == "optuna_compat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else \
                node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
            if name in private:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert not found, "Optuna's private names outside hmer.studies.optuna_compat:\n" + "\n".join(found)


def test_every_search_for_all_runs_pages_through_the_store():
    """MLflow's `search_runs` answers one page (1,000 runs unless told); a search that means "all of
    them" reads every page through hmer.tracking.store.search_all_runs. Elsewhere a search asks for
    a few runs, as a literal `max_results` of at most 10."""
    import ast

    found = []
    for path in sorted([*(ROOT / "src").rglob("*.py"), *(ROOT / "tools").rglob("*.py"),
                        *(ROOT / "studies").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]):
        if path == ROOT / "src" / "hmer" / "tracking" / "store.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "search_runs"):
                continue
            limit = next((k.value for k in node.keywords if k.arg == "max_results"), None)
            if not (isinstance(limit, ast.Constant) and isinstance(limit.value, int) and limit.value <= 10):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, "searches of one page where all runs are meant (use search_all_runs):\n" + "\n".join(found)
