"""Decoding with the real (tiny, untrained, eval-mode) models: a batch of differently sized,
padded images decodes exactly like its images one at a time, and the incremental beam scores
agree with teacher forcing (what joint search's rescoring relies on)."""

from __future__ import annotations

import pytest
import torch

from hmer.decoding import beam_search, decode_batch, sequence_log_probs
from hmer.model import build_model
from toy_decoders import EOS, SOS, padded_batch

torch.set_num_threads(1)

# Sizes deliberately not multiples of the encoder's stride (16).
SIZES = [(30, 45), (50, 77), (20, 33)]


def tiny_model(preset: str) -> torch.nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        # float64: an untrained model's distributions are nearly flat, and float32 rounding that
        # differs between batch shapes could flip a near-tie; here we test the bookkeeping.
        return build_model(preset).eval().double()


@pytest.mark.parametrize("preset", ["tiny-transformer", "tiny-comer", "tiny-rnn", "tiny-convs2s"])
def test_real_model_decodes_a_padded_batch_like_single_images(preset):
    model = tiny_model(preset)
    images, mask, singles = padded_batch(SIZES, seed=0)
    images = images.double()
    for direction in ("l2r", "bi"):
        for beam_size in (1, 3):
            batched = decode_batch(model, images, mask, direction, beam_size=beam_size, max_len=6)
            alone = [decode_batch(model, img.double(), m, direction, beam_size=beam_size, max_len=6)[0]
                     for img, m in singles]
            assert batched == alone, (direction, beam_size)
            assert all(len(s) <= 6 and all(t > 2 for t in s) for s in batched)


def test_real_model_beam_scores_equal_teacher_forced_scores():
    model = tiny_model("tiny-transformer")
    images, mask, _ = padded_batch(SIZES, seed=1)
    feats, fmask = model.encode(images.double(), mask)
    for start, end in ((SOS, EOS), (EOS, SOS)):
        pools = beam_search(model, feats, fmask, start, end, beam_size=3, max_len=6)
        hyps = [(i, h) for i, pool in enumerate(pools) for h in pool]
        forced = sequence_log_probs(model, feats, fmask, [i for i, _ in hyps], [h.tokens for _, h in hyps],
                                    [start] * len(hyps), [end] * len(hyps))
        assert forced == pytest.approx([h.log_prob for _, h in hyps], abs=1e-8)


@pytest.mark.parametrize("preset", ["tiny-transformer", "tiny-comer"])
def test_rescoring_in_memory_bounded_chunks_gives_the_same_log_probs(preset):
    # Joint search rescores every hypothesis by teacher forcing, in chunks of rows sorted by
    # length; the chunking (down to one row per call) must not change a single score.
    model = tiny_model(preset)
    images, mask, _ = padded_batch(SIZES, seed=2)
    feats, fmask = model.encode(images.double(), mask)
    generator = torch.Generator().manual_seed(0)
    images_of_rows = [int(i) for i in torch.randint(0, len(SIZES), (12,), generator=generator)]
    rows = [torch.randint(3, 20, (int(n),), generator=generator).tolist()
            for n in torch.randint(0, 9, (12,), generator=generator)]
    starts = [SOS if j % 2 else EOS for j in range(12)]
    ends = [EOS if s == SOS else SOS for s in starts]
    whole = sequence_log_probs(model, feats, fmask, images_of_rows, rows, starts, ends, max_cells=1 << 40)
    for cells in (1, 200, 2_000):
        chunked = sequence_log_probs(model, feats, fmask, images_of_rows, rows, starts, ends, max_cells=cells)
        assert chunked == pytest.approx(whole, abs=1e-9), cells
