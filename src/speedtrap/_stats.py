"""Statistics shared by the probes, the search's verdict rules and the report."""

from __future__ import annotations

import math


def wilson(correct: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of ``correct`` successes in ``n`` trials (95% for z = 1.96)."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= correct <= n:
        raise ValueError(f"correct={correct} is not in 0..{n}")
    p = correct / n
    z2 = z * z
    denom = 1 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    low = 0.0 if correct == 0 else max(0.0, center - half)  # exact at the ends, where rounding would
    high = 1.0 if correct == n else min(1.0, center + half)  # put the bound a hair inside the estimate
    return low, high
