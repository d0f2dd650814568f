"""CAN's symbol counting as a part of the factory (issue 68): every decoder family builds and trains
with it, every search reads the counts as teacher forcing does, and the counting loss counts the
caption's symbols."""

from __future__ import annotations

import pytest
import torch

from hmer.data import Vocab
from hmer.decoding import beam_search, decode_batch, sequence_log_probs
from hmer.model import build_model
from hmer.model.counting import CountingDecoder, caption_counts
from hmer.model.decoder_base import make_targets
from hmer.model_presets import preset_config
from hmer.training import train
from hmer.training.setup import counted_classes
from tiny_dataset import tiny_config, tiny_data
from toy_decoders import EOS, SOS, padded_batch

FAMILIES = ["tiny-transformer", "tiny-comer", "tiny-rnn", "tiny-convs2s"]
SIZES = [(30, 45), (50, 77), (20, 33)]


def counting_model(preset: str) -> torch.nn.Module:
    cfg = preset_config(preset)
    cfg.counting = True
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return build_model(cfg).eval().double()


@pytest.mark.parametrize("preset", FAMILIES)
def test_every_search_reads_the_counts_as_teacher_forcing_does(preset):
    model = counting_model(preset)
    assert isinstance(model.decoder, CountingDecoder)
    images, mask, singles = padded_batch(SIZES, seed=1)
    feats, fmask = model.encode(images.double(), mask)
    pools = beam_search(model, feats, fmask, SOS, EOS, beam_size=3, max_len=6)
    hyps = [(i, h) for i, pool in enumerate(pools) for h in pool]
    forced = sequence_log_probs(model, feats, fmask, [i for i, _ in hyps], [h.tokens for _, h in hyps],
                                [SOS] * len(hyps), [EOS] * len(hyps))
    assert forced == pytest.approx([h.log_prob for _, h in hyps], abs=1e-8)
    # a padded batch decodes as its images one at a time, with the joint search for bi too
    direction = "bi" if preset in ("tiny-transformer", "tiny-comer") else "l2r"
    batched = decode_batch(model, images.double(), mask, direction, beam_size=3, max_len=6)
    assert batched == [decode_batch(model, img.double(), m, direction, beam_size=3, max_len=6)[0]
                       for img, m in singles]


def test_the_counts_change_what_the_classifier_reads():
    model = counting_model("tiny-transformer")
    images, mask, _ = padded_batch(SIZES, seed=2)
    feats, fmask = model.encode(images.double(), mask)
    tgt_in = torch.full((len(SIZES), 4), SOS)
    with_counts = model.decode(feats, fmask, tgt_in)
    without = model.decoder.inner(feats, fmask, tgt_in)
    term = model.decoder.count_term(model.decoder.counter(feats, fmask)[0])
    torch.testing.assert_close(with_counts, without + term[:, None])
    assert term.abs().max() > 0


def test_the_counting_loss_counts_the_caption_s_symbols_not_its_structure():
    vocab = Vocab()
    tokens = "x ^ { 2 } + x".split()
    _, tgt_out, _ = make_targets([vocab.encode(tokens)], "bi")
    counts = caption_counts(tgt_out, 1, counted_classes(vocab))[0]
    assert counts[vocab.stoi["x"]] == 2 and counts[vocab.stoi["2"]] == 1 and counts[vocab.stoi["+"]] == 1
    assert counts.sum() == 4  # neither ^ { } nor the end token


@pytest.mark.parametrize("preset", ["tiny-transformer", "tiny-rnn", "tiny-convs2s"])
def test_a_counting_model_of_every_family_trains(tmp_path, preset):
    direction = {"tiny-transformer": "bi"}.get(preset, "l2r")
    cfg = tiny_config(**{"model.counting": True, "model.direction": direction, "train.epochs": 1})
    family = preset_config(preset)
    cfg = cfg.override({"model.decoder": family.decoder, "model.token_pos": family.token_pos,
                        "model.conv_attention": family.conv_attention})
    result = train(cfg, data=tiny_data(), tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
                   run_dir=tmp_path / "run")
    assert result.stopped_by == "epochs" and result.test_scores
    plain = build_model(cfg.override({"model.counting": False}).model)
    assert result.num_params > sum(p.numel() for p in plain.parameters())
