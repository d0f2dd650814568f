"""The GPU campaign: one command per lease that continues the campaign's training run, times what it
is asked to, and brings everything back; and the two commands around it on the session's machine.

    python tools/gpu_campaign.py prepare             # before: .gpu/ (data, the carried run), sizes, the call
    run(command="python3 tools/gpu_campaign.py lease", carry=[".whl", ".gpu"], timeout_s=600)   # the lease
    python tools/gpu_campaign.py home <files_at>      # after: the runs merged into the store, the run kept
    python tools/gpu_campaign.py lease --device cpu --rehearse --out /tmp/out   # the CI rehearsal

docs/benchmarks.md section 5 walks through a lease: the exact calls, the git commands that keep the
committed store out of the call, and what to commit afterwards.

ONE RUN ACROSS LEASES. The campaign trains one run, `comer-fusion` (CoMER's best coverage variant),
across as many leases as it takes. Each lease carries the run in (`.gpu/carried.tar.gz`: the run's
MLflow record with its whole history, and its last checkpoint, fp32 weights without the optimiser's
state; `hmer.training.carry`), continues it until a pause leaves time to bring it back, and returns
it (`carried.tar.gz`, in pieces of 15 MiB) with an export of every run of the lease (`runs.tar.gz`).
`home` checks everything that came back (status.json, each file it lists at the size it left with,
every archive read to its end) and only then merges the export into the store, all of it or none
(the run keeps its first id as `hmer.source_run_id`: one run, one curve; run again after a failure,
it finishes the merge without duplicating a run) and keeps the carried file at
`mlruns/carried/gpu-campaign.tar.gz`, committed: the only thing that outlives a session, and the
smallest that continues the run (about 25 MB for 6.4 M parameters; the optimiser's momentum, as much
again, would not fit the call beside the wheels and the data). Each lease's optimiser restart is
tagged on the run (`hmer.warm_restart`); what it costs the curve is measured on the CPU in
docs/benchmarks.md section 5. When the run's epochs are done, the lease that finishes them decodes
2014, 2016, 2019 and the standard 2014 images (the trainer's own final evaluation, beam 10 with
joint search), then times decoding with the trained weights.

THE PLAN OF A LEASE (each step, its cap and its settings) is tools/gpu_campaign_plan.py's: 15 minutes
of device time, a machine start (1-2 min) and the transfers, then one command under the tool's 600 s;
the lease takes 560 s of it (--lease-seconds), of which 60 s are kept for the wrap-up.

$OUT: lease.log, status.json, bench.md, runs.tar.gz (or .part-NNN), carried.tar.gz.part-NNN (while
the run is unfinished): at most 8 files of 16 MiB (checked; tools/lease.py).

The driver uses the standard library only, so it runs before anything is installed; the steps that
need torch and the project run as subprocesses (`hmer ...`, or `tools/gpu_campaign_steps.py`).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import shutil
import sys
import time
from pathlib import Path

from gpu_campaign_plan import (CAPS, CARRIED, EXPERIMENT, GPU_TRAIN_FIGURES, GPU_TRIALS, KEEP, OPTIONAL,
                               REHEARSAL_CAPS, REHEARSAL_TRAIN_FIGURES, REHEARSAL_TRAIN_SET, REHEARSAL_TRIALS,
                               STANDARD_2014, STEP_NAMES, STOP_MARGIN_S, TRAIN_PRESET, TRAIN_SET)
from gpu_campaign_bench import bench_markdown, parse_figures
from lease import Lease, Step

REPO = Path(__file__).resolve().parents[1]
STEPS_SCRIPT = Path(__file__).resolve().parent / "gpu_campaign_steps.py"


class Campaign:
    """One lease of the campaign: the steps of STEP_NAMES that it runs, and what they record."""

    def __init__(self, args):
        self.args = args
        self.gpu = args.device != "cpu"
        self.home = Path(args.home).resolve()
        self.lease = Lease(self.home, Path(args.out), args.lease_seconds, args.wrapup_seconds, args.cap_scale)
        self.site = self.home / "site"
        self.record = {"bench": [], "train": {}}  # what the wrap-up records (<home>/campaign.json)

    # ---- the environment of the steps ---------------------------------------------------------
    def env(self) -> dict:
        env = dict(os.environ)
        paths = [str(self.site)] if (self.site / "hmer").is_dir() else [str(REPO / "src")]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env.update(PYTHONPATH=os.pathsep.join(paths), PYTHONUNBUFFERED="1", HMER_MLRUNS=str(self.home / "mlruns"),
                   HMER_CACHE=str(self.home / "cache"))
        env.pop("MLFLOW_TRACKING_URI", None)
        return env

    def run(self, cmd: list[str], cap: float):
        return self.lease.run(cmd, cap, env=self.env(), cwd=REPO)

    def hmer(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "hmer.cli", *args]

    def inside(self, step: str, *args: str) -> list[str]:
        """A step that runs in the project's environment (tools/gpu_campaign_steps.py)."""
        return [sys.executable, str(STEPS_SCRIPT), step, *args]

    def data_path(self) -> Path:
        src = Path(self.args.data)
        return self.home / "data" / (src.name if src.suffix == ".zip" else "crohme")

    def save(self) -> None:
        (self.home / "campaign.json").write_text(json.dumps(self.record, indent=1))

    # ---- the lease ---------------------------------------------------------------------------------
    def main(self) -> int:
        a = self.args
        self.lease.log(f"campaign lease on {a.device}{' (rehearsal)' if a.rehearse else ''}, home {self.home}, "
                       f"{self.lease.left():.0f} s before the wrap-up")
        caps = REHEARSAL_CAPS if a.rehearse else CAPS
        steps = []
        for name in STEP_NAMES:
            if name in a.skip:
                self.lease.skipped(name, "--skip")
            elif name in OPTIONAL and name not in a.with_:
                continue
            else:
                steps.append(Step(name, caps[name], getattr(self, "step_" + name.replace("-", "_"))))
        self.lease.run_steps(steps)
        self.save()
        status = self.lease.finish(Step("wrap-up", 0, self.step_wrapup),
                                   {"train": self.record["train"], "device": a.device, "rehearse": a.rehearse})
        return 0 if not status["out_problems"] else 1

    def step_install(self, cap: float) -> str | None:
        if (self.site / "hmer").is_dir():
            return None  # installed by an earlier command on this machine
        wheels = sorted(glob.glob(str(Path(self.args.wheels) / "*.whl")))
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--no-cache-dir", "--upgrade", "--target", str(self.site)]
        if wheels:
            rc, _, _ = self.run([*pip, *wheels], cap / 3)
            if rc != 0:
                return "failed"
        else:
            self.lease.log(f"no wheels in {self.args.wheels}: the environment's own mlflow, optuna, editdistance")
        # The project from a copy of its sources, so that the build leaves nothing in the checkout.
        src = self.home / "project-src"
        shutil.rmtree(src, ignore_errors=True)
        shutil.copytree(REPO / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(REPO / name, src / name)
        rc, _, _ = self.run([*pip, "--no-build-isolation", str(src)], cap / 3)
        if rc != 0:
            shutil.rmtree(self.site / "hmer", ignore_errors=True)  # the steps then run from src/
            return "failed"
        rc, _, _ = self.run([sys.executable, "-c", "import hmer, mlflow, optuna, editdistance, torch; "
                             "print('hmer from', hmer.__file__); print('mlflow', mlflow.__version__, 'optuna', "
                             "optuna.__version__, 'torch', torch.__version__)"], cap / 3)
        return "done" if rc == 0 else "failed"

    def step_data(self, cap: float) -> str | None:
        src, dest = Path(self.args.data), self.data_path()
        if not src.exists():
            self.lease.log(f"no data at {src} (`prepare` packs it)")
            return "failed"
        if dest.exists():
            return None
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dest) if src.is_dir() else shutil.copyfile(src, dest)
        self.lease.log(f"data: {src} -> {dest}")
        standard, there = src.parent / STANDARD_2014, REPO.parent / "shared" / "crohme" / STANDARD_2014
        if standard.is_file() and not there.exists():
            there.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(standard, there)
            self.lease.log(f"standard 2014 images: {standard} -> {there}")
        return "done"

    def step_check(self, cap: float) -> str:
        rc, _, _ = self.run(self.inside("check", "--device", self.args.device, "--preset", self.train_preset(),
                                        "--share", "8"), cap)
        return "done" if rc == 0 else ("timeout" if rc is None else "failed")

    def step_carry_in(self, cap: float) -> str | None:
        carried = Path(self.args.carried)
        if not (carried.is_file() or glob.glob(f"{carried}.part-*")):
            self.lease.log(f"no carried run at {carried}: this lease starts the campaign's run")
            return None
        rc, out, _ = self.run(self.inside("carry-in", str(carried), "--data", str(self.data_path())), cap)
        match = re.search(r"^carried run ([0-9a-f]{32}) ", out, re.M)
        if rc == 0 and match:
            self.record["train"]["carried_in"] = match.group(1)
            return "done"
        return "failed"

    def train_preset(self) -> str:
        return "tiny-transformer" if self.args.rehearse else self.args.train_preset

    def checkpoint(self) -> Path | None:
        found = sorted(glob.glob(str(self.home / "mlruns" / "checkpoints" / "*" / "last.pt")), key=os.path.getmtime)
        return Path(found[-1]) if found else None

    def step_train(self, cap: float) -> str:
        a, tr = self.args, self.record["train"]
        window, final = max(int(cap - STOP_MARGIN_S), 1), math.ceil(a.eval_seconds)
        if window <= final:  # (`hmer train` refuses a window that the test years alone fill)
            self.lease.log(f"{window} s left to train, not more than the test years take (--eval-seconds "
                           f"{final}): the run waits for the next lease")
            return "not run (no time left)"
        pause = ["--pause-within", str(window), "--final-seconds", str(final)]
        if a.epochs_per_lease:  # the rehearsal's stand-in for a lease's end: deterministic
            pause += ["--pause-after-epochs", str(a.epochs_per_lease)]
        ckpt = self.checkpoint()
        if ckpt is not None:
            cmd = self.hmer("train", "--resume", str(ckpt), "--experiment", EXPERIMENT, "--no-progress", *pause)
        else:
            sets = REHEARSAL_TRAIN_SET if a.rehearse else [*TRAIN_SET, *a.train_set]
            cmd = self.hmer("train", "--preset", self.train_preset(), "--device", a.device, "--data",
                            str(self.data_path()), "--experiment", EXPERIMENT, "--run-name",
                            f"campaign-{self.train_preset()}", "--no-progress", *pause, "--set", *sets)
        rc, out, seconds = self.run(cmd, cap)
        ran = re.search(r"^(?:paused )?run ([0-9a-f]{32})", out, re.M)
        ckpt = self.checkpoint()
        tr["run_id"] = ran.group(1) if ran else (ckpt.parent.name if ckpt else None)
        epochs = [int(e) for e in re.findall(r"^epoch (\d+)/\d+ ", out, re.M)]
        tr.update(seconds=round(seconds, 1), epochs_this_lease=epochs, finished=rc == 0)
        self.save()
        if rc == 0:
            return "done"
        return {3: "paused", None: "stopped at its cap"}.get(rc, f"failed (exit {rc})")

    def step_shape_cost(self, cap: float) -> str:
        """tools/gpu_shape_cost.py under the step's cap; its shape_cost.json to $OUT (its profiler
        tables stay in <home>/shape-cost: $OUT holds 8 files)."""
        folder = self.home / "shape-cost"
        cmd = [sys.executable, str(REPO / "tools" / "gpu_shape_cost.py"), "--device", self.args.device,
               "--out", str(folder), "--budget", str(max(cap - 30, 10))]
        if not self.gpu:
            cmd += ["--preset", "tiny-transformer", "--smoke"]
        rc, _, _ = self.run(cmd, cap)
        if (folder / "shape_cost.json").is_file():
            shutil.copyfile(folder / "shape_cost.json", self.lease.out / "shape_cost.json")
        return _status(rc)

    def step_bench_train(self, cap: float) -> str:
        end = time.monotonic() + cap
        for preset, setting, sets, fig_cap, timed in (REHEARSAL_TRAIN_FIGURES if self.args.rehearse
                                                      else GPU_TRAIN_FIGURES):
            row = {"what": "train", "preset": preset, "setting": setting, "overrides": sets}
            left = end - time.monotonic()
            if left < 5:
                self.record["bench"].append({**row, "status": "not run (step cap)"})
                continue
            cmd = self.hmer("bench", "train", "--preset", preset, "--device", self.args.device, "--data",
                            str(self.data_path()), "--images", "100000" if self.gpu else "16",
                            "--seconds", str(timed), "--set", *sets)
            rc, out, seconds = self.run(cmd, min(fig_cap * (self.args.cap_scale if fig_cap > 2 else 1), left))
            self.record["bench"].append({**row, **parse_figures(out), "command": " ".join(cmd[len(self.hmer()):]),
                                         "seconds": round(seconds, 1), "status": _status(rc)})
            self.save()
        return "done"

    def step_bench_trials(self, cap: float) -> str:
        t = REHEARSAL_TRIALS if self.args.rehearse else GPU_TRIALS
        cmd = [sys.executable, str(REPO / "benchmarks" / "bench_concurrency.py"), "--device", self.args.device,
               "--preset", t["preset"], "--procs", t["procs"], "--seconds", str(t["seconds"]),
               "--setup-seconds", str(t["setup_seconds"]), "--data", str(self.data_path())]
        rc, out, seconds = self.run(cmd, cap)
        figures = parse_figures(out)
        n = t["procs"].split(",")[-1]
        self.record["bench"].append({
            "what": "trials", "preset": t["preset"], "setting": f"{n} trials side by side against 1",
            "overrides": [], "images_per_second": figures.get(f"total_images_per_second_{n}"),
            "one_trial_images_per_second": figures.get("total_images_per_second_1"),
            "scaling": figures.get(f"scaling_{n}"), "command": " ".join(cmd[1:]).replace(str(REPO) + "/", ""),
            "seconds": round(seconds, 1), "status": _status(rc)})
        self.save()
        return _status(rc)

    def step_bench_decode(self, cap: float) -> str | None:
        tr = self.record["train"]
        if not tr.get("finished"):
            return None
        sets = [f"bench.weights={tr['run_id']}", "bench.check_unbatched=" + ("64" if self.gpu else "2")]
        if self.args.rehearse:
            sets += ["train.beam_size=2", "train.max_decode_len=12", "data.eval_max_batch_size=4"]
        cmd = self.hmer("bench", "decode", "--preset", self.train_preset(), "--device", self.args.device,
                        "--data", str(self.data_path()), "--images", "100000" if self.gpu else "4", "--set", *sets)
        rc, out, seconds = self.run(cmd, cap)
        self.record["bench"].append({
            "what": "decode", "preset": self.train_preset(), "setting": f"trained weights ({tr['run_id'][:8]})",
            "overrides": sets, **parse_figures(out), "command": " ".join(cmd[len(self.hmer()):]),
            "seconds": round(seconds, 1), "status": _status(rc)})
        self.save()
        return _status(rc)

    def step_wrapup(self, cap: float) -> str:
        self.save()
        rc, _, _ = self.run(self.inside("wrap-up", "--home", str(self.home), "--out", str(self.lease.out),
                                        "--device", self.args.device), cap)
        self.record = json.loads((self.home / "campaign.json").read_text())  # with the bench rows' MLflow runs
        (self.lease.out / "bench.md").write_text(bench_markdown(self.record["bench"], self.args))
        return "done" if rc == 0 else "failed"


def _status(rc: int | None) -> str:
    return "done" if rc == 0 else ("timeout" if rc is None else f"failed (exit {rc})")


def _seconds(text: str) -> float:
    """A positive, finite number (of seconds, or a scale), for argparse: `nan`, `inf` and `-5` are
    refused with the flag named, before the lease starts."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive, finite number")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    le = sub.add_parser("lease", help="the device command: continue the campaign's run, time what --with asks")
    le.add_argument("--device", default="cuda", help="cuda (a lease) or cpu (the rehearsal)")
    le.add_argument("--rehearse", action="store_true", help="tiny presets, seconds a step")
    le.add_argument("--out", default=os.environ.get("OUT", "gpu-out"), help="default: $OUT")
    le.add_argument("--home", default="/tmp/hmer-campaign", help="the lease's store, checkpoints, installation")
    le.add_argument("--data", default=".gpu/crohme.zip", help="the packed data (`prepare`), or any dataset")
    le.add_argument("--wheels", default=".whl")
    le.add_argument("--carried", default=str(CARRIED), help="the carried run (`prepare` puts it there)")
    le.add_argument("--lease-seconds", type=_seconds, default=560.0, help="the command's whole time, wrap-up included")
    le.add_argument("--wrapup-seconds", type=_seconds, default=60.0, help="kept free for the wrap-up")
    le.add_argument("--with", dest="with_", action="append", default=[], metavar="STEP", choices=OPTIONAL,
                    help="also run an optional step (shape-cost, bench-train, bench-trials) before training "
                         "(repeatable)")
    le.add_argument("--skip", action="append", default=[], metavar="STEP", choices=STEP_NAMES,
                    help="leave a step out of this lease (repeatable)")
    le.add_argument("--train-preset", default=TRAIN_PRESET, help="the preset a fresh campaign run trains")
    le.add_argument("--train-set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="more overrides for a fresh campaign run (after TRAIN_SET), e.g. train.epochs=120")
    le.add_argument("--eval-seconds", type=_seconds, default=240.0,
                    help="what the test years take: the trainer pauses before a last epoch that leaves less")
    le.add_argument("--cap-scale", type=_seconds, default=1.0,
                    help="multiply every step's cap (a rehearsal on a machine shared with other jobs)")
    le.add_argument("--epochs-per-lease", type=int, default=0,
                    help="rehearsal: pause the run after this many epochs (0: by time only)")

    pr = sub.add_parser("prepare", help="before a lease: .gpu/ (packed data, the carried run), the call's size")
    pr.add_argument("--data", default=os.environ.get("HMER_DATA", str(REPO.parent / "shared" / "crohme" /
                                                                    "crohme-inkml.zip")), help="CROHME to pack")
    pr.add_argument("--gpu-dir", default=".gpu")
    pr.add_argument("--wheels", default=".whl")
    pr.add_argument("--keep", default=str(KEEP), help="the campaign's run between leases")

    ho = sub.add_parser("home", help="after a lease: merge its runs into the store, keep the carried run")
    ho.add_argument("files", metavar="FILES", help="the folder the lease's $OUT came back to")
    ho.add_argument("--keep", default=str(KEEP))
    ho.add_argument("--tracking-uri", default=None, help="default: the MLflow home ($HMER_MLRUNS, else mlruns/)")

    pd = sub.add_parser("pack-data", help="the dataset as 1-bit PNGs, about 9 MB (prepare does it)")
    pd.add_argument("src")
    pd.add_argument("out")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command != "lease":  # on the session's machine, where the project is installed
        import gpu_campaign_steps

        try:
            return {"prepare": gpu_campaign_steps.prepare, "home": gpu_campaign_steps.home,
                    "pack-data": gpu_campaign_steps.pack_data}[args.command](args)
        except (ValueError, FileNotFoundError, IsADirectoryError, PermissionError) as exc:
            # a file that is missing, cut short or not what it should be: one line, as `hmer` says it
            print(f"gpu_campaign.py {args.command}: error: {' '.join(str(exc).split())}", file=sys.stderr)
            return 2
    for name in ("data", "wheels", "carried"):  # relative to the repository root, where device commands run
        value = Path(getattr(args, name))
        setattr(args, name, str(value if value.is_absolute() else REPO / value))
    return Campaign(args).main()


if __name__ == "__main__":
    sys.exit(main())
