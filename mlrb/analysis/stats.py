"""Statistics for comparing agents on paired runs: pure functions of numbers.

The data are paired differences (A's score minus B's on one task and seed), held as one
group per task. The estimand is the mean over tasks of each task's mean difference, so
every task weighs the same however many seeds it has:

- `bootstrap_interval`: a percentile bootstrap interval in two stages, tasks drawn with
  replacement (clusters), then seeds within each drawn task; with one task, its seeds only.
  A percentile interval is too narrow on few values (85% where it says 95%, at 6 seeds), so
  it is read at Hesterberg's expanded level (`expanded_tail`), as a t interval widens;
- `sign_flip_p`: a two-sided paired sign-flip permutation test: under "A and B are
  interchangeable", each difference is as likely to have the other sign. Exact (every
  sign pattern) up to `EXACT_UP_TO` differences, else Monte Carlo;
- `seeds_needed`: pairs for a paired test to detect an effect, by the normal approximation;
- `holm`: Holm's step-down adjustment of p-values for many comparisons at once.

numpy is imported inside the functions that use it, so importing this module is cheap.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from statistics import NormalDist

# Up to this many differences the sign-flip test enumerates all 2**n sign patterns.
EXACT_UP_TO = 16
CHUNK = 1000  # bootstrap resamples drawn at once (bounds the memory of one draw)


def sd(values: Sequence[float]) -> float | None:
    """The sample standard deviation (n - 1); None below 2 values. The one place it is computed
    (tests/test_one_place.py holds it): the report, the anchors and the benchmarks call it."""
    n = len(values)
    if n < 2:
        return None
    m = sum(values) / n
    return math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))


def sem(values: Sequence[float]) -> float | None:
    """The standard error of the mean: the sample SD / sqrt(n); None below 2 values."""
    spread = sd(values)
    return None if spread is None else spread / math.sqrt(len(values))


def pooled_sd(groups: Sequence[Sequence[float]]) -> tuple[float | None, int]:
    """The within-group SD pooled over the groups with 2 values or more, and their values in all."""
    usable = [g for g in groups if len(g) >= 2]
    dof = sum(len(g) - 1 for g in usable)
    if not dof:
        return None, 0
    squares = sum(sum((v - sum(g) / len(g)) ** 2 for v in g) for g in usable)
    return math.sqrt(squares / dof), sum(len(g) for g in usable)


def mean_of_means(groups: Sequence[Sequence[float]]) -> float:
    """The estimand: the mean over groups (tasks) of each group's mean."""
    return sum(sum(g) / len(g) for g in groups) / len(groups)


@functools.cache
def t_quantile(p: float, df: int) -> float:
    """Student's t quantile for 0.5 <= p < 1: closed forms for 1 and 2 degrees of freedom, else
    bisection on the distribution function (Simpson's rule on the density from 0)."""
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    constant = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(x: float, steps: int = 2000) -> float:
        h = x / steps
        density = [constant * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(steps + 1)]
        return 0.5 + h / 3 * (density[0] + density[-1] + 4 * sum(density[1:-1:2]) + 2 * sum(density[2:-1:2]))

    low, high = 0.0, 8.0
    while cdf(high) < p:
        high *= 2
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if cdf(middle) < p else (low, middle)
    return (low + high) / 2


def expanded_tail(level: float, n: int) -> float:
    """The tail share at which to read a percentile bootstrap of a mean of n values so that it
    covers about as a t interval would (Hesterberg's expanded percentile interval):
    Phi(-sqrt(n / (n - 1)) * t(1 - tail, n - 1)), tail = (1 - level) / 2. Near the plain tail
    from some 30 values on; 0.016 instead of 0.025 at 20 values, 0.0024 at 6."""
    tail = (1 - level) / 2
    if n < 2:
        return tail
    return NormalDist().cdf(-math.sqrt(n / (n - 1)) * t_quantile(1 - tail, n - 1))


def bootstrap_interval(
    groups: Sequence[Sequence[float]], level: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of `mean_of_means`: each resample draws as many groups as
    there are, with replacement, and within each drawn group as many of its values as it has.
    Drawing the groups too is what makes tasks clusters: when tasks differ in their effect, the
    interval is wider than one that pools every value. Read at the expanded level for all the
    values together (`expanded_tail`). None with fewer than 2 values in all."""
    import numpy as np

    groups = [g for g in groups if len(g)]
    if sum(len(g) for g in groups) < 2:
        return None
    rng = np.random.default_rng(seed)
    sizes = np.array([len(g) for g in groups])
    padded = np.zeros((len(groups), sizes.max()))
    for i, g in enumerate(groups):
        padded[i, : len(g)] = g
    several = len(groups) > 1
    equal_sizes = bool((sizes == sizes.max()).all())  # no position to mask out
    estimates = []
    for start in range(0, resamples, CHUNK):
        b = min(CHUNK, resamples - start)
        drawn = rng.integers(0, len(groups), (b, len(groups))) if several else np.zeros((b, 1), dtype=int)
        n = sizes[drawn]  # (b, groups): the size of each drawn group
        # Within each drawn group, n of its values with replacement: positions past n are masked out.
        # (truncation is the floor: the products are not negative)
        picks = (rng.random((b, drawn.shape[1], sizes.max())) * n[..., None]).astype(np.intp)
        values = padded[drawn[..., None], picks] if several else padded[0][picks]
        if equal_sizes:
            group_means = values.mean(axis=2)
        else:
            inside = np.arange(sizes.max()) < n[..., None]
            group_means = (values * inside).sum(axis=2) / n
        estimates.append(group_means.mean(axis=1))
    tail = expanded_tail(level, int(sizes.sum()))
    low, high = np.quantile(np.concatenate(estimates), [tail, 1 - tail])
    return float(low), float(high)


def sign_flip_p(groups: Sequence[Sequence[float]], resamples: int = 20_000, seed: int = 0) -> float | None:
    """Two-sided p-value of `mean_of_means` under random signs of the differences: the share of
    sign patterns whose statistic is at least as far from 0 as the observed one. Every pattern
    when there are at most EXACT_UP_TO differences; else `resamples` random ones, the observed
    counted among them ((1 + hits) / (1 + resamples)). None without differences."""
    import numpy as np

    groups = [g for g in groups if len(g)]
    if not groups:
        return None
    # The statistic is linear in the differences: sum_i w_i d_i, w_i = 1 / (groups * its group's size).
    weighted = np.concatenate([np.asarray(g, dtype=float) / (len(g) * len(groups)) for g in groups])
    observed = abs(weighted.sum())
    tolerance = 1e-9 * max(1.0, float(np.abs(weighted).sum()))  # equal statistics must compare equal
    n = len(weighted)
    if n <= EXACT_UP_TO:
        patterns = (np.arange(2**n)[:, None] >> np.arange(n)) & 1
        flipped = np.abs((1 - 2 * patterns) @ weighted)
        return float(np.mean(flipped >= observed - tolerance))
    rng = np.random.default_rng(seed)
    hits, total = 0, weighted.sum()
    for start in range(0, resamples, CHUNK):
        b = min(CHUNK, resamples - start)
        # each random bit flips one sign: drawn 8 to a byte, several times cheaper than a draw per sign
        flipped = np.unpackbits(rng.integers(0, 256, size=(b, (n + 7) // 8), dtype=np.uint8), axis=1, count=n)
        statistics = total - 2 * (flipped.astype(float) @ weighted)
        hits += int(np.sum(np.abs(statistics) >= observed - tolerance))
    return (1 + hits) / (1 + resamples)


def smallest_p(pairs: int) -> float:
    """The smallest p-value the exact two-sided sign-flip test can give with this many pairs."""
    return min(1.0, 2.0 / 2**pairs)


def fewest_pairs(alpha: float = 0.05) -> int:
    """The fewest pairs with which the sign-flip test can reach p <= alpha at all (6 at 0.05)."""
    n = 1
    while smallest_p(n) > alpha:
        n += 1
    return n


def z_sum(alpha: float = 0.05, power: float = 0.8) -> float:
    """z(1 - alpha/2) + z(power): 1.96 + 0.84 = 2.80 at the defaults."""
    normal = NormalDist()
    return normal.inv_cdf(1 - alpha / 2) + normal.inv_cdf(power)


def seeds_needed(sd_diff: float, effect: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Pairs for a two-sided paired test at `alpha` to detect a mean difference of `effect`
    with probability `power`, when one difference has standard deviation `sd_diff`: the normal
    approximation n = ((z(1 - alpha/2) + z(power)) * sd_diff / effect)**2, rounded up. It
    ignores that the SD is itself estimated, so it is a little low for small n."""
    return math.ceil((z_sum(alpha, power) * sd_diff / effect) ** 2 - 1e-9)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (in the order given): the k-th smallest of m is
    multiplied by m - k + 1, then made non-decreasing, capped at 1."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted = [0.0] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted
