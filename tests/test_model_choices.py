"""Every registered model choice (decoders, coverage kinds, positions) on tiny configurations: shapes
and dtypes (float32 and bfloat16), causality, incremental decoding against the teacher-forced pass,
coverage using only the past, and padding invariance. Everything runs in eval mode where outputs are
compared (dropout off, BatchNorm on its running statistics)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from hmer.model import build_model, make_targets
from hmer.model.accelerations import accelerate
from hmer.model.hmer_model import repeat_rows
from hmer.model_presets import preset_config
from tiny_dataset import make_images

torch.set_num_threads(1)

VOCAB = 113
# (preset, overrides): every decoder, and every coverage mode of the transformer.
DECODERS = {
    "transformer": ("tiny-transformer", {}),
    "comer-self": ("tiny-comer", {"coverage": "self"}),
    "comer-cross": ("tiny-comer", {"coverage": "cross"}),
    "comer-fusion": ("tiny-comer", {"coverage": "fusion"}),
    "rnn": ("tiny-rnn", {}),
    "convs2s": ("tiny-convs2s", {}),
    "convs2s-gehring": ("tiny-convs2s", {"conv_attention": "gehring"}),
}
# A smaller trunk still: these tests are about the decoders and the masks.
SMALL = {"growth_rate": 4, "num_dense_layers": 2, "d_model": 32, "nhead": 4, "dim_feedforward": 64,
         "rnn_hidden": 32, "rnn_attention": 32, "rnn_embedding": 32, "rnn_coverage_kernel": 5}


def make_model(variant: str = "transformer", seed: int = 0, **overrides):
    preset, extra = DECODERS[variant]
    cfg = dataclasses.replace(preset_config(preset), **{**SMALL, **extra, **overrides})
    torch.manual_seed(seed)
    model = build_model(cfg)
    _warm_batchnorm(model)
    return model.eval()


def _warm_batchnorm(model) -> None:
    """Give BatchNorm non-trivial running statistics, so eval-mode tests exercise them."""
    model.train()
    images, mask = make_images([(24, 40), (16, 24)])
    with torch.no_grad():
        model.loss(images, mask, [[5, 6, 7], [8, 9]])


TOKENS = [[5, 6, 7, 8, 9], [10, 11, 12]]
SIZES = [(32, 48), (24, 32)]


# ---- shapes and dtypes --------------------------------------------------------------------------

def _check_forward(model, dtype, direction="bi"):
    images, mask = make_images(SIZES)
    model = model.to(dtype)
    tgt_in, tgt_out, pad = make_targets(TOKENS, direction)
    feats, feat_mask = model.encode(images.to(dtype), mask)
    assert feats.dtype == dtype and feats.shape == (2, 4, 6, model.cfg.d_model)
    assert feat_mask.dtype == torch.bool and feat_mask.shape == (2, 4, 6)
    assert feat_mask[1, 3:].all() and feat_mask[1, :, 4:].all() and not feat_mask[1, :3, :4].any()
    logits = model(images.to(dtype), mask, tgt_in)
    assert logits.dtype == dtype and logits.shape == (tgt_in.shape[0], tgt_in.shape[1], VOCAB)
    assert torch.isfinite(logits).all()
    model.train()
    loss = model.loss(images.to(dtype), mask, TOKENS)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.eval()
    state = model.decoder.init_state(feats, feat_mask)
    step_logits, state = model.decoder.step(state, tgt_in[:2, 0])
    assert step_logits.dtype == dtype and step_logits.shape == (2, VOCAB)
    attn = model.attention_maps(images.to(dtype), mask, tgt_in)
    assert attn.shape == (tgt_in.shape[0], tgt_in.shape[1], 4, 6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("variant", list(DECODERS))
def test_every_decoder_runs_in_float32_and_bfloat16(variant, dtype):
    _check_forward(make_model(variant), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("image_pos", ["sin2d", "cape", "learned", "none"])
def test_every_image_position_encoding_runs(image_pos, dtype):
    _check_forward(make_model("transformer", image_pos=image_pos), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("variant", ["transformer", "convs2s"])
@pytest.mark.parametrize("token_pos", ["sin1d", "learned"])
def test_every_token_position_encoding_runs(variant, token_pos, dtype):
    _check_forward(make_model(variant, token_pos=token_pos), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("direction", ["l2r", "r2l", "bi"])
def test_every_direction_runs(direction, dtype):
    _check_forward(make_model("comer-fusion", direction=direction), dtype, direction)


def test_bf16_autocast_forward():
    model = make_model("comer-fusion")
    images, mask = make_images(SIZES)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model.loss(images, mask, TOKENS)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)


# ---- causality and incremental decoding ---------------------------------------------------------

@pytest.mark.parametrize("variant", list(DECODERS))
def test_logits_never_depend_on_later_tokens(variant):
    model = make_model(variant)
    images, mask = make_images(SIZES)
    tgt_in, _, _ = make_targets([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]], "l2r")
    t = 3
    changed = tgt_in.clone()
    changed[:, t + 1:] = torch.randint(3, VOCAB, changed[:, t + 1:].shape)
    with torch.no_grad():
        a, b = model(images, mask, tgt_in), model(images, mask, changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=1e-5)
    assert not torch.allclose(a[:, t + 1:], b[:, t + 1:])


def _incremental(model, feats, feat_mask, tgt_in):
    state = model.decoder.init_state(feats, feat_mask)
    out = []
    for t in range(tgt_in.shape[1]):
        logits, state = model.decoder.step(state, tgt_in[:, t])
        out.append(logits)
    return torch.stack(out, 1)


@pytest.mark.parametrize("variant", list(DECODERS))
def test_incremental_decoding_equals_teacher_forcing(variant):
    model = make_model(variant, image_pos="cape", token_pos="learned")
    images, mask = make_images(SIZES)
    tgt_in, _, _ = make_targets([[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]], "r2l")
    with torch.no_grad():
        feats, feat_mask = model.encode(images, mask)
        full = model.decode(feats, feat_mask, tgt_in)
        steps = _incremental(model, feats, feat_mask, tgt_in)
    torch.testing.assert_close(steps, full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", ["transformer", "comer-fusion", "rnn", "convs2s"])
def test_reorder_state_expands_and_reorders_beams(variant):
    """Expand 2 images to 3 beams each, feed each beam its own prefix, shuffle the beams midway:
    every row's logits must equal a teacher-forced pass on that row's image and prefix."""
    model = make_model(variant)
    images, mask = make_images(SIZES)
    beam = 3
    g = torch.Generator().manual_seed(3)
    prefixes = torch.randint(3, VOCAB, (2 * beam, 5), generator=g)
    prefixes[:, 0] = 1
    with torch.no_grad():
        feats, feat_mask = model.encode(images, mask)
        state = model.decoder.init_state(feats, feat_mask)
        state = model.decoder.reorder_state(state, torch.arange(2).repeat_interleave(beam))
        rows = torch.arange(2 * beam)  # which prefix each state row follows
        for t in range(prefixes.shape[1]):
            if t == 2:  # reorder within each image's beams, as beam search does
                perm = torch.tensor([2, 0, 0, 4, 5, 3])
                state = model.decoder.reorder_state(state, perm)
                rows = rows[perm]
            logits, state = model.decoder.step(state, prefixes[rows, t])
        expected = model.decode(feats.repeat_interleave(beam, 0), feat_mask.repeat_interleave(beam, 0), prefixes)
    torch.testing.assert_close(logits, expected[rows, -1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", ["transformer", "comer-self", "comer-cross", "comer-fusion", "rnn", "convs2s"])
def test_grouped_rows_read_each_image_once_and_drop_finished_images(variant):
    """Beam search's layout (reorder_state(..., group=beam)): rows image-major, beams reordered
    within each image, then the first image dropped; the transformer then attends per image
    (state.groups), with or without coverage, and memory is cut to the live image. Every row's logits must still equal a
    teacher-forced pass on its image and prefix, and the teacher-forced pass with group=beam
    (joint search's rescoring) must equal the one on repeated features."""
    model = make_model(variant)
    images, mask = make_images(SIZES)
    beam = 3
    g = torch.Generator().manual_seed(4)
    prefixes = torch.randint(3, VOCAB, (2 * beam, 6), generator=g)
    prefixes[:, 0] = 1
    with torch.no_grad():
        feats, feat_mask = model.encode(images, mask)
        state = model.decoder.init_state(feats, feat_mask)
        state = model.decoder.reorder_state(state, torch.arange(2).repeat_interleave(beam), group=beam)
        rows = torch.arange(2 * beam)
        for t in range(prefixes.shape[1]):
            if t == 2:
                perm = torch.tensor([2, 0, 0, 4, 5, 3])
                state = model.decoder.reorder_state(state, perm, group=beam)
                rows = rows[perm]
            if t == 4:  # image 0 is done: only image 1's beams go on
                keep = torch.tensor([3, 5, 4])
                state = model.decoder.reorder_state(state, keep, group=beam)
                rows = rows[keep]
                assert state.memory["mask"].shape[0] == 1  # memory holds the live image only
            logits, state = model.decoder.step(state, prefixes[rows, t])
        repeated = model.decode(feats.repeat_interleave(beam, 0), feat_mask.repeat_interleave(beam, 0), prefixes)
        grouped = model.decode(feats, feat_mask, prefixes, group=beam)
    torch.testing.assert_close(logits, repeated[rows, -1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(grouped, repeated, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="groups of 4"):
        model.decoder.reorder_state(state, torch.arange(3), group=4)


def _training_decoder(variant):
    """The variant in training mode with no dropout and the accelerations of training on a CPU
    (hmer.model.accelerations), and features of SIZES encoded once (the encoder's BatchNorm then
    reads the same batch for every pass compared)."""
    model = make_model(variant, dropout=0.0)
    accelerate(model, torch.device("cpu"))
    model.train()
    images, mask = make_images(SIZES)
    feats, feat_mask = model.encode(images, mask)
    return model, feats.detach(), feat_mask


def _real_token_loss(logits, tgt_out):
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=0,
                                             reduction="sum")


@pytest.mark.parametrize("direction", ["l2r", "bi"])
@pytest.mark.parametrize("variant", ["transformer", "transformer-explicit", "rnn", "convs2s"])
def test_a_padded_training_batch_computes_each_caption_as_if_alone(variant, direction):
    """Training pads captions to the batch's longest, bidirectional rows read their image as a
    group (the transformer projects its keys/values once) and the transformer's per-token layers
    compute the real tokens alone (accelerations.PackedTokens): every real position's logits and the
    gradients of the summed loss must equal those of each caption decoded alone, unpadded, on its image.
    `transformer-explicit` takes the attention path of training with dropout (its dropout rate
    rounds to dropping nothing) instead of the fused one."""
    model, feats, feat_mask = _training_decoder(variant.removesuffix("-explicit"))
    if variant.endswith("-explicit"):
        for layer in model.decoder.layers:
            layer.self_attn.dropout.p = layer.cross_attn.dropout.p = 1e-9  # explicit path; keeps every weight
    tgt_in, tgt_out, pad = make_targets(TOKENS, direction)
    assert pad.any()  # the two captions differ in length: the batch holds padding
    logits = model.decode(feats, feat_mask, tgt_in)
    grads = torch.autograd.grad(_real_token_loss(logits, tgt_out), list(model.decoder.parameters()))
    alone_loss = 0.0
    for row in range(tgt_in.shape[0]):
        image, length = row % len(TOKENS), int((~pad[row]).sum())
        alone = model.decode(feats[image:image + 1], feat_mask[image:image + 1], tgt_in[row:row + 1, :length])
        torch.testing.assert_close(logits[row, :length], alone[0], rtol=1e-5, atol=1e-5)
        alone_loss = alone_loss + _real_token_loss(alone, tgt_out[row:row + 1, :length])
    alone_grads = torch.autograd.grad(alone_loss, list(model.decoder.parameters()))
    for got, expected in zip(grads, alone_grads):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("variant", list(DECODERS))
def test_bidirectional_training_equals_the_pass_on_repeated_features(variant):
    """Both directions' rows grouped by image (accelerations.grouped_directions) against each image's
    features repeated once per direction (the plain path), with coverage too: the same logits at
    every real position."""
    model, feats, feat_mask = _training_decoder(variant)
    tgt_in, _, pad = make_targets(TOKENS, "bi")
    logits = model.decode(feats, feat_mask, tgt_in)
    repeated = model.decoder(*repeat_rows(feats, feat_mask, tgt_in.shape[0]), tgt_in)
    torch.testing.assert_close(logits[~pad], repeated[~pad], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("coverage", ["self", "cross", "fusion"])
def test_coverage_uses_only_past_attention(coverage):
    model = make_model(f"comer-{coverage}")
    images, mask = make_images(SIZES)
    tgt_in, _, _ = make_targets([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]], "l2r")
    attn = model.attention_maps(images, mask, tgt_in)
    cov = model.attention_maps(images, mask, tgt_in, coverage=True)
    assert (cov[:, 0] == 0).all()  # nothing before the first step
    torch.testing.assert_close(cov[:, 1:] - cov[:, :-1], attn[:, :-1], rtol=0, atol=1e-5)  # step t excluded
    t = 2
    changed = tgt_in.clone()
    changed[:, t + 1:] = 20
    cov2 = model.attention_maps(images, mask, changed, coverage=True)
    torch.testing.assert_close(cov2[:, : t + 2], cov[:, : t + 2], rtol=0, atol=1e-6)
    # The refinement term itself: an ARM fed attention that differs only from step t on
    # gives the same term up to step t.
    arm, feat_mask = model.decoder.arm, model.encode(images, mask)[1]
    from hmer.model.transformer import sums_before
    maps = torch.rand(2, 6, arm.conv.in_channels, feat_mask[0].numel())  # [B, L, C_in, S]
    later = maps.clone()
    later[:, t:] = torch.rand_like(later[:, t:])
    with torch.no_grad():
        a, b = arm(sums_before(maps), feat_mask), arm(sums_before(later), feat_mask)
    torch.testing.assert_close(a[:, :, : t + 1], b[:, :, : t + 1])
    assert not torch.allclose(a[:, :, t + 1:], b[:, :, t + 1:])


def test_attention_maps_are_distributions_over_the_unpadded_image():
    model = make_model("comer-fusion")
    images, mask = make_images(SIZES)
    tgt_in, _, _ = make_targets(TOKENS, "l2r")
    attn = model.attention_maps(images, mask, tgt_in)
    feat_mask = model.encode(images, mask)[1]
    assert (attn.masked_select(feat_mask[:, None]) == 0).all()
    torch.testing.assert_close(attn.sum(dim=(2, 3)), torch.ones(2, tgt_in.shape[1]))


@pytest.mark.parametrize("kind", ["gehring", "scaled"])
def test_convs2s_attention_computes_its_formula_with_and_without_the_weights(kind):
    from hmer.model.convs2s import ImageAttention

    torch.manual_seed(0)
    d, lengths = 16, (10, 6)
    attention = ImageAttention(d, kind)
    x, g, memory = torch.randn(2, 3, d), torch.randn(2, 3, d), torch.randn(2, 10, d)
    pad = torch.arange(10)[None, :] >= torch.tensor(lengths)[:, None]
    expected = []
    with torch.no_grad():
        for i, m in enumerate(lengths):
            q, z = (attention.in_proj(x[i]) + g[i]) * math.sqrt(0.5), memory[i, :m]
            if kind == "scaled":  # a transformer's attention: scores over sqrt(d), a weighted average
                context = torch.softmax(q @ z.T / math.sqrt(d), -1) @ z
            else:  # Gehring et al.: unscaled scores, the context times m sqrt(1/m)
                context = torch.softmax(q @ z.T, -1) @ z * (m * math.sqrt(1 / m))
            expected.append((attention.out_proj(context) + x[i]) * math.sqrt(0.5))
        fast, none = attention(x, g, memory, pad, need_weights=False)
        explicit, weights = attention(x, g, memory, pad, need_weights=True)
    assert none is None
    torch.testing.assert_close(fast, torch.stack(expected))
    torch.testing.assert_close(explicit, torch.stack(expected))
    assert (weights[1, :, 6:] == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3))


def test_convs2s_takes_the_scaled_attention_in_presets_and_studies():
    from hmer.studies.suite.ablate_decoder import DECODER

    assert preset_config("convs2s").conv_attention == preset_config("tiny-convs2s").conv_attention == "scaled"
    cells = {cell["model.decoder"]: DECODER.overrides(cell) for cell in DECODER.cells([1])}
    assert cells["convs2s"]["model.conv_attention"] == "scaled"
    assert "model.conv_attention" not in cells["rnn"] and "model.conv_attention" not in cells["transformer"]


# ---- padding ------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant,image_pos", [(v, "sin2d") for v in DECODERS]
                         + [("transformer", p) for p in ("cape", "learned", "none")])
def test_padding_an_image_onto_a_bigger_canvas_changes_nothing(variant, image_pos):
    """The same images alone on tight canvases and together on a larger one (whose size is not a
    multiple of the stride), in eval mode: identical features and logits."""
    model = make_model(variant, image_pos=image_pos)
    sizes = [(29, 45), (19, 26)]
    tgt_in, _, _ = make_targets(TOKENS, "bi")
    big, big_mask = make_images(sizes, canvas=(45, 70))
    with torch.no_grad():
        big_feats, big_fmask = model.encode(big, big_mask)
        big_logits = model(big, big_mask, tgt_in)
        for i, (h, w) in enumerate(sizes):
            img, m = big[i:i + 1, :, :h, :w], big_mask[i:i + 1, :h, :w]
            feats, fmask = model.encode(img, m)
            fh, fw = feats.shape[1:3]
            assert not fmask.any() and not big_fmask[i, :fh, :fw].any() and big_fmask[i, fh:].all()
            torch.testing.assert_close(big_feats[i:i + 1, :fh, :fw], feats, rtol=1e-4, atol=1e-4)
            rows = [i, i + 2]  # the image's l2r and r2l rows
            torch.testing.assert_close(big_logits[rows], model(img, m, tgt_in[rows]), rtol=1e-4, atol=1e-4)
