"""The data layer's errors. Every one is a `ValueError`, so the command line reports it as a
one-line user error, and every message names the file (and the line where one is known).

Which of them stop a bulk load and which are skipped with a count is the error policy, set out
in `hmer.data.splits.load_split` and in docs/data.md.
"""

from __future__ import annotations

from .vocab import UnknownTokenError


class DataError(ValueError):
    """Something is wrong with the data on disk (not with the code reading it)."""


class InkMLError(DataError):
    """An InkML file that is empty, not well-formed XML, or holds no usable pen strokes."""


class ImageReadError(DataError):
    """An image file (bmp/png/jpg) that cannot be decoded."""


class NoInkError(DataError):
    """An image in which nothing is ink: blank, uniform, or a single pixel (`hmer predict` names it
    and reads nothing into it)."""


class DatasetNotFoundError(DataError):
    """No dataset folder or zip where one was asked for (or at any default place)."""


class MissingSplitError(DataError):
    """The dataset exists but has no `<split>/caption.txt`."""


class CaptionError(DataError):
    """A caption line that is malformed, or names a file that is not there."""


class WriterFileError(DataError):
    """A writers.txt line that is malformed, or names an expression twice."""


__all__ = [
    "DataError",
    "InkMLError",
    "ImageReadError",
    "NoInkError",
    "DatasetNotFoundError",
    "MissingSplitError",
    "CaptionError",
    "WriterFileError",
    "UnknownTokenError",
]
