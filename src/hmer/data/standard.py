"""The standard offline CROHME 2014 test images (the WAP authors' renderings), for comparing the
project's renderer with them: their sizes, and a side-by-side picture.

The tarball (`wap-offline-2014-test.tar.gz`, JianshuZhang/WAP `data/off_image_test.tar.gz`) holds
986 8-bit BMPs named `<name>_0.bmp`; nothing derived from it is written but the picture drawn by

    python -m hmer.data.standard [--inkml ZIP] [--tar TAR.GZ] [--out docs/rendering_side_by_side.png]
"""

from __future__ import annotations

import argparse
import io
import sys
import tarfile
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
from PIL import Image, ImageDraw

from .render import RenderConfig, render_ink, to_model_scale

STANDARD_SUFFIX = "_0.bmp"


def iter_standard_images(tar_path: str | Path, names: Iterable[str] | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """(name, uint8 [H, W]) for each standard image, or for `names` only, in archive order."""
    wanted = set(names) if names is not None else None
    with tarfile.open(tar_path, "r:*") as tar:
        for member in tar:
            name = Path(member.name).name[: -len(STANDARD_SUFFIX)]
            if member.isfile() and member.name.endswith(STANDARD_SUFFIX) and (wanted is None or name in wanted):
                file = tar.extractfile(member)
                assert file is not None, member.name  # None only for what is not a regular file
                with Image.open(io.BytesIO(file.read())) as img:
                    yield name, np.asarray(img.convert("L"), dtype=np.uint8)


STANDARD_2014 = "2014-std"  # the split name its scores are logged under (test_2014-std_exprate)


def default_standard_tar() -> Path:
    """The standard images beside the CROHME data every command finds, else in ../shared/crohme."""
    from .source import DatasetNotFoundError, default_data_paths, resolve_data_path

    name = "wap-offline-2014-test.tar.gz"
    try:
        data = resolve_data_path()
        found = (data if data.is_dir() else data.parent) / name
        if found.is_file():
            return found
    except DatasetNotFoundError:
        pass
    return default_data_paths()[-1].parent / name


def standard_2014_expressions(tar_path: str | Path, captions: dict[str, list[str]],
                              render: RenderConfig | None = None) -> list:
    """The standard 2014 images as Expressions with the 2014 captions, in caption order, brought to
    the size of `render`'s renderings (`to_model_scale`; None: as they are), the scale a model trained
    on them knows. An image missing from the archive is an error naming it."""
    from .batching import Expression

    images = dict(iter_standard_images(tar_path, captions))
    missing = [n for n in captions if n not in images]
    if missing:
        raise FileNotFoundError(f"{tar_path}: no standard image for {len(missing)} 2014 caption(s), "
                                f"e.g. {missing[0]}{STANDARD_SUFFIX}")
    return [Expression(name=name, tokens=tokens, image=images[name] if render is None else
                       to_model_scale(images[name], render)) for name, tokens in captions.items()]


def standard_2014_if_available(exprs_2014: Sequence, render: RenderConfig | None = None) -> list | None:
    """`standard_2014_expressions` for a run's 2014 test split (what it scores as `test_2014-std_*`),
    or None when the tarball (`default_standard_tar()`) is absent or lacks one of them."""
    tar = default_standard_tar()
    if not exprs_2014 or not tar.is_file():
        return None
    try:
        return standard_2014_expressions(tar, {e.name: e.tokens for e in exprs_2014}, render)
    except FileNotFoundError:
        return None


def side_by_side(pairs: Sequence[tuple[str, np.ndarray, np.ndarray]], gap: int = 12,
                 titles: tuple[str, str] = ("ours (hmer.data.render)", "standard (WAP off_image_test)")) -> Image.Image:
    """One picture: per row, the name, then ours (left) and the standard image (right)."""
    label_h = 14
    col_w = max(max(o.shape[1] for _, o, _ in pairs), max(t.shape[1] for _, _, t in pairs))
    height = sum(label_h + max(o.shape[0], t.shape[0]) + gap for _, o, t in pairs) + label_h
    canvas = Image.new("L", (2 * col_w + 3 * gap, height), 128)
    draw = ImageDraw.Draw(canvas)
    draw.text((gap, 2), titles[0], fill=255)
    draw.text((2 * gap + col_w, 2), titles[1], fill=255)
    y = label_h
    for name, ours, theirs in pairs:
        draw.text((gap, y + 1), f"{name}: {ours.shape[0]}x{ours.shape[1]}", fill=255)
        draw.text((2 * gap + col_w, y + 1), f"{theirs.shape[0]}x{theirs.shape[1]}", fill=255)
        y += label_h
        canvas.paste(Image.fromarray(ours), (gap, y))
        canvas.paste(Image.fromarray(theirs), (2 * gap + col_w, y))
        y += max(ours.shape[0], theirs.shape[0]) + gap
    return canvas


DEFAULT_EXAMPLES = ("18_em_0", "RIT_2014_145", "508_em_87", "RIT_2014_277", "35_em_19", "501_em_18")


def main(argv: list[str] | None = None) -> int:
    from .source import open_source

    repo_shared = Path(__file__).resolve().parents[4] / "shared" / "crohme"
    p = argparse.ArgumentParser(prog="python -m hmer.data.standard", description=__doc__.split("\n\n")[0])
    p.add_argument("--inkml", default=str(repo_shared / "crohme-inkml.zip"), help="dataset with the 2014 InkML")
    p.add_argument("--tar", default=str(repo_shared / "wap-offline-2014-test.tar.gz"), help="standard images")
    p.add_argument("--out", default=None, help="write the side-by-side PNG here")
    p.add_argument("--names", default=",".join(DEFAULT_EXAMPLES), help="comma-separated 2014 names to show")
    p.add_argument("--height", type=int, default=0,
                   help="as a model trained at data.render_height=H sees them: ours rendered at H px, the standard "
                        "images scaled to H px as the final evaluation scales them (0: both as drawn)")
    p.add_argument("--zoom", type=int, default=1, help="enlarge the picture this many times (nearest pixel)")
    args = p.parse_args(argv)

    cfg = RenderConfig(height=max(0, args.height))
    source = open_source(args.inkml)
    names = [n for n in args.names.split(",") if n]
    theirs = dict(iter_standard_images(args.tar, names))
    if args.height > 0:
        theirs = {e.name: e.image for e in standard_2014_expressions(
            args.tar, {n: [] for n in names if n in theirs}, cfg)}
    pairs = [(n, render_ink(source.read_ink("2014", n), cfg), theirs[n]) for n in names if n in theirs]
    if args.out:
        titles = (f"ours at {args.height} px", f"standard scaled to {args.height} px") if args.height > 0 else \
            ("ours (hmer.data.render)", "standard (WAP off_image_test)")
        picture = side_by_side(pairs, titles=titles)
        if args.zoom > 1:
            picture = picture.resize((picture.width * args.zoom, picture.height * args.zoom), Image.Resampling.NEAREST)
        picture.save(args.out, optimize=True)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
