"""Where a dataset lives and how its files are read: a folder or a zip in the BTTR/CoMER
`data.zip` layout, one folder per split (`<split>/caption.txt`, `<name>.inkml` or an image, optional
`writers.txt`), possibly under one top folder; the layout and where it is looked for: docs/data.md,
"Where to put CROHME".

caption.txt is read strictly (`parse_captions`): a malformed line, a name given twice or a token
outside the vocabulary raises. A wrong structure always raises, naming file and line; bulk loading
skips an unusable content file with one warning (docs/data.md, "Error policy").
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Iterator, Sequence

from .errors import CaptionError, DatasetNotFoundError, MissingSplitError
from .inkml import Ink, parse_inkml
from .vocab import UnknownTokenError, Vocab

SPLITS = ("train", "2014", "2016", "2019")
IMAGE_SUFFIXES = (".bmp", ".png", ".jpg", ".jpeg")
# When a name has several files, the first suffix in this order wins (ink beats a rendering of it).
CONTENT_SUFFIXES = (".inkml", *IMAGE_SUFFIXES)
CAPTION_FILE = "caption.txt"
WRITER_FILE = "writers.txt"


# ---- finding the dataset -------------------------------------------------------------------------

def repo_root() -> Path | None:
    """The checkout this package runs from (editable install), or None when installed elsewhere."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "pyproject.toml").is_file() else None


def default_data_paths() -> list[Path]:
    """Where a dataset is looked for when none is given and $HMER_DATA is unset."""
    base = repo_root() or Path.cwd()
    # Last, the shared CROHME zip that sits beside the checkout on the project's machines.
    return [base / "data" / "crohme", base / "data" / "crohme.zip",
            base.parent / "shared" / "crohme" / "crohme-inkml.zip"]


def resolve_data_path(path: str | os.PathLike[str] | None = None) -> Path:
    """Explicit path, else $HMER_DATA, else the first default that exists."""
    env = os.environ.get("HMER_DATA")
    if path or env:
        found = Path(path or env or "").expanduser()
        if not found.exists():
            why = f"{found} (expected a folder or zip with <split>/{CAPTION_FILE})" if path else \
                f"$HMER_DATA={env} does not exist"
            raise DatasetNotFoundError(f"dataset not found: {why}")
        return found
    for candidate in default_data_paths():
        if candidate.exists():
            return candidate
    tried = ", ".join(str(p) for p in default_data_paths())
    raise DatasetNotFoundError(f"no dataset given, $HMER_DATA is unset, and none at {tried}; "
                               "see docs/data.md for where to put CROHME")


# ---- one dataset: a folder or a zip --------------------------------------------------------------

class DatasetSource:
    """Read access to one dataset's splits, the same for a folder and a zip (a worker process reopens
    it with `open_source(location)`)."""

    location: Path
    _files: dict[str, dict[str, list[str]]]  # list_files, by split

    def split_names(self) -> list[str]:
        """Every split folder that holds a caption.txt, known splits first."""
        raise NotImplementedError

    def caption_text(self, split: str) -> str:
        """The split's caption.txt as text; `MissingSplitError` when the split is not there."""
        if split not in self.split_names():
            raise self.missing_split_error(split)
        return self.read_bytes(split, CAPTION_FILE).decode("utf-8")

    def list_files(self, split: str) -> dict[str, list[str]]:
        """{name: [file names with a content suffix]} of the split's folder, listed once."""
        if split not in self._files:
            self._files[split] = _group_by_stem(self._filenames(split))
        return self._files[split]

    def _filenames(self, split: str) -> list[str]:
        """The names of the files in the split's folder; `MissingSplitError` when it is not there."""
        raise NotImplementedError

    def read_bytes(self, split: str, filename: str) -> bytes:
        raise NotImplementedError

    def read_optional(self, split: str, filename: str) -> bytes | None:
        try:
            return self.read_bytes(split, filename)
        except FileNotFoundError:
            return None

    def describe(self, split: str, filename: str = "") -> str:
        """How a file is named in messages (a path, or zip:member)."""
        raise NotImplementedError

    def identity(self, split: str) -> dict[str, object]:
        """What the split's contents depend on (paths, sizes, mtimes), for cache keys."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> "DatasetSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- conveniences shared by both kinds --
    def missing_split_error(self, split: str) -> MissingSplitError:
        have = ", ".join(self.split_names()) or "none"
        return MissingSplitError(f"split {split!r} not found in {self.location} "
                                 f"(no {split}/{CAPTION_FILE}; splits there: {have})")

    def file_for(self, split: str, name: str) -> str | None:
        """The file of expression `name` (by CONTENT_SUFFIXES order), or None."""
        files = self.list_files(split).get(name)
        return files[0] if files else None

    def read_ink(self, split: str, name: str) -> Ink:
        filename = f"{name}.inkml"
        return parse_inkml(self.read_bytes(split, filename), source=self.describe(split, filename))


def _order_splits(names: Sequence[str]) -> list[str]:
    known = [s for s in SPLITS if s in names]
    return known + sorted(n for n in names if n not in SPLITS)


def _group_by_stem(filenames: Sequence[str]) -> dict[str, list[str]]:
    files: dict[str, list[str]] = {}
    for filename in filenames:
        stem, dot, suffix = filename.rpartition(".")
        if dot and f".{suffix.lower()}" in CONTENT_SUFFIXES:
            files.setdefault(stem, []).append(filename)
    rank = {s: i for i, s in enumerate(CONTENT_SUFFIXES)}
    for names in files.values():
        names.sort(key=lambda f: rank["." + f.rpartition(".")[2].lower()])
    return files


class FolderSource(DatasetSource):
    def __init__(self, root: Path):
        self.location = root
        self.root = self._find_root(root)
        self._files: dict[str, dict[str, list[str]]] = {}

    @staticmethod
    def _find_root(root: Path) -> Path:
        def has_splits(folder: Path) -> bool:
            return any((child / CAPTION_FILE).is_file() for child in folder.iterdir() if child.is_dir())

        if has_splits(root):
            return root
        subfolders = [c for c in root.iterdir() if c.is_dir() and has_splits(c)]
        return subfolders[0] if len(subfolders) == 1 else root  # one top folder is allowed

    def split_names(self) -> list[str]:
        return _order_splits([c.name for c in self.root.iterdir() if (c / CAPTION_FILE).is_file()])

    def _filenames(self, split: str) -> list[str]:
        folder = self.root / split
        if not folder.is_dir():
            raise self.missing_split_error(split)
        return [e.name for e in os.scandir(folder) if e.is_file()]

    def read_bytes(self, split: str, filename: str) -> bytes:
        return (self.root / split / filename).read_bytes()

    def describe(self, split: str, filename: str = "") -> str:
        return str(self.root / split / filename) if filename else str(self.root / split)

    def identity(self, split: str) -> dict[str, object]:
        folder = self.root / split
        digest = hashlib.sha256()
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if entry.is_file():
                st = entry.stat()
                digest.update(f"{entry.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        return {"kind": "folder", "path": str(folder.resolve()), "files": digest.hexdigest()}


class ZipSource(DatasetSource):
    def __init__(self, path: Path):
        self.location = path
        try:
            self.zip = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as exc:
            raise DatasetNotFoundError(f"{path}: not a readable zip ({exc})") from None
        members = [m for m in self.zip.namelist() if not m.endswith("/")]
        self.prefix = self._find_prefix(members)
        self._by_split: dict[str, list[str]] = {}
        for member in members:
            if not member.startswith(self.prefix):
                continue
            parts = member[len(self.prefix):].split("/")
            if len(parts) == 2:
                self._by_split.setdefault(parts[0], []).append(parts[1])
        self._files: dict[str, dict[str, list[str]]] = {}

    @staticmethod
    def _find_prefix(members: Sequence[str]) -> str:
        """The folder inside the zip that holds the split folders ('' or e.g. 'crohme/')."""
        prefixes: dict[str, set[str]] = {}
        for member in members:
            path = PurePosixPath(member)
            if path.name == CAPTION_FILE and len(path.parts) >= 2:
                parent = path.parent
                prefix = f"{parent.parent.as_posix()}/" if parent.parent.as_posix() != "." else ""
                prefixes.setdefault(prefix, set()).add(parent.name)
        if not prefixes:
            return ""
        # Most known splits first, then the shallowest.
        return min(prefixes, key=lambda p: (-len(prefixes[p] & set(SPLITS)), p.count("/"), p))

    def split_names(self) -> list[str]:
        return _order_splits([s for s, files in self._by_split.items() if CAPTION_FILE in files])

    def _filenames(self, split: str) -> list[str]:
        if split not in self._by_split:
            raise self.missing_split_error(split)
        return self._by_split[split]

    def read_bytes(self, split: str, filename: str) -> bytes:
        try:
            return self.zip.read(f"{self.prefix}{split}/{filename}")
        except KeyError:
            raise FileNotFoundError(f"{self.describe(split, filename)}: no such member") from None

    def describe(self, split: str, filename: str = "") -> str:
        return f"{self.location}:{self.prefix}{split}/{filename}"

    def identity(self, split: str) -> dict[str, object]:
        st = self.location.stat()
        return {"kind": "zip", "path": str(self.location.resolve()), "size": st.st_size,
                "mtime_ns": st.st_mtime_ns, "member": f"{self.prefix}{split}/"}

    def close(self) -> None:
        self.zip.close()


def open_source(path: str | os.PathLike[str] | None = None) -> DatasetSource:
    """Open the dataset at `path` (or $HMER_DATA, or the default place)."""
    found = resolve_data_path(path)
    return FolderSource(found) if found.is_dir() else ZipSource(found)


# ---- caption.txt, and the files of its captions --------------------------------------------------

@dataclass(frozen=True)
class Caption:
    name: str
    tokens: list[str]
    line: int  # 1-based line number in caption.txt


def parse_captions(text: str, where: str, vocab: Vocab | None = None) -> list[Caption]:
    """caption.txt -> captions, strictly: the first malformed line, duplicate name or unknown
    token raises (naming `where`, the line and the token)."""
    captions: list[Caption] = []
    for caption, errors in caption_lines(text, where, vocab or Vocab()):
        if errors:
            raise errors[0]
        assert caption is not None  # a line without a caption has an error
        captions.append(caption)
    return captions


def caption_lines(text: str, where: str, vocab: Vocab) -> Iterator[tuple[Caption | None, list[ValueError]]]:
    """Each non-blank line's caption and its errors (the caption is None where the line is malformed
    or its name has a caption already): what `parse_captions` raises and `hmer data check` lists."""
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        # The layout uses a tab; a space after the name is accepted as well.
        name, _, rest = line.partition("\t") if "\t" in line else line.partition(" ")
        name, tokens = name.strip(), rest.split()
        if not tokens:
            yield None, [CaptionError(f"{where}:{number}: no tokens after the name {name!r} "
                                      "(expected <name> TAB <tokens>)")]
        elif name in seen:
            yield None, [CaptionError(f"{where}:{number}: {name!r} already has a caption on line {seen[name]}")]
        else:
            seen[name] = number
            yield (Caption(name=name, tokens=tokens, line=number),
                   [UnknownTokenError(token, f"{where}:{number}") for token in tokens if token not in vocab])



def files_for_captions(source: DatasetSource, split: str, captions: Sequence[Caption]) -> list[str]:
    """The file of each caption; `CaptionError` (file and line) for the first one without."""
    files = []
    for caption in captions:
        filename = source.file_for(split, caption.name)
        if filename is None:
            raise CaptionError(f"{source.describe(split, CAPTION_FILE)}:{caption.line}: no file for {caption.name!r} "
                               f"(looked for {caption.name}{{{','.join(CONTENT_SUFFIXES)}}} in "
                               f"{source.describe(split)})")
        files.append(filename)
    return files
