"""The validation hold-out: which training expressions a run selects its checkpoints on.

A CROHME test year has writers and captions that training never saw (3.0 / 1.6 / 0.3 % of the
2014 / 2016 / 2019 captions occur in train), but half the training expressions share their caption
with another. A random hold-out thus puts most of validation beside a twin in training and measures
memorisation: a `tiny-transformer` model read 18.3 % validation ExpRate against 4-5 % on the test
years, a bias that best checkpoint, plateau schedule, pruning and the sweep's objective inherit.

Rules (`data.val_split`):

- ``writer`` (the default): whole writers are held out, in a seeded order, until validation holds
  `data.val_fraction` of train; expressions without a known writer (a third of CROHME train) stay in
  training. A held-out expression whose caption is fewer than `data.val_min_edits` token edits from
  a training caption is left out of both sides. A dataset that names no writer (an image dataset in
  the BTTR/CoMER `data.zip` layout) holds out whole captions instead (rule ``caption``), and says so.
- `data.val_min_edits` (default 2; 1 leaves out exact twins only, what older configs get). With
  exact twins alone, a fifth of the writer hold-out had a training caption one edit away (`x ^ { 2 }`
  beside `y ^ { 2 }`), against 8-14 % of a test year; a model read those at 45 % against 19-31 % on
  the test years' ones, and validation read 13.5 % (beam) where the test years averaged 5.9 %.
- ``random``: a seeded random `val_fraction` of expressions (captions shared).

`split_validation` returns a `HoldOut`: the two name lists and what was done, which `hmer data
split` prints and every run logs.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import combinations
from typing import AbstractSet, Iterable, Mapping, Sequence

import editdistance
import numpy as np

from ..config import VAL_SPLITS

# A writer hold-out that has to leave more than this share of train out of both sides is not
# what was asked for: say so rather than train on a quietly smaller set.
MAX_LEFT_OUT = 0.06
# A writer is held out only if at most this share of their expressions has a caption that
# training keeps (those would be left out of both sides).
MAX_SHARED_PER_WRITER = 0.5


class HoldOutError(ValueError):
    """The requested hold-out cannot be formed from this dataset."""


@dataclass
class HoldOut:
    """What a hold-out did: the rule that applied, and the names on each side."""

    rule: str  # writer | caption | random | none
    train: list[str]
    val: list[str]
    # held-out writers' expressions whose caption training has, or has within val_min_edits - 1 edits
    left_out: list[str] = field(default_factory=list)
    val_writers: list[str] = field(default_factory=list)
    note: str = ""  # why the rule differs from the requested one, when it does


def split_validation(names: Sequence[str], captions: Mapping[str, str], writers: Mapping[str, str | None],
                     rule: str, fraction: float, seed: int, min_edits: int = 2) -> HoldOut:
    """Split `names` by `rule` (module docstring); `captions`: name -> tokens joined by spaces,
    `writers`: name -> writer or None, `min_edits`: `data.val_min_edits` (the writer rule only).
    Deterministic whatever the input order; both lists keep it."""
    if rule not in VAL_SPLITS:
        raise HoldOutError(f"data.val_split={rule!r} is not one of {', '.join(VAL_SPLITS)}")
    if min_edits < 1:
        raise HoldOutError(f"data.val_min_edits={min_edits} must be at least 1 (1: no caption on both sides)")
    if fraction <= 0 or len(names) < 2:
        return HoldOut(rule="none", train=list(names), val=[])
    target = min(len(names) - 1, max(1, round(len(names) * fraction)))
    if rule == "random":
        return _record(names, set(_seeded_order(names, seed)[:target]), rule="random")
    if any(writers.get(n) for n in names):
        return _writer_hold_out(names, captions, writers, target, seed, min_edits)
    held = _caption_hold_out(names, captions, target, seed)
    held.note = "no writer is named in this dataset (an image dataset?): whole captions are held out instead"
    return held


def _record(names: Sequence[str], val_names: set[str], rule: str, left_out: AbstractSet[str] = frozenset(),
            val_writers: Sequence[str] = ()) -> HoldOut:
    """The `HoldOut` record of a rule's choice: `val_names` held out of `names`, `left_out` on neither side."""
    return HoldOut(rule=rule,
                   train=[n for n in names if n not in val_names and n not in left_out],
                   val=[n for n in names if n in val_names],
                   left_out=[n for n in names if n in left_out],
                   val_writers=sorted(val_writers))


def _seeded_order(keys: Iterable[str], seed: int) -> list[str]:
    ordered = sorted(keys)
    return [ordered[i] for i in np.random.default_rng(seed).permutation(len(ordered))]


def _writer_hold_out(names: Sequence[str], captions: Mapping[str, str], writers: Mapping[str, str | None],
                     target: int, seed: int, min_edits: int) -> HoldOut:
    by_writer: dict[str, list[str]] = defaultdict(list)
    for name in names:
        if writer := writers.get(name):
            by_writer[writer].append(name)
    caption_count = Counter(captions[n] for n in names)
    # A held-out expression may stay in validation only if no caption within min_edits - 1 edits
    # of its own (its own included) keeps a copy in training.
    near = near_captions(caption_count, min_edits - 1)

    def in_training(caption: str, held_captions: Counter[str]) -> bool:
        return any(caption_count[c] > held_captions[c] for c in near[caption])

    held_writers: list[str] = []
    held: list[str] = []  # every expression of a held-out writer
    held_captions: Counter[str] = Counter()
    val_size = 0
    for writer in _seeded_order(set(by_writer), seed):
        with_writer = held_captions + Counter(captions[n] for n in by_writer[writer])
        shared = sum(1 for n in by_writer[writer] if in_training(captions[n], with_writer))
        # Some collections had every writer copy the same formulas; holding out such a writer
        # mostly leaves expressions out of both sides, so it stays in training.
        if shared > MAX_SHARED_PER_WRITER * len(by_writer[writer]):
            continue
        held_writers.append(writer)
        held.extend(by_writer[writer])
        held_captions = with_writer
        val_size = sum(1 for n in held if not in_training(captions[n], held_captions))
        if val_size >= target:
            break
    if val_size < target:
        raise HoldOutError(
            f"data.val_split=writer: holding out all {len(by_writer)} known writers gives only {val_size} "
            f"validation expressions without a caption{_within(min_edits)} in training, fewer than the "
            f"{target} asked for (data.val_fraction); lower data.val_fraction or data.val_min_edits, "
            f"or use data.val_split=random")
    val = {n for n in held if not in_training(captions[n], held_captions)}
    left_out = set(held) - val
    if len(left_out) > MAX_LEFT_OUT * len(names):
        raise HoldOutError(
            f"data.val_split=writer: the held-out writers leave {len(left_out)} expressions "
            f"({len(left_out) / len(names):.1%} of train) out of both sides because training has their caption"
            f"{_within(min_edits)}, more than {MAX_LEFT_OUT:.0%}; try another data.val_seed, a lower "
            f"data.val_min_edits or data.val_split=random")
    return _record(names, val, rule="writer", left_out=left_out, val_writers=held_writers)


def _within(min_edits: int) -> str:
    return "" if min_edits == 1 else f" or one within {min_edits - 1} token edit{'s' if min_edits > 2 else ''}"


def near_captions(captions: Iterable[str], max_edits: int) -> dict[str, set[str]]:
    """{caption: the captions at most `max_edits` token edits from it, itself included}. Two sequences
    within d edits become equal after deleting at most d tokens from each, so only captions sharing
    such a reduced form are compared: ~0.1 s for CROHME's 4,400 captions at d = 1, not seconds."""
    unique = sorted(set(captions))
    near: dict[str, set[str]] = {c: {c} for c in unique}
    if max_edits <= 0:
        return near
    tokens = {c: tuple(c.split()) for c in unique}
    by_reduced: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for caption, toks in tokens.items():
        reduced = {tuple(t for i, t in enumerate(toks) if i not in dropped)
                   for k in range(min(max_edits, len(toks)) + 1)
                   for dropped in map(set, combinations(range(len(toks)), k))}
        for form in reduced:
            by_reduced[form].append(caption)
    for group in by_reduced.values():
        for a, b in combinations(group, 2):
            if b not in near[a] and editdistance.eval(tokens[a], tokens[b]) <= max_edits:
                near[a].add(b)
                near[b].add(a)
    return near


def _caption_hold_out(names: Sequence[str], captions: Mapping[str, str], target: int, seed: int) -> HoldOut:
    by_caption: dict[str, list[str]] = defaultdict(list)
    for name in names:
        by_caption[captions[name]].append(name)
    val: set[str] = set()
    for caption in _seeded_order(set(by_caption), seed):
        if len(val) >= target:
            break
        if len(val) + len(by_caption[caption]) < len(names):  # never empty the training side
            val.update(by_caption[caption])
    return _record(names, val, rule="caption")

