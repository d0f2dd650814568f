"""`hmer data check`, `hmer data split` and `hmer data render` (`hmer.cli.data`), as library
functions returning an exit status.

    check_command(data)                       counts per split and every problem found
    split_command(data, cfg.data, out_dir)    the validation hold-out a run would use, audited
    render_command(data, "crohme-bmp.zip")    the BTTR/CoMER data.zip layout, rendered

The rendered zip is the layout BTTR's and CoMER's data modules read, plus `writers.txt` so that the
writer hold-out is the InkML's; `--format png` writes 1-bit PNGs, less than half the size (docs/data.md,
"`hmer data render`").
"""

from __future__ import annotations

import io
import os
import sys
import zipfile
from itertools import accumulate
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Sequence, TextIO

import numpy as np
from PIL import Image

from ..config import DataConfig
from ..atomic import write_atomically, write_text_atomically
from .cache import check_files, load_images
from .render import INK_LEVEL, RenderConfig
from .source import (CAPTION_FILE, SPLITS, WRITER_FILE, DatasetSource, caption_lines, files_for_captions,
                     open_source, parse_captions)
from .splits import TRAIN, near_captions, read_writers, split_source_validation, writers_file_text
from .vocab import Vocab

RENDERED_TOP_FOLDER = "data"  # BTTR / CoMER read data/<split>/...


@dataclass(frozen=True)
class Problem:
    level: str  # "error" or "warning"
    message: str


@dataclass
class SplitReport:
    split: str
    captions: int
    files: int
    usable: int  # captions without errors whose file exists and reads
    problems: list[Problem]


# ---- check ------------------------------------------------------------------------------------------

def check_split(source: DatasetSource, split: str, vocab: Vocab, workers: int | None = None) -> SplitReport:
    """Every problem of one split; never raises for problems in the data."""
    problems: list[Problem] = []
    caption_where = source.describe(split, CAPTION_FILE)
    names: dict[str, int] = {}
    bad_captions: set[str] = set()
    for caption, errors in caption_lines(source.caption_text(split), caption_where, vocab):
        problems.extend(Problem("error", str(e)) for e in errors)
        if caption is None:
            continue
        names[caption.name] = caption.line
        if errors:
            bad_captions.add(caption.name)
        depths = list(accumulate((t == "{") - (t == "}") for t in caption.tokens))
        if min(depths) < 0 or depths[-1]:
            problems.append(Problem("warning",
                                    f"{caption_where}:{caption.line}: unbalanced braces in {caption.name!r}"))

    files = source.list_files(split)
    for name, line in names.items():
        if name not in files:
            problems.append(Problem("error",
                                    f"{caption_where}:{line}: no file for {name!r} in {source.describe(split)}"))
    for name, found in files.items():
        if name not in names:
            problems.append(Problem("warning", f"{source.describe(split, found[0])}: no caption for this file"))
        if len(found) > 1:
            problems.append(Problem("warning", f"{source.describe(split, found[0])}: several files for {name!r} "
                                               f"({', '.join(found)}); the first is used"))

    captioned = [n for n in names if n in files]
    usable = 0
    for index, error, notes in check_files(source, split, [files[n][0] for n in captioned], workers=workers):
        if error:
            problems.append(Problem("error", error))
        elif captioned[index] not in bad_captions:
            usable += 1
        problems.extend(Problem("warning", note) for note in notes)
    return SplitReport(split, captions=len(names), files=len(files), usable=usable, problems=problems)


def check_command(data: str | None, out: TextIO = sys.stdout, *, workers: int | None = None) -> int:
    """Print the count of each split and every problem; 0 when there is no error, else 1. The
    hold-out sizes shown are those of the default `DataConfig()`."""
    cfg, vocab = DataConfig(), Vocab()
    with open_source(data or None) as source:
        print(f"dataset: {source.location}", file=out)
        present = source.split_names()
        reports = [check_split(source, split, vocab, workers) for split in present]
        missing = [Problem("warning", f"split {s!r} is missing (no {s}/{CAPTION_FILE} in {source.location})")
                   for s in SPLITS if s not in present]
        errors_in_train = any(p.level == "error" for r in reports if r.split == TRAIN for p in r.problems)
        held = split_source_validation(source, cfg) if TRAIN in present and not errors_in_train else None

    print(f"{'split':<10}{'captions':>10}{'files':>10}{'usable':>10}", file=out)
    for r in reports:
        print(f"{r.split:<10}{r.captions:>10}{r.files:>10}{r.usable:>10}", file=out)
    if held is not None:
        left_out = f", {len(held.left_out)} left out" if held.left_out else ""
        print(f"train after the hold-out: {len(held.train)} train + {len(held.val)} val{left_out} "
              f"(rule {held.rule}, val_fraction={cfg.val_fraction}, val_seed={cfg.val_seed}; "
              f"`hmer data split` for more)", file=out)

    problems = missing + [p for r in reports for p in r.problems]
    for p in problems:
        print(f"{p.level}: {p.message}", file=out)
    errors = sum(p.level == "error" for p in problems)
    warnings = len(problems) - errors
    print(f"{errors} error(s), {warnings} warning(s)", file=out)
    return 0 if errors == 0 else 1


# ---- split ------------------------------------------------------------------------------------------

def split_command(data: str | None, data_cfg: DataConfig, out_dir: str | os.PathLike[str] | None = None,
                  out: TextIO = sys.stdout) -> int:
    """Print the validation hold-out of `data_cfg` (sizes, writers, caption lengths, what the sides
    share); with `out_dir`, write `train.txt` and `val.txt` as every run logs them."""
    with open_source(data or data_cfg.path or None) as source:
        held = split_source_validation(source, data_cfg)
        captions = {c.name: c.tokens for c in parse_captions(source.caption_text(TRAIN),
                                                              source.describe(TRAIN, CAPTION_FILE))}
        writers = read_writers(source, TRAIN, list(captions))
        year_captions = {y: [c.tokens for c in parse_captions(source.caption_text(y), source.describe(y))]
                         for y in source.split_names() if y != TRAIN}
        location = source.location

    n = len(captions)
    print(f"dataset: {location}", file=out)
    print(f"rule: {held.rule} (data.val_split={data_cfg.val_split}, data.val_fraction={data_cfg.val_fraction}, "
          f"data.val_seed={data_cfg.val_seed}, data.val_min_edits={data_cfg.val_min_edits})", file=out)
    if held.note:
        print(f"note: {held.note}", file=out)
    print(f"{'side':<10}{'expressions':>12}{'share':>8}{'writers':>9}{'no writer':>11}{'mean tokens':>13}", file=out)
    for side, names in (("train", held.train), ("val", held.val), ("left out", held.left_out)):
        known = {writers[x] for x in names if writers[x]}
        print(f"{side:<10}{len(names):>12}{len(names) / n:>8.1%}{len(known):>9}"
              f"{sum(not writers[x] for x in names):>11}{_mean([len(captions[x]) for x in names]):>13.1f}", file=out)
    for year, tokens in year_captions.items():
        lengths = [len(t) for t in tokens]
        print(f"{'test ' + year:<10}{len(lengths):>12}{'':>8}{'':>9}{'':>11}{_mean(lengths):>13.1f}", file=out)
    train_captions = {" ".join(captions[x]) for x in held.train}
    train_writers = {writers[x] for x in held.train if writers[x]}
    shared_captions = {" ".join(captions[x]) for x in held.val} & train_captions
    shared_writers = {writers[x] for x in held.val if writers[x]} & train_writers
    print(f"shared between val and train: {len(shared_captions)} captions, {len(shared_writers)} known writers",
          file=out)
    # A test year has few near twins of training captions; validation should not have many more.
    sides = {"val": [captions[x] for x in held.val], **{f"test {y}": t for y, t in year_captions.items()}}
    joined = {side: [" ".join(t) for t in tokens] for side, tokens in sides.items() if tokens}
    near = near_captions(train_captions.union(*joined.values()), 1)
    print("captions with a training caption within 1 token edit (itself included): " + ", ".join(
        f"{side} {np.mean([any(c in train_captions for c in near[caption]) for caption in found]):.1%}"
        for side, found in joined.items()), file=out)
    if out_dir is not None:
        folder = Path(out_dir)
        folder.mkdir(parents=True, exist_ok=True)
        for side, names in (("train", held.train), ("val", held.val)):
            write_text_atomically(folder / f"{side}.txt", "".join(f"{x}\n" for x in names))
        print(f"wrote {folder / 'train.txt'} and {folder / 'val.txt'}", file=out)
    return 0


def _mean(values: Sequence[int]) -> float:
    return float(np.mean(values)) if len(values) else float("nan")


# ---- render ----------------------------------------------------------------------------------------

def encode_bmp(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="BMP")
    return buffer.getvalue()


# --format: zip compression. PNG is compressed already; deflating it again gains nothing.
IMAGE_FORMATS = {"bmp": zipfile.ZIP_DEFLATED, "png": zipfile.ZIP_STORED}


def render_command(data: str | None, out_zip: str | os.PathLike[str], render_cfg: RenderConfig | None = None,
                   workers: int | None = None, out: TextIO = sys.stdout, *, limit: int = 0,
                   image_format: str = "bmp") -> int:
    """Write every split as `data/<split>/{caption.txt,writers.txt,<name>.bmp}` into
    `out_zip`, whole or not at all; `image_format="png"`: 1-bit PNGs, refusing an image that is not
    binary. `limit` > 0 keeps the first `limit` captions of each split. 1 when files were skipped."""
    if image_format not in IMAGE_FORMATS:
        raise ValueError(f"image format {image_format!r} is not one of {', '.join(IMAGE_FORMATS)}")
    render_cfg = render_cfg or RenderConfig()
    target = Path(out_zip)
    target.parent.mkdir(parents=True, exist_ok=True)
    skipped = 0

    def write(f: BinaryIO) -> None:
        nonlocal skipped
        with zipfile.ZipFile(f, "w", compression=IMAGE_FORMATS[image_format]) as archive:
            for split in source.split_names():
                written, failed = _render_split(source, split, archive, render_cfg, workers, limit, image_format)
                skipped += failed
                note = f", {failed} skipped (unreadable; see `hmer data check`)" if failed else ""
                print(f"{split}: {written} images{note}", file=out)

    with open_source(data) as source:
        write_atomically(target, write)
    print(f"wrote {target} ({target.stat().st_size / 2**20:.1f} MiB)", file=out)
    return 1 if skipped else 0


def _render_split(source: DatasetSource, split: str, archive: zipfile.ZipFile, render_cfg: RenderConfig,
                  workers: int | None, limit: int, image_format: str) -> tuple[int, int]:
    captions = parse_captions(source.caption_text(split), source.describe(split, CAPTION_FILE))
    if limit > 0:
        captions = captions[:limit]
    files = files_for_captions(source, split, captions)
    loaded = load_images(source, split, [c.name for c in captions], files, render_cfg,
                         use_cache=limit <= 0, workers=workers)
    kept = [c for c in captions if c.name in loaded.images]
    folder = f"{RENDERED_TOP_FOLDER}/{split}"
    archive.writestr(f"{folder}/{CAPTION_FILE}", "".join(f"{c.name}\t{' '.join(c.tokens)}\n" for c in kept))
    writers = writers_file_text(read_writers(source, split, [c.name for c in kept]))
    if writers:
        archive.writestr(f"{folder}/{WRITER_FILE}", writers)
    for c in kept:
        image = loaded.images[c.name]
        if image_format == "bmp":
            encoded = encode_bmp(image)
        elif np.isin(image, (0, 255)).all():  # 1-bit PNG: CROHME's 11.1 MiB against 24.3 MiB of BMP, zipped
            buffer = io.BytesIO()
            Image.fromarray(image > INK_LEVEL).save(buffer, format="PNG", optimize=True)
            encoded = buffer.getvalue()
        else:
            raise ValueError(f"{source.describe(split, files[captions.index(c)])}: its rendering is not binary; "
                             "--format png keeps 1-bit pixels only (use bmp)")
        archive.writestr(f"{folder}/{c.name}.{image_format}", encoded)
    return len(kept), len(captions) - len(kept)
