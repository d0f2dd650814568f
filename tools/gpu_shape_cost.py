#!/usr/bin/env python3
"""What does a new (N, H, W) batch shape cost a training step on a GPU, where does it go, and do the
project's remedies remove it? Old and new side by side in one device call, sections in priority order
under one time budget (issue 47; docs/benchmarks.md section 5):

  run(command="set -o pipefail; PYTHONUNBUFFERED=1 python3 tools/gpu_shape_cost.py --out $OUT "
              "--budget 300 2>&1 | tee $OUT/shape_cost.log", timeout_s=420)

or as the `shape-cost` step of tools/gpu_campaign.py. Needs the machine's torch and this checkout's
src/ (editdistance, absent on a bare machine, is only imported, never called: it raises if it were).
Batches are synthetic: random pixels at shapes drawn like CROHME's (no CROHME data is used or kept).
Results: $OUT/shape_cost.json (rewritten after every section), $OUT/prof_tables.txt; a table is
printed last, each remedy beside the baseline it is meant to beat.

The CPU rehearsal (tests/test_gpu_shape_cost.py runs it; every section that needs a GPU is skipped,
the others run on two shapes of the `tiny` preset):
  python tools/gpu_shape_cost.py --device cpu --preset tiny-transformer --smoke --out /tmp/sc

Sections (a "fresh" shape is one this process's cuDNN plan cache has never seen; "cold" = the step's
first time at a shape, "warm" = its second; per-shape cost = median cold - median warm):
  S1  baseline: 16 fresh shapes, each stepped cold then warm, as the trainer steps (conv 1x1)
  S4  1x1 convolutions as matrix products (train.conv1x1_as_matmul): numerics against the
      convolutions (fp32 without TF32, and bf16 autocast), then 16 fresh shapes cold / warm
  S9  the planning pass (train.plan_shapes): 16 fresh shapes planned (encoder forward + backward,
      hmer.training.planning.plan), then the full step at each (is it warm after planning?), then
      again; with and without the 1x1 matmuls
  S7  ceiling and CUDA graphs (train.cuda_graphs): one 52-image shape and one reference-size shape,
      eager step against `GraphedStep`'s replay; host time against GPU-busy time
  S8  the plan cache, each in a fresh process on S1's first shapes stepped three times:
      TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT 300 (too small: thrash), 0 (unbounded), and the size
      `cache_plans` gives 40 shapes; then 40 fresh shapes twice at torch's default 10,000 against
      the sized cache (does the default evict a ladder's plans?)
  S2  attribution: torch.profiler over 2 cold + 2 warm steps -> CPU ms in conv fwd/bwd, BN, mm,
      SDPA, cudaMalloc; the slowest single convolution calls
  S3  micro: one 1x1 conv, one 3x3 conv and the 1x1 matmul, forward + backward at fresh shapes
  S6  cudnn.enabled=False cold / warm; S5 cudnn.benchmark=True cold / warm

Why one file of over 400 lines: it is one device call's measurement, and what it measures is the state
of its one process (the cuDNN plan cache a section warms or leaves cold, the allocator's counters, the
results rewritten after every section under one time budget), held in the module's globals that `main`
sets. Its sections share that state and its helpers (`TrainStep`, `cold_warm`, `section`); split into
modules, each would import and mutate the same globals across files, and a lease would carry several
files for one script. A section added is one function here and one line in `main`.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
try:
    import editdistance  # noqa: F401
except ImportError:  # only the hold-out and the metrics call it, and this tool calls neither
    def _absent(*_args):
        raise RuntimeError("editdistance is not installed here; gpu_shape_cost.py never scores text")

    sys.modules["editdistance"] = types.SimpleNamespace(eval=_absent)

import numpy as np
import torch
import torch.nn as nn

from hmer.data import Expression, Vocab
from hmer.data.vocab import CROHME_SYMBOLS
from hmer.device import CUDNN_PLAN_CACHE
from hmer.model import build_model
from hmer.model.accelerations import PointwiseConv, use_matmul
from hmer.model_presets import preset_with_recipe
from hmer.training.graphs import GraphedStep
from hmer.training.loader import make_train_batch
from hmer.training.optim import build_optimizer
from hmer.training.planning import cache_plans, plan, plans_per_shape
from hmer.training.setup import prepare_model
from hmer.training.step import LossModule, train_step

T0 = time.perf_counter()
ARGS = argparse.Namespace()
DEV = torch.device("cpu")
RESULTS: dict = {}
RNG = np.random.default_rng(1)


def log(*a):
    print(f"[{time.perf_counter() - T0:6.1f}s]", *a, flush=True)


def sync():
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def save():
    if ARGS.out:
        with open(os.path.join(ARGS.out, "shape_cost.json"), "w") as f:
            json.dump(RESULTS, f, indent=1, default=str)


def left() -> float:
    return ARGS.budget - (time.perf_counter() - T0)


def med(xs):
    return statistics.median(xs) if xs else float("nan")


# ---- shapes and batches ------------------------------------------------------------------------
def _pool(seed, budget=320_000, cap=16):
    """Unpadded-looking (N, H, W): H, W anywhere in CROHME's range, N filling the reference pixel budget."""
    rng, seen = np.random.default_rng(seed), set()
    while True:
        h, w = int(rng.integers(40, 261)), int(rng.integers(80, 1101))
        if (h, w) in seen:
            continue
        seen.add((h, w))
        yield (max(1, min(cap, budget // (h * w))), h, w)


POOL = _pool(0)


def fresh(k):
    return [next(POOL) for _ in range(k)]


class TrainStep:
    """A model, its optimiser and the trainer's step, as `train.*` asks (`matmul`: the 1x1
    convolutions as matrix products)."""

    def __init__(self, cfg, amp, matmul=False, model=None):
        self.cfg, self.amp = cfg, amp
        self.model = prepare_model(model if model is not None else build_model(cfg.model).to(DEV), cfg.train)
        use_matmul(self.model, matmul)
        self.model.train()
        self.opt = build_optimizer(self.model.parameters(), cfg.train)
        self.loss_module = LossModule(self.model, cfg.train.label_smoothing)

    def batch(self, shape):
        n, h, w = shape
        exprs = []
        for i in range(n):
            toks = [CROHME_SYMBOLS[j] for j in RNG.integers(0, len(CROHME_SYMBOLS), int(RNG.integers(6, 30)))]
            exprs.append(Expression(name=f"s{i}", tokens=toks,
                                    image=RNG.integers(0, 256, size=(h, w), dtype=np.uint8)))
        return make_train_batch(exprs, Vocab(), self.cfg.model.direction, DEV, None, self.cfg.train.channels_last)

    def step(self, tb):
        train_step(self.loss_module, self.opt, self.model, tb, self.cfg.train.grad_clip, self.amp)

    def timed(self, tb, step=None):
        sync()
        t = time.perf_counter()
        (step or self.step)(tb)
        sync()
        return time.perf_counter() - t


def alloc_counters():
    if DEV.type != "cuda":
        return {}
    s = torch.cuda.memory_stats()
    return {k: s.get(k, 0) for k in ("segment.all.allocated", "segment.all.freed", "num_alloc_retries",
                                      "num_device_alloc", "num_device_free")}


def cold_warm(setup, shapes, label, passes=2):
    """Each shape stepped `passes` times in turn: pass 1 cold, pass 2 warm (and 3, ...)."""
    tbs = [setup.batch(s) for s in shapes]
    a0 = alloc_counters()
    times = []
    for _ in range(passes):
        times.append([setup.timed(tb) for tb in tbs])
    cold, warm = times[0], times[1]
    r = dict(label=label, shapes=shapes, cold_s=cold, warm_s=warm, cold_med=med(cold), warm_med=med(warm),
             per_shape_s=med(cold) - med(warm), imgs=sum(s[0] for s in shapes),
             cold_img_s=sum(s[0] for s in shapes) / sum(cold), warm_img_s=sum(s[0] for s in shapes) / sum(warm),
             cold_over_warm=med(cold) / med(warm), alloc={k: v - a0[k] for k, v in alloc_counters().items()})
    if passes > 2:
        r["third_pass_s"] = times[2]
    log(f"{label}: cold median {r['cold_med']:.3f} s, warm median {r['warm_med']:.3f} s, "
        f"per-shape {r['per_shape_s']:.3f} s, cold/warm {r['cold_over_warm']:.2f}")
    return r


# ---- S4: 1x1 convolutions as matrix products -----------------------------------------------------
def numerics_1x1(cfg):
    """The same function? fp32 (TF32 off) and bf16 autocast, eval mode, one batch."""
    ref = prepare_model(build_model(cfg.model).to(DEV), cfg.train).eval()
    alt = copy.deepcopy(ref)
    n = use_matmul(alt, True)
    tb = TrainStep.batch(types.SimpleNamespace(cfg=cfg), (4, 120, 360))
    out = {"pointwise_convs": n}
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        for name, dt in (("fp32", None), ("bf16", torch.bfloat16 if DEV.type == "cuda" else None)):
            if name == "bf16" and dt is None:
                continue
            with torch.no_grad(), torch.autocast(DEV.type, dtype=dt or torch.float32, enabled=dt is not None):
                a = ref.loss_from_targets(tb.batch.images, tb.batch.image_mask, tb.tgt_in, tb.tgt_out)
                b = alt.loss_from_targets(tb.batch.images, tb.batch.image_mask, tb.tgt_in, tb.tgt_out)
                la = ref(tb.batch.images, tb.batch.image_mask, tb.tgt_in).float()
                lb = alt(tb.batch.images, tb.batch.image_mask, tb.tgt_in).float()
            out[name] = dict(loss_conv=float(a), loss_matmul=float(b),
                             logits_rel_err=float((la - lb).norm() / la.norm()), finite=bool(torch.isfinite(lb).all()))
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    return out


# ---- S9: the planning pass -----------------------------------------------------------------------
def planned(cfg, amp, matmul, k):
    setup = TrainStep(cfg, amp, matmul=matmul)
    warm_up(setup)
    shapes = fresh(k)
    tbs = [setup.batch(s) for s in shapes]
    n, plan_s = plan(setup.model, shapes, DEV, amp, cfg.train.channels_last)
    after = [setup.timed(tb) for tb in tbs]
    again = [setup.timed(tb) for tb in tbs]
    r = dict(label=f"planned{', 1x1 matmul' if matmul else ''}", shapes=shapes, plan_s=plan_s,
             plan_s_per_shape=plan_s / max(n, 1), cold_s=after, warm_s=again,
             after_plan_med=med(after), warm_med=med(again), after_plan_over_warm=med(after) / med(again),
             cold_med=med(after), per_shape_s=med(after) - med(again),
             cold_img_s=sum(s[0] for s in shapes) / sum(after), warm_img_s=sum(s[0] for s in shapes) / sum(again),
             cold_over_warm=med(after) / med(again))
    log(f"S9 {r['label']}: plan {plan_s / max(n, 1):.3f} s a shape, then the step {med(after):.3f} s "
        f"against {med(again):.3f} s warm")
    return r


# ---- S7: ceiling and CUDA graphs -----------------------------------------------------------------
def graphs_vs_eager(cfg, amp, shape, steps=10):
    """One shape: the ordinary eager step against `GraphedStep` (train.cuda_graphs) on copies of the
    same model, both with their shape seen, stepping the same batch; their last losses side by side
    (a graph that replayed wrong, e.g. gradients not zeroed, would leave its loss far from eager's)."""
    eager = TrainStep(cfg, amp)
    graphed_setup = TrainStep(cfg, amp, model=copy.deepcopy(eager.model))
    graphed = GraphedStep(graphed_setup.loss_module, graphed_setup.opt, graphed_setup.model, cfg.train.grad_clip, amp)
    tb = eager.batch(shape)
    first_eager = eager.timed(tb)
    first_graphed = graphed_setup.timed(tb, graphed)  # eager step + warm-up + capture
    for _ in range(2):
        eager.step(tb)
        graphed(tb)
    sync()
    t = time.perf_counter()
    for _ in range(steps):
        eager_loss = train_step(eager.loss_module, eager.opt, eager.model, tb, cfg.train.grad_clip, amp)
    sync()
    eager_s = (time.perf_counter() - t) / steps
    t = time.perf_counter()
    for _ in range(steps):
        graph_loss = graphed(tb)
    sync()
    graph_s = (time.perf_counter() - t) / steps
    r = dict(shape=shape, first_eager_s=first_eager, first_graphed_s=first_graphed, eager_step_s=eager_s,
             graph_step_s=graph_s, eager_img_s=shape[0] / eager_s, graph_img_s=shape[0] / graph_s,
             graphs=graphed.graphs, failures=list(graphed.failures.values())[:2],
             eager_last_loss=float(eager_loss.detach()), graph_last_loss=float(graph_loss))
    if DEV.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(3):
                eager.step(tb)
            sync()
        busy = sum(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0))
                   for e in p.key_averages()) / 1e6 / 3
        r.update(gpu_busy_s_per_step=busy, img_s_if_gpu_bound=shape[0] / busy)
    log(f"S7 {shape}: eager {eager_s * 1e3:.1f} ms, graph {graph_s * 1e3:.1f} ms a step "
        f"(graphs {graphed.graphs}, failures {len(graphed.failures)})")
    return r


# ---- S2: attribution -----------------------------------------------------------------------------
def s2_profile(setup, shapes):
    from torch.profiler import ProfilerActivity, profile

    tbs = [setup.batch(s) for s in shapes]
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV.type == "cuda" else [])
    summary, text = {}, []
    for phase in ("cold", "warm"):
        with profile(activities=acts) as p:
            t = time.perf_counter()
            for tb in tbs:
                setup.step(tb)
            sync()
            wall = time.perf_counter() - t
        ka = p.key_averages()

        def dev_self(e):
            return getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0))

        groups = {  # exact names (nested ATen calls would be counted twice by substring)
            "conv_fwd": ("aten::cudnn_convolution", "aten::mkldnn_convolution"),
            "conv_bwd": ("aten::convolution_backward",), "bn_fwd": ("aten::batch_norm",),
            "bn_bwd": ("aten::cudnn_batch_norm_backward", "aten::native_batch_norm_backward"),
            "mm": ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear"),
            "sdpa_fwd": ("aten::scaled_dot_product_attention",),
            "cudaMalloc": ("cudaMalloc",), "cudaFree": ("cudaFree",)}
        g = {k: round(sum(e.cpu_time_total for e in ka if e.key in names) / 1e3, 2) for k, names in groups.items()}
        g["step_wall_ms"] = round(1e3 * wall / len(tbs), 1)
        g["gpu_busy_ms"] = round(sum(dev_self(e) for e in ka) / 1e3, 2)
        convs = sorted((e.cpu_time_total / 1e3 for e in p.events()
                        if e.name in ("aten::cudnn_convolution", "aten::convolution_backward")), reverse=True)
        g["conv_calls"] = len(convs)
        g["conv_call_ms_top10"] = [round(x, 2) for x in convs[:10]]
        g["conv_call_ms_median"] = round(med(convs), 3)
        summary[phase] = g
        text.append(f"==== {phase} ({len(tbs)} steps) ====\n"
                    + ka.table(sort_by="cpu_time_total", row_limit=30, max_name_column_width=60))
        log(f"S2 {phase}: {g}")
    if ARGS.out:
        with open(os.path.join(ARGS.out, "prof_tables.txt"), "w") as f:
            f.write("\n\n".join(text))
    return summary


# ---- S3: micro -----------------------------------------------------------------------------------
def s3_micro(n=10):
    out = {}
    c1 = PointwiseConv(228, 96, bias=False).to(DEV)
    c3 = nn.Conv2d(96, 24, 3, padding=1, bias=False).to(DEV)
    mm = copy.deepcopy(c1)
    use_matmul(mm, True)
    for name, mod, cin in (("conv1x1_228to96", c1, 228), ("conv3x3_96to24", c3, 96), ("mm1x1_228to96", mm, 228)):
        mod = mod.to(memory_format=torch.channels_last)
        xs = [torch.randn(7, cin, int(RNG.integers(10, 66)), int(RNG.integers(20, 276)), device=DEV)
              .to(memory_format=torch.channels_last).requires_grad_() for _ in range(n)]  # block-1 maps

        def once(x, mod=mod):  # this iteration's module (bound now: the loop rebinds `mod`)
            sync()
            t = time.perf_counter()
            with torch.autocast(DEV.type, dtype=torch.bfloat16, enabled=DEV.type == "cuda"):
                y = mod(x)
            y.float().sum().backward()
            sync()
            return time.perf_counter() - t

        cold = [once(x) for x in xs]
        warm = [once(x) for x in xs]
        out[name] = dict(cold_ms=round(1e3 * med(cold), 3), warm_ms=round(1e3 * med(warm), 3),
                         per_shape_ms=round(1e3 * (med(cold) - med(warm)), 3))
        log(f"S3 {name}: {out[name]}")
    return out


# ---- S8: the plan cache, each setting in a fresh process ----------------------------------------
def setting_child(name):
    """In a fresh process under the setting's environment; prints one JSON line."""
    cfg = preset_with_recipe(ARGS.preset)
    setup = TrainStep(cfg, torch.bfloat16 if DEV.type == "cuda" else None, matmul=ARGS.matmul)
    warm_up(setup)
    shapes = [tuple(s) for s in json.loads(ARGS.shapes)]
    r = cold_warm(setup, shapes, name, passes=3)
    r["cache_limit"] = os.environ.get(CUDNN_PLAN_CACHE, "torch's default")
    print("SETTING_JSON " + json.dumps(r, default=str), flush=True)


def run_setting(name, limit, shapes, cap, matmul=False):
    env = dict(os.environ)
    env.pop(CUDNN_PLAN_CACHE, None)
    if limit is not None:
        env[CUDNN_PLAN_CACHE] = str(limit)
    cmd = [sys.executable, os.path.abspath(__file__), "--setting", name, "--shapes", json.dumps(shapes),
           "--device", ARGS.device, "--preset", ARGS.preset, "--budget", str(cap)] + (["--matmul"] if matmul else [])
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=cap)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {cap:.0f} s"}
    for line in p.stdout.splitlines():
        if line.startswith("SETTING_JSON "):
            r = json.loads(line[len("SETTING_JSON "):])
            log(f"S8 {name}: cold {r['cold_med']:.3f} warm {r['warm_med']:.3f} third {med(r.get('third_pass_s', []))}")
            return r
    return {"error": (p.stdout[-800:] + p.stderr[-1500:])}


def warm_up(setup):
    """Allocator, kernels and optimiser state, on one small shape stepped three times."""
    tb = setup.batch((4, 64, 200))
    for _ in range(3):
        setup.step(tb)
    sync()


def section(name, est, fn):
    if left() < est:
        RESULTS[name] = {"skipped": f"{left():.0f} s left, needs ~{est} s"}
        log(f"{name}: skipped")
        return None
    try:
        RESULTS[name] = fn()
    except Exception as e:  # noqa: BLE001 - a failed section costs only itself
        RESULTS[name] = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
        log(f"{name}: ERROR {RESULTS[name]['error']}")
    save()
    return RESULTS[name]


SUMMARY_ROWS = [  # (what, result key, the baseline it is read against)
    ("baseline (conv 1x1, no plan)", "S1_baseline", None),
    ("1x1 as matmul", "S4_fix_1x1mm", "S1_baseline"),
    ("planned", "S9_planned", "S1_baseline"),
    ("planned, 1x1 as matmul", "S9_planned_1x1mm", "S4_fix_1x1mm"),
    ("cache 300 (thrash)", "S8_lru300", "S8_lru_sized"),
    ("cache unbounded", "S8_lru0", "S8_lru_sized"),
    ("cache sized to 40 shapes", "S8_lru_sized", None),
    ("40 shapes, torch's default cache", "S8_default_40", "S8_sized_40"),
    ("40 shapes, cache sized", "S8_sized_40", None),
    ("cuDNN off", "S6_cudnn_off", "S1_baseline"),
    ("cudnn.benchmark", "S5_benchmark_true", "S1_baseline"),
]


def summary():
    print("\n=== summary: s a step (cold = first at a shape, warm = second; per-shape = cold - warm) ===")
    print(f"{'what':34s} {'cold':>7s} {'warm':>7s} {'cold/warm':>9s} {'per-shape':>9s} {'3rd pass':>8s}  against")
    for what, key, base in SUMMARY_ROWS:
        r = RESULTS.get(key)
        if not isinstance(r, dict):
            continue
        if "cold_med" not in r:
            print(f"{what:34s} {json.dumps(r)[:100]}")
            continue
        third = f"{med(r['third_pass_s']):8.3f}" if r.get("third_pass_s") else f"{'':8s}"
        print(f"{what:34s} {r['cold_med']:7.3f} {r['warm_med']:7.3f} {r['cold_over_warm']:9.2f} "
              f"{r['per_shape_s']:9.3f} {third}  {base or ''}")
    for key in ("S7_graphs_large", "S7_graphs_reference"):
        r = RESULTS.get(key)
        if isinstance(r, dict) and "eager_step_s" in r:
            print(f"graphs {str(r['shape']):16s} eager {r['eager_step_s'] * 1e3:7.1f} ms ({r['eager_img_s']:.0f} img/s)"
                  f"  graph {r['graph_step_s'] * 1e3:7.1f} ms ({r['graph_img_s']:.0f} img/s)  graphs {r['graphs']}"
                  f"  failures {len(r['failures'])}  last loss eager {r['eager_last_loss']:.4f} graph "
                  f"{r['graph_last_loss']:.4f}" + (f"  GPU busy {r['gpu_busy_s_per_step'] * 1e3:.1f} ms"
                                                       if "gpu_busy_s_per_step" in r else ""))
        elif isinstance(r, dict):
            print(f"{key}: {json.dumps(r)[:200]}")
    for key in ("S4_numerics_1x1mm", "S2_profile", "S3_micro"):
        if isinstance(RESULTS.get(key), dict):
            print(f"{key}: {json.dumps(RESULTS[key], default=str)[:600]}")
    print(f"elapsed {RESULTS['elapsed_s']:.0f} s")


def main(argv=None):
    global ARGS, DEV
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="bttr")
    ap.add_argument("--budget", type=float, default=300, help="seconds for all sections")
    ap.add_argument("--smoke", action="store_true", help="2 shapes a section (the CPU rehearsal)")
    ap.add_argument("--setting", default="", help="(S8's child) the plan-cache setting it measures")
    ap.add_argument("--shapes", default="[]")
    ap.add_argument("--matmul", action="store_true", help="(S8's child) the 1x1 convolutions as matmuls")
    ARGS = ap.parse_args(argv)
    DEV = torch.device(ARGS.device)
    if ARGS.out:
        os.makedirs(ARGS.out, exist_ok=True)
    if ARGS.setting:
        return setting_child(ARGS.setting)
    k = 2 if ARGS.smoke else 16
    cuda = DEV.type == "cuda"
    RESULTS["env"] = dict(
        torch=torch.__version__, cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version() if cuda else None,
        gpu=torch.cuda.get_device_name() if cuda else None, preset=ARGS.preset, smoke=ARGS.smoke,
        env={v: os.environ.get(v) for v in (CUDNN_PLAN_CACHE, "TORCH_CUDNN_V8_API_DISABLED",
                                             "PYTORCH_CUDA_ALLOC_CONF", "CUDA_MODULE_LOADING")},
        cpu_count=os.cpu_count())
    log("env", RESULTS["env"])
    cfg = preset_with_recipe(ARGS.preset)
    amp = torch.bfloat16 if cuda else None
    base = TrainStep(cfg, amp)
    RESULTS["plans_per_shape"] = {"conv": plans_per_shape(base.model)}
    use_matmul(base.model, True)
    RESULTS["plans_per_shape"]["matmul"] = plans_per_shape(base.model)
    use_matmul(base.model, False)
    log("params", sum(p.numel() for p in base.model.parameters()), "plans a shape", RESULTS["plans_per_shape"])
    warm_up(base)
    save()

    s1 = section("S1_baseline", 25, lambda: cold_warm(base, fresh(k), "baseline"))
    section("S4_numerics_1x1mm", 10, lambda: numerics_1x1(cfg))

    def matmul_1x1():
        mm = TrainStep(cfg, amp, matmul=True, model=copy.deepcopy(base.model))
        warm_up(mm)
        return cold_warm(mm, fresh(k), "1x1 as matmul")

    section("S4_fix_1x1mm", 20, matmul_1x1)
    section("S9_planned", 25, lambda: planned(cfg, amp, False, k))
    section("S9_planned_1x1mm", 25, lambda: planned(cfg, amp, True, k))
    if cuda:
        section("S7_graphs_large", 30, lambda: graphs_vs_eager(cfg, amp, (52, 128, 384)))
        section("S7_graphs_reference", 20, lambda: graphs_vs_eager(cfg, amp, (7, 112, 384)))
    else:  # the rehearsal: GraphedStep's eager path on a small shape
        section("S7_graphs_reference", 5, lambda: graphs_vs_eager(cfg, amp, (2, 48, 96), steps=2))
    shapes = (s1 or {}).get("shapes", fresh(6))[:2 if ARGS.smoke else 6]
    sized = cache_plans(base.model, 40)
    settings = [("lru300", 300), ("lru0", 0), ("lru_sized", sized)] if cuda else [("lru_sized", sized)]
    for name, limit in settings:
        section(f"S8_{name}", 45, lambda name=name, limit=limit: run_setting(name, limit, shapes,
                                                                            min(90, max(10, left() - 5))))
    if cuda:
        forty = fresh(40)
        section("S8_default_40", 70, lambda: run_setting("default_40", None, forty, min(150, max(10, left() - 5))))
        section("S8_sized_40", 70, lambda: run_setting("sized_40", sized, forty, min(150, max(10, left() - 5))))
    section("S2_profile", 40, lambda: s2_profile(base, fresh(2)))
    section("S3_micro", 10, lambda: s3_micro(2 if ARGS.smoke else 10))
    if cuda:
        def with_cudnn(flag, value, label):
            """cold_warm with torch.backends.cudnn.<flag> = value, restored afterwards."""
            before = getattr(torch.backends.cudnn, flag)
            setattr(torch.backends.cudnn, flag, value)
            try:
                return cold_warm(base, fresh(3), label)
            finally:
                setattr(torch.backends.cudnn, flag, before)

        section("S6_cudnn_off", 15, lambda: with_cudnn("enabled", False, "cudnn-off"))
        section("S5_benchmark_true", 40, lambda: with_cudnn("benchmark", True, "cudnn.benchmark"))
    RESULTS["elapsed_s"] = time.perf_counter() - T0
    save()
    summary()
    return 0


if __name__ == "__main__":
    sys.exit(main())
