"""The factory and presets (parameter counts against the papers, every preset builds, the tiny
ones train), the direction helpers and the loss, and the building blocks checked against
PyTorch references (resizing, adaptive pooling, masked BatchNorm, the attention fast path)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from hmer.config import Config, ModelConfig
from hmer.data.vocab import Vocab
from hmer.model import build_model, count_parameters, list_presets, make_targets
from hmer.model.attention import MultiHeadAttention
from hmer.model.posenc import ContentAwareImagePositions, adaptive_pool_matrix, resize_matrix
from hmer.model.transformer import MaskedBatchNorm, sums_before
from hmer.model_presets import PRESETS, preset_config
from tiny_dataset import make_images

torch.set_num_threads(1)


# ---- presets ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,reference", [("bttr", 6.38e6), ("comer-fusion", 6.39e6)])
def test_parameter_counts_match_the_papers(name, reference):
    with torch.device("meta"):
        n = count_parameters(build_model(name))
    assert abs(n - reference) / reference < 0.02, f"{name}: {n:,} parameters, paper {reference:,.0f}"


def test_presets_cover_every_family_in_both_directions():
    for family in ("bttr", "comer-self", "comer-cross", "comer-fusion", "wap-rnn", "convs2s"):
        assert preset_config(family).direction == "bi"
        assert preset_config(f"{family}-l2r").direction == "l2r"
    assert preset_config("comer-cross").coverage == "cross" and preset_config("bttr").coverage == "none"
    assert preset_config("wap-rnn").decoder == "rnn" and preset_config("convs2s").decoder == "convs2s"
    for name in ("tiny-transformer", "tiny-comer", "tiny-rnn", "tiny-convs2s"):
        assert preset_config(name).d_model == 64
    with pytest.raises(KeyError, match="unknown model preset"):
        preset_config("nope")


def test_list_presets_counts_what_build_model_builds():
    rows = list_presets()
    assert [r[0] for r in rows] == list(PRESETS)
    counts = {name: n for name, _, n, _ in rows}
    assert all(description for _, description, _, _ in rows)
    assert counts["tiny-comer"] == count_parameters(build_model("tiny-comer"))
    assert counts["comer-fusion"] > counts["comer-self"] == counts["comer-cross"] > counts["bttr"]
    # beside each, what CAN's symbol counting adds (`hmer models` prints it)
    counting = {name: c for name, _, _, c in rows}
    tiny = preset_config("tiny-transformer")
    tiny.counting = True
    assert counting["tiny-transformer"] == count_parameters(build_model(tiny)) - counts["tiny-transformer"] > 0


def test_build_model_accepts_a_preset_name_a_model_config_or_a_config():
    cfg = preset_config("tiny-rnn")
    for arg in ("tiny-rnn", cfg, Config(model=cfg)):
        model = build_model(arg)
        assert model.cfg == cfg and type(model.decoder).__name__ == "GRUDecoder"
    with pytest.raises(ValueError, match="coverage"):
        build_model(dataclasses.replace(cfg, coverage="self"))


CPU_SIZED = [n for n in PRESETS if n.startswith("tiny") or n == "small"]  # stride 8: two dense blocks


@pytest.mark.parametrize("name", [n for n in PRESETS if n not in CPU_SIZED])
def test_paper_presets_build_and_run_forward(name):
    torch.manual_seed(0)
    model = build_model(name).eval()
    images, mask = make_images([(40, 56)])
    tgt_in, _, _ = make_targets([[5, 6, 7]], model.cfg.direction)
    with torch.no_grad():
        logits = model(images, mask, tgt_in)
    assert logits.shape == (tgt_in.shape[0], 4, 113) and torch.isfinite(logits).all()
    assert model.stride == 16


@pytest.mark.parametrize("name", CPU_SIZED)
def test_tiny_presets_train(name):
    torch.manual_seed(0)
    model = build_model(name)
    images, mask = make_images([(32, 48), (24, 40)])
    tokens = [[5, 6, 7, 8], [9, 10, 11]]
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(6):
        loss = model.loss(images, mask, tokens)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


# ---- direction and loss ---------------------------------------------------------------------------

def test_make_targets_for_each_direction():
    vocab = Vocab()
    tokens = [[5, 6, 7], [8]]
    tin, tout, pad = make_targets(tokens, "l2r", vocab)
    assert tin.tolist() == [[1, 5, 6, 7], [1, 8, 0, 0]] and tout.tolist() == [[5, 6, 7, 2], [8, 2, 0, 0]]
    assert pad.tolist() == [[False] * 4, [False, False, True, True]]
    tin, tout, _ = make_targets(tokens, "r2l", (0, 1, 2))
    assert tin.tolist() == [[2, 7, 6, 5], [2, 8, 0, 0]] and tout.tolist() == [[7, 6, 5, 1], [8, 1, 0, 0]]
    tin, tout, pad = make_targets(tokens, "bi")
    assert tin.shape == (4, 4) and tin[:2].tolist() == [[1, 5, 6, 7], [1, 8, 0, 0]]
    assert tout[2:].tolist() == [[7, 6, 5, 1], [8, 1, 0, 0]]
    assert tin.dtype == torch.long and pad.dtype == torch.bool
    with pytest.raises(ValueError):
        make_targets(tokens, "sideways")


def test_bidirectional_loss_is_the_average_of_both_directions():
    torch.manual_seed(0)
    model = build_model("tiny-comer").eval()  # eval: no dropout, the three losses see the same model
    images, mask = make_images([(32, 48), (24, 40)])
    tokens = [[5, 6, 7, 8, 9], [10, 11]]
    with torch.no_grad():
        bi = model.loss(images, mask, tokens)
        l2r = model.loss(images, mask, tokens, direction="l2r")
        r2l = model.loss(images, mask, tokens, direction="r2l")
        # and by hand: the two halves of the bi logits are the l2r and r2l passes
        tgt_in, tgt_out, _ = make_targets(tokens, "r2l")
        by_hand = F.cross_entropy(model(images, mask, tgt_in).flatten(0, 1), tgt_out.flatten(), ignore_index=0)
    torch.testing.assert_close(bi, (l2r + r2l) / 2)
    torch.testing.assert_close(r2l, by_hand)
    assert not torch.allclose(l2r, r2l)


def test_bidirectional_encodes_each_image_once():
    model = build_model("tiny-transformer").eval()
    images, mask = make_images([(32, 48), (24, 40)])
    calls = []
    model.encoder.register_forward_hook(lambda m, args, out: calls.append(args[0].shape[0]))
    model.loss(images, mask, [[5, 6], [7]])
    assert calls == [2]


# ---- building blocks against PyTorch references ---------------------------------------------------

def test_resize_and_pool_matrices_match_interpolate_and_adaptive_pool():
    n, size = 5, 13
    grid = torch.randn(1, 3, n, n)
    for extent in (1, 3, 5, 8, 13):
        rows = resize_matrix(n, torch.tensor([extent]), size)[0]
        ours = torch.einsum("ri,bcij,sj->bcrs", rows, grid, rows)[:, :, :extent, :extent]
        ref = F.interpolate(grid, size=(extent, extent), mode="bilinear", align_corners=False)
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
        assert (rows[extent:] == 0).all()
        x = torch.randn(1, 3, extent, extent)
        pool = adaptive_pool_matrix(n, torch.tensor([extent]), size)[0, :, :extent]
        torch.testing.assert_close(torch.einsum("ih,bchw,jw->bcij", pool, x, pool), F.adaptive_avg_pool2d(x, n))


def test_cape_pools_only_the_unpadded_region():
    cape = ContentAwareImagePositions(8, grid=3)
    feats = torch.randn(1, 7, 9, 8)
    mask = torch.ones(1, 7, 9, dtype=torch.bool)
    mask[:, :5, :6] = False
    out = cape(feats, mask)[:, :5, :6]
    crop = feats[:, :5, :6]
    pooled = F.adaptive_avg_pool2d(crop.permute(0, 3, 1, 2), 3)
    codes = F.conv2d(pooled, cape.position_code.weight[..., None, None], cape.position_code.bias)
    expected = crop + F.interpolate(codes, size=(5, 6), mode="bilinear", align_corners=False).permute(0, 2, 3, 1)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_masked_batchnorm_matches_batchnorm_over_the_unpadded_positions():
    """CoMER's MaskBatchNorm2d: BatchNorm1d over the gathered unpadded feature vectors."""
    x = torch.randn(4, 3, 5, 6)
    valid = torch.zeros(4, 1, 5, 6)
    valid[:, :, :4, :3] = 1
    valid[0, :, :, :] = 1
    ours, ref = MaskedBatchNorm(3), torch.nn.BatchNorm1d(3)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 2), ours.bias.uniform_(-1, 1)
        ref.weight.copy_(ours.weight), ref.bias.copy_(ours.bias)
    keep = valid[:, 0].bool()
    expected = ref(x.permute(0, 2, 3, 1)[keep])
    got = ours(x, valid).permute(0, 2, 3, 1)[keep]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.running_mean, ref.running_mean)
    torch.testing.assert_close(ours.running_var, ref.running_var)
    ours.eval(), ref.eval()
    torch.testing.assert_close(ours(x, valid).permute(0, 2, 3, 1)[keep], ref(x.permute(0, 2, 3, 1)[keep]))


def test_attention_fast_path_equals_explicit_scores_and_refinement_is_subtracted():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).eval()
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 4:] = True
    fast = mha(x, memory, key_padding_mask=pad).out
    slow, weights, _ = mha(x, memory, key_padding_mask=pad, need_weights=True)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)
    assert (weights[1, :, :, 4:] == 0).all()
    causal_fast = mha(x, causal=True).out
    causal_slow, causal_w, _ = mha(x, causal=True, need_weights=True)
    torch.testing.assert_close(causal_fast, causal_slow, rtol=1e-5, atol=1e-5)
    assert (causal_w.triu(1) == 0).all()
    term = torch.randn(2, 4, 5, 7)
    _, refined, unrefined = mha(x, memory, key_padding_mask=pad, refine=lambda attn: term, need_weights=True)
    scores = mha.scores(mha.split_heads(mha.q_proj(x)), mha.project_kv(memory)[0])
    masked = scores.masked_fill(pad[:, None, None], float("-inf"))
    torch.testing.assert_close(refined, torch.softmax(masked - term, -1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(unrefined, torch.softmax(masked, -1), rtol=1e-5, atol=1e-5)
    # rows in groups that share their keys (accelerations.grouped_attention): each row as if alone
    rows = torch.randn(4, 5, 16)
    grouped = mha(rows, memory, key_padding_mask=pad, need_weights=True)
    alone = mha(rows, memory.repeat_interleave(2, 0), key_padding_mask=pad.repeat_interleave(2, 0), need_weights=True)
    torch.testing.assert_close(grouped.out, alone.out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grouped.weights, alone.weights, rtol=1e-5, atol=1e-5)


def test_sums_before_is_cumsum_shifted_by_a_step_to_the_bit_with_its_gradient():
    x = torch.arange(1.0, 5.0).view(1, 4)
    assert sums_before(x).tolist() == [[0.0, 1.0, 3.0, 6.0]]
    torch.manual_seed(0)
    x = torch.rand(3, 40, 5, 7, requires_grad=True)
    grad = torch.randn(3, 40, 5, 7)
    shifted = torch.cat([torch.zeros_like(x[:, :1]), x.cumsum(1)[:, :-1]], dim=1)
    expected_grad, = torch.autograd.grad(shifted, x, grad)
    ours = sums_before(x)
    got_grad, = torch.autograd.grad(ours, x, grad)
    assert torch.equal(ours, shifted) and torch.equal(got_grad, expected_grad)


def test_encoder_stride_and_channels():
    model = build_model(ModelConfig())
    assert model.encoder.out_channels == 684 and model.stride == 16
    images, mask = make_images([(64, 96)])
    with torch.no_grad():
        feats, feat_mask = model.eval().encode(images, mask)
    assert feats.shape == (1, 4, 6, 256) and feat_mask.shape == (1, 4, 6)


def test_reference_presets_and_the_tiny_presets_pin_their_encoders():
    """bttr / comer-* are the reference code's functions; the tiny presets keep the project's
    choices, which are also the ModelConfig defaults (old run records reload unchanged)."""
    bttr, comer = preset_config("bttr"), preset_config("comer-fusion")
    assert (bttr.mask_padding, bttr.encoder_tail, bttr.image_pos, bttr.embed_norm, bttr.embed_pos_norm) == \
        (False, "relu-norm-pos", "sin2d-bttr", True, False)
    assert (comer.mask_padding, comer.encoder_tail, comer.image_pos, comer.embed_norm, comer.embed_pos_norm) == \
        (False, "pos-norm", "sin2d", True, True)
    defaults = ModelConfig()
    for name in ("tiny-transformer", "tiny-comer", "tiny-rnn", "tiny-convs2s"):
        cfg = preset_config(name)
        assert (cfg.mask_padding, cfg.encoder_tail) == (defaults.mask_padding, defaults.encoder_tail) == \
            (True, "relu-norm-pos")
    tiny = preset_config("tiny-transformer")
    assert tiny.image_pos == "sin2d" and tiny.embed_norm is False
    assert Config().train.search_rule == "hmer"


@torch.no_grad()
def test_mask_padding_makes_batched_features_batch_invariant_and_its_absence_does_not():
    torch.manual_seed(0)
    images = torch.rand(2, 1, 40, 72)
    mask = torch.zeros(2, 40, 72, dtype=torch.bool)
    mask[1, 24:, :] = True
    mask[1, :, 40:] = True
    images[1, :, 24:, :] = 0.0
    images[1, :, :, 40:] = 0.0
    for mask_padding, invariant in ((True, True), (False, False)):
        model = build_model(dataclasses.replace(preset_config("tiny-transformer"), mask_padding=mask_padding)).eval()
        batched, _ = model.encode(images, mask)
        alone, _ = model.encode(images[1:, :, :24, :40], mask[1:, :24, :40])
        assert torch.allclose(batched[1, :alone.shape[1], :alone.shape[2]], alone[0], atol=1e-5) is invariant


def test_the_two_sinusoid_variants_differ_only_in_their_frequencies():
    from hmer.model.posenc import BTTRSinusoidal2DImagePositions, Sinusoidal2DImagePositions

    mask = torch.zeros(1, 3, 5, dtype=torch.bool)
    comer, bttr = Sinusoidal2DImagePositions(16).encoding(mask), BTTRSinusoidal2DImagePositions(16).encoding(mask)
    assert torch.allclose(comer[..., 0], bttr[..., 0])  # sin at frequency 1 in both
    assert not torch.allclose(comer[..., 1], bttr[..., 1])  # cos(f0) against cos(f1)
