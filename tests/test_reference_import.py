"""`hmer import` of a golden BTTR / CoMER checkpoint, then `hmer evaluate`, `hmer predict` and
`hmer report` on the run it made, end to end through the command line, with a real MLflow store."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from hmer.cli import main
from hmer.config import Config
from hmer.decoding import decode_batch
from hmer.decoding.reference_search import reference_decode
from conftest import PEERS, peers_or_skip
from hmer.model import build_model
from tiny_dataset import write_dataset



@pytest.fixture
def env(tmp_path, monkeypatch, one_thread):
    peers_or_skip()
    monkeypatch.setenv("HMER_MLRUNS", str(tmp_path / "mlruns"))
    monkeypatch.setenv("HMER_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    data = write_dataset(tmp_path / "data")
    return {"data": str(data), "store": f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}", "tmp": tmp_path}


def _only_run(store: str):
    mlflow.set_tracking_uri(store)
    runs = mlflow.search_runs(experiment_names=["hmer"])
    assert len(runs) == 1
    return runs.iloc[0]


def test_import_evaluate_predict_report(env, capsys):
    assert main(["import", str(PEERS / "comer_fusion.ckpt"), "--years", "2014", "--limit", "2",
                 "--data", env["data"], "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    run = _only_run(env["store"])
    run_id = run["run_id"]
    assert run_id in out and "comer-fusion" in out and "\\Pi" in out  # the appended symbol is reported
    assert run["params.train.search_rule"] == "comer" and run["params.model.mask_padding"] == "False"
    assert run["tags.hmer.status"] == "finished" and "metrics.test_2014_exprate" in run
    client = MlflowClient(env["store"])
    assert client.get_registered_model("comer-fusion-reference").latest_versions[0].run_id == run_id

    assert main(["evaluate", run_id, "--data", env["data"], "--years", "2014", "--limit", "2",
                 "--device", "cpu"]) == 0
    assert "2014" in capsys.readouterr().out
    assert main(["evaluate", run_id, "--data", env["data"], "--years", "2014", "--limit", "1",
                 "--device", "cpu", "--search-rule", "hmer"]) == 0  # the project's rule on the same weights
    assert "2014" in capsys.readouterr().out

    image = Path(env["data"]) / "2014" / "2014_0.png"
    assert main(["predict", run_id, str(image), "--device", "cpu"]) == 0
    assert capsys.readouterr().out.count("\n") == 1

    report_dir = env["tmp"] / "report"
    assert main(["report", "--runs", run_id, "--out", str(report_dir)]) == 0
    assert any(run_id[:8] in p.read_text() or "comer-fusion" in p.read_text()
               for p in report_dir.glob("*.md"))


def test_a_file_that_is_no_reference_checkpoint_is_one_line(env, capsys, tmp_path):
    import torch

    not_lightning = tmp_path / "other.ckpt"
    torch.save({"state_dict": {"encoder.weight": torch.zeros(1)}}, not_lightning)
    assert main(["import", str(not_lightning)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "neither a BTTR" in err and "other.ckpt" in err


def test_search_rule_reaches_decode_batch(one_thread):
    """decode_batch with a reference rule returns that rule's best, in left-to-right order."""
    import torch

    torch.manual_seed(0)
    model = build_model("tiny-comer").eval()
    with torch.no_grad():
        model.decoder.out.bias[1:3] += 3.0  # random weights: make the searches finish early
    images = torch.rand(2, 1, 32, 48)
    mask = torch.zeros(2, 32, 48, dtype=torch.bool)
    mask[1, :, 40:] = True
    for rule in ("bttr", "comer"):
        for direction in ("bi", "r2l"):
            got = decode_batch(model, images, mask, direction, beam_size=3, max_len=8, search_rule=rule)
            feats, feat_mask = model.encode(images, mask)
            want = reference_decode(model, feats, feat_mask, rule, direction, 1, 2, 3, 8, 1.0)
            assert got == [r.best.tokens for r in want]
    with pytest.raises(ValueError, match="train.search_rule"):
        Config().override({"train.search_rule": "greedy"}).validate()
