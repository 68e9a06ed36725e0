"""pass@k (unbiased estimator) against hand-computed values, and masked means."""
from math import comb

import numpy as np
import pytest
import torch

from minies.metrics import masked_mean, mean_pass_at_k, pass_at_k


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 1, 2 / 5),
    (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
    (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
    (16, 1, 16, 1.0),
    (16, 0, 16, 0.0),
    (8, 0, 1, 0.0),
    (8, 8, 1, 1.0),
    (4, 2, 3, 1.0),  # n - c = 2 < k = 3: every 3-subset holds a correct sample
    (4, 1, 4, 1.0),  # k = n with one correct
    (1, 1, 1, 1.0),
    (1, 0, 1, 0.0),
])
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_the_combinatorial_formula():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                expected = 1.0 if n - c < k else 1 - comb(n - c, k) / comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12), (n, c, k)


def test_pass_at_1_is_the_fraction_correct():
    assert pass_at_k(32, 7, 1) == pytest.approx(7 / 32)


def test_pass_at_k_grows_with_k():
    values = [pass_at_k(16, 3, k) for k in range(1, 17)]
    assert all(a <= b + 1e-12 for a, b in zip(values, values[1:]))


def test_pass_at_k_needs_k_samples():
    with pytest.raises(ValueError, match="at least 5 samples"):
        pass_at_k(4, 2, 5)


def test_mean_pass_at_k():
    assert mean_pass_at_k([0, 2, 5], n=5, k=1) == pytest.approx((0 + 0.4 + 1) / 3)
    assert mean_pass_at_k([0, 2, 5], n=5, k=2) == pytest.approx((0 + 0.7 + 1) / 3)


def test_masked_mean():
    values = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_mean(values, mask) == pytest.approx(2.0)
    assert masked_mean(values, torch.zeros_like(mask)) == 0.0


def test_pass_at_1_interval_over_problems():
    from minies.evaluate import pass_at_1_interval

    # Per-problem pass@1 of 0, 0.5, 1, 0.5: std 0.408 (ddof 1), so 1.96 · 0.408 / 2.
    assert pass_at_1_interval([0, 2, 4, 2], 4) == pytest.approx(1.96 * np.sqrt(1 / 6) / 2)
    assert pass_at_1_interval([3, 3, 3], 4) == 0.0  # every problem alike: no spread
    assert pass_at_1_interval([1], 4) == 0.0
