"""The CPU dropout masks (hmer.model.accelerations): Bernoulli's distribution, torch's seed, the identity
where nothing is dropped."""

import math

import torch

from hmer.model.accelerations import Dropout, keep_mask, kept_fraction


def dropout(x, p, training=True):
    module = Dropout(p).train(training)
    module.cheap_masks = True
    return module(x)


def test_masks_keep_one_minus_p_and_scale_to_the_same_expectation():
    torch.manual_seed(0)
    x = torch.ones(400_000)
    for p in (0.1, 0.2, 0.3, 0.5):
        mask = keep_mask(x, p)
        kept = (mask > 0).float().mean().item()
        # binomial standard error over 400k draws is below 1e-3
        assert abs(kept - (1 - p)) < 4e-3, (p, kept)
        assert torch.allclose(mask[mask > 0], torch.tensor(1 / kept_fraction(p)))
        assert abs(mask.mean().item() - 1.0) < 6e-3


def test_masks_are_independent_across_elements_and_calls():
    torch.manual_seed(1)
    x = torch.ones(200_000)
    a, b = keep_mask(x, 0.3) > 0, keep_mask(x, 0.3) > 0
    assert not torch.equal(a, b)
    # neighbours (which share one 64-bit draw) are uncorrelated: P(both kept) = (1-p)^2
    both = (a[:-1] & a[1:]).float().mean().item()
    assert abs(both - 0.49) < 6e-3
    assert abs((a & b).float().mean().item() - 0.49) < 6e-3


def test_torch_manual_seed_governs_the_masks():
    x = torch.randn(3, 5, 7)
    torch.manual_seed(7)
    first = dropout(x, 0.2)
    torch.manual_seed(7)
    assert torch.equal(first, dropout(x, 0.2))


def test_evaluation_and_zero_p_are_the_identity():
    x = torch.randn(4, 9)
    assert dropout(x, 0.3, training=False) is x
    assert dropout(x, 0.0) is x
    module = Dropout(0.3).eval()
    assert torch.equal(module(x), x)


def test_the_plain_path_is_torchs_dropout():
    x = torch.randn(3, 50)
    torch.manual_seed(2)
    ours = Dropout(0.3)(x)
    torch.manual_seed(2)
    assert torch.equal(ours, torch.nn.functional.dropout(x, 0.3))


def test_gradient_is_the_mask():
    torch.manual_seed(5)
    x = torch.randn(1000, requires_grad=True)
    torch.manual_seed(5)
    y = dropout(x, 0.4)
    y.sum().backward()
    kept = y.detach() != 0
    assert torch.allclose(x.grad[kept], torch.tensor(1 / kept_fraction(0.4)))
    assert torch.count_nonzero(x.grad[~kept]) == 0
    assert math.isclose(kept_fraction(0.4), 0.6, abs_tol=1e-5)
