"""Student's t intervals of a multi-seed result: what its seeds say about the mean, and where
one more run like them should land.

For ``n`` seeds with mean ``m`` and sample standard deviation ``s`` (``n - 1`` in the
denominator), ``t`` the ``(1 + level) / 2`` quantile of Student's t with ``n - 1`` degrees of
freedom:

- :func:`mean_interval`: ``m ± t s / sqrt(n)``, the confidence interval of the mean, what the
  fidelity tables show (``benchmarks/_fidelity_report.py``);
- :func:`prediction_interval`: ``m ± t s sqrt(1 + 1/n)``, where a single new run of the same
  protocol falls with probability ``level`` (the seeds and the run drawn alike, normal
  errors), what a demo run is compared with (``raycompat/upgrade/committed_range.py``). The
  seeds' ``[min, max]`` holds a new run only with probability ``(n - 1) / (n + 1)``.

Both are None for fewer than two seeds (no spread to scale by). scipy is imported on first use.
"""

from __future__ import annotations

import math


def _half_width(sd: float, n: int, level: float, scale: float) -> float:
    from scipy.stats import t

    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return float(t.ppf(0.5 + level / 2, n - 1)) * sd * scale


def mean_interval(
    mean: float, sd: float | None, n: int, level: float = 0.95
) -> tuple[float, float] | None:
    """The ``level`` confidence interval of the mean of ``n`` seeds; None below two seeds."""
    if n < 2 or sd is None:
        return None
    half = _half_width(sd, n, level, 1 / math.sqrt(n))
    return mean - half, mean + half


def prediction_interval(
    mean: float, sd: float | None, n: int, level: float = 0.95
) -> tuple[float, float] | None:
    """Where one more run falls with probability ``level``; None below two seeds."""
    if n < 2 or sd is None:
        return None
    half = _half_width(sd, n, level, math.sqrt(1 + 1 / n))
    return mean - half, mean + half
