"""The GPU campaign's plan: what a lease runs, in which order, under which caps and with which
settings, and the names of what the campaign keeps. The driver (tools/gpu_campaign.py) runs it; its
steps that need the project (tools/gpu_campaign_steps.py) read the names from here too, so that
neither imports the other. Standard library only: the driver reads it before anything is installed.

THE PLAN OF A LEASE: 15 minutes of device time, a machine start (1-2 min) and the transfers, then
one command under the tool's 600 s; the lease takes 560 s of it (--lease-seconds), of which 60 s are
kept for the wrap-up. The durations of the four leases so far: install 14-18 s, the check 48-58 s
for six families (now one: the trained preset, and a check of the memory share of 8 processes).

    step          cap     what
    install       120 s   the wheels carried in .whl/ (../shared/device/fetch-wheels.sh) into <home>/site with
                          --no-index --no-deps, then the project itself; an import check
    data           60 s   the packed data (.gpu/crohme.zip, `prepare`) copied to <home>/data/
    check         120 s   CUDA, bf16, one training step of the trained preset; 8 processes' memory share
    carry-in       60 s   the carried run merged into <home>'s store, its checkpoint in place
    shape-cost    240 s   (only with --with shape-cost) tools/gpu_shape_cost.py: a new batch shape's cost, cold
                          against warm, with and without the 1x1 matmuls, the planning pass, the plan cache's
                          size, CUDA graphs (issue 47); shape_cost.json to $OUT. The first lease that has the
                          remedies runs it once
    bench-train   300 s   (only with --with bench-train) training images/s figures, GPU_TRAIN_FIGURES
    bench-trials  330 s   (only with --with bench-trials) 1 trial against 8 side by side on the GPU
    train         rest    the run continues (the first lease starts it: comer-fusion with TRAIN_SET), paused
                          after the last epoch that leaves time for the next, or for the test years when
                          the next is the last (--eval-seconds)
    bench-decode  240 s   once the run has finished: `hmer bench decode` of 2014 with its weights
    wrap-up        60 s   benchmark figures as MLflow runs, every run exported, the run packed to $OUT
"""

from __future__ import annotations

from pathlib import Path

# ---- what the campaign keeps, and where ---------------------------------------------------------
EXPERIMENT = "gpu-campaign"
BENCH_EXPERIMENT = "gpu-bench"
KEEP = Path("mlruns") / "carried" / f"{EXPERIMENT}.tar.gz"  # the run between leases, committed
CARRIED = Path(".gpu") / "carried.tar.gz"  # what a lease carries in (`prepare` copies KEEP)
# The standard 2014 images (test_2014-std), carried beside the data when the call has room; on the
# leased machine they go where the project looks for them: beside the checkout, as on this one.
STANDARD_2014 = "wap-offline-2014-test.tar.gz"

# ---- what a lease trains ------------------------------------------------------------------------
TRAIN_PRESET = "comer-fusion"
# Large batches (k = 8: the fastest first pass the fourth lease measured, 80 img/s for bttr against
# 7.7 at the reference batch) at CoMER's learning rate as it is: with its gradient clipping, which
# binds at nearly every step, the training loss per epoch at 4x the batch followed the reference's
# with the lr unscaled, and fell behind with it scaled (train.lr_scaling=sqrt: +0.3, linear: +1.3 at
# epoch 12; docs/benchmarks.md section 4, on the CPU).
LARGE = ["data.batch_pixels=2560000", "data.max_batch_size=128"]
TRAIN_SET = [*LARGE]
STOP_MARGIN_S = 30  # from the trainer's pause deadline to the step's cap: its checkpoint and run closed

# ---- what a lease times, when asked (--with) -------------------------------------------------------
# (preset, setting name, overrides, cap seconds, timed seconds), in priority order.
PADDED = ["data.pad_multiple=64"]
GPU_TRAIN_FIGURES = [
    (p, name, sets, cap, timed)
    for name, sets, cap, timed in [
        ("reference", [], 90, 20),
        ("large k=8", LARGE, 150, 60),
        ("large k=8, padded to 64 px", [*LARGE, *PADDED], 150, 60),
        ("compile, padded to 64 px", ["train.compile=true", *PADDED], 150, 20),
        ("padded to 64 px", PADDED, 150, 60),
        ("shapes seen: 24 batches cycled", ["bench.batches=24"], 90, 20),
    ]
    for p in ("bttr", "comer-fusion")
]
# Trials side by side (issue 47's target: 8 trials at least 4x one trial's images a second): a
# study's trial at the `short` budget trains the full-size model at the reference batch.
# Each N starts together and waits for a common moment: imports, data and warm-up take the setup time.
GPU_TRIALS = {"preset": "bttr", "procs": "1,8", "seconds": 30, "setup_seconds": 100}

# ---- the CPU rehearsal: the same steps, tiny, seconds each ---------------------------------------
REHEARSAL_TINY = ["data.batch_pixels=20000", "data.max_batch_size=8"]
REHEARSAL_TRAIN_FIGURES = [
    ("tiny-transformer", "large k=4, padded to 32 px", ["data.batch_pixels=80000", "data.max_batch_size=32",
                                            "data.pad_multiple=32"], 60, 3),
    # Inductor on a CPU needs minutes (docs/benchmarks.md section 2): this figure shows a cap at work.
    ("tiny-transformer", "compile", [*REHEARSAL_TINY, "train.compile=true"], 2, 3),
]
REHEARSAL_TRIALS = {"preset": "tiny-transformer", "procs": "1,2", "seconds": 2, "setup_seconds": 40}
# (the limits keep a rehearsal on the real data to minutes; the tests' datasets are smaller still)
REHEARSAL_TRAIN_SET = ["train.beam_size=2", "train.max_decode_len=12", "train.attention_maps=1", "train.epochs=3",
                       "data.train_limit=300", "data.val_limit=40", "data.test_limit=40", *REHEARSAL_TINY]

STEP_NAMES = ("install", "data", "check", "carry-in", "shape-cost", "bench-train", "bench-trials", "train",
              "bench-decode")
OPTIONAL = ("shape-cost", "bench-train", "bench-trials")  # run only when asked (--with): a lease trains by default
CAPS = {"install": 120, "data": 60, "check": 120, "carry-in": 60, "shape-cost": 240, "bench-train": 300,
        "bench-trials": 330,
        "train": 0, "bench-decode": 240}
REHEARSAL_CAPS = {**CAPS, "shape-cost": 150, "bench-train": 150, "bench-trials": 150, "bench-decode": 60}
