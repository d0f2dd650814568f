"""tools/gpu_shape_cost.py, the GPU diagnostic of issue 47, rehearsed on the CPU: every section that
can run without a GPU runs on two shapes of the `tiny` preset, old and new side by side (the 1x1
convolutions as convolutions and as matrix products, planned and not, the eager step and
`GraphedStep`'s eager path, a fresh process with the plan cache sized), and the summary is printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hmer.model import build_model
from hmer.training.planning import cache_plans

REPO = Path(__file__).resolve().parents[1]


def test_the_shape_cost_diagnostic_rehearses_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    env.pop("TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT", None)
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_shape_cost.py"), "--device", "cpu",
                           "--preset", "tiny-transformer", "--smoke", "--out", str(out), "--budget", "600"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / "shape_cost.json").read_text())
    errors = {k: v for k, v in results.items() if isinstance(v, dict) and ("error" in v or "skipped" in v)}
    assert not errors, errors
    for key in ("S1_baseline", "S4_fix_1x1mm", "S9_planned", "S9_planned_1x1mm"):
        r = results[key]
        assert len(r["cold_s"]) == len(r["warm_s"]) == 2 and r["cold_med"] > 0 and r["warm_med"] > 0, key
    assert results["S9_planned"]["plan_s"] > 0
    assert results["plans_per_shape"]["matmul"] < results["plans_per_shape"]["conv"]
    numerics = results["S4_numerics_1x1mm"]
    assert numerics["pointwise_convs"] > 0 and numerics["fp32"]["logits_rel_err"] < 1e-5
    graphs = results["S7_graphs_reference"]
    assert graphs["graphs"] == 0 and graphs["failures"] == []  # a CPU has no graph: GraphedStep steps eagerly
    sized = results["S8_lru_sized"]  # a fresh process with the cache sized for 40 shapes of the preset
    assert sized["cache_limit"] == str(cache_plans(build_model("tiny-transformer"), 40))
    assert len(sized["third_pass_s"]) == 2
    assert "=== summary" in proc.stdout and "1x1 as matmul" in proc.stdout
