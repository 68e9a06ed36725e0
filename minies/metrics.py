"""Metrics: the unbiased pass@k estimator and summaries of a batch of scored rollouts."""
import numpy as np


def pass_at_k(n, c, k):
    """Unbiased pass@k for one problem with n samples of which c are correct (Chen et al. 2021):
    1 - C(n-c, k) / C(n, k), in the stable product form 1 - prod_{i=n-c+1..n} (1 - k/i)."""
    if not all(isinstance(x, (int, np.integer)) for x in (n, c, k)):  # 3.0 samples is a bug upstream
        raise ValueError(f"pass@k needs integer counts, got n={n!r}, c={c!r}, k={k!r}")
    if k < 1 or not 0 <= c <= n:
        raise ValueError(f"pass@{k}: impossible counts n={n}, c={c} (need k >= 1 and 0 <= c <= n)")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_pass_at_k(correct_counts, n, k):
    """pass@k averaged over problems, given each problem's number of correct samples out of n."""
    return float(np.mean([pass_at_k(n, int(c), k) for c in correct_counts]))


def average_ranks(values):
    """Ranks 0..n-1 of the values in ascending order, tied values sharing the mean of their ranks."""
    values = np.asarray(values, dtype=np.float64)
    ranks = np.empty_like(values)
    ranks[values.argsort(kind="stable")] = np.arange(len(values))
    for value in np.unique(values):
        ranks[values == value] = ranks[values == value].mean()
    return ranks


def masked_mean(values, mask):
    mask = mask.float()
    return float((values * mask).sum() / mask.sum().clamp(min=1))
