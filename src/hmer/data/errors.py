"""The data layer's errors: each a `ValueError` (the command line reports it in one line) whose message
names the file, and the line where known. Which stop a bulk load is the error policy (docs/data.md).
"""

from __future__ import annotations

from .vocab import UnknownTokenError  # noqa: F401 - a data error too, raised from the vocabulary


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

