"""File contents to images: uint8 [H, W], white ink on black, as the encoder sees them.

An image file is decoded as grey (black-on-white images are inverted, a transparent
background is paper: white, or black where light ink would vanish on white); an InkML file is
rendered (`hmer.data.render`). A file that cannot be read raises `ImageReadError` naming it;
`has_ink` says whether an image has anything to read.
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
from .render import INK_LEVEL, RenderConfig, render_ink

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
            if width * height == 0:
                raise ImageReadError(f"{where}: empty image")
            if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
                # A transparent background shows the paper it is put on: white, as a page shows it;
                # but light ink on it (white on transparent, drawn for a dark page) vanishes there,
                # so where nothing is then ink, on black, as a dark page shows it.
                rgba = img.convert("RGBA")
                pixels = _on_paper(rgba, 255)
                if not has_ink(pixels):
                    pixels = _on_paper(rgba, 0)
            else:
                pixels = _white_ink(np.asarray(img.convert("L"), dtype=np.uint8))
    except ImageReadError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
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
    """Whether a white-on-black image has any ink: a pixel brighter than the renderer's `INK_LEVEL`.
    A blank page, a one-colour image or a single pixel has none (the paper is whatever most of it is)."""
    return bool((pixels > INK_LEVEL).any())


def read_image(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an image file as uint8 [H, W], white ink on black; `ImageReadError` names the file."""
    path = Path(path)
    return decode_image(path.read_bytes(), str(path))


def file_to_image(data: bytes, filename: str, where: str, render_cfg: RenderConfig) -> np.ndarray:
    """The image an expression file stands for: rendered InkML, or the decoded image."""
    if filename.lower().endswith(".inkml"):
        return render_ink(parse_inkml(data, source=where), render_cfg)
    return decode_image(data, where)
