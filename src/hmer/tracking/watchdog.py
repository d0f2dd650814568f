"""A server's keeper: it runs one server of `hmer ui` and ends it when `hmer ui` dies, however it dies.

    python watchdog.py FD FOLDER -- mlflow ui --port 5000 ...

`hmer ui` starts each server through this script, in a process group of its own, and holds the
write end of the pipe FD reads. When `hmer ui` ends (SIGKILL too: issue 70, both servers left holding
their ports) the kernel closes it; the script stops its group (SIGTERM, SIGKILL after STOP_TIMEOUT_S)
and removes FOLDER (the served copy, the logs). A SIGTERM from `hmer ui` reaches the server, whose
status the script exits with. Standard library only: run by its path, it imports nothing of hmer.
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
            # SIGTERM to this process group, FOLDER removed, SIGKILL after STOP_TIMEOUT_S (this script too)
            group = os.getpgid(0)
            os.killpg(group, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while server.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            shutil.rmtree(folder, ignore_errors=True)
            os.killpg(group, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
