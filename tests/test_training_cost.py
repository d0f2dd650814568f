"""A trial's compute as epochs (hmer.training.cost): measured on real steps, reproducible training."""

import torch

from hmer.training.cost import epochs_for_budget, train_seconds_per_image
from tiny_dataset import tiny_config, tiny_data


def test_seconds_per_image_is_measured_on_real_steps_and_leaves_the_rng_alone():
    cfg = tiny_config()
    exprs = tiny_data(n_train=12)["train"]
    torch.manual_seed(11)
    before = torch.get_rng_state()
    per_image = train_seconds_per_image(cfg, exprs, n_batches=3)
    assert 0 < per_image < 5
    assert torch.equal(torch.get_rng_state(), before)


def test_epochs_fill_the_budget_within_bounds():
    assert epochs_for_budget(1500, 0.02, 8251, 60) == 9  # 165 s an epoch
    assert epochs_for_budget(10, 0.02, 8251, 60) == 1  # never zero epochs
    assert epochs_for_budget(1e6, 0.02, 8251, 60) == 60
