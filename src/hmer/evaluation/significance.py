"""Is a variant really better than the baseline? Paired tests over the test expressions: the paired
bootstrap, the exact McNemar test and the exact paired sign-flip test, and how each pools several
seeds (`compare`): docs/reports.md, "Significance".
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb
from typing import Sequence

import numpy as np

DEFAULT_RESAMPLES = 10_000
DEFAULT_CONFIDENCE = 0.95
_CHUNK = 1_000  # bootstrap resamples drawn at a time (bounded memory on 1,000+ expressions)
_TOLERANCE = 1e-12  # float slack when comparing resampled differences with the observed one


@dataclass(frozen=True)
class BootstrapResult:
    """A paired bootstrap of the ExpRate difference `variant - baseline`, in percentage points."""

    difference: float
    low: float
    high: float
    p_value: float
    n: int
    n_resamples: int
    confidence: float


@dataclass(frozen=True)
class McNemarResult:
    """Exact McNemar test on one pair of correctness vectors: `baseline_only` counts the expressions
    the baseline reads and the variant does not, `variant_only` the reverse, `n` all of them."""

    baseline_only: int
    variant_only: int
    p_value: float
    n: int

    @property
    def favours(self) -> int:
        """The side the discordant expressions favour: 1 the variant, -1 the baseline, 0 neither."""
        return (self.variant_only > self.baseline_only) - (self.variant_only < self.baseline_only)


@dataclass(frozen=True)
class SignFlipResult:
    """Exact paired sign-flip test of the seed-averaged difference `variant - baseline`.

    `difference`: the difference of the seed-mean ExpRates, percentage points; `favours`: 1 the
    variant, -1 the baseline, 0 neither (from the exact integer statistic, so a tie is 0 whatever
    the float rounding); `p_value`: exact, two-sided; `informative`: expressions whose difference is
    not zero (the others flip to themselves).
    """

    difference: float
    favours: int
    p_value: float
    n: int
    informative: int


@dataclass(frozen=True)
class Comparison:
    """A variant against the baseline on one test year (see `compare`)."""

    difference: float  # seed-mean ExpRate difference, percentage points
    low: float  # confidence interval of the difference (paired bootstrap)
    high: float
    p_bootstrap: float
    p_mcnemar: float  # largest McNemar p over the seed-matched pairs
    n: int  # test expressions both systems were scored on
    pairs: int  # seed pairs McNemar was run on
    sign_flip: SignFlipResult  # the test over all seeds at once
    mcnemar: tuple[McNemarResult, ...] = ()  # one per seed pair, in the order of the baseline's seeds


def _as_matrix(correct: Sequence[bool] | Sequence[Sequence[bool]] | np.ndarray, name: str) -> np.ndarray:
    """Correctness as a float matrix [seeds, expressions] with values in [0, 1]."""
    arr = np.asarray(correct, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise ValueError(f"{name}: expected correctness of shape [expressions] or [seeds, expressions], "
                         f"got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ValueError(f"{name}: no runs")
    if np.isnan(arr).any() or (arr < 0).any() or (arr > 1).any():
        raise ValueError(f"{name}: correctness must be 0/1 (or True/False)")
    return arr


def _paired(baseline, variant) -> tuple[np.ndarray, np.ndarray]:
    """Both systems' correctness matrices, refused unless they score the same, non-zero, number of expressions."""
    base, var = _as_matrix(baseline, "baseline"), _as_matrix(variant, "variant")
    if base.shape[1] != var.shape[1]:
        raise ValueError(f"baseline and variant are scored on different numbers of expressions "
                         f"({base.shape[1]} and {var.shape[1]})")
    if base.shape[1] == 0:
        raise ValueError("no test expressions to compare")
    return base, var


def paired_bootstrap(baseline: Sequence[bool] | Sequence[Sequence[bool]] | np.ndarray,
                     variant: Sequence[bool] | Sequence[Sequence[bool]] | np.ndarray, *,
                     n_resamples: int = DEFAULT_RESAMPLES, confidence: float = DEFAULT_CONFIDENCE,
                     seed: int = 0) -> BootstrapResult:
    """Paired bootstrap of the ExpRate difference `variant - baseline` over test expressions, from
    correctness `[expressions]` or `[seeds, expressions]` (averaged over seeds): the difference in
    percentage points, its percentile interval and the two-sided p-value
    `(1 + #{|d* - d| >= |d|}) / (1 + n_resamples)`, 1 for two identical systems."""
    base, var = _paired(baseline, variant)
    base, var = base.mean(axis=0), var.mean(axis=0)
    n = base.shape[0]
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be positive, got {n_resamples}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    per_expression = (var - base) * 100.0
    observed = float(per_expression.mean())
    rng = np.random.default_rng(seed)
    resampled = np.empty(n_resamples, dtype=np.float64)
    for start in range(0, n_resamples, _CHUNK):
        stop = min(start + _CHUNK, n_resamples)
        idx = rng.integers(0, n, size=(stop - start, n))
        resampled[start:stop] = per_expression[idx].mean(axis=1)
    alpha = 1.0 - confidence
    low, high = np.quantile(resampled, [alpha / 2.0, 1.0 - alpha / 2.0])
    extreme = int(np.count_nonzero(np.abs(resampled - observed) >= abs(observed) - _TOLERANCE))
    p_value = (1.0 + extreme) / (1.0 + n_resamples)
    return BootstrapResult(difference=observed, low=float(low), high=float(high), p_value=min(1.0, p_value),
                           n=n, n_resamples=n_resamples, confidence=confidence)


def exact_binomial_two_sided(k: int, n: int) -> float:
    """P(X <= min(k, n-k)) * 2, capped at 1, for X ~ Binomial(n, 1/2); exact integer arithmetic."""
    if n < 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return 1.0
    tail = sum(comb(n, i) for i in range(min(k, n - k) + 1))
    return min(1.0, 2 * tail / 2**n)  # int / int: correctly rounded even for huge n


def mcnemar(baseline: Sequence[bool] | np.ndarray, variant: Sequence[bool] | np.ndarray) -> McNemarResult:
    """Exact (binomial) McNemar test on two correctness vectors over the same expressions."""
    base = np.asarray(baseline, dtype=bool)
    var = np.asarray(variant, dtype=bool)
    if base.ndim != 1 or base.shape != var.shape:
        raise ValueError(f"mcnemar needs two correctness vectors of one length, got shapes {base.shape} "
                         f"and {var.shape}")
    baseline_only = int(np.count_nonzero(base & ~var))
    variant_only = int(np.count_nonzero(var & ~base))
    p = exact_binomial_two_sided(variant_only, baseline_only + variant_only)
    return McNemarResult(baseline_only=baseline_only, variant_only=variant_only, p_value=p, n=int(base.shape[0]))


def sign_flip(baseline: Sequence[bool] | Sequence[Sequence[bool]] | np.ndarray,
              variant: Sequence[bool] | Sequence[Sequence[bool]] | np.ndarray) -> SignFlipResult:
    """Exact two-sided sign-flip test (arguments as `paired_bootstrap`'s): `p = P(|sum of s_i d_i| >=
    |sum of d_i|)` over fair signs s_i; 1 when the difference is 0."""
    base, var = _paired(baseline, variant)
    n = base.shape[1]
    for arr, name in ((base, "baseline"), (var, "variant")):
        if not np.isin(arr, (0.0, 1.0)).all():
            raise ValueError(f"{name}: the sign-flip test needs 0/1 correctness per run")
    base_seeds, var_seeds = base.shape[0], var.shape[0]
    # d * base_seeds * var_seeds, an integer per expression: the null distribution lives on integers
    scaled = (var.sum(axis=0) * base_seeds - base.sum(axis=0) * var_seeds).round().astype(np.int64)
    observed = int(scaled.sum())
    informative = int(np.count_nonzero(scaled))
    difference = 100.0 * observed / (base_seeds * var_seeds * n)
    favours = (observed > 0) - (observed < 0)
    if observed == 0:
        return SignFlipResult(difference=difference, favours=0, p_value=1.0, n=n, informative=informative)
    # The c expressions of one magnitude m add m * (2X - c), X ~ Binomial(c, 1/2): the null distribution
    # of the sum is the convolution of those, one per magnitude (at most base_seeds * var_seeds of them).
    null = np.ones(1)  # probabilities of the sums -reach..reach, reach = (len - 1) / 2
    magnitudes, counts = np.unique(np.abs(scaled[scaled != 0]), return_counts=True)
    for magnitude, c in zip(magnitudes.tolist(), counts.tolist()):
        spread = np.zeros(2 * magnitude * c + 1)
        spread[::2 * magnitude] = [comb(c, k) / 2**c for k in range(c + 1)]  # int / int: correctly rounded
        null = np.convolve(null, spread)
    reach = (len(null) - 1) // 2
    as_extreme = np.abs(np.arange(-reach, reach + 1)) >= abs(observed)  # integers: no tolerance needed
    p_value = min(1.0, float(null[as_extreme].sum()))
    return SignFlipResult(difference=difference, favours=favours, p_value=p_value, n=n, informative=informative)


def seed_pairs(baseline_seeds: Sequence[int], variant_seeds: Sequence[int]) -> list[tuple[int, int]]:
    """Index pairs (baseline row, variant row) of matching seeds, in the order of the baseline's seeds;
    sorted order when none match."""
    pairs = sorted(((i, variant_seeds.index(s)) for i, s in enumerate(baseline_seeds) if s in variant_seeds),
                   key=lambda pair: baseline_seeds[pair[0]])
    if pairs:
        return pairs
    b_order = sorted(range(len(baseline_seeds)), key=lambda i: baseline_seeds[i])
    v_order = sorted(range(len(variant_seeds)), key=lambda i: variant_seeds[i])
    return list(zip(b_order, v_order))


def compare(baseline: Sequence[Sequence[bool]] | np.ndarray, variant: Sequence[Sequence[bool]] | np.ndarray, *,
            baseline_seeds: Sequence[int] | None = None, variant_seeds: Sequence[int] | None = None,
            n_resamples: int = DEFAULT_RESAMPLES, confidence: float = DEFAULT_CONFIDENCE, seed: int = 0) -> Comparison:
    """The three tests for a variant against the baseline on one test year, from correctness `[seeds,
    expressions]`; the seed of each row (default: rows in order) pairs runs for McNemar."""
    base, var = _paired(baseline, variant)
    boot = paired_bootstrap(base, var, n_resamples=n_resamples, confidence=confidence, seed=seed)
    b_seeds = list(baseline_seeds) if baseline_seeds is not None else list(range(base.shape[0]))
    v_seeds = list(variant_seeds) if variant_seeds is not None else list(range(var.shape[0]))
    if len(b_seeds) != base.shape[0] or len(v_seeds) != var.shape[0]:
        raise ValueError("one seed per row of correctness is needed")
    tests = tuple(mcnemar(base[i] > 0.5, var[j] > 0.5) for i, j in seed_pairs(b_seeds, v_seeds))
    return Comparison(difference=boot.difference, low=boot.low, high=boot.high, p_bootstrap=boot.p_value,
                      p_mcnemar=max(t.p_value for t in tests), n=boot.n, pairs=len(tests),
                      sign_flip=sign_flip(base, var), mcnemar=tests)
