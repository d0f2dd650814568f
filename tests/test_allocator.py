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


def _python(code: str, *args: str, **env: str) -> str:
    """The output of `python -c code args` in a fresh process, without the caller's glibc MALLOC_* variables."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", code, *args], env={**clean, **env}, capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


def _probe(**env: str) -> str:
    return _python(PROBE, **env)


@glibc
def test_tuned_once_in_a_fresh_process():
    assert _probe() == "True True"


@glibc
def test_the_users_malloc_variables_win():
    assert _probe(MALLOC_TOP_PAD_="1048576") == "False False"


@glibc
def test_the_hmer_command_tunes_malloc_before_it_runs():
    code = "import hmer.cli, hmer.allocator as m; hmer.cli.main(['models']); print('tuned', m._tuned)"
    assert _python(code).splitlines()[-1] == "tuned True"


REUSE = """
import ctypes, resource, sys
from hmer.allocator import tune_malloc
if sys.argv[1] == "tuned":
    assert tune_malloc()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, (ctypes.c_size_t,), (ctypes.c_void_p,)
size = 64 << 20  # above glibc's largest mmap threshold (32 MiB), as beam search's blocks at x0.7 are
def first_touch_faults():
    block = libc.malloc(size)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    ctypes.memset(block, 1, size)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    libc.free(block)
    return faults
first_touch_faults()
print(first_touch_faults())
"""


@glibc
def test_a_freed_large_block_is_reused_not_mapped_and_zeroed_again():
    tuned, untuned = int(_python(REUSE, "tuned")), int(_python(REUSE, "untuned"))
    # glibc's own: a fresh mapping, its pages faulted (and zeroed) again: one a page, or one a huge page
    # where transparent huge pages are always on; tuned: the heap's pages, touched once, stay mapped
    assert tuned < untuned
    assert tuned < (64 << 20) // os.sysconf("SC_PAGE_SIZE") // 100
