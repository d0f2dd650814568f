"""The data layer: CROHME InkML in, batches of images and token ids out.

    read_inkml -> Ink            strokes, truth and symbol segmentation of one InkML file
    render_ink -> uint8 image    white ink on black, scaled like the standard offline images
    load_split / load_dataset    a folder or zip in the <split>/caption.txt layout, via the cache
    make_batches / collate       pixel-budget bucketing, padding and masks

See docs/data.md for the layout, where to put CROHME, the error policy and the cache.
"""

from .batching import Batch, Expression, collate, fit_to_pixels, make_batches, padded_shapes, padding_share
from .errors import (CaptionError, DataError, DatasetNotFoundError, ImageReadError, InkMLError, MissingSplitError,
                     UnknownTokenError, WriterFileError)
from .images import read_expression_file, read_image
from .inkml import Ink, TraceGroup, parse_inkml, read_inkml
from .render import RenderConfig, render_ink
from .source import SPLITS, open_source
from .splits import load_dataset, load_split
from .vocab import Vocab

__all__ = [
    "Batch", "collate", "fit_to_pixels", "make_batches", "padded_shapes", "padding_share",
    "CaptionError", "DataError", "DatasetNotFoundError", "ImageReadError", "InkMLError", "MissingSplitError",
    "UnknownTokenError", "WriterFileError",
    "Expression", "read_expression_file",
    "Ink", "TraceGroup", "parse_inkml", "read_inkml",
    "RenderConfig", "render_ink",
    "SPLITS", "load_split", "open_source", "read_image",
    "load_dataset",
    "Vocab",
]
