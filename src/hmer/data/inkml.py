"""Reading CROHME InkML: pen strokes, the writer's LaTeX truth, and the symbol segmentation.

Accepted, because the CROHME collections use all of it: the InkML namespace or none; traces of
`x y`, `x y t`, `x y f` or more channels (X and Y as the `<traceFormat>` names them, else the first
two values); points separated by commas, by newlines, or a flat list of values (grouped by the
channel count); files that are not UTF-8 and do not say so (MfrDB0104 is Latin-1), read as Latin-1
with a note. InkML's difference encodings (`'`, `"`, `!`), which CROHME does not use, are refused.

An empty file, XML that is not well formed, or a file without a point of ink raises `InkMLError`
naming the file (and the line, where the parser gives one); whether a bulk load skips such a file
is its caller's choice (`hmer.data.splits.load_split`).
"""

from __future__ import annotations

import os
import re
from itertools import chain
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import InkMLError

_XML_ID = "{http://www.w3.org/XML/1998/namespace}id"
# Characters that introduce InkML's difference / velocity encodings, which CROHME never uses.
_DIFFERENCE_MARKS = re.compile(r"['\"!*?]")


@dataclass(frozen=True)
class TraceGroup:
    """One segmented symbol: its truth label and the ids of the traces it is drawn with."""

    truth: str | None
    trace_ids: tuple[str, ...]
    id: str | None = None


@dataclass
class Ink:
    """One InkML file: `strokes[i]` is float32 [N, 2] of (x, y) pen positions in device units (y
    down), from the `<trace>` with id `trace_ids[i]`."""

    strokes: list[np.ndarray]
    trace_ids: list[str]
    truth: str | None = None
    groups: list[TraceGroup] = field(default_factory=list)
    source: str = "<memory>"
    notes: list[str] = field(default_factory=list)  # oddities that did not stop the reading


def read_inkml(path: str | os.PathLike[str]) -> Ink:
    """Read one InkML file; raises `InkMLError` (naming the file) when it is unusable."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise InkMLError(f"{path}: is a folder, not an InkML file") from None
    return parse_inkml(data, source=str(path))


def parse_inkml(data: bytes, source: str = "<memory>") -> Ink:
    """Parse the bytes of an InkML document. `source` names it in errors and in `Ink.source`."""
    if not data.strip():
        raise InkMLError(f"{source}: empty file")
    notes: list[str] = []
    root = _parse_xml(data, source, notes)
    if _local(root.tag) != "ink":
        raise InkMLError(f"{source}: the root element is <{_local(root.tag)}>, not <ink>")

    channels = _channel_names(root)
    x_index = channels.index("X") if "X" in channels else 0
    y_index = channels.index("Y") if "Y" in channels else 1

    strokes: list[np.ndarray] = []
    trace_ids: list[str] = []
    for number, element in enumerate(e for e in root.iter() if _local(e.tag) == "trace"):
        trace_id = element.get("id") or element.get(_XML_ID) or str(number)
        points = _parse_points(element.text or "", len(channels), x_index, y_index, source, trace_id)
        if len(points) == 0:
            notes.append(f"trace {trace_id} has no points")
            continue
        strokes.append(points)
        trace_ids.append(trace_id)
    if not strokes:
        raise InkMLError(f"{source}: no pen strokes (no <trace> with points)")

    truth = _truth_of(root)
    groups = _trace_groups(root)
    known = set(trace_ids)
    for group in groups:
        missing = [t for t in group.trace_ids if t not in known]
        if missing:
            notes.append(f"trace group {group.id or group.truth!r} refers to missing trace(s) {', '.join(missing)}")
    return Ink(strokes=strokes, trace_ids=trace_ids, truth=truth, groups=groups, source=source, notes=notes)


_WRITER = re.compile(rb'<annotation\s+type\s*=\s*"writer"\s*>([^<]*)</annotation>')
_FIRST_TRACE = re.compile(rb"<trace[\s>]")  # not <traceFormat>, which comes before the annotations
UNKNOWN_WRITERS = frozenset({"", "unknown", "none", "anonymous"})


def writer_of(data: bytes) -> str | None:
    """The writer an InkML document names (`<annotation type="writer">`), or None for none or an
    unknown one. Only the header before the traces is scanned: this runs over a whole split."""
    first_trace = _FIRST_TRACE.search(data)
    head = data[:first_trace.start()] if first_trace else data
    match = _WRITER.search(head)
    if not match:
        return None
    writer = match.group(1).decode("utf-8", "replace").strip()
    return None if writer.lower() in UNKNOWN_WRITERS else writer


# ---- helpers ------------------------------------------------------------------------------------

def _local(tag: str) -> str:
    """`{namespace}name` -> `name`; files with and without the InkML namespace read the same."""
    return tag.rsplit("}", 1)[-1]


def _parse_xml(data: bytes, source: str, notes: list[str]) -> ET.Element:
    try:
        return ET.fromstring(data)
    except ET.ParseError as exc:
        first_error = exc
    # An undeclared non-UTF-8 encoding is the one defect worth repairing: the strokes are fine,
    # only a stray character in a comment or MathML annotation is not UTF-8.
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        declaration = data[:200].split(b"?>", 1)[0] if data.lstrip().startswith(b"<?xml") else b""
        if b"encoding" not in declaration:
            try:
                root = ET.fromstring(data.decode("latin-1").encode("utf-8"))
            except ET.ParseError:
                pass
            else:
                notes.append("not valid UTF-8 and no encoding declared; read as Latin-1")
                return root
    line, column = getattr(first_error, "position", (None, None))
    reason = str(first_error).split(":")[0]
    where = f"{source}:{line}" if line else source
    raise InkMLError(f"{where}: not well-formed XML ({reason}, column {column})") from None


def _channel_names(root: ET.Element) -> list[str]:
    """Channel names of the first <traceFormat> (e.g. ["X", "Y", "T"]); [] when there is none."""
    for element in root.iter():
        if _local(element.tag) == "traceFormat":
            return [c.get("name", "") for c in element if _local(c.tag) == "channel"]
    return []


def _parse_points(text: str, n_channels: int, x_index: int, y_index: int, source: str, trace_id: str) -> np.ndarray:
    """Trace text -> float32 [N, 2] of (x, y)."""
    if _DIFFERENCE_MARKS.search(text):
        raise InkMLError(f"{source}: trace {trace_id} uses InkML difference encoding, which is not supported")
    chunks = text.split(",")
    if len(chunks) == 1:
        lines = [line for line in text.splitlines() if line.strip()]
        if len(lines) > 1:  # no commas: one point per line
            chunks = lines
    rows = [row for row in map(str.split, chunks) if row]  # a trailing comma or blank line leaves an empty chunk
    if not rows:
        return np.zeros((0, 2), dtype=np.float32)
    per_point = max(n_channels, 2)
    if len(rows) == 1 and len(rows[0]) > per_point and len(rows[0]) % per_point == 0:
        flat = rows[0]  # neither commas nor newlines: a flat list of values
        rows = [flat[i:i + per_point] for i in range(0, len(flat), per_point)]
    needed = max(x_index, y_index) + 1
    lengths = set(map(len, rows))
    shortest = min(lengths)
    if shortest < needed:
        bad = next(row for row in rows if len(row) < needed)
        raise InkMLError(f"{source}: trace {trace_id} has a point with {len(bad)} value(s) "
                         f"({' '.join(bad)!r}); X and Y need {needed}")
    if len(lengths) > 1:  # points with extra trailing channels: keep the channels all of them have
        rows = [row[:shortest] for row in rows]
    try:
        values = np.array(list(chain.from_iterable(rows)), dtype=np.float64).reshape(len(rows), shortest)
    except ValueError:
        bad_value = next(v for row in rows for v in row if not _is_number(v))
        raise InkMLError(f"{source}: trace {trace_id} has a value that is not a number: {bad_value!r}") from None
    points = values[:, [x_index, y_index]]
    if not np.isfinite(points).all():
        raise InkMLError(f"{source}: trace {trace_id} has a value that is not finite")
    return points.astype(np.float32)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _trace_groups(root: ET.Element) -> list[TraceGroup]:
    """Every <traceGroup> that refers to traces directly: one per segmented symbol."""
    groups = []
    for element in root.iter():
        if _local(element.tag) != "traceGroup":
            continue
        refs = tuple((view.get("traceDataRef") or "").lstrip("#")
                     for view in element if _local(view.tag) == "traceView")
        refs = tuple(r for r in refs if r)
        if not refs:
            continue  # the outer "Segmentation" group only holds other groups
        groups.append(TraceGroup(truth=_truth_of(element), trace_ids=refs,
                                 id=element.get(_XML_ID) or element.get("id")))
    return groups


def _truth_of(element: ET.Element) -> str | None:
    """Text of the element's own `<annotation type="truth">` child, or None when it has none."""
    for child in element:
        if _local(child.tag) == "annotation" and child.get("type") == "truth":
            return (child.text or "").strip()
    return None
