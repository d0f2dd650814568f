"""One writer at a time per store: the lock that the commands which write a whole store take.

    with store_lock(mlruns_dir(), "hmer runs publish /tmp/ws") as lock:
        if lock.stale is not None:
            print(lock.stale_line(), file=sys.stderr)   # a writer killed before it let go
        ...                                              # write the store

`hmer runs publish`, `hmer runs import`, `hmer runs workspace` and the GPU campaign's `home`
replace or merge a store's files in several steps, and `hmer runs rescore`, `present`, `rename`,
`supersede` and `fingerprint` write into many of its runs; two of them at once on one store break
each other (one publish's staging folder removed under the other's feet, a run imported twice, a
run rescored while a publish replaces its store). So
each takes this lock first, and a second one does not wait: it is refused (`StoreLocked`, a
ValueError: one line, exit status 2) naming the process that holds the lock and since when, with
nothing changed.

The lock is an advisory `flock` on `<store>/.store.lock`, and the file holds who took it (command,
pid, host, time). The kernel releases a `flock` when its process ends, however it ends (SIGKILL
too), so a holder that was killed never blocks the next writer. The file is removed on release;
a file that is there with nobody holding its lock is what a killed writer left behind: the next
writer names it (`stale`) and takes the lock over. Held again by the same process (a library
function under the command that already holds it), the lock is simply held.

Within one machine only: `flock` on a network filesystem may lock nothing across hosts. Where
`fcntl` does not exist (not POSIX), no lock is taken.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ContextManager, Iterator

LOCK_FILE = ".store.lock"
RECORD_WAIT_S = 2.0  # how long a refused writer waits for the holder's record (written just after its flock)


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


@dataclass
class TakenLock:
    """A store's lock as this process holds it; `stale` is the record a killed writer left, if any."""

    path: Path
    stale: Holder | str | None = None  # a Holder, or the unreadable text of a half-written record

    def stale_line(self) -> str:
        who = self.stale.describe() if isinstance(self.stale, Holder) else "a writer whose record is unreadable"
        return (f"{self.path}: a stale lock, left by {who}, which ended without releasing it (killed); "
                f"taken over")


_held: dict[Path, list] = {}  # lock file -> [its descriptor, how many times this process holds it, TakenLock]


@contextlib.contextmanager
def store_lock(folder: str | os.PathLike[str], command: str) -> Iterator[TakenLock]:
    """Hold the lock of the store in `folder` (created if missing) while the block runs; see the
    module docstring. Raises StoreLocked when another process holds it. A folder made for the lock
    is removed with it if nothing was written into it."""
    path = Path(folder).resolve() / LOCK_FILE
    if path in _held:
        _held[path][1] += 1
        try:
            yield _held[path][2]
        finally:
            _held[path][1] -= 1
        return
    try:
        import fcntl  # noqa: F401 - POSIX only
    except ImportError:
        yield TakenLock(path)
        return
    created = not path.parent.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, stale = _acquire(path, command)
    taken = TakenLock(path, stale)
    _held[path] = [fd, 1, taken]
    try:
        yield taken
    finally:
        del _held[path]
        # removed while still held: a writer that opened the file before this sees that it is gone
        # once it has the lock (`_acquire`), and opens the path again
        path.unlink(missing_ok=True)
        os.close(fd)  # releases the flock
        if created:  # a store folder made for the lock alone, by a command that then wrote nothing
            with contextlib.suppress(OSError):
                path.parent.rmdir()


def database_store_lock(tracking_uri: str, command: str) -> ContextManager[TakenLock | None]:
    """`store_lock` on the folder of a `sqlite:///` store; none for a server or a database server,
    which take their writers' transactions one by one themselves (yields None)."""
    if not tracking_uri.startswith("sqlite:///"):
        return contextlib.nullcontext()
    return store_lock(Path(tracking_uri[len("sqlite:///"):]).parent, command)


def _acquire(path: Path, command: str) -> tuple[int, Holder | str | None]:
    import fcntl

    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _wait_for_record(fd)
            os.close(fd)
            who = holder.describe() if isinstance(holder, Holder) else "another process (its record unreadable)"
            raise StoreLocked(f"{path.parent}: {who} is writing this store and holds its lock ({path.name}); "
                              f"nothing was changed: run this again once it has ended") from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # released (and removed) between our open and our flock: open the path again
            os.close(fd)
            continue
        stale = _read_record(fd) or None
        record = json.dumps(asdict(Holder(command=command, pid=os.getpid(), host=socket.gethostname(),
                                          since=time.time())))
        os.ftruncate(fd, 0)
        os.pwrite(fd, record.encode(), 0)
        os.fsync(fd)
        return fd, stale


def _read_record(fd: int) -> Holder | str:
    """The holder that the lock file records; its text when it is not a whole record; "" when empty."""
    size = os.fstat(fd).st_size
    text = os.pread(fd, size, 0).decode("utf-8", errors="replace") if size else ""
    try:
        return Holder(**json.loads(text))
    except (ValueError, TypeError):
        return text.strip()


def _wait_for_record(fd: int) -> Holder | str:
    """The holder's record, waiting a moment for it: it is written just after the holder's flock."""
    deadline = time.monotonic() + RECORD_WAIT_S
    while True:
        record = _read_record(fd)
        if isinstance(record, Holder) or time.monotonic() > deadline:
            return record
        time.sleep(0.05)
