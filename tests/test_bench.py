"""`hmer bench train|decode` end to end on CPU with tiny sizes: both run through the CLI and end
with a line `images_per_second=<positive number>` that scripts read (benchmarks/*.py)."""

from __future__ import annotations

import pytest
import torch

from hmer.bench import split_overrides, synthetic_expressions
from hmer.cli import main
from hmer.device import cpu_description


def _last_figure(text: str) -> float:
    last = text.strip().splitlines()[-1]
    key, _, value = last.partition("=")
    assert key == "images_per_second", last
    return float(value)


def test_bench_train_tiny_on_cpu_ends_with_images_per_second(capsys, one_thread):
    assert main(["bench", "train", "--preset", "tiny", "--device", "cpu", "--images", "8",
                 "--set", "bench.pool=300"]) == 0
    out = capsys.readouterr().out
    assert _last_figure(out) > 0
    assert "padding_share=" in out and "shapes=" in out and "epoch_seconds_8835=" in out and "peak_memory_mb=" in out
    figures = dict(item.split("=") for line in out.splitlines() if line.startswith("gflop_per_image=")
                   for item in line.split())
    # forward + backward of a real tiny model: some MFLOPs an image, a share of the peak in (0, 1]
    assert 1e-4 < float(figures["gflop_per_image"]) < 10
    assert float(figures["peak_gflops"]) > 0
    assert 0 < float(figures["share_of_peak"]) <= 1.0
    assert float(figures["achieved_gflops"]) == pytest.approx(
        float(figures["gflop_per_image"]) * _last_figure(out), rel=0.02, abs=0.05)


def test_bench_train_on_a_few_batches_times_them_after_a_pass_over_them(capsys, one_thread):
    assert main(["bench", "train", "--preset", "tiny", "--device", "cpu", "--images", "20",
                 "--set", "bench.pool=300", "bench.batches=2", "bench.flop_batches=0"]) == 0
    out = capsys.readouterr().out
    assert "timed_batches=2 " in out
    assert _last_figure(out) > 0


def test_bench_peak_times_a_matmul_on_this_process_threads(capsys, one_thread):
    assert main(["bench", "peak", "--threads", "1", "--size", "256"]) == 0
    out = capsys.readouterr().out
    assert "threads=1 matmul_size=256" in out
    # which kind of core: its model and the vector instructions torch's kernels use there
    assert f"processor='{cpu_description()}'" in out and torch.backends.cpu.get_cpu_capability() in out
    assert float(out.strip().splitlines()[-1].partition("=")[2]) > 0.1


def test_bench_decode_tiny_on_cpu_ends_with_images_per_second(capsys, one_thread):
    assert main(["bench", "decode", "--preset", "tiny", "--device", "cpu", "--images", "2",
                 "--set", "bench.pool=40", "data.eval_max_batch_size=2", "train.beam_size=2",
                 "train.max_decode_len=6", "bench.check_unbatched=2"]) == 0
    out = capsys.readouterr().out
    assert _last_figure(out) > 0
    assert "mean_hyp_tokens=" in out
    assert "unbatched_match=2/2" in out


def test_bench_settings_are_split_from_config_overrides():
    config, knobs = split_overrides(["train.lr=0.1", "bench.warmup=3", "bench.weights=run"])
    assert config == ["train.lr=0.1"]
    assert knobs["warmup"] == 3 and knobs["weights"] == "run"
    with pytest.raises(ValueError, match="bench.nonsense"):
        split_overrides(["bench.nonsense=1"])


def test_synthetic_sizes_follow_crohme():
    exprs = synthetic_expressions(400)
    heights = sorted(e.image.shape[0] for e in exprs)
    widths = sorted(e.image.shape[1] for e in exprs)
    lengths = sorted(len(e.tokens) for e in exprs)
    assert 70 <= heights[200] <= 125 and 170 <= widths[200] <= 340 and 6 <= lengths[200] <= 18
