"""Token embedding: lookup table + 1-D positions (+ CoMER's LayerNorms when asked)."""

from __future__ import annotations

import torch.nn as nn
from torch import Tensor

from .posenc import make_token_positions


class TokenEmbedding(nn.Module):
    """tokens [B, L] -> [B, L, d] = embed(tokens) + position(start .. start+L-1).

    norm=True: LayerNorm(embed(tokens)) + position (BTTR's `word_embed`);
    norm=True, pos_norm=True: LayerNorm(LayerNorm(embed(tokens)) + position) (CoMER's).
    """

    def __init__(self, vocab_size: int, d_model: int, token_pos: str, max_len: int, norm: bool = False,
                 pos_norm: bool = True):
        super().__init__()
        self.table = nn.Embedding(vocab_size, d_model)
        self.positions = make_token_positions(token_pos, d_model, max_len)
        self.embed_norm = nn.LayerNorm(d_model) if norm else nn.Identity()
        self.out_norm = nn.LayerNorm(d_model) if norm and pos_norm else nn.Identity()

    def forward(self, tokens: Tensor, start: int = 0) -> Tensor:
        x = self.embed_norm(self.table(tokens))
        x = x + self.positions(tokens.shape[1], start).to(x.dtype)
        return self.out_norm(x)
