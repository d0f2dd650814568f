"""LaTeX tokens to the MathML tree that the official CROHME pipeline reads (pandoc 2.17 / texmath 0.12.4).

The official pipeline (CoMER's `tex2symlg`) runs `pandoc --mathml` on each expression as `$tokens$`.
This parses our tokens as texmath's TeX reader does and returns the element tree its MathML writer
prints for inline math, reduced to what the later steps read: element names, each symbol's text (all
symbols kept as `mi`: the later steps treat `mi` / `mo` / `mn` alike) and the nesting. Where texmath
rejects the input, pandoc writes no `<math>` and `to_mathml` raises `NotConverted`.

Written from texmath's behaviour, not its code. What matters for the graph:

- `a _ b ^ c` (either order) takes arguments without scripts of their own and gives `msubsup`; a
  lone `^` or `_` takes one that may carry scripts (`x _ { a } _ { b }` is `x` with subscript
  `a_b`); a script with nothing before it has an empty base; `\\limits` makes the scripts `munder` /
  `mover` / `munderover` (inline math sets even `\\sum`'s limits as sub- and superscripts);
- matched `( ... )`, `[ ... ]` and `| ... |` are one group (an `mrow`) that a script can follow;
- `\\frac` and `\\sqrt` take single tokens or braced groups, never a control sequence that is not a
  symbol (`\\frac`, `\\limits`, `\\{`); `\\sqrt` without an argument is the symbol `√`; `\\sqrt [ n ]`
  without its argument fails the whole expression;
- a digit is a number of its own (`1 2` is two numbers).

Pandoc 1.19 (CoMER's pin) writes `\\sin`, `\\cos`, `\\tan`, `\\log` and `\\lim` otherwise; this follows
2.17, the version of the fixtures it is tested against.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Sequence, TypeVar


class NotConverted(ValueError):
    """The tokens are not math that texmath reads: pandoc leaves the expression as text."""


@dataclass
class Element:
    """One MathML element: `mi` for any symbol (with its `text`), else a layout element
    (`mrow`, `msub`, `msup`, `msubsup`, `munder`, `mover`, `munderover`, `mfrac`, `msqrt`, `mroot`)."""

    name: str
    children: list[Element] = field(default_factory=list)
    text: str | None = None

    def __repr__(self) -> str:
        if self.name == "mi":
            return f"mi({self.text!r})"
        return f"{self.name}({', '.join(map(repr, self.children))})"


def symbol(text: str) -> Element:
    return Element("mi", text=text)


# The text texmath writes for each token of our vocabulary that is not written as itself.
_TEXT = {
    "-": "\u2212", "'": "\u2032", "\\prime": "\u2032",
    "\\Delta": "\u0394", "\\alpha": "\u03b1", "\\beta": "\u03b2", "\\gamma": "\u03b3",
    "\\lambda": "\u03bb", "\\mu": "\u03bc", "\\phi": "\u03d5", "\\pi": "\u03c0", "\\sigma": "\u03c3",
    "\\theta": "\u03b8", "\\cdot": "\u22c5", "\\cdots": "\u22ef", "\\ldots": "\u2026",
    "\\div": "\u00f7", "\\times": "\u00d7", "\\pm": "\u00b1", "\\exists": "\u2203",
    "\\forall": "\u2200", "\\in": "\u2208", "\\infty": "\u221e", "\\int": "\u222b", "\\sum": "\u2211",
    "\\geq": "\u2265", "\\leq": "\u2264", "\\neq": "\u2260", "\\rightarrow": "\u2192",
    "\\sin": "sin", "\\cos": "cos", "\\tan": "tan", "\\log": "log", "\\lim": "lim",
    "\\{": "{", "\\}": "}", "\\sqrt": "\u221a",
}
# Single characters texmath reads as operators (the rest of the ASCII punctuation of the vocabulary
# is read as a delimiter or, inside `\\frac` / `\\sqrt` arguments, as a plain character).
_OPERATORS = frozenset("+-*,.;:?><!'=/")
_OPENERS = {"(": ")", "[": "]", "|": "|"}
_DELIMITERS = frozenset("()[]|")
_BRACE_DELIMITERS = frozenset({"\\{", "\\}"})
# Control sequences that are not symbols: they cannot stand as an argument of `\\frac` or `\\sqrt`.
_NOT_SYMBOLS = frozenset({"\\frac", "\\limits", "\\{"})


def text_of(token: str) -> str:
    """The text of the MathML symbol element texmath writes for `token`."""
    return _TEXT.get(token, token)


class _Fail(Exception):
    """A parse failure; `consumed` says whether input was consumed (a parser then does not backtrack)."""

    def __init__(self, consumed: bool):
        super().__init__(consumed)
        self.consumed = consumed


Parsed = tuple[Element, int]
_T = TypeVar("_T")


class _Reader:
    """texmath's recursive descent over whole tokens: an alternative is tried only when the previous
    one failed without consuming input, unless wrapped in `_attempt` (texmath's `try`).

    `expr` and `expr1` keep what they read at each position (a packrat parser): without it, reading a
    script again (as both scripts, then as one) doubles the work at each level, and 200 tokens nesting
    `g _ { g _ { ...` unclosed did not finish in minutes. They memoise in their own bodies, as a
    wrapper would add frames to every level of a nesting."""

    def __init__(self, tokens: Sequence[str]):
        self.tokens = list(tokens)
        # (what, position) -> what was read there, or, for a failure, whether it consumed input
        self._read: dict[tuple[str, int], Parsed | bool] = {}

    def _recall(self, key: tuple[str, int]) -> Parsed:
        read = self._read[key]
        if isinstance(read, bool):
            raise _Fail(read)
        return read

    def at(self, pos: int) -> str | None:
        return self.tokens[pos] if pos < len(self.tokens) else None

    @staticmethod
    def _attempt(parse: Callable[[int], _T], pos: int) -> _T:
        try:
            return parse(pos)
        except _Fail:
            raise _Fail(False) from None

    # ---- sequences -------------------------------------------------------------------------
    def many(self, pos: int, stop: str | None = None, at_least_one: bool = False) -> tuple[list[Element], int]:
        """Expressions until one fails without consuming input (or the next token is `stop`)."""
        items: list[Element] = []
        while stop is None or self.at(pos) != stop:
            try:
                item, pos = self.expr(pos)
            except _Fail as fail:
                if fail.consumed:
                    raise
                break
            items.append(item)
        if at_least_one and not items:
            raise _Fail(False)
        return items, pos

    @staticmethod
    def group(items: list[Element]) -> Element:
        return items[0] if len(items) == 1 else Element("mrow", items)

    def formula(self) -> Element:
        items, pos = self.many(0)
        if pos != len(self.tokens) or not items:
            raise _Fail(True)
        return self.group(items)

    # ---- one expression with its scripts ---------------------------------------------------
    def expr(self, pos: int) -> Parsed:
        key = ("expr", pos)
        if key in self._read:
            return self._recall(key)
        try:
            base, end = self.expr1(pos)
            limits = self.at(end) == "\\limits"
            if limits:
                end += 1
            try:
                read = self.scripts(base, limits, end)
            except _Fail:
                read = base, end
        except _Fail as fail:
            self._read[key] = fail.consumed
            raise
        self._read[key] = read
        return read

    def scripts(self, base: Element, limits: bool, pos: int) -> Parsed:
        """Scripts on `base`: both (`both_scripts`), else one (`one_script`); a failure without
        consumed input when neither reads."""
        for read_scripts in (self.both_scripts, self.one_script):
            try:
                return self._attempt(partial(read_scripts, base, limits), pos)
            except _Fail:
                pass
        raise _Fail(False)

    def both_scripts(self, base: Element, limits: bool, pos: int) -> Parsed:
        """`_ a ^ b` or `^ b _ a`, each argument without scripts of its own."""
        def in_order(first: str, second: str, p: int) -> tuple[Element, Element, int]:
            if self.at(p) != first:
                raise _Fail(False)
            one, p = self.expr1(p + 1)
            if self.at(p) != second:
                raise _Fail(True)
            two, p = self.expr1(p + 1)
            return one, two, p

        try:
            sub, sup, pos = self._attempt(lambda p: in_order("_", "^", p), pos)
        except _Fail:
            sup, sub, pos = in_order("^", "_", pos)
        return Element("munderover" if limits else "msubsup", [base, sub, sup]), pos

    def one_script(self, base: Element, limits: bool, pos: int) -> Parsed:
        """`^ a` or `_ a`, where the argument may carry scripts itself."""
        mark = self.at(pos)
        if mark not in ("^", "_"):
            raise _Fail(False)
        arg, pos = self.expr(pos + 1)
        if mark == "^":
            return Element("mover" if limits else "msup", [base, arg]), pos
        return Element("munder" if limits else "msub", [base, arg]), pos

    # ---- one term ------------------------------------------------------------------------
    def expr1(self, pos: int) -> Parsed:
        key = ("expr1", pos)
        if key in self._read:
            return self._recall(key)
        try:
            tok = self.at(pos)
            if tok is None:
                raise _Fail(False)
            if tok == "{":
                read = self.braces(pos)
            elif len(tok) == 1 and (tok.isalpha() or tok.isdigit() or tok in _OPERATORS):
                read = symbol(text_of(tok)), pos + 1
            elif tok in ("^", "_"):
                read = self.scripts(symbol(""), False, pos)
            elif tok in _DELIMITERS:
                read = symbol(tok), pos + 1
                if tok in _OPENERS:
                    try:
                        read = self._attempt(self.delimited, pos)
                    except _Fail:
                        pass
            elif tok in _BRACE_DELIMITERS:
                read = symbol(text_of(tok)), pos + 1
            elif tok.startswith("\\"):
                read = self._attempt(self.command, pos)
            else:
                raise _Fail(False)
        except _Fail as fail:
            self._read[key] = fail.consumed
            raise
        self._read[key] = read
        return read

    def braces(self, pos: int) -> Parsed:
        items, pos = self.many(pos + 1)
        if self.at(pos) != "}":
            raise _Fail(True)
        return self.group(items), pos + 1

    def delimited(self, pos: int) -> Parsed:
        """A matched `( )`, `[ ]` or `| |` as one group (texmath backtracks when there is no match)."""
        opener = self.tokens[pos]
        closer = _OPENERS[opener]
        try:
            items, end = self.many(pos + 1, stop=closer, at_least_one=True)
        except _Fail:
            items, end = [], pos + 1
        if self.at(end) != closer:
            raise _Fail(True)
        return Element("mrow", [symbol(opener), *items, symbol(closer)]), end + 1

    def command(self, pos: int) -> Parsed:
        tok = self.tokens[pos]
        if tok == "\\frac":
            top, p = self.argument(pos + 1)
            bottom, p = self.argument(p)
            return Element("mfrac", [top, bottom]), p
        if tok == "\\sqrt":
            if self.at(pos + 1) == "[":
                items, p = self.many(pos + 2, stop="]")
                if self.at(p) != "]":
                    raise _Fail(True)
                radicand, p = self.argument(p + 1)
                return Element("mroot", [radicand, self.group(items) if items else Element("mrow")]), p
            try:
                radicand, p = self.argument(pos + 1)
                return Element("msqrt", [radicand]), p
            except _Fail as fail:
                if fail.consumed:
                    raise
            return symbol(text_of(tok)), pos + 1
        if tok in _NOT_SYMBOLS:
            raise _Fail(False)
        return symbol(text_of(tok)), pos + 1

    def argument(self, pos: int) -> Parsed:
        """texmath's `texToken`: a symbol, a braced group or one plain character."""
        tok = self.at(pos)
        if tok is None or tok == "}":
            raise _Fail(False)
        if tok == "{":
            return self.braces(pos)
        if tok in _NOT_SYMBOLS:
            raise _Fail(False)
        return symbol(text_of(tok)), pos + 1


# The most frames the reader nests per token (a term opening a group: `expr`, `expr1`, `_attempt`,
# `delimited`, `many`; a script: `_attempt`, its parser, `in_order`, ...), with room to spare. A
# prediction nests as deep as it is long at worst (199 `(` then `x`, which pandoc reads), deeper than
# Python's default limit of 1000 frames allows.
_FRAMES_PER_TOKEN = 10


def to_mathml(tokens: Sequence[str]) -> Element:
    """The root element pandoc writes inside `<semantics>` for `$ tokens $`; `NotConverted` when
    pandoc writes no math (texmath cannot read the tokens, or there are none)."""
    tokens = list(tokens)
    limit = sys.getrecursionlimit()
    # room for the nesting of these tokens, however deep the caller is; the limit is the process's,
    # so it is set back at once (the suite scores in one thread)
    sys.setrecursionlimit(limit + _FRAMES_PER_TOKEN * len(tokens))
    try:
        return _Reader(tokens).formula()
    except _Fail:
        raise NotConverted(" ".join(tokens)) from None
    finally:
        sys.setrecursionlimit(limit)
