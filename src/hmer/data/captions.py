"""caption.txt: one line per expression, `<name> TAB <space-separated tokens>`, read strictly."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from .errors import CaptionError
from .vocab import UnknownTokenError, Vocab


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
