"""A real browser for the web UIs a user opens on a store (`hmer ui` starts them: tests/test_ui.py).

    with chromium() as browser:
        page = browser.new_page()
        page.goto(mlflow + "/#/experiments/1/runs?workflowType=machine_learning")

Debian's Chromium (`apt-get install chromium`) driven by Playwright's Python package with the
system browser's executable, headless, in a fresh profile, with the background services that
would try to reach the internet turned off (without them a machine with no network fills the
log with refused connections).

`require_browser()` skips a test when Chromium, Playwright or optuna-dashboard is missing; with
HMER_REQUIRE_BROWSER=1 (set by .ci/run) it fails instead, so CI cannot pass without them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path
from typing import Iterator

import pytest

# Playwright adds --headless itself; the rest keep a sandbox-less container's Chromium quiet and offline.
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> str | None:
    """`$HMER_CHROMIUM`, else Debian's `chromium` (or `chromium-browser`) on PATH."""
    return os.environ.get("HMER_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def _beside_python(name: str) -> str | None:
    beside = Path(sys.executable).parent / name  # the venv running the tests
    return str(beside) if beside.is_file() else shutil.which(name)


def require_browser() -> None:
    """Skip (or, with HMER_REQUIRE_BROWSER=1, fail) unless Chromium, Playwright, mlflow and
    optuna-dashboard are all here."""
    missing = []
    if chromium_path() is None:
        missing.append("chromium (apt-get install -y chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright module (pip install -e '.[test]')")
    for name in ("mlflow", "optuna-dashboard"):
        if _beside_python(name) is None:
            missing.append(f"{name} (pip install -e .)")
    if not missing:
        return
    reason = f"{', '.join(missing)} not found"
    if os.environ.get("HMER_REQUIRE_BROWSER") == "1":
        pytest.fail(f"HMER_REQUIRE_BROWSER=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@contextlib.contextmanager
def chromium() -> Iterator:
    """A headless Chromium (Playwright `Browser`) in a fresh, empty profile; closed afterwards."""
    from playwright.sync_api import sync_playwright

    require_browser()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


def screenshot(page, name: str) -> None:
    """Save the page as `$HMER_SCREENSHOTS/<name>.png` when that folder is set (`HMER_SCREENSHOTS=docs`
    refreshes the README's pictures); normal runs write nothing."""
    folder = os.environ.get("HMER_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"))
