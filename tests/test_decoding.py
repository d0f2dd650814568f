"""Decoding on toy models whose right answers are known: brute-force enumeration, a plain
one-image reference beam search, and hand-made tables (see toy_decoders.py)."""

from __future__ import annotations

import pytest
import torch

from hmer.decoding import beam_search, decode_batch, greedy_search, joint_beam_search, sequence_log_probs
from toy_decoders import (
    EOS,
    PAD,
    SOS,
    RandomModel,
    TableModel,
    ToyModel,
    brute_force,
    brute_force_joint,
    key_of,
    normalized,
    padded_batch,
)

torch.set_num_threads(1)

A, B = 3, 4  # the two symbols of the 5-token toy vocabularies


def one_image(model: ToyModel, h: int = 2, w: int = 3, seed: int = 0):
    images, mask, _ = padded_batch([(h, w)], seed=seed)
    feats, fmask = model.encode(images, mask)
    return images, mask, feats, fmask


# ---- greedy vs beam vs brute force ------------------------------------------------------------

def disagreeing_model() -> TableModel:
    """Greedy takes `a` (0.5 > 0.45), after which nothing is likely; `b` then ends with 0.9, so
    [b] (0.405) beats greedy's [a] (0.5 * 0.35 = 0.175)."""
    return TableModel(
        5,
        table={
            (SOS,): {A: 0.50, B: 0.45, EOS: 0.01},
            (SOS, A): {EOS: 0.35, A: 0.33, B: 0.31},
            (SOS, B): {EOS: 0.90, A: 0.05, B: 0.04},
        },
        defaults={SOS: {EOS: 0.5, A: 0.24, B: 0.24}},
    )


def test_greedy_and_beam_disagree_and_beam_finds_the_brute_force_best():
    model = disagreeing_model()
    _, _, feats, mask = one_image(model)
    assert greedy_search(model, feats, mask, SOS, EOS, max_len=4) == [[A]]
    pools = beam_search(model, feats, mask, SOS, EOS, beam_size=2, max_len=4, length_penalty=1.0)
    best_score, best_lp, best_seq = brute_force(model, SOS, EOS, max_len=4, alpha=1.0)[0]
    assert best_seq == [B] and pools[0][0].tokens == [B]
    assert pools[0][0].log_prob == pytest.approx(best_lp, abs=1e-5)
    assert pools[0][0].score == pytest.approx(best_score, abs=1e-5)
    assert [h.score for h in pools[0]] == sorted((h.score for h in pools[0]), reverse=True)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("start,end", [(SOS, EOS), (EOS, SOS)])
def test_a_beam_wide_enough_to_keep_every_prefix_finds_the_brute_force_best(alpha, start, end):
    # 2 symbols, max_len 4: 31 sequences, at most 16 live prefixes; a beam of 64 drops none of
    # them, so the search may stop early only where the bound proves nothing can beat its best.
    model = RandomModel(5, seed=3, sharpness=1.0)
    images, _, feats, mask = one_image(model)
    key = key_of(model, images)
    pool = beam_search(model, feats, mask, start, end, beam_size=64, max_len=4, length_penalty=alpha,
                       exhaustive=True)[0]
    expected = brute_force(model, start, end, max_len=4, alpha=alpha, key=key)
    assert pool[0].tokens == expected[0][2]
    exact = {tuple(seq): (score, lp) for score, lp, seq in expected}
    for hyp in pool:  # every returned hypothesis carries its exact scores, best first
        assert (hyp.score, hyp.log_prob) == pytest.approx(exact[tuple(hyp.tokens)], abs=1e-5)
    assert [h.score for h in pool] == sorted((h.score for h in pool), reverse=True)


def sure_of_a_long_answer_model() -> TableModel:
    """Sure (0.99 a step) of [A A A A A A]; every other prefix ends with probability 0.6. The
    junk prefixes that the beam keeps beside the answer therefore finish first and fill the
    pool of finished hypotheses long before the answer does."""
    answer = (SOS,) + (A,) * 6
    table = {answer[:i]: {A: 0.99} for i in range(1, len(answer))}
    table[answer] = {EOS: 0.99}
    return TableModel(8, table=table, defaults={SOS: {EOS: 0.6}})


@pytest.mark.parametrize("beam_size", [2, 3, 10])
def test_beam_search_keeps_decoding_a_sure_long_answer_after_short_junk_has_filled_the_pool(beam_size):
    # Regression: stopping as soon as `beam_size` hypotheses had finished returned junk here
    # (seen on a real model that read 16 memorized formulas back greedily but not by beam).
    model = sure_of_a_long_answer_model()
    _, _, feats, mask = one_image(model)
    assert greedy_search(model, feats, mask, SOS, EOS, max_len=10) == [[A] * 6]
    pool = beam_search(model, feats, mask, SOS, EOS, beam_size=beam_size, max_len=10, length_penalty=1.0)[0]
    assert pool[0].tokens == [A] * 6
    assert pool[0].log_prob == pytest.approx(7 * torch.tensor(0.99).log().item(), abs=1e-5)


# ---- the batched search against a plain one-image reference ----------------------------------

def reference_beam(model: ToyModel, key: float, start: int, end: int, k: int, max_len: int, alpha: float,
                   exhaustive: bool = False) -> list[tuple[list[int], float]]:
    """The same search written the obvious way, one image, lists only: (tokens, score) best first."""
    live = [((start,), 0.0)]
    pool: list[tuple[list[int], float]] = []

    def add(tokens, lp):
        pool.append((tokens, normalized(lp, len(tokens), alpha)))
        pool.sort(key=lambda p: -p[1])
        del pool[k:]

    for t in range(max_len + 1):
        steps = [(prefix, s, model.log_probs(prefix, key).float().double()) for prefix, s in live]
        if t == max_len:
            for prefix, s, lp in steps:
                add(list(prefix[1:]), s + float(lp[end]))
            break
        cands = [
            (s + float(lp[tok]), b, tok)
            for b, (_, s, lp) in enumerate(steps)
            for tok in range(model.vocab_size)
            if tok not in (PAD, start)
        ]
        cands.sort(key=lambda c: (-c[0], c[1], c[2]))
        new_live = []
        for rank, (score, b, tok) in enumerate(cands[: 2 * k]):
            prefix = steps[b][0]
            if tok == end:
                if rank < k:
                    add(list(prefix[1:]), score)
            elif len(new_live) < k:
                new_live.append((prefix + (tok,), score))
        live = new_live
        best_live = max(s for _, s in live)
        if pool and not exhaustive and len(pool) >= k and normalized(best_live, t + 1, alpha) <= pool[-1][1]:
            break
        bound = max(normalized(best_live, t + 1, alpha), normalized(best_live, max_len, alpha))
        if pool and bound <= pool[0][1]:
            break
    return pool


@pytest.mark.parametrize("exhaustive", [False, True])
def test_batched_beam_search_matches_a_plain_reference(exhaustive):
    model = RandomModel(7, seed=11, sharpness=1.5, end_bias=0.5)
    images, mask, _ = padded_batch([(3, 5), (6, 2), (4, 4), (2, 7)], seed=1)
    feats, fmask = model.encode(images, mask)
    keys = model.image_keys(feats, fmask).tolist()
    for start, end in ((SOS, EOS), (EOS, SOS)):
        pools = beam_search(model, feats, fmask, start, end, beam_size=3, max_len=6, length_penalty=1.0,
                            exhaustive=exhaustive)
        for pool, key in zip(pools, keys):
            expected = reference_beam(model, key, start, end, 3, 6, 1.0, exhaustive)
            assert [h.tokens for h in pool] == [toks for toks, _ in expected]
            assert [h.score for h in pool] == pytest.approx([s for _, s in expected], abs=1e-5)


def test_finished_images_leave_the_decoder_state():
    # Short expressions: every image is done long before max_len, at its own step.
    model = RandomModel(7, seed=1, end_bias=0.5, image_weight=3.0)
    images, mask, _ = padded_batch([(3, 5), (6, 2), (4, 4)], seed=2)
    feats, fmask = model.encode(images, mask)
    beam_search(model, feats, fmask, SOS, EOS, beam_size=4, max_len=50)
    rows = model.rows_per_step
    assert rows[0] == 3 * 4 and len(rows) < 50
    assert rows == sorted(rows, reverse=True) and rows[-1] < rows[0]


# ---- batching, padding, directions, limits ----------------------------------------------------

@pytest.mark.parametrize("direction", ["l2r", "r2l", "bi"])
@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_batch_decodes_like_its_images_one_at_a_time(direction, beam_size):
    model = RandomModel(8, seed=2, sharpness=1.5, image_weight=3.0, end_bias=0.3)
    sizes = [(3, 5), (7, 2), (4, 4), (2, 6)]
    images, mask, singles = padded_batch(sizes, seed=4)
    batched = decode_batch(model, images, mask, direction, beam_size=beam_size, max_len=8)
    alone = [decode_batch(model, img, m, direction, beam_size=beam_size, max_len=8)[0] for img, m in singles]
    assert batched == alone
    assert len({tuple(s) for s in batched}) > 1  # the images really are decoded differently


def test_beam_pools_are_identical_batched_and_alone():
    model = RandomModel(8, seed=9, sharpness=1.0, image_weight=3.0)
    images, mask, singles = padded_batch([(5, 3), (2, 2), (4, 6)], seed=6)
    feats, fmask = model.encode(images, mask)
    batched = beam_search(model, feats, fmask, [SOS, EOS, SOS], [EOS, SOS, EOS], beam_size=4, max_len=7)
    for i, ((img, m), start, end) in enumerate(zip(singles, [SOS, EOS, SOS], [EOS, SOS, EOS])):
        f, fm = model.encode(img, m)
        assert beam_search(model, f, fm, start, end, beam_size=4, max_len=7)[0] == batched[i]


@pytest.mark.parametrize("direction", ["l2r", "r2l", "bi"])
@pytest.mark.parametrize("beam_size", [1, 3])
def test_max_len_caps_every_output(direction, beam_size):
    model = RandomModel(6, seed=1, end_bias=-30.0)  # the end tokens are (almost) never likely
    images, mask, _ = padded_batch([(3, 3), (2, 4)])
    out = decode_batch(model, images, mask, direction, beam_size=beam_size, max_len=5)
    assert [len(s) for s in out] == [5, 5]
    assert all(tok >= 3 for s in out for tok in s)


def r2l_model() -> TableModel:
    """Right to left the model reads b, then a, then stops: the expression is `a b`."""
    return TableModel(
        5,
        table={
            (EOS,): {B: 0.9},
            (EOS, B): {A: 0.9},
            (EOS, B, A): {SOS: 0.9},
        },
        defaults={EOS: {SOS: 0.5}, SOS: {EOS: 0.5}},
    )


@pytest.mark.parametrize("beam_size", [1, 3])
def test_r2l_output_is_reversed_into_left_to_right_order(beam_size):
    model = r2l_model()
    images, mask, _ = padded_batch([(2, 2)])
    feats, fmask = model.encode(images, mask)
    assert greedy_search(model, feats, fmask, EOS, SOS, max_len=6) == [[B, A]]  # decoding order
    assert decode_batch(model, images, mask, "r2l", beam_size=beam_size, max_len=6) == [[A, B]]


# ---- bidirectional joint search ---------------------------------------------------------------

def bidirectional_model() -> TableModel:
    """l2r prefers [a] (0.6 * 0.9 = 0.54) to [b] (0.38 * 0.9 = 0.342); r2l strongly prefers [b]
    (0.792 against 0.09), so the joint scores are [a] 0.0486 and [b] 0.271: [b] wins."""
    return TableModel(
        5,
        table={
            (SOS,): {A: 0.60, B: 0.38},
            (SOS, A): {EOS: 0.9},
            (SOS, B): {EOS: 0.9},
            (EOS,): {A: 0.10, B: 0.88},
            (EOS, A): {SOS: 0.9},
            (EOS, B): {SOS: 0.9},
        },
        defaults={SOS: {EOS: 0.5, A: 0.2, B: 0.2}, EOS: {SOS: 0.5, A: 0.2, B: 0.2}},
    )


def test_joint_rescoring_overturns_the_left_to_right_choice():
    model = bidirectional_model()
    images, mask, _ = padded_batch([(2, 3), (3, 2)])
    assert decode_batch(model, images, mask, "l2r", beam_size=3, max_len=5) == [[A], [A]]
    assert decode_batch(model, images, mask, "bi", beam_size=3, max_len=5) == [[B], [B]]
    feats, fmask = model.encode(images, mask)
    best = joint_beam_search(model, feats, fmask, SOS, EOS, beam_size=3, max_len=5, length_penalty=1.0)[0]
    score, lp, seq = brute_force_joint(model, max_len=5, alpha=1.0)[0]
    assert seq == [B] == best.tokens
    assert best.log_prob == pytest.approx(lp, abs=1e-5)
    assert best.score == pytest.approx(score, abs=1e-5)


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_joint_search_picks_the_best_joint_score_of_both_beams(alpha):
    # The definition, computed independently: each direction's pool, every pooled sequence
    # scored exactly in both directions, the best (l2r pool first on ties).
    model = RandomModel(6, seed=21, sharpness=1.0, image_weight=2.0)
    images, mask, singles = padded_batch([(3, 4), (5, 2), (2, 2)], seed=8)
    feats, fmask = model.encode(images, mask)
    found = joint_beam_search(model, feats, fmask, SOS, EOS, beam_size=4, max_len=5, length_penalty=alpha)
    l2r = beam_search(model, feats, fmask, SOS, EOS, 4, 5, alpha)
    r2l = beam_search(model, feats, fmask, EOS, SOS, 4, 5, alpha)
    for i, (img, m) in enumerate(singles):
        key = key_of(model, img, m)
        seqs = [h.tokens for h in l2r[i]] + [h.tokens[::-1] for h in r2l[i]]
        joint = [model.sequence_log_prob(s, SOS, EOS, key) + model.sequence_log_prob(s[::-1], EOS, SOS, key)
                 for s in seqs]
        scores = [normalized(lp, len(s), alpha) for lp, s in zip(joint, seqs)]
        j = max(range(len(seqs)), key=lambda j: (scores[j], -j))
        assert found[i].tokens == seqs[j]
        assert found[i].score == pytest.approx(scores[j], abs=1e-5)
        assert found[i].log_prob == pytest.approx(joint[j], abs=1e-5)


def test_teacher_forced_log_probs_are_the_sequence_log_probs():
    model = RandomModel(6, seed=4, image_weight=2.0)
    images, mask, singles = padded_batch([(3, 4), (5, 2)], seed=3)
    feats, fmask = model.encode(images, mask)
    seqs = [[3, 4, 5], [], [5, 5]]
    got = sequence_log_probs(model, feats, fmask, [0, 1, 1], seqs, [SOS, EOS, SOS], [EOS, SOS, EOS])
    keys = [key_of(model, *singles[i]) for i in (0, 1, 1)]
    want = [model.sequence_log_prob(s, st, en, k) for s, st, en, k in zip(seqs, [SOS, EOS, SOS], [EOS, SOS, EOS], keys)]
    assert got == pytest.approx(want, abs=1e-5)


# ---- arguments ---------------------------------------------------------------------------------

def test_bad_arguments_and_empty_batches():
    model = disagreeing_model()
    images, mask, _ = padded_batch([(2, 2)])
    with pytest.raises(ValueError, match="direction"):
        decode_batch(model, images, mask, "up")
    with pytest.raises(ValueError, match="beam_size"):
        decode_batch(model, images, mask, "l2r", beam_size=0)
    with pytest.raises(ValueError, match="one id per image"):
        feats, fmask = model.encode(images, mask)
        beam_search(model, feats, fmask, [SOS, SOS], EOS)
    assert decode_batch(model, images[:0], mask[:0], "bi") == []
    assert decode_batch(model, images, mask, "l2r", max_len=0) == [[]]
