"""One device command as steps under caps, and what comes back kept within the device tool's limits.

A GPU is lent for about 15 minutes of device time: a machine start, then one command of at most
10 minutes, on a bare machine whose disk is gone once it is given back. `Lease` runs that command
as steps in order, each under its own cap, so that a step that fails or runs out of time is logged
and costs only itself; the last `wrapup_seconds` are kept for the step that brings the results
back. A step that needs the project (torch, mlflow) runs as a subprocess (`Lease.run`: stopped with
SIGINT at its cap, SIGKILL 20 s later), so this module uses the standard library only and runs
before anything is installed.

What comes back ($OUT) must fit the device tool: at most 8 files, each at most 16 MiB, 64 MiB
together, no deeper than two folders (`check_out` says what does not). The catalogue of steps, what
they run and with which settings, is the campaign's (tools/gpu_campaign_plan.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

OUT_FILES = 8
OUT_FILE_MB = 16
OUT_TOTAL_MB = 64
PART_MB = 15  # a larger file comes back as .part-NNN pieces of this size (a margin under OUT_FILE_MB)
KILL_AFTER_S = 20  # from SIGINT at a cap to SIGKILL: a training run checkpoints and closes its run first


@dataclass
class Step:
    """One step of a lease: `run(cap seconds)` returns its status ("done", "failed", "timeout",
    "paused", ...), or None when it had nothing to do. `cap` 0: whatever is left of the lease."""

    name: str
    cap: float
    run: Callable[[float], str | None]


class Lease:
    """One device command: its clock, its log (`<home>/lease.log`), its steps' statuses and $OUT."""

    def __init__(self, home: Path, out: Path, seconds: float, wrapup_seconds: float, cap_scale: float = 1.0):
        self.home, self.out = home.resolve(), out.resolve()
        self.t0 = time.monotonic()
        self.deadline = self.t0 + seconds
        self.wrapup_seconds = wrapup_seconds
        self.cap_scale = cap_scale
        self.steps: dict[str, dict] = {}
        self.home.mkdir(parents=True, exist_ok=True)
        self.out.mkdir(parents=True, exist_ok=True)
        self.log_path = self.home / "lease.log"

    def log(self, text: str) -> None:
        line = f"[+{time.monotonic() - self.t0:6.1f}s] {text}"
        print(line, flush=True)
        with self.log_path.open("a") as f:
            f.write(line + "\n")

    def left(self) -> float:
        """Seconds until the lease's wrap-up must start."""
        return self.deadline - self.wrapup_seconds - time.monotonic()

    def run(self, cmd: list[str], cap: float, *, env: dict | None = None, cwd: Path | None = None,
            ) -> tuple[int | None, str, float]:
        """Run `cmd` for at most `cap` s: (exit status, or None when the cap stopped it; its output; seconds)."""
        self.log("$ " + " ".join(cmd) + f"   (cap {cap:.0f} s)")
        start = time.monotonic()
        sink_path = self.home / "last-step.out"
        with sink_path.open("w") as sink:
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            stopped = False
            while proc.poll() is None:
                if time.monotonic() - start >= cap:
                    stopped = True
                    self.log(f"stopping it after {time.monotonic() - start:.0f} s (SIGINT)")
                    _signal(proc, signal.SIGINT)
                    try:
                        proc.wait(KILL_AFTER_S)
                    except subprocess.TimeoutExpired:
                        _signal(proc, signal.SIGKILL)
                        proc.wait()
                    break
                time.sleep(0.2)
        output = sink_path.read_text(errors="replace")
        seconds = time.monotonic() - start
        tail = "\n".join(output.rstrip().splitlines()[-25:])
        self.log(f"exit {proc.returncode}{' (stopped at its cap)' if stopped else ''} after {seconds:.1f} s; "
                 "output tail:\n" + "\n".join("    " + line for line in tail.splitlines()))
        return (None if stopped else proc.returncode), output, seconds

    def run_steps(self, steps: list[Step]) -> None:
        """Each step in order under min(its cap x cap_scale, what is left before the wrap-up)."""
        for step in steps:
            budget = self.left()
            if budget < 5:
                self.steps[step.name] = {"status": "not run (no time left)", "seconds": 0.0}
                self.log(f"step {step.name}: not run, {budget:.0f} s left before the wrap-up")
                continue
            start = time.monotonic()
            try:
                status = step.run(min(step.cap * self.cap_scale, budget) if step.cap else budget)
            except Exception as exc:  # noqa: BLE001 - a failed step costs only itself
                status = "failed"
                self.log(f"step {step.name}: {type(exc).__name__}: {exc}")
            seconds = round(time.monotonic() - start, 1)
            if status is None:
                self.log(f"step {step.name}: nothing to do")
                continue
            self.steps[step.name] = {"status": status, "seconds": seconds}
            self.log(f"step {step.name}: {status} ({seconds:.1f} s)")

    def skipped(self, name: str, why: str) -> None:
        self.steps[name] = {"status": "skipped", "seconds": 0.0}
        self.log(f"step {name}: skipped ({why})")

    def finish(self, wrapup: Step, status: dict) -> dict:
        """The wrap-up step with all the time left, then `status` (with the steps' own and the list
        of what $OUT holds) as $OUT/status.json, and the log as $OUT/lease.log. Returns the status."""
        start = time.monotonic()
        try:
            result = wrapup.run(max(self.deadline - time.monotonic(), 30.0)) or "done"
        except Exception as exc:  # noqa: BLE001 - the log and the status still go back
            result = "failed"
            self.log(f"step {wrapup.name}: {type(exc).__name__}: {exc}")
        self.steps[wrapup.name] = {"status": result, "seconds": round(time.monotonic() - start, 1)}
        self.log(f"step {wrapup.name}: {result}")
        files = sorted({p.name for p in self.out.iterdir()} | {"status.json", "lease.log"})
        status = {**status, "steps": self.steps, "seconds": round(time.monotonic() - self.t0, 1), "files": files,
                  "out_problems": check_out(self.out, extra_files=len(files) - len(list(self.out.iterdir())))}
        for problem in status["out_problems"]:
            self.log(f"$OUT: {problem}")
        self.log(f"lease done in {time.monotonic() - self.t0:.0f} s; $OUT: {', '.join(files)}")
        # Each file's size as it leaves (the log's too: nothing is logged after this), so that the
        # machine it comes back to can tell a file cut short in transfer (`home`).
        status["sizes"] = {**{p.name: p.stat().st_size for p in self.out.iterdir()
                                if p.is_file() and p.name != "status.json"},
                           "lease.log": self.log_path.stat().st_size}
        (self.out / "status.json").write_text(json.dumps(status, indent=1))
        (self.out / "lease.log").write_bytes(self.log_path.read_bytes())
        return status


def check_out(out: Path, extra_files: int = 0) -> list[str]:
    """What in `out` breaks the device tool's limits on files back (with `extra_files` still to come)."""
    files = [p for p in out.rglob("*") if p.is_file()]
    problems = []
    if len(files) + extra_files > OUT_FILES:
        problems.append(f"{len(files) + extra_files} files, more than the {OUT_FILES} that come back")
    for f in files:
        if f.stat().st_size > OUT_FILE_MB * 2**20:
            problems.append(f"{f.name} is {f.stat().st_size / 2**20:.1f} MiB, over {OUT_FILE_MB} MiB")
        if len(f.relative_to(out).parts) > 3:
            problems.append(f"{f.relative_to(out)} is more than two folders down")
    total = sum(f.stat().st_size for f in files)
    if total > OUT_TOTAL_MB * 2**20:
        problems.append(f"{total / 2**20:.1f} MiB together, over {OUT_TOTAL_MB} MiB")
    return problems


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
