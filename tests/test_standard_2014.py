"""The standard 2014 images (the WAP authors' renderings) scored beside the suite's own renderings:
`hmer evaluate RUN --standard-2014 --log` records them in the run as the split `2014-std`, which
reports show as a column of its own (issue 12)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from hmer.data.render import RenderConfig
from hmer.data.source import parse_captions
from hmer.data.source import open_source
from hmer.data.standard import STANDARD_2014, standard_2014_expressions
from hmer.reports.runs import load_runs, scored_years
from hmer.reports.tables import format_table, variant_table
from hmer.training import train
from tiny_dataset import tiny_config, tiny_data

pytestmark = pytest.mark.shared_data


def _captions_2014(crohme_data, n: int) -> dict[str, list[str]]:
    with open_source(crohme_data) as source:
        return {c.name: c.tokens for c in parse_captions(source.caption_text("2014"), "2014")[:n]}


def test_standard_images_are_scaled_to_the_rendering_height(crohme_data, standard_2014_images):
    captions = _captions_2014(crohme_data, 5)
    exprs = standard_2014_expressions(standard_2014_images, captions, RenderConfig(height=64))
    assert [e.name for e in exprs] == list(captions) and all(e.image.shape[0] == 64 for e in exprs)
    assert [e.tokens for e in exprs] == list(captions.values())
    as_they_are = standard_2014_expressions(standard_2014_images, captions)
    assert any(e.image.shape[0] != 64 for e in as_they_are)
    with pytest.raises(FileNotFoundError, match="no standard image"):
        standard_2014_expressions(standard_2014_images, {"no_such_expression": ["x"]})


def test_standard_images_are_scaled_by_the_render_scale(crohme_data, standard_2014_images):
    """At `data.render_scale` the standard images reach a model scaled by that factor, as the
    suite's renderings at that scale are drawn: a symbol keeps one size across expressions."""
    captions = _captions_2014(crohme_data, 5)
    as_they_are = standard_2014_expressions(standard_2014_images, captions)
    scaled = standard_2014_expressions(standard_2014_images, captions, RenderConfig(scale=0.5))
    for before, after in zip(as_they_are, scaled):
        assert after.image.shape == tuple(max(1, round(n * 0.5)) for n in before.image.shape)


def test_the_standard_images_are_what_a_user_s_image_is_made_and_are_left_as_they_are(standard_2014_images):
    """`images.standard_like` (what `hmer predict` makes of a user's image) holds the tarball's own
    measures: all 986 images are two levels, their ink within the standard margins, their strokes about
    `STANDARD_STROKE_PX` wide, so that each standard image given to `hmer predict` is read as it is."""
    import numpy as np

    from hmer.data.images import INK_LEVEL, STANDARD_STROKE_PX, standard_like, stroke_width
    from hmer.data.standard import iter_standard_images

    widths, changed = [], []
    for name, image in iter_standard_images(standard_2014_images):
        assert set(np.unique(image)) == {0, 255}, name
        if not np.array_equal(standard_like(image, name), image):
            changed.append(name)
        widths.append(stroke_width(image > INK_LEVEL))
    assert len(widths) == 986 and not changed, changed[:5]
    assert np.median(widths) == pytest.approx(STANDARD_STROKE_PX, abs=0.01)


def test_evaluate_logs_the_standard_images_as_their_own_column(crohme_data, standard_2014_images, tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = train(tiny_config(**{"train.epochs": 1}), data=tiny_data(), tracking_uri=store,
                   run_dir=tmp_path / "run").run_id
    proc = subprocess.run([sys.executable, "-m", "hmer.cli", "evaluate", run_id, "--tracking-uri", store,
                           "--data", str(crohme_data), "--years", "2014", "--limit", "4",
                           "--standard-2014", str(standard_2014_images), "--log"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert STANDARD_2014 in proc.stdout and f"recorded in run {run_id}" in proc.stdout
    metrics = MlflowClient(store).get_run(run_id).data.metrics
    assert metrics[f"test_{STANDARD_2014}_n"] == 4 and f"test_{STANDARD_2014}_exprate" in metrics
    artifacts = {a.path for a in MlflowClient(store).list_artifacts(run_id, "predictions")}
    assert f"predictions/test_{STANDARD_2014}.csv" in artifacts
    assert scored_years(load_runs(store, run_ids=[run_id])) == ["2014", STANDARD_2014]
    refused = subprocess.run([sys.executable, "-m", "hmer.cli", "evaluate", run_id, "--tracking-uri", store,
                              "--data", str(crohme_data), "--years", "2014", "--limit", "4", "--beam", "3",
                              "--log"], capture_output=True, text=True)
    assert refused.returncode == 2 and "--log records only the run's own decoding" in refused.stderr


def test_a_run_scores_the_standard_images_and_the_restyled_validation_at_its_end(crohme_data, standard_2014_images,
                                                                                tmp_path):
    # Real CROHME ink: the training images are redrawn from their strokes (data.aug_*), validation
    # is drawn a second time in the standard-like style, and the final evaluation scores the
    # standard images of the same 2014 expressions beside 2014 (issue 26).
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = tiny_config(**{
        "train.epochs": 1, "data.path": str(crohme_data), "data.render_height": 32,
        "data.train_limit": 16, "data.val_limit": 4, "data.test_limit": 3, "data.val_alt": "standard-like",
        "data.aug_share": 0.5, "data.aug_width_min": 0.5, "data.aug_width_max": 1.5, "data.aug_downscale": 0.5,
        "data.aug_slant": 5.0, "data.aug_jitter": 0.3})
    result = train(cfg, tracking_uri=store, run_dir=tmp_path / "run")
    metrics = MlflowClient(store).get_run(result.run_id).data.metrics
    assert metrics[f"test_{STANDARD_2014}_n"] == metrics["test_2014_n"] == 3
    assert metrics["val-alt_final_n"] == metrics["val_final_n"] == 4
    assert list(result.test_scores) == ["2014", STANDARD_2014]
    artifacts = {a.path for a in MlflowClient(store).list_artifacts(result.run_id, "split")}
    assert "split/val-alt_predictions.csv" in artifacts
    runs = load_runs(store, run_ids=[result.run_id])
    assert scored_years(runs) == ["2014", STANDARD_2014]
    # the report shows the restyled validation beside validation
    table = variant_table(runs.assign(variant="tiny"))
    assert table.loc["tiny", "val_alt_exprate_mean"] == pytest.approx(metrics["val-alt_final_exprate"])
    assert "val-alt ExpRate" in format_table(table)
    assert "val-alt" not in format_table(variant_table(runs.drop(columns="metrics.val-alt_final_exprate")
                                                            .assign(variant="tiny")))


def test_the_redrawn_epoch_is_reproducible_and_differs_from_the_cached_images(crohme_data):
    import numpy as np
    import torch

    from hmer.config import DataConfig
    from hmer.data import RenderConfig, Vocab, load_dataset, make_batches
    from hmer.data.augment import AugmentConfig, load_strokes
    from hmer.training.loader import Redraw, train_batches

    data_cfg = DataConfig(render_height=32, train_limit=12)
    train_set = load_dataset(crohme_data, data_cfg, splits=("train",))["train"]
    with open_source(crohme_data) as source:
        strokes = load_strokes(source, "train", [e.name for e in train_set])
    batches = make_batches(train_set, 20_000, 4, shuffle=True, seed=1)
    aug = AugmentConfig(share=1.0, width_min=0.5, width_max=1.5, blur=1.0, rotate=3.0)

    def epoch(prefetch: int, redraw: bool = True):
        red = Redraw(strokes, RenderConfig.from_data_config(data_cfg), aug, np.random.default_rng([7, 1, 1])) \
            if redraw else None
        return [tb.batch.images for tb in train_batches(train_set, batches, Vocab(), "l2r", torch.device("cpu"),
                                                        prefetch=prefetch, redraw=red)]

    first, again, ahead, plain = epoch(0), epoch(0), epoch(2), epoch(0, redraw=False)
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(first, again, ahead))
    assert any(a.shape != p.shape or not torch.equal(a, p) for a, p in zip(first, plain))


def test_the_sweep_searches_its_whole_space_on_ink(crohme_data, tmp_path, monkeypatch):
    # The sweep's renderer augmentation and second validation style redraw strokes, so its whole
    # space runs only on InkML: one trial on a few real expressions, scored on both styles.
    import optuna

    from hmer.studies import STUDIES, run_sweep
    from hmer.studies.sweeps import sweep_objective  # noqa: F401  (the objective the value comes from)

    sweep = STUDIES.get("sweep")
    monkeypatch.setenv("HMER_MLRUNS", str(tmp_path / "mlruns"))
    storage, store = f"sqlite:///{tmp_path / 'optuna.db'}", f"sqlite:///{tmp_path / 'mlflow.db'}"
    outcome = run_sweep(sweep, "smoke", storage=storage, tracking_uri=store, data_path=str(crohme_data),
                        n_trials=1, study_name="sweep-ink", overrides={
                            "data.train_limit": 16, "data.val_limit": 4, "train.epochs": 1, "train.beam_size": 2,
                            "train.max_decode_len": 12, "train.attention_maps": 0, "train.device": "cpu"})
    assert outcome.complete
    (trial,) = optuna.load_study(study_name="sweep-ink", storage=storage).trials
    assert set(trial.params) == {p.name for p in sweep.params}
    (run,) = MlflowClient(store).search_runs(
        [MlflowClient(store).get_experiment_by_name("sweep-ink").experiment_id], "tags.`hmer.trial` = '0'")
    metrics = run.data.metrics
    assert not any(key.startswith("test_") for key in metrics)  # a sweep reads no test year
    if trial.params["data.render_style"] == sweep.fixed["data.val_alt"]:  # validation is already drawn so
        assert "val-alt_final_n" not in metrics and metrics["val_final_n"] == 4
        assert trial.value == pytest.approx(metrics["val_final_exprate"])
    else:
        assert metrics["val-alt_final_n"] == metrics["val_final_n"] == 4
        assert trial.value == pytest.approx((metrics["val_final_exprate"] + metrics["val-alt_final_exprate"]) / 2)


@pytest.mark.parametrize("render_style, val_alt, restyled", [("direct", "standard-like", True),
                                                              ("standard-like", "direct", True),
                                                              ("standard-like", "standard-like", False)])
def test_validation_is_drawn_again_only_in_another_style(crohme_data, render_style, val_alt, restyled):
    # A run drawn in the data.val_alt style would decode the same images twice and log the same
    # scores under val-alt: it has no second validation (real CROHME ink, drawn by the renderer).
    import numpy as np
    import torch

    from hmer.training.distributed import DistInfo
    from hmer.training.setup import build

    cfg = tiny_config(**{"data.path": str(crohme_data), "data.render_height": 32, "data.train_limit": 4,
                         "data.val_limit": 3, "data.test_limit": 2, "data.test_years": "2014",
                         "data.render_style": render_style, "data.val_alt": val_alt})
    data = build(cfg, None, torch.device("cpu"), DistInfo()).data
    assert ("val-alt" in data) == restyled
    if restyled:
        assert [e.name for e in data["val-alt"]] == [e.name for e in data["val"]]
        assert not any(np.array_equal(a.image, b.image) for a, b in zip(data["val-alt"], data["val"]))
