"""hmer.allocator.tune_malloc: glibc's thresholds set in-process, once, and never over the user's own."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                           reason="mallopt tuning applies to glibc Linux only")
PROBE = "from hmer.allocator import tune_malloc; print(tune_malloc(), tune_malloc())"


def _probe(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


@glibc
def test_tuned_once_in_a_fresh_process():
    assert _probe() == "True True"


@glibc
def test_the_users_malloc_variables_win():
    assert _probe(MALLOC_TOP_PAD_="1048576") == "False False"


@glibc
def test_the_hmer_command_tunes_malloc_before_it_runs():
    code = "import hmer.cli, hmer.allocator as m; hmer.cli.main(['models']); print('tuned', m._tuned)"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "tuned True"
