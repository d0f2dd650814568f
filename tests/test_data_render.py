"""The renderer: deterministic, scale-free, configurable, and in the standard images' style."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conftest import glyph_strokes
from hmer.config import DataConfig
from hmer.data import RenderConfig, parse_inkml, render_ink
from hmer.data.render import ink_scale


def test_same_strokes_give_the_same_bytes():
    strokes = glyph_strokes(3)
    first, second = render_ink(strokes), render_ink([s.copy() for s in strokes])
    assert first.dtype == np.uint8 and first.ndim == 2
    assert first.tobytes() == second.tobytes()


def test_white_binary_ink_on_black_with_a_blank_margin():
    image = render_ink(glyph_strokes(1))
    assert set(np.unique(image).tolist()) == {0, 255}
    assert (image == 255).mean() < 0.5  # ink is the minority: white on black
    rows, cols = np.nonzero(image)
    cfg = RenderConfig()
    assert rows.min() >= cfg.padding - 1 and cols.min() >= cfg.padding - 1
    assert image.shape[0] - 1 - rows.max() >= cfg.padding - 1
    assert image.shape[1] - 1 - cols.max() >= cfg.padding - 1


@pytest.mark.parametrize("factor", [1000.0, 0.001, 37.3])
def test_coordinate_scale_does_not_change_the_image(factor):
    strokes = glyph_strokes(2)
    reference = render_ink(strokes)
    scaled = render_ink([s * factor for s in strokes])
    assert scaled.shape == reference.shape
    assert scaled.tobytes() == reference.tobytes()


def test_translation_does_not_change_the_image():
    strokes = glyph_strokes(4)
    assert render_ink([s + 12345.0 for s in strokes]).tobytes() == render_ink(strokes).tobytes()


def test_stroke_height_sets_the_scale():
    # Two strokes 50 and 100 units tall: their mean (75) becomes stroke_height pixels.
    strokes = [np.array([[0, 0], [0, 50]]), np.array([[20, 0], [20, 100]])]
    assert ink_scale(strokes) == pytest.approx(RenderConfig().stroke_height / 75)
    # A flat stroke (below 10 % of the tallest) does not drag the mean down.
    assert ink_scale(strokes + [np.array([[40, 50], [80, 51]])]) == pytest.approx(RenderConfig().stroke_height / 75)


def test_fixed_height_and_stroke_width_are_configurable():
    strokes = glyph_strokes(5)
    assert render_ink(strokes, RenderConfig(height=64)).shape[0] == 64
    thin = (render_ink(strokes, RenderConfig(stroke_width=1)) > 0).sum()
    thick = (render_ink(strokes, RenderConfig(stroke_width=5)) > 0).sum()
    assert thick > 2 * thin


def test_from_data_config_zero_means_default():
    assert RenderConfig.from_data_config(DataConfig()) == RenderConfig()
    custom = RenderConfig.from_data_config(DataConfig(render_height=80, stroke_width=2.0))
    assert custom.height == 80 and custom.stroke_width == 2.0
    assert custom.key() != RenderConfig().key()


def test_antialiased_mode_has_grey_edges_and_is_deterministic():
    cfg = RenderConfig(antialias=True)
    image = render_ink(glyph_strokes(6), cfg)
    assert len(np.unique(image)) > 2
    assert image.tobytes() == render_ink(glyph_strokes(6), cfg).tobytes()
    assert image.shape == render_ink(glyph_strokes(6)).shape


def test_oversize_ink_is_clamped_keeping_the_aspect():
    long_line = [np.array([[0, 0], [0, 10]]), np.array([[0, 0], [100_000, 0]])]
    cfg = RenderConfig()
    image = render_ink(long_line, cfg)
    assert image.shape[1] <= cfg.max_width and image.shape[0] <= cfg.max_height
    small = dataclasses.replace(cfg, max_width=300)
    assert render_ink(long_line, small).shape[1] <= 300


@pytest.mark.parametrize("strokes", [
    [np.array([[5.0, 5.0]])],                          # one dot
    [np.array([[0.0, 0.0], [50.0, 0.0]])],             # a lone minus sign: no height at all
    [np.array([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])],  # a pen that never moved
])
def test_degenerate_ink_still_renders_a_mark(strokes):
    image = render_ink(strokes)
    assert image.max() == 255 and image.shape[0] >= 1


def test_no_points_is_an_error():
    with pytest.raises(ValueError, match="nothing to render"):
        render_ink([np.zeros((0, 2))])


def test_renders_an_ink_object():
    doc = "<ink><trace>0 0, 10 10</trace><trace>20 0, 20 10</trace></ink>"
    ink = parse_inkml(doc.encode())
    assert render_ink(ink).tobytes() == render_ink(ink.strokes).tobytes()
