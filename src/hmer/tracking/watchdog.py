"""A server's keeper: it runs one server of `hmer ui` and ends it when `hmer ui` dies, however it dies.

    python watchdog.py FD FOLDER -- mlflow ui --port 5000 ...

`hmer ui` starts each server through this script, in a process group of its own, holding the write
end of a pipe whose read end is FD. When `hmer ui` ends (SIGKILL included) the kernel closes that
end; the script then stops its group (SIGTERM, then SIGKILL after STOP_TIMEOUT_S) and removes FOLDER
(the served copy and the logs). Without it a kill -9 of `hmer ui` left both servers holding their
ports (issue 70). A SIGTERM from `hmer ui` itself passes to the server, and the script exits with
its status. Standard library only: it is run by its path and imports nothing of the package.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time

STOP_TIMEOUT_S = 10.0
POLL_S = 0.5


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[3] != "--":
        print("usage: watchdog.py FD FOLDER -- COMMAND...", file=sys.stderr)
        return 2
    parent_end, folder, command = int(argv[1]), argv[2], argv[4:]
    for signum in (signal.SIGTERM, signal.SIGINT):
        # a handler, not SIG_IGN: the server is exec'd with the default action, so the group's SIGTERM ends it
        signal.signal(signum, lambda *_: None)
    server = subprocess.Popen(command)  # (without FD: close_fds)
    while True:
        status = server.poll()
        if status is not None:
            return status if status >= 0 else 128 - status
        readable, _, _ = select.select([parent_end], [], [], POLL_S)
        if readable and not os.read(parent_end, 1):  # the end of the pipe: `hmer ui` is gone
            _stop_group(server, folder)


def _stop_group(server: subprocess.Popen, folder: str) -> None:
    """SIGTERM to this process group (the server and its workers), SIGKILL after STOP_TIMEOUT_S to what
    is left of it, this script included; FOLDER removed in between."""
    group = os.getpgid(0)
    os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    shutil.rmtree(folder, ignore_errors=True)
    os.killpg(group, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
