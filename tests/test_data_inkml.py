"""The InkML reader on the forms CROHME files take, and on broken files."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import inkml_document
from hmer.data import InkMLError, parse_inkml, read_inkml
from hmer.data.inkml import Ink, TraceGroup

SQUARE = [np.array([[0, 0], [10, 0], [10, 10]]), np.array([[20, 5], [30, 15]])]


def test_namespaced_and_plain_documents_read_the_same():
    with_ns = parse_inkml(inkml_document(SQUARE, namespace=True).encode())
    without = parse_inkml(inkml_document(SQUARE, namespace=False).encode())
    assert len(with_ns.strokes) == len(without.strokes) == 2
    for a, b in zip(with_ns.strokes, without.strokes):
        assert a.dtype == np.float32 and a.shape[1] == 2
        np.testing.assert_array_equal(a, b)
    assert with_ns.truth == without.truth == "$x$"
    assert with_ns.trace_ids == ["0", "1"]


@pytest.mark.parametrize("channels", [("X", "Y"), ("X", "Y", "T"), ("X", "Y", "T", "F")])
def test_extra_channels_are_dropped(channels):
    strokes = [np.column_stack([s, np.arange(len(s) * (len(channels) - 2)).reshape(len(s), -1)]) for s in SQUARE]
    ink = parse_inkml(inkml_document(strokes, channels=channels).encode())
    for got, want in zip(ink.strokes, SQUARE):
        np.testing.assert_array_equal(got, want)


def test_channel_order_comes_from_the_trace_format():
    swapped = [np.column_stack([np.full(len(s), 7), s[:, 1], s[:, 0]]) for s in SQUARE]  # T Y X
    ink = parse_inkml(inkml_document(swapped, channels=("T", "Y", "X")).encode())
    np.testing.assert_array_equal(ink.strokes[0], SQUARE[0])


def test_no_trace_format_means_x_then_y():
    doc = '<ink xmlns="http://www.w3.org/2003/InkML"><trace>1 2 99, 3 4 98</trace></ink>'
    np.testing.assert_array_equal(parse_inkml(doc.encode()).strokes[0], [[1, 2], [3, 4]])


@pytest.mark.parametrize("text", [
    "1 2, 3 4, 5 6",
    "  1   2 ,\n   3\t4 ,5 6 ,  ",        # odd spacing, tabs, newlines, trailing comma
    "\n1 2\n3 4\n5 6\n",                  # one point per line, no commas
    "1 2 3 4 5 6",                        # a flat list: neither commas nor newlines
    "1.0 2.00, 3e0 4, 5 6.0",             # decimals and exponents
])
def test_point_lists_with_odd_whitespace(text):
    doc = f"<ink><traceFormat><channel name='X'/><channel name='Y'/></traceFormat><trace id='a'>{text}</trace></ink>"
    np.testing.assert_array_equal(parse_inkml(doc.encode()).strokes[0], [[1, 2], [3, 4], [5, 6]])


def test_decimal_coordinates_and_single_point_traces():
    doc = "<ink><trace>10213 6535</trace><trace>0.125 -3.5, 0.25 -3.25</trace></ink>"
    ink = parse_inkml(doc.encode())
    np.testing.assert_array_equal(ink.strokes[0], [[10213, 6535]])
    np.testing.assert_allclose(ink.strokes[1], [[0.125, -3.5], [0.25, -3.25]])


def test_missing_truth_is_none_not_an_error():
    ink = parse_inkml(inkml_document(SQUARE, truth=None).encode())
    assert ink.truth is None and len(ink.strokes) == 2


def group_strokes(ink: Ink, group: TraceGroup) -> list[np.ndarray]:
    """The strokes a trace group refers to (unknown trace ids are left out)."""
    index = {tid: i for i, tid in enumerate(ink.trace_ids)}
    return [ink.strokes[index[t]] for t in group.trace_ids if t in index]


def test_trace_groups_give_symbols_with_truth_and_strokes():
    doc = inkml_document(SQUARE + [np.array([[40, 0], [40, 10]])], groups=[("x", [0, 1]), ("1", [2])])
    ink = parse_inkml(doc.encode())
    assert [(g.truth, g.trace_ids) for g in ink.groups] == [("x", ("0", "1")), ("1", ("2",))]
    assert ink.groups[0].id == "101"
    strokes = group_strokes(ink, ink.groups[1])
    np.testing.assert_array_equal(strokes[0], [[40, 0], [40, 10]])
    assert not ink.notes


def test_a_group_naming_a_missing_trace_is_noted():
    ink = parse_inkml(inkml_document(SQUARE, groups=[("x", [0, 5])]).encode())
    assert ink.groups[0].trace_ids == ("0", "5")
    assert len(group_strokes(ink, ink.groups[0])) == 1
    assert any("missing trace" in note and "5" in note for note in ink.notes)


def test_latin1_file_without_declaration_is_read_with_a_note(tmp_path):
    doc = inkml_document(SQUARE, truth="$a \\cdot b$").replace("</ink>", "<annotation>\u00b7</annotation></ink>")
    path = tmp_path / "latin.inkml"
    path.write_bytes(doc.encode("latin-1"))
    ink = read_inkml(path)
    assert len(ink.strokes) == 2 and any("Latin-1" in note for note in ink.notes)


@pytest.mark.parametrize("content", [b"", b"   \n\t"])
def test_empty_file_raises_naming_the_file(tmp_path, content):
    path = tmp_path / "empty_one.inkml"
    path.write_bytes(content)
    with pytest.raises(InkMLError, match="empty_one.inkml") as info:
        read_inkml(path)
    assert isinstance(info.value, ValueError) and "empty" in str(info.value)


def test_corrupt_xml_names_the_file_and_line(tmp_path):
    path = tmp_path / "broken.inkml"
    path.write_text('<ink xmlns="http://www.w3.org/2003/InkML">\n<trace id="0">1 2, 3 4</trace>\n<trace id="1">5 6\n')
    with pytest.raises(InkMLError) as info:
        read_inkml(path)
    message = str(info.value)
    assert "broken.inkml:" in message and "not well-formed" in message
    line = int(message.split("broken.inkml:")[1].split(":")[0])
    assert line >= 3


@pytest.mark.parametrize("doc, expected", [
    ("<ink><annotation type='truth'>x</annotation></ink>", "no pen strokes"),
    ("<ink><trace>  </trace></ink>", "no pen strokes"),
    ("<ink><trace id='7'>1 2, 3 abc</trace></ink>", "trace 7 has a value that is not a number: 'abc'"),
    ("<ink><trace id='7'>1 2, 3</trace></ink>", "trace 7 has a point with 1 value"),
    ("<ink><trace id='7'>1 2, '1 '1</trace></ink>", "difference encoding"),
    ("<svg><trace>1 2</trace></svg>", "not <ink>"),
])
def test_unusable_content_raises_with_the_source_name(doc, expected):
    with pytest.raises(InkMLError) as info:
        parse_inkml(doc.encode(), source="sample.inkml")
    assert str(info.value).startswith("sample.inkml") and expected in str(info.value)


def test_a_folder_is_not_an_inkml_file(tmp_path):
    with pytest.raises(InkMLError, match="folder"):
        read_inkml(tmp_path)
