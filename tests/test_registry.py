"""Registries, and the proof that adding a variant touches one place: a decoder defined and
registered in this file alone is built by the factory, decoded by every search, trained by the
trainer and run as a one-cell study, then unregistered so that no other test sees it."""

from __future__ import annotations

import math
from csv import DictReader
from typing import Optional

import pandas as pd
import pytest
import torch
import torch.nn as nn
from mlflow.tracking import MlflowClient
from torch import Tensor

from hmer.cli import main
from hmer.config import Config
from hmer.decoding import decode_batch
from hmer.evaluation import expression_metrics
from hmer.model import Decoder, DecoderState, build_model, make_targets
from hmer.model.posenc import TokenEmbedding
from hmer.registry import DECODERS, METRICS, SEARCH_RULES, Registry
from hmer.tracking import keys
from tiny_dataset import make_images, tiny_config, tiny_data

TOY = "toy-glance"

# A one-epoch tiny model, short decoding, one test year (as tests/test_studies.py).
TINY = {"train.epochs": 1, "train.beam_size": 2, "train.max_decode_len": 12, "train.attention_maps": 0,
        "train.device": "cpu", "data.batch_pixels": 20_000, "data.max_batch_size": 8, "data.test_years": "2014"}


# ---- the registry itself ----------------------------------------------------------------------------

def test_a_registry_registers_looks_up_and_forgets_by_name():
    kinds = Registry("test.kind")

    @kinds.register("first", linked={"test.other": 1})
    def first():
        """The first one.

        More text that is not the description."""

    kinds.register("second", len, description="the built-in len")
    assert kinds.names() == ("first", "second") and list(kinds) == ["first", "second"] and len(kinds) == 2
    assert kinds.get("first") is first and "second" in kinds and "third" not in kinds
    assert kinds.description("first") == "The first one" and kinds.description("second") == "the built-in len"
    assert kinds.linked("first") == {"test.other": 1} and kinds.linked("second") == {}

    with pytest.raises(ValueError, match=r"^test.kind='third' is not one of first, second$"):
        kinds.get("third")
    with pytest.raises(ValueError, match="registered already"):
        kinds.register("first", print)
    kinds.unregister("first")
    assert kinds.names() == ("second",)
    with pytest.raises(ValueError, match="not one of second"):
        kinds.unregister("first")


def test_a_registry_imports_its_home_package_at_the_first_lookup():
    assert "transformer" in DECODERS and "hmer" in SEARCH_RULES and "exprate" in METRICS
    missing = Registry("test.kind", home="hmer.no_such_package")
    with pytest.raises(ModuleNotFoundError):
        missing.names()
    with pytest.raises(ModuleNotFoundError):  # tried again, not remembered as done
        missing.names()


def test_config_validation_reads_the_registries():
    with pytest.raises(ValueError, match=r"model.decoder='nope' is not one of .*transformer"):
        Config().override({"model.decoder": "nope"}).validate()
    with pytest.raises(ValueError, match=r"model.image_pos='nope' is not one of .*sin2d"):
        Config().override({"model.image_pos": "nope"}).validate()
    with pytest.raises(ValueError,
                       match="model.coverage='fusion', model.decoder='rnn': coverage 'fusion' needs a decoder"):
        Config().override({"model.decoder": "rnn", "model.coverage": "fusion"}).validate()


# ---- a decoder of this file's own --------------------------------------------------------------------

class GlanceDecoder(Decoder):
    """Toy decoder: each token glances at the image once; no memory of the prefix."""

    def __init__(self, cfg):
        super().__init__()
        self.embed = TokenEmbedding(cfg)
        self.query = nn.Linear(cfg.d_model, cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.vocab_size)

    def forward(self, feats: Tensor, feat_mask: Tensor, tgt_in: Tensor, tgt_pad_mask: Optional[Tensor] = None,
                return_attention: bool = False, start: int = 0):
        b, h, w, d = feats.shape
        x = self.embed(tgt_in, start=start)  # [B, L, d]
        memory = feats.reshape(b, h * w, d)
        scores = self.query(x) @ memory.transpose(1, 2) / math.sqrt(d)  # [B, L, h*w]
        attn = scores.masked_fill(feat_mask.reshape(b, 1, h * w), float("-inf")).softmax(dim=-1)
        logits = self.out(x + attn @ memory)
        return (logits, attn.view(b, -1, h, w)) if return_attention else logits

    # Each step needs only its own token and position: the state is the image, nothing else.
    def init_state(self, feats: Tensor, feat_mask: Tensor) -> DecoderState:
        return DecoderState(t=0, memory={"feats": feats, "mask": feat_mask})

    def step(self, state: DecoderState, tokens: Tensor) -> tuple[Tensor, DecoderState]:
        logits = self(state.rows("feats"), state.rows("mask"), tokens[:, None], start=state.t)[:, 0]
        return logits, DecoderState(t=state.t + 1, memory=state.memory, src_index=state.src_index)


@pytest.fixture
def toy_decoder():
    """GlanceDecoder registered as TOY (bringing learned token positions in a study), and gone after."""
    DECODERS.register(TOY, GlanceDecoder, linked={"model.token_pos": "learned"})
    yield TOY
    DECODERS.unregister(TOY)
    assert TOY not in DECODERS


def test_the_factory_builds_it_and_every_search_decodes_it(toy_decoder, capsys):
    torch.manual_seed(0)
    cfg = tiny_config(**{"model.decoder": toy_decoder})
    model = build_model(cfg).eval()
    assert isinstance(model.decoder, GlanceDecoder)

    images, mask = make_images([(24, 40), (32, 24)])
    tgt_in, tgt_out, _ = make_targets([[5, 6, 7], [8]], "l2r")
    teacher = model(images, mask, tgt_in)
    state = model.decoder.init_state(*model.encode(images, mask))
    for t in range(tgt_in.shape[1]):  # incremental decoding reproduces teacher forcing
        logits, state = model.decoder.step(state, tgt_in[:, t])
        torch.testing.assert_close(logits, teacher[:, t])
    assert model.attention_maps(images, mask, tgt_in).shape[:2] == tgt_in.shape

    for direction in ("l2r", "r2l", "bi"):
        for beam, rule in ((1, "hmer"), (3, "hmer"), (3, "bttr"), (3, "comer")):
            hyps = decode_batch(model, images, mask, direction, beam_size=beam, max_len=6, search_rule=rule)
            assert len(hyps) == 2 and all(len(h) <= 6 for h in hyps), (direction, beam, rule)

    assert main(["models"]) == 0  # `hmer models` lists it from the registry
    assert toy_decoder in capsys.readouterr().out


def test_the_trainer_trains_and_decodes_it(toy_decoder, tmp_path, monkeypatch):
    from hmer.training import train

    monkeypatch.setenv("HMER_MLRUNS", str(tmp_path / "mlruns"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    torch.set_num_threads(1)
    result = train(tiny_config(**{"model.decoder": toy_decoder, "train.epochs": 1}), data=tiny_data(),
                   tracking_uri=store, experiment="toy", run_dir=tmp_path / "ckpt")
    assert result.epochs == 1 and result.test_scores["2014"].n == 4
    run = MlflowClient(store).get_run(result.run_id)
    assert run.info.status == "FINISHED" and run.data.params["model.decoder"] == toy_decoder
    assert "test_2014_exprate" in run.data.metrics


@pytest.mark.slow
def test_a_one_cell_study_runs_it(toy_decoder, tmp_path, monkeypatch):
    from hmer.studies import StudySpec, run_grid_study

    monkeypatch.setenv("HMER_MLRUNS", str(tmp_path / "mlruns"))
    monkeypatch.setenv("HMER_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "mlruns").mkdir()
    tracking, storage = (f"sqlite:///{tmp_path / 'mlruns' / name}" for name in ("mlflow.db", "optuna.db"))
    torch.set_num_threads(1)
    spec = StudySpec(name="toy", description="the toy decoder alone", axes={"model.decoder": (toy_decoder,)},
                     model_presets={"tiny": "tiny-transformer"})
    outcome = run_grid_study(spec, "smoke", storage=storage, tracking_uri=tracking, data=tiny_data(), seeds=(1,),
                             overrides=TINY, study_name="toy-test", print_table=False)
    assert outcome.complete and outcome.n_complete == outcome.n_expected == 1

    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name("toy-test")
    runs = [r for r in client.search_runs([experiment.experiment_id])
            if r.data.tags.get(keys.ROLE) not in ("study", keys.ROLE_SUMMARY)]  # the trials
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    params = runs[0].data.params
    # What the registration links to the decoder comes with it in the study.
    assert params["model.decoder"] == toy_decoder and params["model.token_pos"] == "learned"


# ---- a metric of this file's own ---------------------------------------------------------------------

def test_a_metric_registered_here_is_logged_and_reported_under_its_name(tmp_path, monkeypatch, capsys):
    """The metric's one file is this one: training logs it, `hmer report --metric` takes it, and the
    report's tables carry its label and numbers, with its paired tests."""
    from hmer.evaluation.metrics import Metric
    from hmer.training import train

    le3 = METRICS.register("le3", Metric("≤3", lambda d: d <= 3), description="Within three token edits")

    monkeypatch.setenv("HMER_MLRUNS", str(tmp_path / "mlruns"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    torch.set_num_threads(1)
    try:
        scores = expression_metrics([["a"], ["a", "b", "c", "d"]], [["a"], ["x"]])
        assert scores.extra["le3"] == 50.0 and scores.exprate == 50.0
        assert scores.as_dict("test_2014")["test_2014_le3"] == 50.0
        # Two variants of one seed each: the second is tested against the first on the new metric.
        results = [train(tiny_config(**{"train.epochs": 1, "train.seed": seed}), data=tiny_data(), tracking_uri=store,
                         experiment="metric", run_dir=tmp_path / variant, tags={keys.VARIANT: variant})
                   for seed, variant in ((0, "first"), (1, "second"))]
        capsys.readouterr()
        out = tmp_path / "report"
        assert main(["report", "--experiment", "metric", "--metric", "le3", "--tracking-uri", store,
                     "--out", str(out)]) == 0
        printed = capsys.readouterr().out
    finally:
        METRICS.unregister("le3")
    assert "le3" not in expression_metrics([["a"]], [["a"]]).extra
    with pytest.raises(SystemExit) as exit_:  # gone from the choices with its registration
        main(["report", "--experiment", "metric", "--metric", "le3", "--tracking-uri", store])
    assert exit_.value.code == 2 and "invalid choice: 'le3'" in capsys.readouterr().err

    # The run logs it for validation and every test year, computed from the decoded predictions.
    client = MlflowClient(store)
    metrics = client.get_run(results[0].run_id).data.metrics
    for key, csv in (("test_2014", "predictions/test_2014.csv"), ("val_final", "split/val_predictions.csv")):
        with open(client.download_artifacts(results[0].run_id, csv, str(tmp_path))) as f:
            distances = [int(row["distance"]) for row in DictReader(f)]
        assert distances and metrics[f"{key}_le3"] == pytest.approx(le3.rate(distances))
    assert results[0].test_scores["2014"].extra["le3"] == pytest.approx(metrics["test_2014_le3"])

    # The report: its label heads a column of the scores and of the differences, tested on it.
    assert "ExpRate, ≤1, ≤2, ExpRate (lgeval), ≤1 (lgeval), ≤2 (lgeval) and ≤3 edits" in printed
    assert "2014 ≤3" in printed and "val ≤3" in printed
    assert "2014 Δ ≤3" in printed and "No predictions artifacts" not in printed
    table = pd.read_csv(out / "table.csv", index_col=0)
    first, second = (client.get_run(r.run_id).data.metrics["test_2014_le3"] for r in results)
    assert table.loc["first", "2014_le3_mean"] == pytest.approx(first)
    assert table.loc["second", "2014_le3_mean"] == pytest.approx(second)
    assert table.loc["second", "2014_delta"] == pytest.approx(second - first)  # paired: the same expressions
    assert 0.0 <= table.loc["second", "2014_p_mcnemar"] <= 1.0
    assert "test_2014_le3" in pd.read_csv(out / "runs.csv").columns
