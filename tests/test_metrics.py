"""ExpRate / <=1 / <=2 on hand-made predictions."""

from __future__ import annotations

import pytest

from hmer.evaluation import Scores, expression_metrics, token_distance

TRUTH = ["\\frac", "{", "a", "}", "{", "b", "}"]


def test_each_kind_of_error_counts_in_tokens():
    cases = [
        (TRUTH, 0),  # exact
        (["\\frac", "{", "x", "}", "{", "b", "}"], 1),  # one substitution
        (["\\frac", "{", "a", "}", "{", "b", "^", "}"], 1),  # one insertion
        (["\\frac", "{", "a", "{", "b", "}"], 1),  # one deletion
        (["\\frac", "{", "x", "}", "{", "b", "}", "}"], 2),  # two errors
        (["\\sqrt", "{", "x", "}", "{", "y", "}", "}"], 4),  # more than two
        (["\\frac", "a", "}", "{", "c"], 3),  # three errors
        ([], len(TRUTH)),  # empty prediction
    ]
    scores = expression_metrics([p for p, _ in cases], [TRUTH] * len(cases))
    assert scores.distances == [d for _, d in cases]
    assert scores.n == 8
    assert scores.exprate == pytest.approx(100 * 1 / 8)
    assert scores.le1 == pytest.approx(100 * 4 / 8)
    assert scores.le2 == pytest.approx(100 * 5 / 8)
    # `\frac` against `\sqrt` is one token wrong, not five characters.
    assert token_distance(["\\frac"], ["\\sqrt"]) == 1


def test_as_dict_gives_the_mlflow_keys():
    scores = expression_metrics([["a"], ["b"]], [["a"], ["c"]])
    assert scores.as_dict("test_2014") == {
        "test_2014_exprate": 50.0,
        "test_2014_le1": 100.0,
        "test_2014_le2": 100.0,
        "test_2014_n": 2,
        # the papers' metrics on symbol label graphs: `b` for `c` is one wrong node
        "test_2014_lgeval_exprate": 50.0,
        "test_2014_lgeval_le1": 100.0,
        "test_2014_lgeval_le2": 100.0,
    }
    assert set(scores.as_dict()) == {"exprate", "le1", "le2", "n", "lgeval_exprate", "lgeval_le1", "lgeval_le2"}


def test_empty_truth_and_empty_split():
    assert expression_metrics([[]], [[]]).exprate == 100.0
    assert expression_metrics([["x"]], [[]]).distances == [1]
    assert expression_metrics([], []) == Scores(n=0, exprate=0.0, le1=0.0, le2=0.0, distances=[],
                                                extra={"lgeval_exprate": 0.0, "lgeval_le1": 0.0, "lgeval_le2": 0.0})


def test_mismatched_lengths_and_strings_are_refused():
    with pytest.raises(ValueError, match="2 predictions for 1 truths"):
        expression_metrics([["a"], ["b"]], [["a"]])
    with pytest.raises(TypeError, match="list of tokens"):
        expression_metrics(["a b"], [["a", "b"]])
