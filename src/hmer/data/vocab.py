"""The CROHME vocabulary: the 110-symbol BTTR/WAP dictionary plus pad, sos and eos.

The shared captions follow the BTTR/WAP convention (with `'` and without `\\Pi`),
so the table below is that dictionary, in a fixed order that never changes: ids are
part of every checkpoint.
"""

from __future__ import annotations

from typing import Iterable, Sequence

PAD, SOS, EOS = "<pad>", "<sos>", "<eos>"
SPECIALS = (PAD, SOS, EOS)

# The 110 symbols of the BTTR/WAP CROHME dictionary.
CROHME_SYMBOLS: tuple[str, ...] = tuple(
    """
    ! ' ( ) + , - . / 0 1 2 3 4 5 6 7 8 9 < = > A B C E F G H I L M N P R S T V X Y [
    \\Delta \\alpha \\beta \\cdot \\cdots \\cos \\div \\exists \\forall \\frac \\gamma \\geq
    \\in \\infty \\int \\lambda \\ldots \\leq \\lim \\limits \\log \\mu \\neq \\phi \\pi \\pm
    \\prime \\rightarrow \\sigma \\sin \\sqrt \\sum \\tan \\theta \\times \\{ \\} ] ^ _
    a b c d e f g h i j k l m n o p q r s t u v w x y z { | }
    """.split()
)
assert len(CROHME_SYMBOLS) == 110 and len(set(CROHME_SYMBOLS)) == 110
# The tokens that lay a formula out rather than write a symbol: what symbol counting leaves uncounted
# (CAN's counting labels leave them out too; hmer.model.counting).
STRUCTURE_TOKENS = ("{", "}", "^", "_")


class UnknownTokenError(ValueError):
    """A caption token that the vocabulary does not hold; names the token and where it was."""

    def __init__(self, token: str, source: str | None = None):
        where = f"{source}: " if source else ""
        super().__init__(f"{where}token {token!r} is not in the vocabulary")
        self.token = token
        self.source = source


class Vocab:
    """Token <-> id. pad = 0, sos = 1, eos = 2, then the symbols."""

    def __init__(self, symbols: Sequence[str] = CROHME_SYMBOLS):
        self.itos: list[str] = list(SPECIALS) + list(symbols)
        self.stoi: dict[str, int] = {s: i for i, s in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise ValueError("vocabulary symbols must be unique")
        self.pad_id, self.sos_id, self.eos_id = 0, 1, 2

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: str) -> bool:
        return token in self.stoi

    def encode(self, tokens: Iterable[str], source: str | None = None) -> list[int]:
        """Tokens -> ids, without sos/eos. `source` (file and line) goes into the error."""
        try:
            return [self.stoi[tok] for tok in tokens]
        except KeyError as missing:
            raise UnknownTokenError(missing.args[0], source) from None

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Ids -> tokens, dropping pad, sos and eos."""
        return [self.itos[i] for i in ids if i > 2]
