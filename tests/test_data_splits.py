"""load_dataset: the seeded validation hold-out, the test years, and deterministic subsets."""

from __future__ import annotations

import numpy as np

from hmer.config import DataConfig
from hmer.data import Expression, load_dataset
from hmer.data.splits import split_validation
from hmer.data.splits import default_splits, subset


def named(n: int) -> list[Expression]:
    return [Expression(f"n{i:03d}", ["x"], np.zeros((2, 2), dtype=np.uint8)) for i in range(n)]


def test_the_random_hold_out_is_seeded_disjoint_and_independent_of_order():
    names = [e.name for e in named(200)]

    def random_val(order, seed):
        return split_validation(order, {n: "x" for n in order}, {}, "random", 0.05, seed)

    held = random_val(names, 7)
    assert len(held.val) == 10 and len(held.train) == 190 and not set(held.train) & set(held.val)
    shuffled = [names[i] for i in np.random.default_rng(1).permutation(200)]
    assert set(random_val(shuffled, 7).val) == set(held.val)
    assert set(random_val(names, 8).val) != set(held.val)
    assert held.train == sorted(held.train)  # input order kept


def test_subset_is_deterministic_and_keeps_order():
    exprs = named(50)
    a = subset(exprs, 10, seed=7, label="2014")
    assert len(a) == 10 and a == subset(exprs, 10, seed=7, label="2014")
    assert [e.name for e in a] == sorted(e.name for e in a)
    assert subset(exprs, 0, 7, "2014") == exprs and subset(exprs, 99, 7, "2014") == exprs


def test_default_splits_follow_the_test_years():
    assert default_splits(DataConfig()) == ("train", "val", "2014", "2016", "2019")
    assert default_splits(DataConfig(test_years="2014")) == ("train", "val", "2014")


def test_load_dataset_holds_out_val_from_train_only(inkml_dataset, isolated_cache):
    root = inkml_dataset({"train": 40, "2014": 5, "2016": 4, "2019": 3})
    # the random rule, whose sizes are exact (the writer rule has its own tests in test_holdout.py)
    cfg = DataConfig(path=str(root), val_fraction=0.1, val_seed=3, val_split="random")
    ds = load_dataset(None, cfg)
    assert list(ds) == ["train", "val", "2014", "2016", "2019"]
    assert (len(ds["train"]), len(ds["val"])) == (36, 4)
    assert all(e.name.startswith("train_") for e in ds["val"])
    assert not {e.name for e in ds["train"]} & {e.name for e in ds["val"]}
    assert [len(ds[y]) for y in ("2014", "2016", "2019")] == [5, 4, 3]
    again = load_dataset(root, cfg)
    assert [e.name for e in again["val"]] == [e.name for e in ds["val"]]


def test_load_dataset_limits_and_chosen_splits(inkml_dataset, isolated_cache):
    root = inkml_dataset({"train": 30, "2014": 6})
    cfg = DataConfig(train_limit=5, val_limit=1, test_limit=2, val_fraction=0.1)
    ds = load_dataset(root, cfg, splits=("train", "val", "2014"))
    assert [len(ds[s]) for s in ("train", "val", "2014")] == [5, 1, 2]
    assert load_dataset(root, cfg, splits=("2014",)).keys() == {"2014"}
    assert [e.name for e in load_dataset(root, cfg, splits=("2014",))["2014"]] == [e.name for e in ds["2014"]]
