"""One expression from one file, strictly: what `hmer predict FILE...` reads.

An `.inkml` file is rendered as the training data is; an image is read as grey (inverted when black
on white), made what the standard 2014 images are (`images.standard_like`) and brought to the
model's input size as the run's evaluation brings them (`render.to_model_scale`), so that a standard
image, or one drawn like them, reads as the run's own scores were measured. Anything else, or an
unreadable file, raises a `DataError` naming the file; an image with no ink, a `NoInkError`.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import DataError, NoInkError
from .expression import Expression
from .images import has_ink, read_image, standard_like
from .inkml import read_inkml
from .render import RenderConfig, render_ink, to_model_scale
from .source import CONTENT_SUFFIXES, IMAGE_SUFFIXES


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
