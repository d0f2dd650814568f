"""glibc's malloc, tuned once per process for tensors that are freed and allocated again each step.

Beam search and training free and allocate the same large tensors (caches, activations) every
step. By default glibc serves a block above its mmap threshold (128 KiB, rising dynamically to at
most 32 MiB) with a fresh `mmap`, hands it back with `munmap` when freed, and the kernel zeroes
its pages again on the next first touch; it also trims the top of the heap above 128 KiB.
Decoding the then best CPU model (run `7ef3f758`) on 2014 made 17,670 `munmap` calls for 102 images, and most of its
time was system time (issue 24). `tune_malloc` keeps freed memory in the process instead:

    M_MMAP_MAX        0       (every block comes from the heap, however large)
    M_TRIM_THRESHOLD  1 GiB   (free memory at the top of the heap is kept, up to this)
    M_TOP_PAD         256 MiB (the heap grows in large steps: fewer `brk` calls)

No mmap threshold is high enough: glibc caps it at 32 MiB, and beam search at the input scale 0.7
(batches of up to 64 images of 10 hypotheses) allocates blocks above that. With the threshold at its
cap they were still mapped and zeroed afresh: decoding 96 images of 2014 with `c8117245` spent 13-16 s
of 90-94 in the kernel, and 1.4-2.8 s of 76-91 with no mapping at all (docs/benchmarks.md section 6).

As MALLOC_MMAP_MAX_ / MALLOC_TRIM_THRESHOLD_ / MALLOC_TOP_PAD_, which a process cannot set for
itself once started. Called by the `hmer` command and by studies; Linux with glibc only, a no-op
elsewhere. After a peak the process keeps up to about the trim threshold, as one that keeps decoding
wants.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_MAX = -4

SETTINGS = {M_MMAP_MAX: 0, M_TRIM_THRESHOLD: 1 << 30, M_TOP_PAD: 256 << 20}
ENV_NAMES = ("MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")

_tuned: bool | None = None


def tune_malloc() -> bool:
    """Apply SETTINGS with glibc's `mallopt`, once per process. True if they are in force.

    Leaves malloc alone where the user set any of glibc's MALLOC_*_ variables (theirs win), and
    where the C library is not glibc (`platform.libc_ver()`).
    """
    global _tuned
    if _tuned is not None:
        return _tuned
    _tuned = False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if any(name in os.environ for name in ENV_NAMES):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    _tuned = all(mallopt(param, value) == 1 for param, value in SETTINGS.items())
    return _tuned
