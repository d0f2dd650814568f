"""File contents to images: uint8 [H, W], white ink on black, as the encoder sees them.

An image file is decoded as grey (black-on-white inverted; a transparent background is white
paper, or black where light ink would vanish on white); an InkML file is rendered. An unreadable
file raises `ImageReadError` naming it. `standard_like` makes a user's image what the standard
2014 images are (the run's evaluation reads them): two grey levels, cropped to the ink with their
margins, and for a photograph or scan (more than two grey levels) strokes as wide as theirs.

`read_expression_file` reads one expression from one file, strictly: what `hmer predict FILE...`
reads. An `.inkml` file is rendered as the training data is; an image is read as grey, made
`standard_like` and brought to the model's input size as the run's evaluation brings them
(`render.to_model_scale`), so that a standard image, or one drawn like them, reads as the run's own
scores were measured. Anything else, or an unreadable file, raises a `DataError` naming the file; an
image with no ink, a `NoInkError`.
"""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from .errors import DataError, ImageReadError, NoInkError
from .batching import Expression
from .inkml import parse_inkml, read_inkml
from .render import INK_LEVEL, RenderConfig, render_ink, to_model_scale
from .source import CONTENT_SUFFIXES, IMAGE_SUFFIXES

# Refused before decoding: a formula needs well under 1 MP (CROHME's about 0.05 MP); a 100-MP scan
# takes minutes and gigabytes, and is a mistake (the wrong file, or a page instead of a formula).
MAX_INPUT_PIXELS = 20_000_000

# The standard 2014 images, as measured over all 986 of the tarball (tests/test_standard_2014.py holds
# these to it): two grey levels, 0 and 255; the ink's bounding box with 12 px of paper above it and to
# its left and 11 px below and to its right; strokes `stroke_width` 3.1-4.3 px wide (3.66 the median);
# within the bounding box, at most 39 % of the pixels ink.
STANDARD_MARGINS = (12, 11, 12, 11)  # top, bottom, left, right
STANDARD_STROKE_PX = 3.66
MAX_INK_SHARE = 0.5  # more of the cropped picture than this is ink: a shadow or a texture, not handwriting


def decode_image(data: bytes, where: str) -> np.ndarray:
    """Image bytes -> uint8 [H, W] with white ink on black (black-on-white images are inverted)."""
    try:
        with warnings.catch_warnings():  # PIL's bomb warning: the size is checked here, on one line
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
        with img:
            width, height = img.size  # from the header, before anything is decoded
            if width * height > MAX_INPUT_PIXELS:
                raise ImageReadError(f"{where}: {width} x {height} pixels ({width * height / 1e6:.0f} MP) is more "
                                     f"than an input image may have ({MAX_INPUT_PIXELS / 1e6:.0f} MP); "
                                     f"crop or scale it to the formula")
            img.load()
            if width * height == 0:
                raise ImageReadError(f"{where}: empty image")
            if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
                # Transparent: on white paper, or on black where light ink would vanish on white.
                rgba = img.convert("RGBA")
                pixels = _on_paper(rgba, 255)
                if not has_ink(pixels):
                    pixels = _on_paper(rgba, 0)
            else:
                pixels = _white_ink(np.asarray(img.convert("L"), dtype=np.uint8))
    except ImageReadError:
        raise
    except Image.DecompressionBombError as exc:  # PIL's own refusal, past 179 MP: said as the limit here is
        raise ImageReadError(f"{where}: more pixels than an input image may have ({MAX_INPUT_PIXELS / 1e6:.0f} MP; "
                             f"{exc}); crop or scale it to the formula") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise ImageReadError(f"{where}: not a readable image ({exc})") from None
    return np.ascontiguousarray(pixels)


def _on_paper(rgba: Image.Image, paper: int) -> np.ndarray:
    """A transparent image put on paper of grey level `paper`, as white ink on black."""
    sheet = Image.new("RGBA", rgba.size, (paper, paper, paper, 255))
    return _white_ink(np.asarray(Image.alpha_composite(sheet, rgba).convert("L"), dtype=np.uint8))


def _white_ink(pixels: np.ndarray) -> np.ndarray:
    """Grey pixels as white ink on black: inverted when mostly white (black ink on paper)."""
    return 255 - pixels if pixels.mean() > 127 else pixels


def has_ink(pixels: np.ndarray) -> bool:
    """Whether a white-on-black image has a pixel brighter than `INK_LEVEL` (a blank page, a one-colour
    image or a single pixel has none)."""
    return bool((pixels > INK_LEVEL).any())


def standard_like(pixels: np.ndarray, where: str) -> np.ndarray:
    """A white-on-black image with ink made as the standard 2014 images are: two grey levels, cropped
    to the ink with their margins (a standard image stays as it is); an image of more levels (a photo,
    a scan) first made two at Otsu's threshold and scaled to their stroke width. ImageReadError
    naming `where` when more than MAX_INK_SHARE of the cropped picture is ink (uneven light, a shadow,
    a textured paper): it would be read as noise."""
    grey = len(np.unique(pixels)) > 2
    ink = pixels > (_otsu_threshold(pixels) if grey else INK_LEVEL)
    ink = _cropped(ink, _despeckled(ink) if grey else ink)
    share = ink.mean()
    if share > MAX_INK_SHARE:
        raise ImageReadError(f"{where}: {share:.0%} of the picture, cropped to what reads as ink, is ink, where a "
                             f"handwritten formula has at most {MAX_INK_SHARE:.0%}: uneven light, a shadow or a "
                             f"textured paper? Photograph it on evenly lit plain paper, cropped to the formula")
    if grey:
        ink = _scaled(ink, STANDARD_STROKE_PX / stroke_width(ink))
        ink = _cropped(ink, ink)
    top, bottom, left, right = STANDARD_MARGINS
    return np.pad(ink.astype(np.uint8) * 255, ((top, bottom), (left, right)))


def stroke_width(ink: np.ndarray) -> float:
    """The strokes' width in px of a boolean ink mask: its area over half its edge pixels (a stroke of
    width w and length L has w L pixels, 2 L of them on its edges)."""
    padded = np.pad(ink, 1)
    inner = ink & padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:]
    edge = int(ink.sum()) - int(inner.sum())
    return 2 * float(ink.sum()) / max(edge, 1)


def _otsu_threshold(pixels: np.ndarray) -> int:
    """The grey level splitting the histogram into paper and ink with the least variance within each
    (Otsu, 1979)."""
    counts = np.bincount(pixels.ravel(), minlength=256).astype(np.float64)
    levels = np.arange(256)
    below = np.cumsum(counts)
    mass = np.cumsum(counts * levels)
    total, total_mass = below[-1], mass[-1]
    above = total - below
    with np.errstate(divide="ignore", invalid="ignore"):
        between = (total_mass * below - total * mass) ** 2 / (below * above)
    return int(np.nanargmax(between[:-1]))


def _despeckled(ink: np.ndarray) -> np.ndarray:
    """The ink without the lone specks of noise (a 3x3 median), for finding where the formula is."""
    from PIL import ImageFilter

    mask = Image.fromarray(ink.astype(np.uint8) * 255).filter(ImageFilter.MedianFilter(3))
    return np.asarray(mask) > INK_LEVEL


def _cropped(ink: np.ndarray, where: np.ndarray) -> np.ndarray:
    """`ink` cropped to the bounding box of `where` (the whole of it where `where` is empty)."""
    rows, cols = np.nonzero(where)
    if not len(rows):
        return ink
    return ink[rows.min():rows.max() + 1, cols.min():cols.max() + 1]


def _scaled(ink: np.ndarray, factor: float) -> np.ndarray:
    """A boolean mask scaled by `factor` (bilinear, then two levels again at half)."""
    height, width = ink.shape
    size = (max(1, round(width * factor)), max(1, round(height * factor)))
    scaled = Image.fromarray(ink.astype(np.uint8) * 255).resize(size, Image.Resampling.BILINEAR)
    return np.asarray(scaled) > INK_LEVEL


def read_image(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an image file as uint8 [H, W], white ink on black; `ImageReadError` names the file."""
    path = Path(path)
    return decode_image(path.read_bytes(), str(path))


def file_to_image(data: bytes, filename: str, where: str, render_cfg: RenderConfig) -> np.ndarray:
    """The image an expression file stands for: rendered InkML, or the decoded image."""
    if filename.lower().endswith(".inkml"):
        return render_ink(parse_inkml(data, source=where), render_cfg)
    return decode_image(data, where)


def check_expression_file(path: str | os.PathLike[str]) -> Path:
    """The cheap checks of `read_expression_file` (suffix, existence), without reading the file."""
    path = Path(path)
    suffix = path.suffix.lower()
    if path.is_dir():
        raise DataError(f"{path}: a folder, not a file: give the image or InkML files in it")
    if suffix not in CONTENT_SUFFIXES:
        raise DataError(f"{path}: not an InkML or image file (expected {', '.join(CONTENT_SUFFIXES)})")
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    return path


def read_expression_file(path: str | os.PathLike[str], render_cfg: RenderConfig | None = None) -> Expression:
    """An `Expression` without tokens, named by the file's stem; a `NoInkError` when its image has no
    ink (a model reads something into a blank page)."""
    path = check_expression_file(path)
    suffix = path.suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        image = read_image(path)
        if has_ink(image):
            image = to_model_scale(standard_like(image, str(path)), render_cfg or RenderConfig())
    else:
        image = render_ink(read_inkml(path), render_cfg or RenderConfig())
    if not has_ink(image):
        height, width = image.shape
        raise NoInkError(f"{path}: no ink: none of its {width} x {height} pixels stands out from the paper past "
                         f"mid-grey (a blank or one-colour image): nothing to read, so no prediction")
    return Expression(name=path.stem, tokens=[], image=image)
