"""One writer at a time per store: the lock that the commands which write a whole store take.

Publish, import, workspace, rescore, present, rename, supersede write many runs in several steps; two
at once break each other. A second writer does not wait: it is refused (`StoreLocked`, one line)
naming the holder. The lock is an advisory `flock` on `<store>/.store.lock`, whose file records the
holder; the kernel releases a `flock` when its process ends (SIGKILL too), so a killed holder's file
is reported `stale` and taken over. Trainings share `.trainers.lock` (`training_lock`), which a
publish takes exclusively (`no_training`); `run_lock` lets one process train a run. One machine only
(`flock` on a network filesystem may lock nothing across hosts); none without `fcntl`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ContextManager, Iterator

from .portable import sqlite_path

try:
    import fcntl
    FLOCK = True
except ImportError:  # not POSIX: no lock is taken
    FLOCK = False

LOCK_FILE = ".store.lock"
RECORD_WAIT_S = 2.0  # how long a refused writer waits for the holder's record


@dataclass(frozen=True)
class Holder:
    """Who took a store's lock."""

    command: str
    pid: int
    host: str
    since: float  # time.time() when it was taken

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since))
        return f"`{self.command}` (pid {self.pid} on {self.host}, since {when})"


class StoreLocked(ValueError):
    """Another process is writing the store: one line naming it."""


class StoreNotWritable(ValueError):
    """The store's lock cannot be written there (a read-only store): one line naming it."""


_held: set[Path] = set()  # the lock files this process holds


@contextlib.contextmanager
def store_lock(folder: str | os.PathLike[str], command: str) -> Iterator[None]:
    """Hold the lock of the store in `folder` (made if missing, removed again if left empty) while the
    block runs; StoreLocked when another process holds it. A stale one, that a killed writer left, is
    taken over and named on stderr."""
    path = Path(folder).resolve() / LOCK_FILE
    if path in _held or not FLOCK:  # (this process holds it already: a publish's command and its library call)
        yield
        return
    created = not path.parent.exists()
    fd = _flocked(path, fcntl.LOCK_EX)
    if fd is None:  # the holder writes its record just after its flock: wait a moment for it
        deadline = time.monotonic() + RECORD_WAIT_S
        while not isinstance(holder := _read_record(path), Holder) and time.monotonic() <= deadline:
            time.sleep(0.05)
        who = holder.describe() if isinstance(holder, Holder) else "another process (its record unreadable)"
        raise StoreLocked(f"{path.parent}: {who} is writing this store and holds its lock ({path.name}); "
                          f"nothing was changed: run this again once it has ended")
    stale = _read_record(path)  # a Holder, or the unreadable text of a half-written record
    if stale:
        who = stale.describe() if isinstance(stale, Holder) else "a writer whose record is unreadable"
        print(f"hmer: {path}: a stale lock, left by {who}, which ended without releasing it (killed); taken over",
              file=sys.stderr)
    _write_record(fd, command)
    os.fsync(fd)
    _held.add(path)
    try:
        yield
    finally:
        _held.discard(path)
        path.unlink(missing_ok=True)  # while `fd` holds it: a process that opened it before sees it gone (_flocked)
        os.close(fd)
        if created:  # a store folder made for the lock alone, by a command that then wrote nothing
            with contextlib.suppress(OSError):
                path.parent.rmdir()


# Shared by the trainings of a store, exclusive for a command that replaces it (issue 70: a publish into
# the store a training wrote left the run gone, exit 0).
TRAINERS_LOCK = ".trainers.lock"
TRAINERS = ".trainers"
RUN_LOCK = ".training.lock"  # in a run's checkpoint folder: one process trains a run at a time


@contextlib.contextmanager
def training_lock(folder: str | os.PathLike[str], command: str) -> Iterator[None]:
    """Held (shared) by each training of the store in `folder`; StoreLocked while a publish replaces it."""
    if not FLOCK:
        yield
        return
    store = Path(folder).resolve()
    fd = _flocked(store / TRAINERS_LOCK, fcntl.LOCK_SH)
    if fd is None:
        raise StoreLocked(f"{store}: {_holder_of(store / LOCK_FILE)} is replacing this store and holds its lock "
                          f"({LOCK_FILE}); no training was started: run this again once it has ended")
    record = store / TRAINERS / f"{socket.gethostname()}-{os.getpid()}.json"
    record.parent.mkdir(exist_ok=True)
    record.write_text(_record(command))
    try:
        yield
    finally:
        record.unlink(missing_ok=True)
        _let_go(fd, store)


@contextlib.contextmanager
def no_training(folder: str | os.PathLike[str]) -> Iterator[None]:
    """Held by a publish into the store in `folder`: no training of it runs or starts meanwhile;
    StoreLocked naming the trainings that write it."""
    store = Path(folder).resolve()
    if not FLOCK or not store.is_dir():
        yield
        return
    fd = _flocked(store / TRAINERS_LOCK, fcntl.LOCK_EX)
    if fd is None:
        who = [_holder_of(path) for path in sorted((store / TRAINERS).glob("*.json"))] or ["a training"]
        raise StoreLocked(f"{store}: {len(who)} training(s) write this store ({'; '.join(who[:3])}); nothing was "
                          f"changed: run this again once they have ended")
    try:
        yield
    finally:
        _let_go(fd, store)


def _flocked(path: Path, kind: int) -> int | None:
    """A descriptor of `path` (made if missing, and its folder) holding a flock of `kind`, or None when
    another process's lock excludes it; a file its holder removed meanwhile is opened again."""
    while True:
        try:  # a store that cannot be locked here (read-only, another user's) is not written at all
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreNotWritable(f"{path.parent}: cannot write the store's lock {path.name} there "
                                   f"({exc.strerror or exc}): a read-only store can be read, not written; nothing "
                                   f"was changed") from None
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        os.close(fd)


def _let_go(fd: int, store: Path) -> None:
    """Release `fd`'s TRAINERS_LOCK; when no other process holds it, remove it and every record first."""
    records = store / TRAINERS
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return
    for record in records.glob("*.json"):
        record.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        records.rmdir()
    (store / TRAINERS_LOCK).unlink(missing_ok=True)
    os.close(fd)


@contextlib.contextmanager
def run_lock(folder: str | os.PathLike[str], run: str, command: str) -> Iterator[None]:
    """Held while a process trains the run whose checkpoints are in `folder`: a second one (two
    `hmer train --resume RUN`) is refused, naming the first."""
    if not FLOCK:
        yield
        return
    path = Path(folder).resolve() / RUN_LOCK
    fd = _flocked(path, fcntl.LOCK_EX)
    if fd is None:
        raise StoreLocked(f"run {run}: {_holder_of(path)} is training it; one process trains a run at a time: "
                          f"nothing was changed")
    _write_record(fd, command)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)  # as store_lock's
        os.close(fd)


def _holder_of(path: Path) -> str:
    """Who a lock or record file names, in words."""
    holder = _read_record(path)
    return holder.describe() if isinstance(holder, Holder) else "another process"


def database_store_lock(tracking_uri: str, command: str) -> ContextManager[None]:
    """`store_lock` on a `sqlite:///` store's folder; none for a server or a database server, which
    serialise their writers themselves."""
    db = sqlite_path(tracking_uri)
    return contextlib.nullcontext() if db is None else store_lock(db.parent, command)


def _record(command: str) -> str:
    """This process as the holder of a lock, as its file records it (JSON)."""
    return json.dumps(asdict(Holder(command=command, pid=os.getpid(), host=socket.gethostname(), since=time.time())))


def _write_record(fd: int, command: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, _record(command).encode(), 0)


def _read_record(path: Path) -> Holder | str:
    """The holder a lock or record file records; its text when not a whole record; "" when empty or
    unreadable."""
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return ""
    try:
        return Holder(**json.loads(text))
    except (ValueError, TypeError):
        return text.strip()

