"""`hmer report --frontier` (issue 66) on a real smoke run of the frontier study: two of its
planned points trained for real at the smoke budget, their FLOPs an image counted by
`benchmarks/frontier_flops.py`'s own measurement (`hmer bench train`), then the table, the CSV and
the figure."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from hmer.studies.frontier_report import frontier_points, hosts, input_label, read_flops
from hmer.studies.suite.frontier import FRONTIER
from study_store import studying_into
from tiny_dataset import write_dataset

ROOT = Path(__file__).resolve().parents[1]
POINTS = ("192/0.0/0.0/8", "192/0.0/0.999/8")  # the baseline and the weight average: one setting's FLOPs
SMOKE = {"train.beam_size": 2, "train.max_decode_len": 12, "train.device": "cpu", "data.batch_pixels": 20_000,
         "data.max_batch_size": 8, "model.d_model": 192}
pytestmark = pytest.mark.slow


def _benchmark_module():
    spec = importlib.util.spec_from_file_location("frontier_flops", ROOT / "benchmarks" / "frontier_flops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def frontier_store(tmp_path_factory):
    from hmer.studies import run_grid_study

    root = tmp_path_factory.mktemp("frontier")
    data = write_dataset(root / "data", {"train": 12, "2014": 2})
    uri, storage = f"sqlite:///{root / 'mlflow.db'}", f"sqlite:///{root / 'optuna.db'}"
    with studying_into(root):
        outcome = run_grid_study(FRONTIER, "smoke", storage=storage, tracking_uri=uri, data_path=str(data),
                                 seeds=(1,), overrides=SMOKE, study_name="frontier-smoke", print_table=False,
                                 variants=POINTS)
    assert outcome.complete, outcome.failed
    return root, uri, data


def test_each_finished_point_is_its_flops_times_the_images_it_trained_with_its_cpu_and_cost(frontier_store,
                                                                                          tmp_path):
    root, uri, data = frontier_store
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    run = next(r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
               if r.data.tags.get("hmer.variant") == POINTS[0])
    config = json.loads(Path(client.download_artifacts(run.info.run_id, "config.json", str(tmp_path))).read_text())
    bench = _benchmark_module()
    measured = bench.measure(config, str(data), images=8, batches=1)
    flops = pd.DataFrame([{"model.d_model": 192, "data.render_scale": 0.0, **measured,
                           "train_images": bench.train_images(config, str(data))}])
    assert measured["gflop_per_image"] > 0

    points = frontier_points("frontier-smoke", flops, uri)
    assert list(points["variant"]) == list(POINTS)
    point = points.iloc[0]
    expected = measured["gflop_per_image"] * int(flops["train_images"].iloc[0]) * 8 / 1e6
    assert point["pflop"] == pytest.approx(expected)
    assert point["input"] == "48 px" and point["epochs"] == 8 and point["width"] == 192
    assert point["cpu_hours"] == pytest.approx(run.data.metrics["train_cpu_seconds"] / 3600)
    assert point["cpu"] == run.data.tags["hmer.device"] and "threads" in point["cpu"]
    assert 0 <= point["val_final_exprate"] <= 100


def test_the_command_writes_the_table_and_figure_and_a_setting_not_measured_is_named(frontier_store, tmp_path):
    root, uri, data = frontier_store
    flops = tmp_path / "flops.csv"
    pd.DataFrame([{"model.d_model": 192, "data.render_scale": 0.0, "gflop_per_image": 1.5,
                   "train_images": 10}]).to_csv(flops, index=False)
    out = tmp_path / "report"
    command = [sys.executable, "-m", "hmer.cli", "report", "--frontier", "--study", "frontier-smoke", "--tracking-uri",
               uri, "--out", str(out), "--flops", str(flops)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert f"2 of {len(FRONTIER.variants)} planned points finished" in done.stdout
    table = pd.read_csv(out / "frontier.csv")
    assert list(table["pflop"]) == pytest.approx([1.5 * 10 * 8 / 1e6] * 2)
    assert (out / "plots" / "frontier.png").stat().st_size > 10_000
    assert "| variant" in (out / "frontier.md").read_text()

    other = pd.DataFrame([{"model.d_model": 256, "data.render_scale": 0.5, "gflop_per_image": 1.0,
                           "train_images": 10}])
    with pytest.raises(LookupError, match=r"no FLOP measurement of \{'model.d_model': 192"):
        frontier_points("frontier-smoke", other, uri)


def test_a_missing_flop_table_is_one_line_naming_the_script(tmp_path):
    with pytest.raises(FileNotFoundError, match="frontier_flops.py"):
        read_flops(tmp_path / "none.csv")
    assert input_label(0.0) == "48 px" and input_label(0.5) == "x0.5"


def test_a_run_continued_on_another_host_names_each_host_once():
    # hmer.tracking.run appends the host a run resumes on; the figure's footnote lists each CPU once
    tags = ["Xeon 207", "EPYC 9B14; Xeon 207", None, float("nan"), "EPYC 9B14"]
    assert hosts(tags) == ["EPYC 9B14", "Xeon 207"]


def test_the_frontier_notebook_draws_the_points_and_what_each_doubling_bought(frontier_store, tmp_path):
    from hmer.cli.notebooks import run_notebooks

    root, uri, data = frontier_store
    (done,) = run_notebooks(notebooks_dir=ROOT / "notebooks", out_dir=tmp_path, tracking_uri=uri,
                            study="frontier-smoke", names=("frontier",), env={"OMP_NUM_THREADS": "1"})
    import nbformat

    nb = nbformat.read(done.path, as_version=4)
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    text = "\n".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/markdown", "")) for o in outputs)
    assert "frontier-smoke: 2 finished points" in text
    assert all(variant in text for variant in POINTS)  # the table of points
    assert "no line has two finished points yet" in text  # one length a line: no step to read
    assert "no input has a point at the compute of a 48 px point" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 1  # the figure
