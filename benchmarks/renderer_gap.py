"""What differs between the standard 2014 images (the WAP authors' renderings, which the papers
score on) and the suite's renderings of the same InkML: the table in docs/data.md.

    python benchmarks/renderer_gap.py [--inkml ZIP] [--tar TAR.GZ] [--height 64] [--limit N]

Four image sets of the same 986 expressions are measured, each as a column:

- `ours` / `standard`: as drawn (the standard images' own size; ours with the default renderer);
- `ours@H` / `standard@H`: what a model trained at `data.render_height=H` sees: ours rendered at
  exactly H px, the standard images scaled to H px with bilinear filtering, as `hmer evaluate
  --standard-2014` and the final evaluation feed them (`hmer.data.standard.standard_2014_expressions`);
- `standard-like@H`: `data.render_style=standard-like` (also what `data.val_alt=standard-like` draws
  validation with): ours drawn at the standard scale, then scaled to H the same way.

Measures (medians over images unless said): height and width; the blank margin to the ink on each
side; polarity (background and ink level); grey levels (share of pixels strictly between 0 and 255,
and of ink pixels that are grey); stroke width from the Euclidean distance transform of the ink
(ink = level >= 128; width = 2 x the distance at ridge pixels, local maxima of the transform, minus
1, whose 10th/50th/90th percentiles over all ridge pixels are given), and the ink mass per ridge
pixel (sum of levels / 255 / ridge pixels: a width that counts grey edges too); joins and
smoothing: connected ink components per image (8-connected; strokes that touch merge) and the
outline share (ink pixels with a background 4-neighbour / ink pixels: higher = more ragged or
thinner). Nothing derived from the data is written; the table is printed.

Needs scipy (for the distance transform and labelling), which the suite itself does not.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np


def measure(images: list[np.ndarray]) -> dict[str, str]:
    from scipy import ndimage

    heights, widths, margins, greys, grey_ink, components, outline, backgrounds, inks = ([] for _ in range(9))
    ridge_widths, masses = [], []
    for img in images:
        img = np.asarray(img)
        heights.append(img.shape[0])
        widths.append(img.shape[1])
        border = np.concatenate([img[0], img[-1], img[:, 0], img[:, -1]])
        backgrounds.append(float(np.median(border)))
        ink = img >= 128
        if not ink.any():
            continue
        inks.append(float(np.median(img[ink])))
        rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
        margins.append((rows[0], img.shape[0] - 1 - rows[-1], cols[0], img.shape[1] - 1 - cols[-1]))
        lit = img > 0
        greys.append(float(((img > 0) & (img < 255)).mean()))
        grey_ink.append(float(((img > 0) & (img < 255)).sum() / max(1, lit.sum())))
        dist = ndimage.distance_transform_edt(ink)
        ridge = ink & (dist >= ndimage.maximum_filter(dist, size=3))
        ridge_widths.append(2 * dist[ridge] - 1)
        masses.append(float(img.sum() / 255.0 / max(1, ridge.sum())))
        components.append(ndimage.label(ink, structure=np.ones((3, 3)))[1])
        eroded = ndimage.binary_erosion(ink, structure=ndimage.generate_binary_structure(2, 1), border_value=0)
        outline.append(float((ink & ~eroded).sum() / ink.sum()))
    m = np.asarray(margins, dtype=float)
    w = np.concatenate(ridge_widths)
    return {
        "height (px)": f"{np.median(heights):.0f}",
        "width (px)": f"{np.median(widths):.0f}",
        "margin top / bottom / left / right (px)": " / ".join(f"{v:.0f}" for v in np.median(m, axis=0)),
        "background / ink level": f"{np.median(backgrounds):.0f} / {np.median(inks):.0f}",
        "grey pixels (0 < level < 255), share of all": f"{100 * np.mean(greys):.1f} %",
        "grey share of lit pixels": f"{100 * np.mean(grey_ink):.1f} %",
        "stroke width, distance transform p10 / p50 / p90 (px)":
            " / ".join(f"{v:.1f}" for v in np.percentile(w, [10, 50, 90])),
        "ink mass per ridge pixel (px)": f"{np.median(masses):.2f}",
        "ink components per image": f"{np.median(components):.0f} (mean {np.mean(components):.1f})",
        "outline share of ink pixels": f"{100 * np.median(outline):.0f} %",
    }


def main() -> int:
    from hmer.config import DataConfig
    from hmer.data import RenderConfig, load_split, open_source
    from hmer.data.standard import standard_2014_expressions

    shared = Path(__file__).resolve().parents[2] / "shared" / "crohme"
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inkml", default=os.environ.get("HMER_DATA") or str(shared / "crohme-inkml.zip"))
    p.add_argument("--tar", default=str(shared / "wap-offline-2014-test.tar.gz"))
    p.add_argument("--height", type=int, default=64, help="the training height to compare at (CPU protocol: 64)")
    p.add_argument("--limit", type=int, default=0, help="only the first N 2014 expressions")
    args = p.parse_args()

    t0 = time.monotonic()
    with open_source(args.inkml) as source:
        ours = load_split(source, "2014", RenderConfig(), limit=args.limit)
        ours_h = load_split(source, "2014", RenderConfig.from_data_config(DataConfig(render_height=args.height)),
                            limit=args.limit)
        like = [e.image for e in load_split(source, "2014", RenderConfig.from_data_config(
            DataConfig(render_height=args.height, render_style="standard-like")), limit=args.limit)]
    captions = {e.name: e.tokens for e in ours}
    standard = standard_2014_expressions(args.tar, captions)
    standard_h = standard_2014_expressions(args.tar, captions, RenderConfig(height=args.height))
    columns = {"ours": [e.image for e in ours], "standard": [e.image for e in standard],
               f"ours@{args.height}": [e.image for e in ours_h],
               f"standard@{args.height}": [e.image for e in standard_h],
               f"standard-like@{args.height}": like}
    table = {name: measure(images) for name, images in columns.items()}
    rows = list(next(iter(table.values())))
    print(f"{len(ours)} expressions of 2014 ({time.monotonic() - t0:.0f} s)\n")
    print("| measure | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for row in rows:
        print(f"| {row} | " + " | ".join(table[c][row] for c in columns) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
