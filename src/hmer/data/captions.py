"""caption.txt: one line per expression, `<name> TAB <space-separated tokens>`, read strictly."""

from __future__ import annotations

from dataclasses import dataclass

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
    vocab = vocab or Vocab()
    captions: list[Caption] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        caption, problem = parse_caption_line(raw, number)
        if problem:
            raise CaptionError(f"{where}:{number}: {problem}")
        if caption is None:
            continue
        if caption.name in seen:
            raise CaptionError(f"{where}:{number}: {caption.name!r} already has a caption on line {seen[caption.name]}")
        seen[caption.name] = number
        for token in caption.tokens:
            if token not in vocab:
                raise UnknownTokenError(token, f"{where}:{number}")
        captions.append(caption)
    return captions


def parse_caption_line(raw: str, number: int) -> tuple[Caption | None, str | None]:
    """One caption line -> (caption, None), (None, None) for a blank line, or (None, problem)."""
    line = raw.strip()
    if not line:
        return None, None
    # The layout uses a tab; a space after the name is accepted as well.
    name, _, rest = line.partition("\t") if "\t" in line else line.partition(" ")
    name, tokens = name.strip(), rest.split()
    if not tokens:
        return None, f"no tokens after the name {name!r} (expected <name> TAB <tokens>)"
    return Caption(name=name, tokens=tokens, line=number), None
