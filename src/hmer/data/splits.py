"""Loading splits: one split as it is on disk (`load_split`), or the splits a run uses
(`load_dataset`): train minus a seeded validation hold-out, the hold-out itself, and the test
years. Model selection uses `val`, never a test year.

    ds = load_dataset(None, cfg.data)                    # train, val and cfg.data.test_years
    ds = load_dataset("data/crohme.zip", cfg.data, splits=("2014",))
"""

from __future__ import annotations

import contextlib
import os
import warnings
import zlib
from typing import Mapping, Sequence

import numpy as np

from ..config import DataConfig
from .cache import load_images
from .batching import Expression
from .holdout import HoldOut, split_validation
from .inkml import UNKNOWN_WRITERS, writer_of
from .render import RenderConfig
from .errors import WriterFileError
from .source import CAPTION_FILE, WRITER_FILE, DatasetSource, files_for_captions, open_source, parse_captions
from .vocab import Vocab

VAL = "val"
TRAIN = "train"


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
    """`holdout.split_validation` of the source's train split by `data.val_split`, from captions and
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
    (`hmer.data.holdout`), `train` the rest; `train_limit`, `val_limit` and `test_limit` (0 = all,
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
