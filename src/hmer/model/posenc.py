"""Positional encodings for target tokens (1-D) and image features (2-D), and the token embedding.

Token positions (`ModelConfig.token_pos`), added to token embeddings [B, L, d]: `sin1d` (fixed
sinusoids; Vaswani et al., BTTR's WordPosEnc) or `learned` (a table of `max_len` rows; ConvS2S).
Image positions (`ModelConfig.image_pos`), added to features [B, h, w, d] with mask [B, h, w]: `sin2d`
(CoMER's), `sin2d-bttr` (BTTR's), `cape` (StyTr^2's), `learned` and `none`; each class says what it
computes. Every image encoding is computed from the unpadded region of each image only, so padding
an image onto a larger canvas never changes the encoding of its pixels.

Each encoding registers itself under its config name (hmer.registry TOKEN_POSITIONS,
IMAGE_POSITIONS): a builder `make(d_model, max_len)` for tokens, `make(d_model, grid)` for images.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch import Tensor

from ..config import ModelConfig
from ..registry import IMAGE_POSITIONS, TOKEN_POSITIONS

TEMPERATURE = 10000.0


# ---- tokens ----------------------------------------------------------------------------------

def sinusoid_table(length: int, d_model: int, temperature: float = TEMPERATURE) -> Tensor:
    """[length, d_model]: even dims sin(pos * f_i), odd dims cos(pos * f_i), f_i = temperature^(-2i/d)."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    inv_freq = temperature ** (-torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
    table = torch.zeros(length, d_model)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table


class SinusoidalTokenPositions(nn.Module):
    """Fixed 1-D sinusoids. The table is a non-persistent buffer (not in checkpoints), so
    it can be longer than any target without affecting saved models."""

    table: Tensor  # the buffer's type (register_buffer does not declare it)

    def __init__(self, d_model: int, max_len: int = 1024):
        super().__init__()
        self.register_buffer("table", sinusoid_table(max_len, d_model), persistent=False)

    def forward(self, length: int, start: int = 0) -> Tensor:
        """[length, d] encodings of positions start .. start+length-1."""
        return self.table[start:start + length]


@TOKEN_POSITIONS.register("sin1d", description="fixed 1-D sinusoids (Vaswani et al.; BTTR)")
def _sin1d(d_model: int, max_len: int) -> nn.Module:
    # The table is not saved, so it is made long enough for any decoding length.
    return SinusoidalTokenPositions(d_model, max(1024, max_len))


@TOKEN_POSITIONS.register("learned")
class LearnedTokenPositions(nn.Module):
    """ConvS2S's learned absolute positions: one vector per position up to `max_len`."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.table = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.table.weight, std=0.1)

    def forward(self, length: int, start: int = 0) -> Tensor:
        return self.table.weight[start:start + length]


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


# ---- helpers: per-image extents, resizing and pooling as matrices ------------------------------
# Resizing to, or pooling over, each image's unpadded region as small per-image matrices applied
# with einsum: no Python loop over the batch, no host sync.

def valid_extent(mask: Tensor) -> tuple[Tensor, Tensor]:
    """Unpadded height and width of each image, [B] each (long, >= 1). Padding is bottom/right."""
    heights = (~mask[:, :, 0]).sum(dim=1).clamp_min(1)
    widths = (~mask[:, 0, :]).sum(dim=1).clamp_min(1)
    return heights, widths


def resize_matrix(n: int, extent: Tensor, size: int) -> Tensor:
    """[B, size, n]: bilinear (align_corners=False) resampling of n grid cells onto `extent`
    output pixels; rows at or beyond each image's extent are zero. Same weights as
    F.interpolate(mode="bilinear", align_corners=False) on the unpadded region."""
    out = torch.arange(size, device=extent.device, dtype=torch.float32)
    ext = extent.to(torch.float32)[:, None]
    src = ((out[None, :] + 0.5) * (n / ext) - 0.5).clamp(0, n - 1)  # [B, size]
    lo = src.floor()
    frac = src - lo
    lo = lo.long()
    hi = (lo + 1).clamp(max=n - 1)
    cells = torch.arange(n, device=extent.device)
    weights = (cells == lo[..., None]) * (1 - frac)[..., None] + (cells == hi[..., None]) * frac[..., None]
    return weights * (out[None, :] < ext)[..., None]


def adaptive_pool_matrix(n: int, extent: Tensor, size: int) -> Tensor:
    """[B, n, size]: averaging weights of adaptive average pooling of `extent` pixels into n cells
    (cell i covers [floor(i*E/n), ceil((i+1)*E/n)), as F.adaptive_avg_pool2d)."""
    cells = torch.arange(n, device=extent.device)[None, :, None]
    ext = extent[:, None, None]
    start = (cells * ext) // n
    end = ((cells + 1) * ext + n - 1) // n
    pixel = torch.arange(size, device=extent.device)[None, None, :]
    inside = (pixel >= start) & (pixel < end)
    return inside.to(torch.float32) / (end - start).to(torch.float32)


# ---- images ----------------------------------------------------------------------------------

class NoImagePositions(nn.Module):
    """No image positions: the features as they are."""

    def forward(self, feats: Tensor, mask: Tensor) -> Tensor:
        return feats


class Sinusoidal2DImagePositions(nn.Module):
    """CoMER's ImgPosEnc (normalize=True): position = cumulative count of unpadded rows/columns,
    divided by the unpadded height/width and scaled to [0, 2*pi]; sin/cos of d/4 frequencies
    per axis, interleaved; [x half, y half] concatenated."""

    def __init__(self, d_model: int, temperature: float = TEMPERATURE):
        super().__init__()
        if d_model % 4:
            raise ValueError(f"d_model={d_model} must be divisible by 4 for the 2-D sinusoidal encoding")
        self.axis_dims = d_model // 2  # each axis's share of d (not `half`: that is nn.Module.half())
        self.temperature = temperature

    @staticmethod
    def normalized_positions(mask: Tensor) -> tuple[Tensor, Tensor]:
        """(y, x), each [B, h, w]: the unpadded positions scaled to (0, 2 pi] per image."""
        not_mask = ~mask
        y = not_mask.cumsum(1, dtype=torch.float32)
        x = not_mask.cumsum(2, dtype=torch.float32)
        eps = 1e-6
        return y / (y[:, -1:, :] + eps) * (2 * math.pi), x / (x[:, :, -1:] + eps) * (2 * math.pi)

    def frequencies(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """The frequencies of the sines and of the cosines, interleaved per axis: d/4 shared ones.
        Computed here rather than stored, so that model.to(bfloat16) cannot round them."""
        inv_freq = self.temperature ** (
            -torch.arange(0, self.axis_dims, 2, device=device, dtype=torch.float32) / self.axis_dims
        )
        return inv_freq, inv_freq

    def encoding(self, mask: Tensor) -> Tensor:
        """[B, h, w, d] float32 encoding of the unpadded positions (meaningless at padding)."""
        sin_freq, cos_freq = self.frequencies(mask.device)
        y, x = self.normalized_positions(mask)
        return torch.cat([torch.stack(((p[..., None] * sin_freq).sin(), (p[..., None] * cos_freq).cos()), dim=-1)
                          .flatten(-2) for p in (x, y)], dim=-1)

    def forward(self, feats: Tensor, mask: Tensor) -> Tensor:
        return feats + self.encoding(mask).to(feats.dtype)


class BTTRSinusoidal2DImagePositions(Sinusoidal2DImagePositions):
    """BTTR's ImgPosEnc (normalize=True): the positions of `sin2d`, encoded with d/2 frequencies
    f_j = temperature^(-j / (d/2)) per axis, dim j = sin(p f_j) for even j, cos(p f_j) for odd j."""

    def frequencies(self, device: torch.device) -> tuple[Tensor, Tensor]:
        inv_freq = 1.0 / self.temperature ** (
            torch.arange(self.axis_dims, device=device, dtype=torch.float32) / self.axis_dims
        )
        return inv_freq[0::2], inv_freq[1::2]


class LearnedImagePositions(nn.Module):
    """A learned n x n x d table, bilinearly resized to each image's unpadded feature size.
    Positions are therefore relative to the formula's extent, like `sin2d`, but learned."""

    def __init__(self, d_model: int, grid: int):
        super().__init__()
        self.grid = nn.Parameter(torch.randn(grid, grid, d_model) * 0.02)

    def forward(self, feats: Tensor, mask: Tensor) -> Tensor:
        b, h, w, _ = feats.shape
        heights, widths = valid_extent(mask)
        n = self.grid.shape[0]
        rows = resize_matrix(n, heights, h).to(feats.dtype)  # [B, h, n]
        cols = resize_matrix(n, widths, w).to(feats.dtype)  # [B, w, n]
        return feats + torch.einsum("bri,ijd,bcj->brcd", rows, self.grid.to(feats.dtype), cols)


class ContentAwareImagePositions(nn.Module):
    """StyTr^2's content-aware positional encoding (CAPE; Deng et al., CVPR 2022, eq. 6-7).

    As StyTr^2's models/transformer.py (`averagepooling` + `new_ps` + interpolate):
      1. P_L = F_pos(AvgPool_{n x n}(E)): the content features are average-pooled to a fixed n x n
         grid (n = 18 there, `cape_grid` here) and a learned 1x1 convolution maps each cell to a
         position code: a code says what content sits in that region, not its coordinates;
      2. P_CA = P_L bilinearly interpolated back to the feature map. The grid's fixed size makes
         the encoding scale-invariant.
    StyTr^2 has no content-independent learned table (that is our `learned`). Pooling and
    interpolation cover each image's unpadded region only, so a padded canvas gives the same encoding.
    """

    def __init__(self, d_model: int, grid: int):
        super().__init__()
        self.grid = grid
        self.position_code = nn.Linear(d_model, d_model)  # F_pos, StyTr^2's 1x1 conv `new_ps`

    def forward(self, feats: Tensor, mask: Tensor) -> Tensor:
        b, h, w, _ = feats.shape
        n = self.grid
        heights, widths = valid_extent(mask)
        content = feats.masked_fill(mask[..., None], 0)
        pool_rows = adaptive_pool_matrix(n, heights, h).to(feats.dtype)  # [B, n, h]
        pool_cols = adaptive_pool_matrix(n, widths, w).to(feats.dtype)  # [B, n, w]
        pooled = torch.einsum("bih,bhwd,bjw->bijd", pool_rows, content, pool_cols)  # [B, n, n, d]
        codes = self.position_code(pooled)
        rows = resize_matrix(n, heights, h).to(feats.dtype)  # [B, h, n]
        cols = resize_matrix(n, widths, w).to(feats.dtype)  # [B, w, n]
        return feats + torch.einsum("bri,bijd,bcj->brcd", rows, codes, cols)


# Registered in the order `hmer models` lists them; `grid` is n of the n x n tables.
IMAGE_POSITIONS.register("sin2d", lambda d_model, grid: Sinusoidal2DImagePositions(d_model),
                         description="2-D sinusoids of the normalised row and column (CoMER)")
IMAGE_POSITIONS.register("sin2d-bttr", lambda d_model, grid: BTTRSinusoidal2DImagePositions(d_model),
                         description="BTTR's 2-D sinusoids: d/2 frequencies per axis")
IMAGE_POSITIONS.register("cape", ContentAwareImagePositions,
                         description="content-aware positions pooled on an n x n grid (StyTr^2)")
IMAGE_POSITIONS.register("learned", LearnedImagePositions, description="a learned n x n table resized to each image")
IMAGE_POSITIONS.register("none", lambda d_model, grid: NoImagePositions(), description="no image positions")
