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


# ---- renderer augmentation and the second style (hmer.data.augment) ----------------------------------

from hmer.data.augment import AugmentConfig, augmented_image, val_alt_render_config  # noqa: E402

AT_64 = RenderConfig(height=64)


def _redraw(aug: AugmentConfig, seed: int = 0, strokes=None, render: RenderConfig = AT_64) -> np.ndarray:
    return augmented_image(strokes or glyph_strokes(3), render, aug, np.random.default_rng(seed))


def test_augmentation_with_neutral_options_redraws_the_cached_image_byte_for_byte():
    assert _redraw(AugmentConfig(share=1.0)).tobytes() == render_ink(glyph_strokes(3), AT_64).tobytes()


def test_augmentation_is_seeded_and_takes_the_same_draws_whatever_is_on():
    aug = AugmentConfig(share=1.0, width_min=0.5, width_max=1.5, pressure=0.3, antialias=0.5, downscale=0.5,
                        blur=1.0, slant=10, rotate=3, jitter=0.5, elastic=2)
    assert _redraw(aug, 4).tobytes() == _redraw(aug, 4).tobytes()
    assert len({_redraw(aug, seed).tobytes() for seed in range(6)}) == 6
    # the generator ends in the same state with every option on or off, so switching one option
    # does not shift the draws of the images after it
    states = []
    for options in (AugmentConfig(share=1.0), aug):
        rng = np.random.default_rng(9)
        augmented_image(glyph_strokes(3), AT_64, options, rng)
        states.append(rng.random())
    assert states[0] == states[1]


def _ink_mass(image: np.ndarray) -> float:
    return float(image.sum()) / 255.0


@pytest.mark.parametrize("options, check", [
    (dict(width_min=2.0, width_max=2.0), lambda img, base: _ink_mass(img) > 1.3 * _ink_mass(base)),
    (dict(width_min=0.34, width_max=0.34), lambda img, base: _ink_mass(img) < 0.7 * _ink_mass(base)),
    (dict(antialias=1.0), lambda img, base: ((img > 0) & (img < 255)).any()),
    (dict(blur=2.0), lambda img, base: ((img > 0) & (img < 255)).mean() > 0.05),
    (dict(downscale=1.0), lambda img, base: img.shape[0] == 64 and ((img > 0) & (img < 255)).any()),
    (dict(pressure=0.5), lambda img, base: img.tobytes() != base.tobytes()),
    (dict(slant=20.0), lambda img, base: img.shape[1] != base.shape[1] or img.tobytes() != base.tobytes()),
    (dict(rotate=10.0), lambda img, base: img.tobytes() != base.tobytes()),
    (dict(jitter=1.0), lambda img, base: img.tobytes() != base.tobytes()),
    (dict(elastic=3.0), lambda img, base: img.tobytes() != base.tobytes()),
])
def test_each_augmentation_option_changes_the_drawing(options, check):
    base = render_ink(glyph_strokes(3), AT_64)
    image = _redraw(AugmentConfig(share=1.0, **options))
    assert image.dtype == np.uint8 and image.ndim == 2 and image.max() > 0
    assert check(image, base)


def test_augmentation_options_come_from_the_config_and_are_checked():
    from hmer.config import Config

    cfg = Config().override({"data.aug_share": 0.5, "data.aug_width_min": 0.5, "data.aug_width_max": 1.5,
                             "data.aug_slant": 8.0}).validate()
    aug = AugmentConfig.from_data_config(cfg.data)
    assert aug.enabled and (aug.share, aug.width_min, aug.width_max, aug.slant) == (0.5, 0.5, 1.5, 8.0)
    assert not AugmentConfig.from_data_config(DataConfig()).enabled  # off by default
    for bad, match in (({"data.aug_share": 1.5}, "aug_share"), ({"data.aug_blur": -1.0}, "aug_blur"),
                       ({"data.aug_width_min": 2.0, "data.aug_width_max": 1.0}, "aug_width_min"),
                       ({"data.val_alt": "fancy"}, "val_alt")):
        with pytest.raises(ValueError, match=match):
            Config().override(bad).validate()


def test_the_standard_like_style_is_drawn_at_its_own_scale_then_scaled_down():
    strokes = glyph_strokes(3) + [s + [0.0, 80.0] for s in glyph_strokes(3)]  # two rows, as a fraction
    native = render_ink(strokes)
    assert native.shape[0] > 64
    like = RenderConfig.from_data_config(DataConfig(render_height=64, render_style="standard-like"))
    assert like.downscale and like.height == 64
    image = render_ink(strokes, like)
    assert image.shape == (64, round(native.shape[1] * 64 / native.shape[0]))
    # thinner and grey at the training height, unlike the binary 3-px renderings at 64 px
    assert ((image > 0) & (image < 255)).any()
    assert _ink_mass(image) < 0.8 * _ink_mass(render_ink(strokes, AT_64))
    # the cache key of the default style is what it was before the style existed
    assert "downscale" not in RenderConfig().key() and like.key()["downscale"] is True
    # data.val_alt draws validation in the named style, with the run's other renderer settings
    assert val_alt_render_config(DataConfig(render_height=64, val_alt="standard-like")) == like
    assert val_alt_render_config(DataConfig(render_height=64, render_style="standard-like",
                                            val_alt="direct")) == AT_64
    # augmentation's downscale draws the same image when nothing else is on
    assert _redraw(AugmentConfig(share=1.0, downscale=1.0), strokes=strokes).tobytes() == image.tobytes()


def test_per_stroke_widths_must_match_the_strokes():
    with pytest.raises(ValueError, match="2 stroke widths for 3 strokes"):
        render_ink(glyph_strokes(4), stroke_widths=[3.0, 3.0])


def test_the_render_scale_draws_every_expression_at_one_multiple_of_the_ink_s_own_scale():
    """`data.render_scale`: a symbol keeps one size whatever the expression, unlike a fixed height,
    which shrinks a two-row expression more than a one-row one."""
    one_row = glyph_strokes(3)
    two_rows = one_row + [s + [0.0, 80.0] for s in one_row]
    half = RenderConfig.from_data_config(DataConfig(render_scale=0.5))
    assert half.scale == 0.5 and not half.downscale and "scale" not in RenderConfig().key()
    # direct: drawn at half the ink's own scale with the suite's pen
    assert ink_scale(one_row, half) == pytest.approx(ink_scale(one_row) / 2)
    assert render_ink(two_rows, half).shape[0] > render_ink(one_row, half).shape[0] + 20
    # standard-like: drawn at the ink's own scale, then halved bilinearly, as the standard images reach the model
    like = RenderConfig.from_data_config(DataConfig(render_scale=0.5, render_style="standard-like"))
    native = render_ink(two_rows)
    image = render_ink(two_rows, like)
    assert image.shape == tuple(round(n / 2) for n in native.shape)
    assert ((image > 0) & (image < 255)).any()
    # augmentation's downscale draws the same image when nothing else is on
    assert _redraw(AugmentConfig(share=1.0, downscale=1.0), strokes=two_rows, render=like).tobytes() == image.tobytes()


def test_a_render_scale_with_a_fixed_height_is_refused_naming_both_keys():
    from hmer.config import Config, ConfigError

    with pytest.raises(ConfigError, match="data.render_scale.*data.render_height"):
        Config().override({"data.render_height": 48, "data.render_scale": 0.5})
    with pytest.raises(ConfigError, match="data.render_scale"):
        Config().override({"data.render_scale": 5})
