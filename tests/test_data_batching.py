"""Bucketing under a pixel budget, collating, scale augmentation and evaluation resizing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hmer.data import Batch, Expression, Vocab, collate, fit_to_pixels, make_batches, padded_shapes, padding_share
from hmer.data.batching import HEIGHT_BIN
from hmer.data.batching import PadLadder, ladder_shapes, shapes_under_scale


def random_expressions(n: int, seed: int = 0) -> list[Expression]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        h, w = int(rng.integers(20, 200)), int(rng.integers(20, 900))
        image = (rng.random((h, w)) < 0.1).astype(np.uint8) * 255
        out.append(Expression(name=f"e{i}", tokens=["x", "+", str(i % 10)], image=image))
    return out


EXPRS = random_expressions(300)
BUDGET = 320_000


def area(idx: list[int], exprs=EXPRS) -> int:
    return len(idx) * max(exprs[i].image.shape[0] for i in idx) * max(exprs[i].image.shape[1] for i in idx)


@pytest.mark.parametrize("cap", [16, 4, 0])
def test_every_expression_exactly_once_within_budget_and_cap(cap):
    batches = make_batches(EXPRS, BUDGET, cap, shuffle=True, seed=3)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(EXPRS)))
    for b in batches:
        assert len(b) == 1 or area(b) <= BUDGET
        if cap:
            assert len(b) <= cap


def test_an_image_above_the_budget_is_a_batch_of_its_own():
    exprs = random_expressions(20) + [Expression("huge", ["x"], np.zeros((700, 700), dtype=np.uint8))]
    batches = make_batches(exprs, BUDGET, 16, shuffle=False)
    assert [20] in batches
    assert sorted(i for b in batches for i in b) == list(range(21))


def test_batches_are_deterministic_for_a_seed_and_shuffled_between_seeds():
    a = make_batches(EXPRS, BUDGET, 16, shuffle=True, seed=11)
    assert a == make_batches(EXPRS, BUDGET, 16, shuffle=True, seed=11)
    b = make_batches(EXPRS, BUDGET, 16, shuffle=True, seed=12)
    assert a != b and sorted(map(tuple, a)) == sorted(map(tuple, b))  # same buckets, other order


def test_unshuffled_batches_go_from_short_to_tall_images_in_16_px_height_bins():
    batches = make_batches(EXPRS, BUDGET, 16, shuffle=False)
    bins = [max(EXPRS[i].image.shape[0] for i in b) // HEIGHT_BIN for b in batches]
    assert bins == sorted(bins)
    exact = make_batches(EXPRS, BUDGET, 16, shuffle=False, height_bin=1)
    heights = [max(EXPRS[i].image.shape[0] for i in b) for b in exact]
    assert heights == sorted(heights)


def test_height_bins_pad_less_than_an_exact_height_sort():
    # Heights vary less than widths: binning them lets the widths line up inside a batch.
    binned = padding_share(EXPRS, make_batches(EXPRS, BUDGET, 16, shuffle=False))
    exact = padding_share(EXPRS, make_batches(EXPRS, BUDGET, 16, shuffle=False, height_bin=1))
    assert binned < exact


def test_padding_share_is_small_when_bucketed_and_zero_for_equal_sizes():
    sorted_share = padding_share(EXPRS, make_batches(EXPRS, BUDGET, 16, shuffle=True, seed=0))
    random_share = padding_share(EXPRS, [list(range(i, min(i + 8, 300))) for i in range(0, 300, 8)])
    assert 0 <= sorted_share < random_share < 1
    same = [Expression(f"s{i}", ["x"], np.zeros((30, 40), dtype=np.uint8)) for i in range(5)]
    assert padding_share(same, [[0, 1, 2], [3, 4]]) == 0.0


def test_collate_pads_bottom_right_with_masks_true_at_padding():
    small = np.full((10, 20), 255, dtype=np.uint8)
    large = np.zeros((30, 15), dtype=np.uint8)
    large[0, 0] = 128
    batch = collate([Expression("a", ["x"], small), Expression("b", ["1", "+", "2"], large)], Vocab())
    assert isinstance(batch, Batch) and len(batch) == 2 and batch.names == ["a", "b"]
    assert batch.images.shape == (2, 1, 30, 20) and batch.images.dtype == torch.float32
    assert batch.image_mask.shape == (2, 30, 20) and batch.image_mask.dtype == torch.bool
    assert batch.images[0, 0, :10, :20].eq(1).all() and batch.images[0, 0, 10:].eq(0).all()
    assert not batch.image_mask[0, :10, :20].any() and batch.image_mask[0, 10:].all()
    assert batch.image_mask[1, :, 15:].all() and not batch.image_mask[1, :, :15].any()
    assert batch.images[1, 0, 0, 0].item() == pytest.approx(128 / 255)
    vocab = Vocab()
    assert batch.token_ids == [vocab.encode(["x"]), vocab.encode(["1", "+", "2"])]
    assert batch.resized == 0


def test_collate_scale_resizes_every_image():
    exprs = [Expression("a", ["x"], np.full((40, 100), 255, dtype=np.uint8))]
    assert collate(exprs, Vocab(), scale=0.7).images.shape[-2:] == (28, 70)
    assert collate(exprs, Vocab(), scale=1.4).images.shape[-2:] == (56, 140)


def test_oversize_evaluation_images_are_resized_and_counted_never_dropped():
    exprs = [Expression("big", ["x"], np.full((400, 2000), 255, dtype=np.uint8)),
             Expression("ok", ["y"], np.full((50, 60), 255, dtype=np.uint8))]
    limit = 200_000
    batches = make_batches(exprs, 1_600_000, 64, shuffle=False, max_image_pixels=limit)
    assert sorted(i for b in batches for i in b) == [0, 1]
    batch = collate(exprs, Vocab(), max_pixels=limit)
    assert batch.resized == 1 and batch.names == ["big", "ok"]
    h, w = fit_to_pixels(400, 2000, limit)
    assert h * w <= limit and abs(w / h - 5) < 0.05
    assert batch.images.shape[-2:] == (h, w)
    assert (~batch.image_mask[0]).sum().item() == h * w


def test_fit_to_pixels_leaves_small_images_alone():
    assert fit_to_pixels(100, 200, 400_000) == (100, 200)
    assert fit_to_pixels(100, 200, None) == (100, 200)
    assert fit_to_pixels(1, 10_000_000, 1000) == (1, 1000)


def test_batch_to_device_and_pinning():
    batch = collate(random_expressions(3), Vocab())
    moved = batch.to("cpu")
    assert moved.images.device.type == "cpu" and moved.token_ids == batch.token_ids
    assert torch.equal(moved.image_mask, batch.image_mask)


def test_collate_rejects_unknown_tokens_naming_the_expression():
    from hmer.data import UnknownTokenError

    with pytest.raises(UnknownTokenError, match="odd"):
        collate([Expression("odd", ["\\Pi"], np.zeros((5, 5), dtype=np.uint8))], Vocab())


MULTIPLES_OF_64 = PadLadder(64)


def test_pad_multiple_rounds_each_batch_up_to_a_few_shapes_and_masks_the_extra():
    exprs = random_expressions(4, seed=5)
    exact = collate(exprs, Vocab())
    padded = collate(exprs, Vocab(), ladder=MULTIPLES_OF_64)
    h, w = exact.images.shape[-2:]
    assert padded.images.shape[-2:] == (-(-h // 64) * 64, -(-w // 64) * 64)
    assert torch.equal(padded.images[..., :h, :w], exact.images)  # the same pixels, more zeros after them
    assert padded.images[..., h:, :].eq(0).all() and padded.images[..., w:].eq(0).all()
    assert padded.image_mask[:, h:, :].all() and padded.image_mask[:, :, w:].all()
    assert torch.equal(padded.image_mask[:, :h, :w], exact.image_mask)
    # under scale augmentation too: the rescaled batch is padded into the same grid
    assert all(d % 64 == 0 for d in collate(exprs, Vocab(), scale=0.83, ladder=MULTIPLES_OF_64).images.shape[-2:])


def test_pad_multiple_trades_padding_for_fewer_distinct_batch_shapes():
    batches = make_batches(EXPRS, BUDGET, 16, shuffle=True, seed=0)
    exact, rounded = padded_shapes(EXPRS, batches), padded_shapes(EXPRS, batches, ladder=MULTIPLES_OF_64)
    assert [n for n, _, _ in exact] == [len(b) for b in batches] == [n for n, _, _ in rounded]
    assert all(h % 64 == 0 and w % 64 == 0 for _, h, w in rounded)
    assert len(set(rounded)) < len(set(exact))
    assert padding_share(EXPRS, batches) < padding_share(EXPRS, batches, ladder=MULTIPLES_OF_64) < 1
    assert padding_share(EXPRS, batches, ladder=PadLadder(1)) == padding_share(EXPRS, batches)


def test_a_geometric_ladder_grows_by_its_factor_in_its_multiples():
    ladder = PadLadder(16, 1.25)
    rungs = ladder.rungs_up_to(2000)
    assert rungs[:10] == [16, 32, 48, 64, 80, 112, 144, 192, 240, 304]
    assert all(b % 16 == 0 and b >= 1.25 * a for a, b in zip(rungs, rungs[1:]))
    assert rungs[-1] >= 2000 > rungs[-2]
    assert [ladder.rung(s) for s in (1, 16, 17, 81, 112, 113, 2000)] == [16, 16, 32, 112, 112, 144, rungs[-1]]
    # growth 1 is every multiple (data.pad_multiple alone); multiple 1 and growth 1 is no ladder
    assert [PadLadder(64).rung(s) for s in (1, 64, 65)] == [64, 64, 128] and not PadLadder().enabled
    assert [PadLadder().rung(s) for s in (1, 37, 999)] == [1, 37, 999]
    with pytest.raises(ValueError, match="growth >= 1"):
        PadLadder(16, 0.9)


def test_a_geometric_ladder_makes_fewer_shapes_than_fixed_steps_at_less_padding():
    # the trade the ladder exists for (on CROHME: 176 shapes at 24.4 % against 188 at 30.9 %)
    batches = make_batches(EXPRS, BUDGET, 16, shuffle=True, seed=0)
    geometric = PadLadder(16, 1.25)
    assert len(set(padded_shapes(EXPRS, batches, ladder=geometric))) < len(set(padded_shapes(EXPRS, batches)))
    assert padding_share(EXPRS, batches, ladder=geometric) < padding_share(EXPRS, batches, ladder=MULTIPLES_OF_64)


def test_the_shapes_under_scale_are_every_shape_collate_gives_for_a_scale_in_the_range():
    # the planning pass warms exactly these; collate at many scales never leaves them
    ladder, low, high = PadLadder(16, 1.25), 0.7, 1.4
    batches = make_batches(EXPRS, BUDGET, 16, shuffle=False)[:12]
    planned = ladder_shapes(padded_shapes(EXPRS, batches), ladder, (low, high))
    seen = set()
    for scale in np.linspace(low, high, 2001):
        seen |= set(padded_shapes(EXPRS, batches, ladder=ladder, scales=[float(scale)] * len(batches)))
    assert seen == planned
    # padded_shapes is what collate does, rescaling included
    for scale in (low, 0.93, high):
        assert padded_shapes(EXPRS, batches[:3], ladder=ladder, scales=[scale] * 3) == [
            (len(idx), *collate([EXPRS[i] for i in idx], Vocab(), scale=scale, ladder=ladder).images.shape[-2:])
            for idx in batches[:3]]
    assert shapes_under_scale(3, 100, 300, ladder) == {(3, 112, 304)}
