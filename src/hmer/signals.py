"""SIGTERM and SIGINT end a training as a kill -9 would not: its run closed KILLED, its store true.

Inside `stop_on_signals()` either signal raises `Stopped` (a KeyboardInterrupt, so every handler of
Ctrl-C sees it) in the main thread, at once: the epoch in progress is dropped, as after a kill -9.
Inside `deferred()` (writing a checkpoint, logging an epoch, opening or closing a run) the signal waits
for the block to end, so no record is half-written. A second signal while stopping is ignored: the
first one is already being acted on. The exit status is 128 + the signal's number (docs/training.md,
"Checkpoints and resume").
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(KeyboardInterrupt):
    """A SIGTERM or SIGINT acted on; `detail` says where the training stood (the trainer fills it)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.detail = ""

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        return f"stopped by {self.signal_name}" + (f" {self.detail}" if self.detail else "")


# depth: nested stop_on_signals() blocks; deferring: nested deferred() blocks; pending: the signal a
# deferred block holds back; stopping: a signal is being acted on
_state = SimpleNamespace(depth=0, deferring=0, pending=None, stopping=False)


def _handle(signum: int, frame) -> None:  # noqa: ARG001 - the signal module's signature
    if _state.stopping:
        return
    if _state.deferring:
        _state.pending = signum
        return
    _state.stopping = True
    raise Stopped(signum)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM and SIGINT raise `Stopped` within the block (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in SIGNALS}
    if _state.depth == 0:
        _state.pending, _state.stopping = None, False
    _state.depth += 1
    for s in SIGNALS:
        signal.signal(s, _handle)
    try:
        yield
    finally:
        _state.depth -= 1
        for s, handler in before.items():
            signal.signal(s, handler)


@contextmanager
def deferred() -> Iterator[None]:
    """A signal that arrives within the block is acted on when the block ends (at a safe point)."""
    _state.deferring += 1
    try:
        yield
    finally:
        _state.deferring -= 1
    if not _state.deferring and _state.pending is not None and not _state.stopping:
        signum, _state.pending = _state.pending, None
        _state.stopping = True
        raise Stopped(signum)
