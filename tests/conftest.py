"""Shared fixtures: the CROHME data where every command finds it, one torch thread, and small InkML
datasets that tests write themselves."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pytest
import torch

INKML_NS = "http://www.w3.org/2003/InkML"


REPO = Path(__file__).resolve().parents[1]
_STORE_BEFORE = pytest.StashKey[set]()


def _committed_store_entries() -> set[str]:
    """Every file and folder under the checkout's `mlruns/` (the committed store), by its path."""
    root = REPO / "mlruns"
    return {str(p.relative_to(REPO)) for p in root.rglob("*")} if root.is_dir() else set()


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # the one process that sees every test end (xdist's or -n 0)
        session.config.stash[_STORE_BEFORE] = _committed_store_entries()


def pytest_sessionfinish(session, exitstatus):
    """No test leaves a file or a folder in the checkout's `mlruns/`, nor takes one away (issue 70: the
    tests left an empty run folder, mlruns/2/<id>): the run fails, naming them."""
    before = session.config.stash.get(_STORE_BEFORE, None)
    if before is None:
        return
    after = _committed_store_entries()
    left, gone = sorted(after - before), sorted(before - after)
    if left or gone:
        said = "; ".join(part for part in (f"left {', '.join(left[:10])}" if left else "",
                                           f"removed {', '.join(gone[:10])}" if gone else "") if part)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        line = f"the tests changed the checkout's committed store mlruns/: {said}"
        if reporter is not None:
            reporter.write_line(line, red=True)
        else:
            print(line)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def crohme_data() -> Path:
    """The CROHME data where every command looks for it: $HMER_DATA, else data/crohme(.zip) in the
    checkout, else ../shared/crohme/crohme-inkml.zip beside it (skips, saying where it looked)."""
    from hmer.data.source import DatasetNotFoundError, resolve_data_path

    try:
        return resolve_data_path()
    except DatasetNotFoundError as exc:
        pytest.skip(f"CROHME data not found ({exc}); see README, 'Data'")


# The golden outputs of the reference BTTR and CoMER code (their README says how they were made):
# $HMER_PEERS, else ../shared/peers beside the checkout.
PEERS = Path(os.environ.get("HMER_PEERS") or Path(__file__).resolve().parents[2] / "shared" / "peers")


def peers_or_skip() -> Path:
    """The golden reference data's folder, or a skip that says where it looked and how to point elsewhere."""
    if not (PEERS / "README.md").is_file():
        pytest.skip(f"golden reference data not found at {PEERS}: set HMER_PEERS to its folder (README, 'The tests')")
    return PEERS


@pytest.fixture(scope="session")
def standard_2014_images() -> Path:
    """The WAP authors' 2014 test images, where `hmer evaluate --standard-2014` looks for them
    (hmer.data.standard.default_standard_tar; skips when absent)."""
    from hmer.data.standard import default_standard_tar

    path = default_standard_tar()
    if not path.is_file():
        pytest.skip(f"standard 2014 images not found at {path}; see README")
    return path


@pytest.fixture
def one_thread():
    """Run with one torch thread (the test machines' cores are shared), then restore."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch) -> Path:
    """A private, empty rendered cache for the test."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("HMER_CACHE", str(cache))
    return cache


# ---- writing small InkML datasets -------------------------------------------------------------------

def inkml_document(strokes: Sequence[np.ndarray], truth: str | None = "$x$", namespace: bool = True,
                   channels: Sequence[str] = ("X", "Y"), groups: Sequence[tuple[str, Sequence[int]]] = (),
                   separator: str = ", ") -> str:
    """An InkML document with `strokes` (arrays [N, len(channels)]) and symbol `groups`."""
    ns = f' xmlns="{INKML_NS}"' if namespace else ""
    parts = [f"<ink{ns}>", "<traceFormat>"]
    parts += [f'<channel name="{c}" type="decimal"/>' for c in channels]
    parts.append("</traceFormat>")
    if truth is not None:
        parts.append(f'<annotation type="truth">{truth}</annotation>')
    for i, stroke in enumerate(strokes):
        points = separator.join(" ".join(f"{v:g}" for v in row) for row in np.asarray(stroke))
        parts.append(f'<trace id="{i}">\n{points}\n</trace>')
    if groups:
        parts.append('<traceGroup xml:id="100"><annotation type="truth">Segmentation</annotation>')
        for g, (label, ids) in enumerate(groups):
            views = "".join(f'<traceView traceDataRef="{t}"/>' for t in ids)
            parts.append(f'<traceGroup xml:id="{101 + g}"><annotation type="truth">{label}</annotation>{views}'
                         "</traceGroup>")
        parts.append("</traceGroup>")
    parts.append("</ink>")
    return "\n".join(parts)


def glyph_strokes(seed: int, scale: float = 1.0, offset: float = 0.0) -> list[np.ndarray]:
    """A few wiggly strokes in a row, like a short handwritten expression."""
    rng = np.random.default_rng(seed)
    strokes = []
    for k in range(2 + seed % 3):
        t = np.linspace(0, 1, 12)
        x = 40 * k + 25 * t + rng.normal(0, 1, t.size)
        y = 30 * np.sin(3 * t + k) + rng.normal(0, 1, t.size)
        strokes.append((np.stack([x, y], axis=1) * scale + offset).round(2))
    return strokes


CAPTIONS = ["x + 1", "a ^ { 2 }", "\\frac { 1 } { 2 }", "y = 3", "\\sqrt { x }", "2 x - 1"]


def write_inkml_dataset(root: Path, splits: dict[str, int] | None = None) -> Path:
    """`<split>/caption.txt` + `<split>/<name>.inkml` for each split; returns `root`."""
    splits = splits or {"train": 12, "2014": 3, "2016": 3, "2019": 3}
    for split, n in splits.items():
        folder = root / split
        folder.mkdir(parents=True, exist_ok=True)
        lines = []
        for i in range(n):
            name = f"{split}_{i:03d}"
            caption = CAPTIONS[i % len(CAPTIONS)]
            (folder / f"{name}.inkml").write_text(inkml_document(glyph_strokes(i), truth=f"${caption}$"))
            lines.append(f"{name}\t{caption}\n")
        (folder / "caption.txt").write_text("".join(lines))
    return root


@pytest.fixture
def inkml_dataset(tmp_path) -> Callable[..., Path]:
    """Factory: inkml_dataset(splits={"train": 12, ...}, root=None) -> dataset folder."""
    def make(splits: dict[str, int] | None = None, root: Path | None = None) -> Path:
        return write_inkml_dataset(root or tmp_path / "data", splits)

    return make
