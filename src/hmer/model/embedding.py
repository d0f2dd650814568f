"""Token embedding: lookup table + 1-D positions (+ CoMER's LayerNorms when asked)."""

from __future__ import annotations

import torch.nn as nn
from torch import Tensor

from ..config import ModelConfig
from ..registry import TOKEN_POSITIONS


class TokenEmbedding(nn.Module):
    """tokens [B, L] -> [B, L, d] = embed(tokens) + position(start .. start+L-1).

    embed_norm: LayerNorm(embed(tokens)) + position (BTTR's `word_embed`);
    embed_norm and embed_pos_norm: LayerNorm(LayerNorm(embed(tokens)) + position) (CoMER's).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, norm = cfg.d_model, cfg.embed_norm
        self.table = nn.Embedding(cfg.vocab_size, d)
        self.positions = TOKEN_POSITIONS.get(cfg.token_pos)(d, cfg.max_len)
        self.embed_norm = nn.LayerNorm(d) if norm else nn.Identity()
        self.out_norm = nn.LayerNorm(d) if norm and cfg.embed_pos_norm else nn.Identity()

    def forward(self, tokens: Tensor, start: int = 0) -> Tensor:
        x = self.embed_norm(self.table(tokens))
        x = x + self.positions(tokens.shape[1], start).to(x.dtype)
        return self.out_norm(x)
