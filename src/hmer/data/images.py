"""File contents to images: uint8 [H, W], white ink on black, as the encoder sees them.

An image file is decoded as grey (black-on-white images are inverted, a transparent
background is paper); an InkML file is rendered (`hmer.data.render`). A file that cannot be
read raises `ImageReadError` naming it.
"""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from .errors import ImageReadError
from .inkml import parse_inkml
from .render import RenderConfig, render_ink

# An input image above this is refused before it is decoded. A formula needs well under 1 MP
# (CROHME's are about 0.05 MP); a 100-MP scan would take minutes and gigabytes to decode and
# shrink, and is a mistake (the wrong file, or a page instead of a formula).
MAX_INPUT_PIXELS = 20_000_000


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
            if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
                # Transparent background: what shows through is paper, i.e. white.
                rgba = img.convert("RGBA")
                paper = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
                grey = Image.alpha_composite(paper, rgba).convert("L")
            else:
                grey = img.convert("L")
    except ImageReadError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise ImageReadError(f"{where}: not a readable image ({exc})") from None
    pixels = np.asarray(grey, dtype=np.uint8)
    if pixels.size == 0:
        raise ImageReadError(f"{where}: empty image")
    if pixels.mean() > 127:  # mostly white: black ink on paper
        pixels = 255 - pixels
    return np.ascontiguousarray(pixels)


def read_image(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an image file as uint8 [H, W], white ink on black; `ImageReadError` names the file."""
    path = Path(path)
    return decode_image(path.read_bytes(), str(path))


def file_to_image(data: bytes, filename: str, where: str, render_cfg: RenderConfig) -> np.ndarray:
    """The image an expression file stands for: rendered InkML, or the decoded image."""
    if filename.lower().endswith(".inkml"):
        return render_ink(parse_inkml(data, source=where), render_cfg)
    return decode_image(data, where)
