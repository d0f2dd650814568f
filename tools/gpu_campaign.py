"""A GPU lease as one rehearsed command per 9-minute slice: install, check, benchmark, train, evaluate,
and bring back the MLflow records.

    python3 tools/gpu_campaign.py --slice 1      # on the GPU machine, one device command each
    python3 tools/gpu_campaign.py --slice 2
    python3 tools/gpu_campaign.py --slice 3
    python tools/gpu_campaign.py --slice 1 --device cpu --rehearse --out /tmp/out   # the CI rehearsal

docs/benchmarks.md section 5 gives the exact device calls (command and carry list) and what to do
with what comes back (`hmer runs import`).

THE PLAN FOR A 25-MINUTE WINDOW (three commands of at most 9 minutes; the durations below are
estimates, except that the four leases so far measured install 14-18 s, check 48-58 s and a 20 s
bench figure 40-60 s; the log of each slice gives the real ones)

    step          cap    estimate  what
    install       120 s     30 s   wheels from .whl/ into <home>/site (--no-index --no-deps), then the project
                                   itself (--no-deps --no-build-isolation); import check
    restore        60 s     10 s   only on a fresh machine at slice >= 2: the resumable copy carried back
    data           60 s      5 s   the packed data zip copied to <home>/data/ (a fixed path, as checkpoints name it)
    check         180 s     60 s   torch.cuda.is_available, bf16, nvidia-smi -L, one bf16 training step of
                                   every family (bttr, comer-self/-cross/-fusion, wap-rnn, convs2s)
    shape-cost    300 s    280 s   tools/gpu_shape_cost.py: a new batch shape's cost, cold against warm, with
                                   and without the 1x1 matmuls, the planning pass, the plan cache's size,
                                   CUDA graphs (issue 47); shape_cost.json to $OUT. --skip shape-cost
                                   once a lease has its figures
    bench-train   300 s    300 s   training images/s of bttr and comer-fusion, bf16, real batches: reference
                                   (20 s); large (k = 8, 60 s); large and padded to 64 px (60 s);
                                   torch.compile, padded; padded (60 s); 24 batches cycled (shapes seen);
                                   channels-last throughout (the default). A lease that has these figures
                                   already passes --skip bench-train and trains instead
    train         rest    ~760 s   comer-fusion (CoMER's best coverage variant, bidirectional), large
                                   batches (k = 8: the fastest first pass the fourth lease measured), with
                                   --time-budget 720 s: slice 1's remainder, all of slice 2, part of slice 3;
                                   killed (SIGINT) before a slice ends and resumed with `hmer train --resume`
                                   from its last epoch's checkpoint; then the trainer's own evaluation of
                                   2014, 2016 and 2019 with beam 10 and joint search (~240 s, reserved)
    bench-decode  240 s    120 s   `hmer bench decode` of 2014 with the trained weights, beam 10, joint search,
                                   and 64 images compared with unbatched decoding
    wrap-up        60 s     30 s   every slice: benchmark figures recorded as MLflow runs, the store exported,
                                   the resumable copy packed, all written to $OUT

    slice 1 ~ install + data + check + bench-train + ~90 s of training     (~9 min)
    slice 2 ~ training                                                       (~9 min)
    slice 3 ~ training to the budget + evaluation + bench-decode + wrap-up (~8 min)
    plus ~1-2 min of machine start per fresh machine: 3 x 9 + starts is about the 30-minute lease;
    a fourth `--slice 4` finishes whatever a slow slice left (the train step reports `unfinished`).

Steps run in this order, each under its own cap: a step that fails or runs out of time is logged and
costs only itself. Steps marked done are not run again; install and data are per machine.

WHERE STATE LIVES. Between slices, on the device's local disk in <home> (default /tmp/hmer-campaign):
the MLflow store and checkpoints, the installed packages, the step states (state.json) and the log.
That survives only while the machine stays warm (it goes back after 30 s idle), so every slice also
writes a resumable copy to $OUT/resume.tar (MLflow store without model files, the state, and the last
checkpoint of an unfinished training run as fp16 weights without optimiser state: a 64 MiB carry
cannot hold a paper-size model's fp32 weights and optimiser state beside the wheels and the data). Put
it at .gpu/resume.tar and carry .gpu: a fresh machine continues from it. Such a continuation is not
bit-identical to an uninterrupted run (rounded weights, optimiser state restarted): the run gets the
tag hmer.warm_restart=<epoch>.

$OUT (at most 8 files, 16 MiB each): campaign-slice<N>.log (the log of every slice so far), bench.md
(the benchmark table with the command behind each figure), status.json, runs-slice<N>.tar.gz (or its
.part-NNN pieces; import with `hmer runs import`) and resume.tar.

The driver uses the standard library only, so it runs before anything is installed; steps that need
torch and hmer run as subprocesses (`python3 tools/gpu_campaign.py _STEP ...`).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = "gpu-campaign"
BENCH_EXPERIMENT = "gpu-bench"
PART_MB = 15  # $OUT takes files of at most 16 MiB

# (preset, setting name, overrides, cap seconds, timed seconds), in priority order. A first pass over
# padded shapes is timed for a minute, long enough to show whether its shapes repeat.
LARGE = ["data.batch_pixels=2560000", "data.max_batch_size=128"]
# Batches padded to multiples of 64 px: 193 distinct shapes in an epoch of training batches instead
# of 1,293, 31.0 % padding instead of 5.4 % (benchmarks/bench_data.py); a new shape costs ~0.5 s on
# an H100 (docs/benchmarks.md section 5).
PADDED = ["data.pad_multiple=64"]
GPU_TRAIN_FIGURES = [
    (p, name, sets, cap, timed)
    for name, sets, cap, timed in [
        ("reference", [], 90, 20),
        # The order follows what the leases so far reached (docs/benchmarks.md section 5): the third
        # timed "padded", the fourth "large, padded" and "large" (by hand, 60 s); compile, padded did
        # not finish within 200 s on the fourth. Large batches first, as a record this time.
        ("large k=8", LARGE, 150, 60),
        ("large k=8, padded to 64 px", [*LARGE, *PADDED], 150, 60),
        ("compile, padded to 64 px", ["train.compile=true", *PADDED], 150, 20),
        ("padded to 64 px", PADDED, 150, 60),
        ("shapes seen: 24 batches cycled", ["bench.batches=24"], 90, 20),
        # channels-last is the default since section 0 measured it, so every figure has it
    ]
    for p in ("bttr", "comer-fusion")
]
STEP_NAMES = ("install", "restore", "data", "check", "shape-cost", "bench-train", "train",
              "bench-decode")  # run in this order
REHEARSAL_TINY = ["data.batch_pixels=20000", "data.max_batch_size=8"]
REHEARSAL_TRAIN_FIGURES = [
    ("tiny", "large k=4, padded to 32 px", ["data.batch_pixels=80000", "data.max_batch_size=32",
                                            "data.pad_multiple=32"], 60, 3),
    # Inductor on a CPU needs minutes (docs/benchmarks.md section 2): this figure shows a cap at work.
    ("tiny", "compile", [*REHEARSAL_TINY, "train.compile=true"], 2, 3),
]
GPU_FAMILIES = ["bttr", "comer-self", "comer-cross", "comer-fusion", "wap-rnn", "convs2s"]
REHEARSAL_FAMILIES = ["tiny", "tiny-comer", "tiny-rnn", "tiny-convs2s"]
REHEARSAL_TRAIN_SET = ["train.beam_size=2", "train.max_decode_len=12", "train.attention_maps=1",
                       "train.epochs=3", *REHEARSAL_TINY]


class Campaign:
    def __init__(self, args):
        self.args = args
        self.gpu = args.device != "cpu"
        self.home = Path(args.home).resolve()
        self.out = Path(args.out).resolve()
        self.slice = args.slice
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.slice_seconds
        self.home.mkdir(parents=True, exist_ok=True)
        self.out.mkdir(parents=True, exist_ok=True)
        self.fresh = not (self.home / "state.json").is_file()
        self.state = self._load_state()
        self.site = self.home / "site"

    # ---- state and log ---------------------------------------------------------------------------
    def _load_state(self) -> dict:
        path = self.home / "state.json"
        if path.is_file():
            return json.loads(path.read_text())
        return {"steps": {}, "bench": [], "train": {}, "slices": []}

    def save(self) -> None:
        tmp = self.home / "state.json.tmp"
        tmp.write_text(json.dumps(self.state, indent=1))
        os.replace(tmp, self.home / "state.json")

    def log(self, text: str) -> None:
        line = f"[slice {self.slice} +{time.monotonic() - self.t0:6.1f}s] {text}"
        print(line, flush=True)
        with (self.home / "campaign.log").open("a") as f:
            f.write(line + "\n")

    def left(self) -> float:
        return self.deadline - time.monotonic()

    # ---- subprocesses ----------------------------------------------------------------------------
    def env(self) -> dict:
        env = dict(os.environ)
        paths = [str(self.site)] if (self.site / "hmer").is_dir() else [str(REPO / "src")]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env.update(PYTHONPATH=os.pathsep.join(paths), PYTHONUNBUFFERED="1", HMER_MLRUNS=str(self.home / "mlruns"),
                   HMER_CACHE=str(self.home / "cache"), HMER_CAMPAIGN_HOME=str(self.home))
        env.pop("MLFLOW_TRACKING_URI", None)
        return env

    def run(self, cmd: list[str], cap: float) -> tuple[int | None, str, float]:
        """Run `cmd` for at most `cap` s (then SIGINT, 20 s later SIGKILL): (exit status or None, output, s)."""
        self.log("$ " + " ".join(cmd) + f"   (cap {cap:.0f} s)")
        start = time.monotonic()
        log_path = self.home / "last-step.out"
        with log_path.open("w") as sink:
            proc = subprocess.Popen(cmd, cwd=REPO, env=self.env(), stdout=sink, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            interrupted = False
            while proc.poll() is None:
                if time.monotonic() - start >= cap:
                    interrupted = True
                    self.log(f"interrupting after {time.monotonic() - start:.0f} s")
                    _signal(proc, signal.SIGINT)
                    try:
                        proc.wait(20)
                    except subprocess.TimeoutExpired:
                        _signal(proc, signal.SIGKILL)
                        proc.wait()
                    break
                time.sleep(0.2)
        out = log_path.read_text(errors="replace")
        seconds = time.monotonic() - start
        rc = proc.returncode
        tail = "\n".join(out.rstrip().splitlines()[-25:])
        self.log(f"exit {rc}{' (interrupted)' if interrupted else ''} after {seconds:.1f} s; output tail:\n"
                 + "\n".join("    " + line for line in tail.splitlines()))
        return (None if interrupted else rc), out, seconds

    def internal(self, step: str, cap: float, *extra: str, positional: tuple[str, ...] = ()):
        return self.run([sys.executable, str(Path(__file__).resolve()), step, *positional, "--home", str(self.home),
                         "--out", str(self.out), "--slice", str(self.slice), "--device", self.args.device, *extra], cap)

    # ---- steps -----------------------------------------------------------------------------------
    def steps(self):
        """(name, cap seconds, once per machine, step), in STEP_NAMES order."""
        specs = {"install": (120, True, self.step_install), "restore": (60, True, self.step_restore),
                 "data": (60, True, self.step_data), "check": (180, False, self.step_check),
                 "shape-cost": (300 if self.gpu else 150, False, self.step_shape_cost),
                 "bench-train": (300 if self.gpu else 150, False, self.step_bench_train),
                 "train": (0, False, self.step_train),
                 "bench-decode": (240 if self.gpu else 60, False, self.step_bench_decode)}
        return [(name, *specs[name]) for name in STEP_NAMES]

    def main(self) -> int:
        self.log(f"campaign slice {self.slice} on {'a fresh' if self.fresh else 'the same'} machine, home {self.home}, "
                 f"device {self.args.device}{', rehearsal' if self.args.rehearse else ''}, "
                 f"{self.left():.0f} s in this slice")
        self.state["slices"].append({"slice": self.slice, "fresh": self.fresh, "started": time.time()})
        reserve = self.args.wrapup_seconds
        for name, cap, per_machine, fn in self.steps():
            record = self.state["steps"].get(name, {})
            if not per_machine and record.get("status") in ("done", "failed", "timeout", "skipped"):
                continue
            if name in self.args.skip:
                self.state["steps"][name] = {"status": "skipped", "seconds": 0.0, "slice": self.slice}
                self.log(f"step {name}: skipped (--skip)")
                continue
            budget = self.left() - reserve
            if budget < 5:
                self.log(f"{name}: deferred to the next slice ({budget:.0f} s left before wrap-up)")
                continue
            start = time.monotonic()
            try:
                status = fn(min(cap * self.args.cap_scale, budget) if cap else budget)
            except Exception as exc:  # noqa: BLE001 - a failed step costs only itself
                status = "failed"
                self.log(f"{name}: {type(exc).__name__}: {exc}")
            if status is None:
                continue
            self.state["steps"][name] = {"status": status, "seconds": round(time.monotonic() - start, 1),
                                         "slice": self.slice}
            self.log(f"step {name}: {status} ({time.monotonic() - start:.1f} s)")
            self.save()
        self.wrap_up()
        return 0

    def step_install(self, cap: float) -> str | None:
        if (self.site / "hmer").is_dir():
            return None  # installed on this machine in an earlier slice
        wheels = sorted(glob.glob(str(Path(self.args.wheels) / "*.whl")))
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--no-cache-dir", "--upgrade", "--target", str(self.site)]
        if wheels:
            rc, _, _ = self.run([*pip, *wheels], cap / 3)
            if rc != 0:
                return "failed"
        else:
            self.log(f"no wheels in {self.args.wheels}: the environment's own mlflow, optuna, editdistance are used")
        # The project from a copy of its sources, so that the build leaves nothing in the checkout.
        src = self.home / "project-src"
        shutil.rmtree(src, ignore_errors=True)
        shutil.copytree(REPO / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(REPO / name, src / name)
        rc, _, _ = self.run([*pip, "--no-build-isolation", str(src)], cap / 3)
        if rc != 0:
            shutil.rmtree(self.site / "hmer", ignore_errors=True)  # steps then fall back to src/
            return "failed"
        rc, _, _ = self.run([sys.executable, "-c", "import hmer, mlflow, optuna, editdistance, torch; "
                             "print('hmer from', hmer.__file__); print('mlflow', mlflow.__version__, 'optuna', "
                             "optuna.__version__, 'torch', torch.__version__)"], cap / 3)
        return "done" if rc == 0 else "failed"

    def step_restore(self, cap: float) -> str | None:
        if not self.fresh or self.slice <= 1:
            return None
        resume = Path(self.args.resume_from)
        if not (resume.is_file() or glob.glob(f"{resume}.part-*")):
            self.log(f"fresh machine and no resumable copy at {resume}: starting over")
            return "skipped"
        this_slice = (self.home / "campaign.log").read_text()
        rc, _, _ = self.internal("_restore", cap, "--resume-from", str(resume))
        with (self.home / "campaign.log").open("a") as f:  # the restored log, then this slice's lines
            f.write(this_slice)
        current = self.state
        self.state = self._load_state()
        self.state["slices"].append(current["slices"][-1])
        self.state["steps"]["install"] = current["steps"].get("install", {})
        return "done" if rc == 0 else "failed"

    def step_data(self, cap: float) -> str | None:
        src = Path(self.args.data)
        if not src.exists():
            self.log(f"no data at {src}")
            return "failed"
        dest = self.data_path()
        if dest.exists():
            return None
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dest, dirs_exist_ok=True)
        else:
            shutil.copyfile(src, dest)
        self.log(f"data: {src} -> {dest}")
        return "done"

    def data_path(self) -> Path:
        src = Path(self.args.data)
        return self.home / "data" / (src.name if src.suffix == ".zip" else "crohme")

    def step_check(self, cap: float) -> str:
        families = GPU_FAMILIES if self.gpu else REHEARSAL_FAMILIES
        rc, _, _ = self.internal("_check", cap, positional=tuple(families))
        return "done" if rc == 0 else ("timeout" if rc is None else "failed")

    # ---- issue 47: the per-shape cost diagnostic (tools/gpu_shape_cost.py), old and new side by side ----
    def step_shape_cost(self, cap: float) -> str:
        """tools/gpu_shape_cost.py under the step's cap: its log goes to the campaign log, its
        shape_cost.json to $OUT (its profiler tables stay in <home>/shape-cost: $OUT holds 8 files)."""
        folder = self.home / "shape-cost"
        cmd = [sys.executable, str(REPO / "tools" / "gpu_shape_cost.py"), "--device", self.args.device,
               "--out", str(folder), "--budget", str(max(cap - 30, 10))]
        if not self.gpu:
            cmd += ["--preset", "tiny", "--smoke"]
        rc, _, _ = self.run(cmd, cap)
        if (folder / "shape_cost.json").is_file():
            shutil.copyfile(folder / "shape_cost.json", self.out / "shape_cost.json")
        return "done" if rc == 0 else ("timeout" if rc is None else "failed")

    def step_bench_train(self, cap: float) -> str:
        end = time.monotonic() + cap
        figures = GPU_TRAIN_FIGURES if self.gpu else REHEARSAL_TRAIN_FIGURES
        for preset, setting, sets, fig_cap, timed in figures:
            left = end - time.monotonic()
            row = {"what": "train", "preset": preset, "setting": setting, "overrides": sets}
            if left < 5:
                row["status"] = "not run (step cap)"
                self.state["bench"].append(row)
                continue
            cmd = self.hmer("bench", "train", "--preset", preset, "--device", self.args.device,
                            "--data", str(self.data_path()), "--images", "100000" if self.gpu else "16",
                            "--seconds", str(timed), "--set", *sets)
            rc, out, seconds = self.run(cmd, min(fig_cap * (self.args.cap_scale if fig_cap > 2 else 1), left))
            row.update(parse_figures(out), command=" ".join(cmd[len(self.hmer()):]), seconds=round(seconds, 1),
                       status="done" if rc == 0 else ("timeout" if rc is None else f"failed (exit {rc})"))
            self.state["bench"].append(row)
            self.save()
        return "done"

    def hmer(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "hmer.cli", *args]

    def step_train(self, cap: float) -> str | None:
        tr = self.state["train"]
        if tr.get("finished"):
            return None
        ckpts = sorted(glob.glob(str(self.home / "mlruns" / "checkpoints" / "*" / "last.pt")), key=os.path.getmtime)
        preset = self.args.train_preset
        if ckpts:
            cmd = self.hmer("train", "--resume", ckpts[-1], "--experiment", EXPERIMENT, "--no-progress")
        else:
            if tr.get("started"):
                self.log("train: the earlier attempt left no checkpoint (it died in its first epoch): starting anew")
            # Large batches: the fastest first pass measured (80 img/s for bttr on the fourth lease's
            # H200, against 61 padded to 64 px and 7.7 with the reference batches).
            sets = LARGE if self.gpu else REHEARSAL_TRAIN_SET
            cmd = self.hmer("train", "--preset", preset, "--device", self.args.device, "--data", str(self.data_path()),
                            "--time-budget", str(self.args.train_budget), "--experiment", EXPERIMENT,
                            "--run-name", f"campaign-{preset}", "--no-progress", "--set", *sets)
        done_s = self._trained_seconds()
        remaining = max(self.args.train_budget - done_s, 0.0)
        eval_reserve = self.args.eval_seconds
        # Stop early enough that a run never gets killed in its final evaluation: either the rest of the
        # budget and the evaluation fit this slice, or training stops an evaluation's time before its end.
        run_for = cap if remaining + eval_reserve <= cap else cap - eval_reserve
        if run_for < (30 if self.gpu else 5):
            self.log(f"train: {cap:.0f} s left in this slice is too little; deferred")
            return None
        tr["started"] = True
        self.save()
        if self.args.epochs_per_slice:  # the rehearsal's stand-in for running out of slice, deterministic
            cmd += ["--pause-after-epochs", str(self.args.epochs_per_slice)]
        rc, out, _ = self.run(cmd, run_for)
        match = re.search(r"^run ([0-9a-f]{32}): ", out, re.M)
        if match:
            tr["run_id"] = match.group(1)
        elif glob.glob(str(self.home / "mlruns" / "checkpoints" / "*" / "last.pt")):
            tr["run_id"] = Path(sorted(glob.glob(str(self.home / "mlruns" / "checkpoints" / "*" / "last.pt")),
                                       key=os.path.getmtime)[-1]).parent.name
        tr.setdefault("slices", []).append(self.slice)
        if rc == 0 and match:
            tr["finished"] = True
            shutil.rmtree(self.home / "mlruns" / "checkpoints" / match.group(1), ignore_errors=True)
            self.save()
            return "done"
        self.save()
        self.log(f"train: unfinished after slice {self.slice} (run {tr.get('run_id')}); the next slice resumes it")
        return None

    def _trained_seconds(self) -> float:
        info = self.home / "train-seconds.json"  # written by _wrapup from the checkpoint
        return float(json.loads(info.read_text()).get("train_seconds", 0.0)) if info.is_file() else 0.0

    def step_bench_decode(self, cap: float) -> str | None:
        tr = self.state["train"]
        if not tr.get("finished"):
            return None
        sets = [f"bench.weights={tr['run_id']}", "bench.check_unbatched=" + ("64" if self.gpu else "2")]
        if not self.gpu:
            sets += ["train.beam_size=2", "train.max_decode_len=12", "data.eval_max_batch_size=4"]
        cmd = self.hmer("bench", "decode", "--preset", self.args.train_preset, "--device", self.args.device,
                        "--data", str(self.data_path()), "--images", "100000" if self.gpu else "4", "--set", *sets)
        rc, out, seconds = self.run(cmd, cap)
        self.state["bench"].append({
            "what": "decode", "preset": self.args.train_preset, "setting": f"trained weights ({tr['run_id'][:8]})",
            "overrides": sets, **parse_figures(out), "command": " ".join(cmd[len(self.hmer()):]),
            "seconds": round(seconds, 1),
            "status": "done" if rc == 0 else ("timeout" if rc is None else f"failed (exit {rc})")})
        return "done" if rc == 0 else ("timeout" if rc is None else "failed")

    def wrap_up(self) -> None:
        self.save()
        rc, _, _ = self.internal("_wrapup", max(self.left(), 30))
        if rc != 0:
            self.log("wrap-up failed: the log, bench.md and status.json still go to $OUT")
        self.state = self._load_state()
        (self.out / "bench.md").write_text(bench_markdown(self.state["bench"], self.args))
        status = {"slice": self.slice, "steps": self.state["steps"], "train": self.state["train"],
                  "files": sorted(p.name for p in self.out.iterdir())}
        (self.out / "status.json").write_text(json.dumps(status, indent=1))
        self.log(f"slice {self.slice} done in {time.monotonic() - self.t0:.0f} s; $OUT: "
                 + ", ".join(sorted(p.name for p in self.out.iterdir())))
        shutil.copyfile(self.home / "campaign.log", self.out / f"campaign-slice{self.slice}.log")


def _signal(proc, sig) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


_FIGURE = re.compile(r"(\w+)=([-\w./]+)")


def parse_figures(output: str) -> dict:
    """The `key=value` figures that `hmer bench` prints (numbers as numbers)."""
    found: dict = {}
    for line in output.splitlines():
        for key, value in _FIGURE.findall(line):
            try:
                found[key] = float(value)
            except ValueError:
                found[key] = value
    return found


BENCH_COLUMNS = [("what", "what"), ("preset", "preset"), ("setting", "setting"), ("status", "status"),
                 ("images_per_second", "img/s"), ("peak_memory_mb", "peak MB"), ("padding_share", "padding"),
                 ("shapes", "shapes"), ("data_wait_share", "data wait"), ("epoch_seconds_8835", "epoch s"),
                 ("year_seconds_2014", "2014 year s"), ("mean_hyp_tokens", "hyp tokens"),
                 ("unbatched_match", "unbatched match")]


def bench_markdown(rows: list[dict], args) -> str:
    lines = [f"# GPU campaign benchmarks ({'rehearsal on ' if args.rehearse else ''}{args.device})", "",
             "| " + " | ".join(h for _, h in BENCH_COLUMNS) + " |", "|" + "---|" * len(BENCH_COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(k, "")) for k, _ in BENCH_COLUMNS) + " |")
    lines += ["", "Commands (`hmer ...`, run in this order, the device and data as above):", ""]
    lines += [f"- {r['preset']} {r['setting']}: `hmer {r['command']}`" for r in rows if r.get("command")]
    return "\n".join(lines) + "\n"


# ---- internal steps: run in a subprocess where torch and hmer import ------------------------------

def internal_check(args) -> int:
    import io

    import torch

    from hmer.bench import run_benchmark

    print(f"torch {torch.__version__}; cuda available: {torch.cuda.is_available()}")
    if args.device != "cpu":
        if not torch.cuda.is_available():
            print("no CUDA device: nothing else to check")
            return 1
        print(f"device: {torch.cuda.get_device_name(0)}; bf16 supported: {torch.cuda.is_bf16_supported()}")
        print(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip())
    failed = 0
    for preset in args.rest:
        buf = io.StringIO()
        t0 = time.monotonic()
        try:
            # One training step (bf16 on a GPU), synthetic batch: every family builds, runs and steps.
            run_benchmark("train", preset=preset, device=args.device, images=1,
                          overrides=["bench.pool=16", "bench.warmup=0"], out=buf)
            fig = parse_figures(buf.getvalue())
            print(f"one training step of {preset}: ok, {time.monotonic() - t0:.1f} s, "
                  f"precision {fig.get('precision')}, peak {fig.get('peak_memory_mb')} MB")
        except Exception as exc:  # noqa: BLE001 - report every family, not the first failure
            failed += 1
            print(f"one training step of {preset}: FAILED {type(exc).__name__}: {exc}")
    return 1 if failed else 0


def internal_wrapup(args) -> int:
    """Bench figures as MLflow runs, tidy tags, export the store, pack the resumable copy."""
    from mlflow.entities import Metric, Param, RunTag

    from hmer.tracking.store import default_tracking_uri, git_commit, mlflow_client
    from hmer.tracking.transfer import ensure_experiment, export_runs, split_file

    home, out = Path(args.home), Path(args.out)
    state = json.loads((home / "state.json").read_text())
    uri = default_tracking_uri()
    client = mlflow_client(uri)
    commit = os.environ.get("HMER_GIT_COMMIT") or git_commit()
    device = _device_name(args.device)
    new_rows = [r for r in state["bench"] if not r.get("mlflow_run") and r.get("status") == "done"]
    if new_rows:
        exp = ensure_experiment(client, BENCH_EXPERIMENT, {})
        for r in new_rows:
            run = client.create_run(exp, run_name=f"{r['what']} {r['preset']} {r['setting']}", tags={
                "hmer.role": "benchmark", "hmer.device": device, "hmer.git_commit": commit,
                "hmer.variant": r["preset"], "hmer.command": r.get("command", "")})
            params = [Param("what", r["what"]), Param("preset", r["preset"]), Param("setting", r["setting"]),
                      Param("overrides", " ".join(r.get("overrides", [])) or "-")]
            now = int(time.time() * 1000)
            metrics = [Metric(k, float(v), now, 0) for k, v in r.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)]
            client.log_batch(run.info.run_id, metrics=metrics, params=params)
            client.set_terminated(run.info.run_id)
            r["mlflow_run"] = run.info.run_id
    run_id = state["train"].get("run_id")
    if run_id:
        run = client.get_run(run_id)
        tags = []
        if run.data.tags.get("hmer.git_commit", "unknown").startswith("unknown") and commit:
            tags.append(RunTag("hmer.git_commit", commit))
        tags.append(RunTag("hmer.campaign_slices", ",".join(map(str, state["train"].get("slices", [])))))
        client.log_batch(run_id, tags=tags)
        if state["train"].get("finished") and run.data.tags.get("hmer.error", "").startswith("KeyboardInterrupt"):
            client.delete_tag(run_id, "hmer.error")  # the planned stop at a slice's end, not a failure
    (home / "state.json").write_text(json.dumps(state, indent=1))
    exp_file = out / f"runs-slice{args.slice}.tar.gz"
    res = export_runs(exp_file, tracking_uri=uri, part_mb=PART_MB)
    print(f"exported {res.runs} runs: {', '.join(f.name for f in res.files)}")
    pack = _pack_resume(home, out / "resume.tar")
    for f in split_file(pack, PART_MB * 2**20):
        print(f"resumable copy: {f.name} ({f.stat().st_size / 2**20:.1f} MiB)")
    return 0


def _device_name(device: str) -> str:
    import platform

    import torch

    if device != "cpu" and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _pack_resume(home: Path, target: Path) -> Path:
    """state, log, MLflow store (files <= 1 MiB: no model weights), and the last checkpoint of an
    unfinished run as fp16 weights without optimiser state."""
    import io

    import torch

    for old in target.parent.glob(target.name + "*"):
        old.unlink()
    ckpt_files = sorted((home / "mlruns" / "checkpoints").glob("*/last.pt"))
    loaded = {p: torch.load(p, map_location="cpu", weights_only=True) for p in ckpt_files}
    # How much of the training budget is spent: the driver reads it without loading torch.
    seconds = max([float(c.get("train_seconds", 0.0)) for c in loaded.values()], default=0.0)
    (home / "train-seconds.json").write_text(json.dumps({"train_seconds": seconds}))
    with tarfile.open(target, "w") as tar:
        for name in ("state.json", "campaign.log", "train-seconds.json"):
            if (home / name).is_file():
                tar.add(home / name, arcname=name)
        db = home / "mlruns" / "mlflow.db"
        if db.is_file():
            copy = home / "mlflow-copy.db"
            with sqlite3.connect(db) as src, sqlite3.connect(copy) as dst:
                src.backup(dst)  # a consistent copy even if a writer were still there
            tar.add(copy, arcname="mlruns/mlflow.db")
            copy.unlink()
        for f in sorted((home / "mlruns" / "artifacts").rglob("*")) if (home / "mlruns" / "artifacts").is_dir() else []:
            if f.is_file() and f.stat().st_size <= 2**20:
                tar.add(f, arcname=str(f.relative_to(home)))
        for ckpt_path in ckpt_files:
            ckpt = loaded[ckpt_path]
            ckpt["model"] = {k: v.half() if v.is_floating_point() else v for k, v in ckpt["model"].items()}
            ckpt["optimizer"] = {"state": {}, "param_groups": ckpt["optimizer"]["param_groups"]}
            best = ckpt_path.parent / "best.pt"
            ckpt["resume_pack"] = {"best_is_last": False, "vocab": None}
            if best.is_file():
                b = torch.load(best, map_location="cpu", weights_only=True)
                ckpt["resume_pack"] = {"best_is_last": int(b.get("epoch", -1)) == int(ckpt["epoch"]),
                                       "vocab": b.get("vocab")}
            buf = io.BytesIO()
            torch.save(ckpt, buf)
            info = tarfile.TarInfo(f"resume/{ckpt_path.parent.name}.pt")
            info.size = buf.tell()
            buf.seek(0)
            tar.addfile(info, buf)
    return target


def internal_restore(args) -> int:
    """A fresh machine: unpack the resumable copy into <home> and rebuild the checkpoint files."""
    import torch

    from hmer.tracking.transfer import resolve_parts

    home = Path(args.home)
    parts = resolve_parts(args.resume_from)
    joined = home / "resume-joined.tar"
    with joined.open("wb") as dst:
        for p in parts:
            dst.write(p.read_bytes())
    with tarfile.open(joined) as tar:
        tar.extractall(home, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(home)
    joined.unlink()
    for pack in sorted((home / "resume").glob("*.pt")):
        ckpt = torch.load(pack, map_location="cpu", weights_only=True)
        extra = ckpt.pop("resume_pack")
        ckpt["model"] = {k: v.float() if v.is_floating_point() else v for k, v in ckpt["model"].items()}
        folder = home / "mlruns" / "checkpoints" / pack.stem
        folder.mkdir(parents=True, exist_ok=True)
        if extra["best_is_last"] and extra["vocab"]:
            torch.save({"format": 1, "model": ckpt["model"], "config": ckpt["config"], "vocab": extra["vocab"],
                        "epoch": ckpt["epoch"], "val_exprate": ckpt["best_val_exprate"]}, folder / "best.pt")
        else:  # the best weights did not travel: the next validated epoch becomes the best
            ckpt["best_val_exprate"] = -1.0
        torch.save(ckpt, folder / "last.pt")
        from hmer.tracking import keys
        from hmer.tracking.store import mlflow_client

        mlflow_client().set_tag(pack.stem, keys.WARM_RESTART, str(ckpt["epoch"]))
        print(f"restored run {pack.stem} at epoch {ckpt['epoch']} (fp16 weights, optimiser state restarted)")
        pack.unlink()
    return 0


# ---- before the lease, on the session machine -------------------------------------------------------

def pack_data(src: str, out: str) -> int:
    """The dataset as 1-bit PNGs in the `data/<split>/` layout: the same pixels as the rendered InkML
    (the default renderings are binary) in about 9 MB instead of 32 MB, so that it travels beside the
    wheels and a resumable copy within a device call's 64 MiB, and nothing is rendered on the GPU machine."""
    import io
    import zipfile

    import numpy as np
    from PIL import Image

    from hmer.data.commands import (CAPTION_FILE, RENDERED_TOP_FOLDER, files_for_captions, load_images,
                                    open_source, parse_captions)
    from hmer.data.render import RenderConfig

    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    with open_source(src) as source, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as archive:
        for split in source.split_names():
            captions = parse_captions(source.caption_text(split), source.describe(split, CAPTION_FILE))
            files = files_for_captions(source, split, captions)
            loaded = load_images(source, split, [c.name for c in captions], files, RenderConfig())
            kept = [c for c in captions if c.name in loaded.images]
            folder = f"{RENDERED_TOP_FOLDER}/{split}"
            archive.writestr(f"{folder}/{CAPTION_FILE}", "".join(f"{c.name}\t{' '.join(c.tokens)}\n" for c in kept))
            for c in kept:
                image = loaded.images[c.name]
                if not np.isin(image, (0, 255)).all():
                    raise ValueError(f"{split}/{c.name}: not a binary image; pack-data keeps 1-bit pixels only")
                buf = io.BytesIO()
                Image.fromarray(image > 127).save(buf, "PNG", optimize=True)
                archive.writestr(f"{folder}/{c.name}.png", buf.getvalue())
            print(f"{split}: {len(kept)} images")
    os.replace(tmp, target)
    print(f"wrote {target} ({target.stat().st_size / 2**20:.1f} MiB)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("internal", nargs="?", default=None,
                   help="pack-data SRC OUT (before the lease); _check/_wrapup/_restore are the campaign's own")
    p.add_argument("rest", nargs="*")
    p.add_argument("--slice", type=int, default=1)
    p.add_argument("--device", default="cuda", help="cuda (the lease) or cpu (the rehearsal)")
    p.add_argument("--rehearse", action="store_true", help="tiny presets, seconds per step")
    p.add_argument("--out", default=os.environ.get("OUT", "gpu-out"), help="default: $OUT")
    p.add_argument("--home", default="/tmp/hmer-campaign", help="state on the machine's local disk")
    p.add_argument("--data", default=".gpu/crohme.zip", help="the packed data (pack-data), or any dataset")
    p.add_argument("--wheels", default=".whl")
    p.add_argument("--resume-from", default=".gpu/resume.tar", help="the resumable copy from the last slice")
    p.add_argument("--slice-seconds", type=float, default=540.0)
    p.add_argument("--wrapup-seconds", type=float, default=60.0, help="kept free at the end of a slice")
    p.add_argument("--skip", action="append", default=[], metavar="STEP",
                   choices=STEP_NAMES,
                   help="leave a step out of this lease, e.g. bench-train once its figures are measured (repeatable)")
    p.add_argument("--train-preset", default="comer-fusion")
    p.add_argument("--train-budget", type=float, default=720.0,
                   help="training seconds in all (hmer train --time-budget)")
    p.add_argument("--eval-seconds", type=float, default=240.0, help="reserved for the three test years")
    p.add_argument("--cap-scale", type=float, default=1.0,
                   help="multiply every step's cap (a rehearsal on a machine shared with other jobs)")
    p.add_argument("--epochs-per-slice", type=int, default=0,
                   help="rehearsal: interrupt training after this many epochs in a slice (0: by time only)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.internal == "pack-data":
        return pack_data(*args.rest)
    if args.internal:
        return {"_check": internal_check, "_wrapup": internal_wrapup, "_restore": internal_restore}[args.internal](args)
    for name in ("data", "wheels", "resume_from"):  # relative to the repository root, where device commands run
        value = Path(getattr(args, name))
        setattr(args, name, str(value if value.is_absolute() else REPO / value))
    if args.rehearse:
        args.train_preset = "tiny" if args.train_preset == "comer-fusion" else args.train_preset
    return Campaign(args).main()


if __name__ == "__main__":
    sys.exit(main())
