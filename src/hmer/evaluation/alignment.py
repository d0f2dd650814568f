"""Token alignment of a truth and a prediction: the edits that turn one into the other.

`align` is a Levenshtein dynamic programme with a backtrace; its edit count is `editdistance`'s.
Among equally short alignments the backtrace, from the ends, prefers the diagonal (a match or a
substitution), then a deletion, then an insertion: the same pair always gives the same edits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

EDIT_KINDS = ("substitution", "insertion", "deletion")  # every kind but "match", in the order tables list them


@dataclass(frozen=True)
class Edit:
    """One step of an alignment (match, substitution, insertion or deletion); `truth` is None for an
    insertion, `prediction` for a deletion."""

    kind: str
    truth: str | None
    prediction: str | None


def align(truth: Sequence[str], prediction: Sequence[str]) -> list[Edit]:
    """The edits that turn `truth` into `prediction`, in reading order."""
    n, m = len(truth), len(prediction)
    # cost[i][j]: fewest edits turning truth[:i] into prediction[:j]
    cost = [list(range(m + 1))] + [[i] + [0] * m for i in range(1, n + 1)]
    for i in range(1, n + 1):
        row, above, t = cost[i], cost[i - 1], truth[i - 1]
        for j in range(1, m + 1):
            row[j] = min(above[j - 1] + (t != prediction[j - 1]), above[j] + 1, row[j - 1] + 1)
    edits: list[Edit] = []
    i, j = n, m
    while i > 0 or j > 0:
        if i > 0 and j > 0:
            same = truth[i - 1] == prediction[j - 1]
            if cost[i][j] == cost[i - 1][j - 1] + (not same):
                edits.append(Edit("match" if same else "substitution", truth[i - 1], prediction[j - 1]))
                i, j = i - 1, j - 1
                continue
        if i > 0 and cost[i][j] == cost[i - 1][j] + 1:
            edits.append(Edit("deletion", truth[i - 1], None))
            i -= 1
        else:
            edits.append(Edit("insertion", None, prediction[j - 1]))
            j -= 1
    edits.reverse()
    return edits


def edit_count(edits: Iterable[Edit]) -> int:
    """The distance an alignment stands for: its edits other than matches."""
    return sum(e.kind != "match" for e in edits)
