"""Expression-level scores: ExpRate and the shares within one / two token edits, in percent.

An expression's distance is the Levenshtein distance between the predicted and the true token
sequences (`\\frac` is one token). ExpRate is the share of exact matches, `le1` / `le2` within one /
two edits. ExpRate is the papers' on 2014, where the official pipeline (LaTeX to MathML to symbol
label graphs, lgeval) agrees file for file; on 2016 and 2019 it is a few tenths of a point apart
(`lgeval_exprate` is the pipeline's). The papers' "≤1 / ≤2 errors" count symbol label graph errors,
a few points lower than token edits (`hmer.reports.paper_claims.EDIT_METRICS_DIFFER`); the reports
label the two apart.

Each metric is a `Metric` registered in `hmer.registry.METRICS`; `expression_metrics` computes every
registered one (beyond the papers' three, into `Scores.extra`) and the reports take theirs from the
registry (docs/architecture.md, "Add a metric in one file"). A metric is a share of expressions, so
that the paired tests compare runs expression by expression. `lgeval` registers the graph measures,
which judge the tokens themselves (`Metric.judge`).

`align` gives the edits themselves: a Levenshtein dynamic programme with a backtrace, whose edit
count is `editdistance`'s. Among equally short alignments the backtrace, from the ends, prefers the
diagonal (a match or a substitution), then a deletion, then an insertion: the same pair always gives
the same edits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterable, Sequence

import editdistance
import numpy as np

from ..registry import METRICS


@dataclass
class Scores:
    """Rates in percent over `n` expressions; `distances` per expression, in input order
    (for the predictions CSV and for paired significance tests). With n == 0 every rate is 0."""

    n: int
    exprate: float
    le1: float
    le2: float
    distances: list[int] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)  # registered metrics beyond the three above

    def as_dict(self, prefix: str = "") -> dict[str, float | int]:
        """The MLflow keys: `as_dict("test_2014")` -> `test_2014_exprate`, `_le1`, `_le2`, `_n` and one
        per extra metric; no prefix, the bare names."""
        head = f"{prefix}_" if prefix else ""
        return {f"{head}exprate": self.exprate, f"{head}le1": self.le1, f"{head}le2": self.le2, f"{head}n": self.n,
                **{f"{head}{name}": value for name, value in self.extra.items()}}


@dataclass(frozen=True)
class Metric:
    """The share of expressions, in percent, whose token edit distance (or `judge` value) `counts`.

    label: the column header of the reports ("ExpRate", "≤1").
    counts: elementwise on an array of distances, whether each is read right (NaN must give False).
    judge: for a metric that reads the tokens (`lgeval`): `judge(predictions, truths)` -> a value per
        expression for `counts`, NaN where it does not score (that leaves the denominator).
    """

    label: str
    counts: Callable[[np.ndarray], np.ndarray]
    judge: Callable[[Sequence[Sequence[str]], Sequence[Sequence[str]]], np.ndarray] | None = None

    def read_right(self, distances: Sequence[float] | np.ndarray) -> np.ndarray:
        """One bool per expression: counted by this metric, from token edit distances."""
        if self.judge is not None:
            raise ValueError(f"metric {self.label!r} judges the tokens, not their edit distance: use verdicts()")
        return np.asarray(self.counts(np.asarray(distances, dtype=float)), dtype=bool)

    def verdicts(self, distances: Sequence[float] | np.ndarray, predictions: Sequence[Sequence[str]] | None = None,
                 truths: Sequence[Sequence[str]] | None = None) -> np.ndarray:
        """Per expression 1.0 (read right), 0.0 or, for a judging metric, NaN (not scored)."""
        if self.judge is None:
            return self.read_right(distances).astype(float)
        if predictions is None or truths is None:
            raise ValueError(f"metric {self.label!r} reads the tokens: pass the predictions and truths")
        values = np.asarray(self.judge(predictions, truths), dtype=float)
        right = np.asarray(self.counts(values), dtype=bool).astype(float)
        right[np.isnan(values)] = np.nan
        return right

    def rate(self, distances: Sequence[float] | np.ndarray, predictions: Sequence[Sequence[str]] | None = None,
             truths: Sequence[Sequence[str]] | None = None) -> float:
        """The rate in percent over the expressions the metric scores (0 for none)."""
        scored = self.verdicts(distances, predictions, truths)
        scored = scored[~np.isnan(scored)]
        return 100.0 * float(scored.sum()) / len(scored) if len(scored) else 0.0


def within(max_errors: int, label: str, judge: Callable | None = None) -> Metric:
    """The metric of readings within `max_errors` token edits of the truth (or errors `judge` counts)."""
    return Metric(label, lambda d: d <= max_errors, judge=judge)


exprate = METRICS.register("exprate", within(0, "ExpRate"), description="ExpRate: exact matches, in percent")
le1 = METRICS.register("le1", within(1, "≤1"), description="Within one token edit, in percent")
le2 = METRICS.register("le2", within(2, "≤2"), description="Within two token edits, in percent")


def label(name: str) -> str:
    """The column header of metric `name` ("ExpRate", "≤1"); unknown names raise one line naming the known."""
    return METRICS.get(name).label


def token_distance(prediction: Sequence[Hashable], truth: Sequence[Hashable]) -> int:
    """Levenshtein distance between two token sequences."""
    return _distances([prediction], [truth])[0]


def expression_metrics(predictions: Sequence[Sequence[Hashable]], truths: Sequence[Sequence[Hashable]]) -> Scores:
    """Score predicted token sequences against the true ones, pairwise in order."""
    if len(predictions) != len(truths):
        raise ValueError(f"expression_metrics: {len(predictions)} predictions for {len(truths)} truths; "
                         "they must pair up one to one")
    distances = _distances(predictions, truths)
    values = {name: METRICS.get(name).rate(distances, predictions, truths) for name in METRICS.names()}
    papers = {name: values.pop(name) for name in ("exprate", "le1", "le2")}
    return Scores(n=len(distances), **papers, distances=distances, extra=values)


def _distances(predictions: Sequence[Sequence[Hashable]], truths: Sequence[Sequence[Hashable]]) -> list[int]:
    # Tokens become small ints through one shared table: editdistance compares elements by
    # hash, so distinct ids make the comparison exact rather than hash-collision-prone.
    ids: dict[Hashable, int] = {}
    out = []
    for j, (pred, truth) in enumerate(zip(predictions, truths)):
        for what, seq in (("prediction", pred), ("truth", truth)):
            if isinstance(seq, (str, bytes)):
                raise TypeError(f"expression_metrics: {what} {j} is a string ({seq[:40]!r}); pass a list of tokens "
                                "(e.g. latex.split()) so that distances count tokens, not characters")
        p = [ids.setdefault(tok, len(ids)) for tok in pred]
        t = [ids.setdefault(tok, len(ids)) for tok in truth]
        out.append(int(editdistance.eval(p, t)))
    return out


# ---- the token edits ------------------------------------------------------------------------------

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
