"""HMERModel: DenseNet-B encoder -> 1x1 conv to d_model -> image positions -> decoder; and `build_model`,
one from a ModelConfig, a full Config or a preset's name (`hmer.model_presets`).

    model = build_model("comer-fusion")                     # or build_model(cfg.model)
    feats, feat_mask = model.encode(images, image_mask)     # [B, h, w, d], bool [B, h, w]
    logits = model(images, image_mask, tgt_in)              # [B', L, V]
    loss = model.loss(images, image_mask, token_ids)        # what the trainer minimises
    attn = model.attention_maps(images, image_mask, tgt_in) # [B', L, h, w]

The encoder tail (`model.encoder_tail`) after the 1x1 conv (with bias) is BTTR's
`relu-norm-pos` (ReLU -> LayerNorm -> + image positions) or CoMER's `pos-norm` (+ image
positions -> LayerNorm, no ReLU). Padded feature positions are masked out of every attention;
with `model.mask_padding` they are also zeroed (the references leave them as computed).

Bidirectional training: `tgt_in` may hold k times as many rows as there are images (k = 2 for `bi`: l2r
rows, then r2l rows); each image is encoded once and its features repeated k times in the rows' order (BTTR's
`torch.cat([x, x])`), or read once by a decoder that takes grouped memory (`groups_directions`,
hmer.model.accelerations).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..config import Config, ModelConfig
from ..model_presets import PRESETS, preset_config
from ..registry import DECODERS, IMAGE_POSITIONS
from .accelerations import PointwiseConv, grouped_directions
from .counting import CountingDecoder, caption_counts, counting_loss
from .decoder_base import PAD_ID, Decoder, make_targets
from .encoder import DenseNetB
from .transformer import sums_before


def repeat_rows(feats: Tensor, feat_mask: Tensor, rows: int) -> tuple[Tensor, Tensor]:
    """Repeat [B, ...] features k = rows / B times along the batch (l2r block, r2l block, ...)."""
    b = feats.shape[0]
    if rows == b:
        return feats, feat_mask
    if rows % b:
        raise ValueError(f"{rows} target rows for {b} images: expected a multiple (k directions x B)")
    k = rows // b
    return feats.repeat(k, 1, 1, 1), feat_mask.repeat(k, 1, 1)


class HMERModel(nn.Module):
    groups_directions = False  # hmer.model.accelerations

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        self.cfg = dataclasses.replace(cfg)
        self.encoder = DenseNetB(cfg)
        self.feature_proj = PointwiseConv(self.encoder.out_channels, cfg.d_model)
        self.feature_norm = nn.LayerNorm(cfg.d_model)
        self.image_pos = IMAGE_POSITIONS.get(cfg.image_pos)(cfg.d_model, cfg.cape_grid)
        # the decoder `model.decoder` names; with `model.counting`, its classifier also reads CAN's symbol counts
        decoder: Decoder = DECODERS.get(cfg.decoder)(cfg)
        self.decoder = CountingDecoder(decoder, cfg) if cfg.counting else decoder

    @property
    def stride(self) -> int:
        """Image pixels per feature position (16 for the paper encoders)."""
        return self.encoder.stride

    def encode(self, images: Tensor, image_mask: Tensor) -> tuple[Tensor, Tensor]:
        """images [B, 1, H, W], image_mask [B, H, W] -> feats [B, h, w, d], feat_mask [B, h, w]."""
        x, mask = self.encoder(images, image_mask)
        if self.cfg.encoder_tail == "relu-norm-pos":
            x = F.relu(self.feature_proj(x)).permute(0, 2, 3, 1)
            x = self.image_pos(self.feature_norm(x), mask)
        else:  # pos-norm
            x = self.feature_norm(self.image_pos(self.feature_proj(x).permute(0, 2, 3, 1), mask))
        if self.cfg.mask_padding:
            x = x.masked_fill(mask[..., None], 0.0)
        return x, mask

    def decode(self, feats: Tensor, feat_mask: Tensor, tgt_in: Tensor, tgt_pad_mask: Optional[Tensor] = None,
               return_attention: bool = False, group: int = 0):
        """Teacher forcing on encoded features; tgt_in may have k * B rows (see module doc). group > 0: tgt_in has
        B * group rows instead, image-major (row r reads image r // group; `Decoder.reads_grouped_memory`)."""
        if group > 0:
            if tgt_in.shape[0] != feats.shape[0] * group:
                raise ValueError(f"{tgt_in.shape[0]} target rows for {feats.shape[0]} images in groups of {group}")
            if not self.decoder.reads_grouped_memory:
                feats, feat_mask = feats.repeat_interleave(group, 0), feat_mask.repeat_interleave(group, 0)
            return self.decoder(feats, feat_mask, tgt_in, tgt_pad_mask, return_attention=return_attention)
        blocks, rest = divmod(tgt_in.shape[0], feats.shape[0])
        if self.groups_directions and self.decoder.reads_grouped_memory and blocks > 1 and not rest \
                and not return_attention:
            return grouped_directions(self.decoder, feats, feat_mask, tgt_in, tgt_pad_mask, blocks)
        feats, feat_mask = repeat_rows(feats, feat_mask, tgt_in.shape[0])
        return self.decoder(feats, feat_mask, tgt_in, tgt_pad_mask, return_attention=return_attention)

    def forward(self, images: Tensor, image_mask: Tensor, tgt_in: Tensor,
                tgt_pad_mask: Optional[Tensor] = None) -> Tensor:
        feats, feat_mask = self.encode(images, image_mask)
        return self.decode(feats, feat_mask, tgt_in, tgt_pad_mask)

    def loss(self, images: Tensor, image_mask: Tensor, token_ids: Sequence[Sequence[int]],
             direction: Optional[str] = None) -> Tensor:
        """Mean cross-entropy over the non-pad target tokens, in cfg.direction (or `direction`).

        For `bi` both halves hold the same number of tokens (the same sequences, reversed), so
        the token mean is exactly the average of the l2r and r2l losses.
        """
        tgt_in, tgt_out, _ = make_targets(token_ids, direction or self.cfg.direction, device=images.device)
        return self.loss_from_targets(images, image_mask, tgt_in, tgt_out)

    def loss_from_targets(self, images: Tensor, image_mask: Tensor, tgt_in: Tensor, tgt_out: Tensor,
                          label_smoothing: float = 0.0, counted: Optional[Tensor] = None,
                          counting_weight: float = 1.0) -> Tensor:
        """`loss` on targets already built and on the device, so the trainer's step never copies from
        the host (which would wait for the GPU). `label_smoothing`: Szegedy et al., 2016. With
        `model.counting` and `counted` [V] (bool), CAN's counting loss is added with `counting_weight`;
        without them, the decoder's loss alone (what validation's `val_loss` reads for every model)."""
        feats, feat_mask = self.encode(images, image_mask)
        logits = self.decode(feats, feat_mask, tgt_in)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tgt_out.flatten(), ignore_index=PAD_ID,
                               label_smoothing=label_smoothing)
        if counted is None or not isinstance(self.decoder, CountingDecoder):
            return loss
        mean, branches = self.decoder.counter(feats, feat_mask)
        target = caption_counts(tgt_out, images.shape[0], counted)
        return loss + counting_weight * counting_loss(branches, mean, target)

    @torch.no_grad()
    def attention_maps(self, images: Tensor, image_mask: Tensor, tgt_in: Tensor, coverage: bool = False) -> Tensor:
        """Cross-attention maps [B', L, h, w] for teacher-forced `tgt_in`: the last decoder layer's,
        averaged over heads (row t: where the model looked to predict token t+1). With
        coverage=True, the coverage instead: the sum of the maps of the steps before t."""
        feats, feat_mask = self.encode(images, image_mask)
        _, attn = self.decode(feats, feat_mask, tgt_in, return_attention=True)
        return sums_before(attn) if coverage else attn


def build_model(cfg: ModelConfig | Config | str) -> HMERModel:
    """An HMERModel from a ModelConfig, a full Config (its .model) or a preset name."""
    if isinstance(cfg, str):
        cfg = preset_config(cfg)
    elif isinstance(cfg, Config):
        cfg = cfg.model
    return HMERModel(cfg)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def parameter_counts(cfg: ModelConfig) -> tuple[int, int]:
    """(number of parameters, what CAN's symbol counting adds to them: `model.counting`, hmer.model.counting).
    The models are built on the meta device: no memory, no initialisation cost."""
    with torch.device("meta"):
        params = count_parameters(build_model(cfg))
        return params, count_parameters(build_model(dataclasses.replace(cfg, counting=True))) - params


def list_presets() -> list[tuple[str, str, int, int]]:
    """(name, description, `parameter_counts`) for every preset, in definition order."""
    return [(name, PRESETS[name].description, *parameter_counts(preset_config(name))) for name in PRESETS]
