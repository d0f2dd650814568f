"""Loading splits: one split as it is on disk (`load_split`), or the splits a run uses
(`load_dataset`): train minus a seeded validation hold-out, the hold-out itself, and the test
years. Model selection uses `val`, never a test year.

    ds = load_dataset(None, cfg.data)                    # train, val and cfg.data.test_years
    ds = load_dataset("data/crohme.zip", cfg.data, splits=("2014",))

The validation hold-out (`split_validation`, rule `data.val_split`: ``writer`` by default, else
``random``; ``caption`` for a dataset that names no writer) holds out whole writers and leaves out of
both sides any caption within `data.val_min_edits` token edits of a training caption: a random
hold-out puts most of validation beside a twin in training and measures memorisation, a bias that
best checkpoint, plateau schedule, pruning and the sweep's objective inherit. It returns a `HoldOut`:
the two name lists and what was done, which `hmer data split` prints and every run logs. The rules and
their measurements: docs/data.md, "The validation hold-out".
"""

from __future__ import annotations

import contextlib
import os
import warnings
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import combinations
from typing import AbstractSet, Iterable, Mapping, Sequence

import editdistance
import numpy as np

from ..config import VAL_SPLITS, DataConfig
from .cache import load_images
from .batching import Expression
from .inkml import UNKNOWN_WRITERS, writer_of
from .render import RenderConfig
from .errors import WriterFileError
from .source import CAPTION_FILE, WRITER_FILE, DatasetSource, files_for_captions, open_source, parse_captions
from .vocab import Vocab

VAL = "val"
TRAIN = "train"

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


# ---- loading ----------------------------------------------------------------------------------------

def load_split(path: str | os.PathLike[str] | DatasetSource | None, split: str,
               render_cfg: RenderConfig | None = None, *, vocab: Vocab | None = None, strict: bool = False,
               limit: int = 0, use_cache: bool = True, workers: int | None = None) -> list[Expression]:
    """Every expression of one split, in caption order (no hold-out), rendered with `render_cfg`
    through the cache. `limit` > 0 keeps the first `limit` caption lines and skips the cache. Errors
    (`hmer.data.source`): structure errors raise; an unusable file raises when `strict`, else it is
    skipped with one counted warning."""
    render_cfg = render_cfg or RenderConfig()
    # (a source given is left open for its owner)
    with contextlib.nullcontext(path) if isinstance(path, DatasetSource) else open_source(path) as source:
        captions = parse_captions(source.caption_text(split), source.describe(split, CAPTION_FILE), vocab)
        if limit > 0:
            captions = captions[:limit]
        files = files_for_captions(source, split, captions)
        loaded = load_images(source, split, [c.name for c in captions], files, render_cfg,
                             strict=strict, use_cache=use_cache and limit <= 0, workers=workers)

    if loaded.failures:
        shown = "; ".join(list(loaded.failures.values())[:3])
        more = f" (and {len(loaded.failures) - 3} more)" if len(loaded.failures) > 3 else ""
        warnings.warn(f"{split}: skipped {len(loaded.failures)} of {len(captions)} files that could not be "
                      f"read: {shown}{more}; `hmer data check` lists them all", stacklevel=2)
    return [Expression(name=c.name, tokens=c.tokens, image=loaded.images[c.name])
            for c in captions if c.name in loaded.images]


def default_splits(data_cfg: DataConfig | None = None) -> tuple[str, ...]:
    """train, val and the configured test years (DataConfig.test_years, e.g. "2014,2016,2019")."""
    years = (data_cfg or DataConfig()).test_years
    return (TRAIN, VAL, *[y.strip() for y in years.split(",") if y.strip()])


def read_writers(source: DatasetSource, split: str, names: Sequence[str]) -> dict[str, str | None]:
    """{name: its writer, or None}: an InkML file's header, else `<split>/writers.txt` (an image
    dataset rendered from InkML keeps them there, so that its hold-out is the InkML's)."""
    listed = read_writer_file(source, split)
    writers: dict[str, str | None] = {}
    for name in names:
        filename = source.file_for(split, name)
        if filename and filename.endswith(".inkml"):
            writers[name] = writer_of(source.read_bytes(split, filename))
        else:
            writers[name] = listed.get(name)
    return writers


def read_writer_file(source: DatasetSource, split: str) -> dict[str, str]:
    """The split's writers.txt as {name: known writer}; {} without one. A malformed line or a name given
    twice raises (a silently different hold-out would be worse than stopping)."""
    data = source.read_optional(split, WRITER_FILE)
    if data is None:
        return {}
    where = source.describe(split, WRITER_FILE)
    writers: dict[str, str] = {}
    for number, raw in enumerate(data.decode("utf-8").splitlines(), start=1):
        if not raw.strip():
            continue
        fields = [f.strip() for f in raw.split("\t")]
        if len(fields) != 2 or not all(fields):
            raise WriterFileError(f"{where}:{number}: expected <name> TAB <writer>, got {raw.strip()!r}")
        name, writer = fields
        if name in writers:
            raise WriterFileError(f"{where}:{number}: {name!r} already has a writer")
        if writer.lower() not in UNKNOWN_WRITERS:  # as an InkML header's "Unknown" is nobody
            writers[name] = writer
    return writers


def writers_file_text(writers: Mapping[str, str | None]) -> str:
    """writers.txt for `writers` ({name: writer or None}): a line for each name with a writer."""
    return "".join(f"{name}\t{writer}\n" for name, writer in writers.items() if writer)


def split_source_validation(source: DatasetSource, data_cfg: DataConfig, *, vocab: Vocab | None = None) -> HoldOut:
    """`split_validation` of the source's train split by `data.val_split`, from captions and
    InkML headers only (no rendering, so `hmer data split` is quick)."""
    captions = parse_captions(source.caption_text(TRAIN), source.describe(TRAIN, CAPTION_FILE), vocab)
    names = [c.name for c in captions]
    writers = read_writers(source, TRAIN, names) if data_cfg.val_split == "writer" else {}
    return split_validation(names, {c.name: " ".join(c.tokens) for c in captions}, writers,
                            data_cfg.val_split, data_cfg.val_fraction, data_cfg.val_seed,
                            min_edits=data_cfg.val_min_edits)


def subset(exprs: Sequence[Expression], limit: int, seed: int, label: str) -> list[Expression]:
    """A seeded random `limit` of `exprs` in their order (all when limit <= 0); `label` (the split)
    varies the draw between splits."""
    if limit <= 0 or limit >= len(exprs):
        return list(exprs)
    rng = np.random.default_rng([seed, zlib.crc32(label.encode())])
    keep = np.sort(rng.choice(len(exprs), size=limit, replace=False))
    return [exprs[i] for i in keep]


def load_dataset(path: str | os.PathLike[str] | None, data_cfg: DataConfig | None = None,
                 splits: Sequence[str] | None = None, *, vocab: Vocab | None = None,
                 workers: int | None = None) -> dict[str, list[Expression]]:
    """{split: expressions} for `splits` (default: train, val and the configured test years). `path`
    falls back to `data_cfg.path`, $HMER_DATA, the default place. `val` is the train split's hold-out
    (the module docstring), `train` the rest; `train_limit`, `val_limit` and `test_limit` (0 = all,
    test_limit for every other split) then keep seeded random subsets."""
    cfg = data_cfg if data_cfg is not None else DataConfig()
    wanted = tuple(splits) if splits is not None else default_splits(cfg)
    render_cfg = RenderConfig.from_data_config(cfg)
    seed = cfg.val_seed
    out: dict[str, list[Expression]] = {}
    with open_source(path or cfg.path or None) as source:
        if TRAIN in wanted or VAL in wanted:
            held = split_source_validation(source, cfg, vocab=vocab)
            full = {e.name: e for e in load_split(source, TRAIN, render_cfg, vocab=vocab, workers=workers)}
            # (a file that could not be read is missing from `full`, and from both sides)
            train = [full[n] for n in held.train if n in full]
            val = [full[n] for n in held.val if n in full]
            if TRAIN in wanted:
                out[TRAIN] = subset(train, cfg.train_limit, seed, TRAIN)
            if VAL in wanted:
                out[VAL] = subset(val, cfg.val_limit, seed, VAL)
        for split in wanted:
            if split not in (TRAIN, VAL):
                exprs = load_split(source, split, render_cfg, vocab=vocab, workers=workers)
                out[split] = subset(exprs, cfg.test_limit, seed, split)
    return {split: out[split] for split in wanted}
