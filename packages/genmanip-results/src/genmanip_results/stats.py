"""Small statistics shared by the eval progress line and the results browser.

Success rates of a few dozen episodes are noisy; every success rate gmp prints comes with a Wilson
score interval, which stays inside [0, 1] and behaves at 0 and n successes (unlike the normal
approximation).
"""

from __future__ import annotations

import math

__all__ = ["wilson_interval"]


def wilson_interval(successes: int | float, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion.

    Args:
        successes: number of successes (0 <= successes <= n; a float count is accepted).
        n: number of trials. ``n == 0`` gives the uninformative interval ``(0.0, 1.0)``.
        z: the normal quantile; 1.96 gives a 95% interval.

    Returns:
        ``(low, high)``, both in [0, 1], ``low <= successes / n <= high``.

    Raises:
        ValueError: ``n < 0``, ``successes`` outside ``[0, n]`` or ``z <= 0``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if z <= 0:
        raise ValueError(f"z must be > 0, got {z}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be within [0, {n}], got {successes}")
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    low = max(0.0, centre - half)
    high = min(1.0, centre + half)
    # Exact endpoints at the boundaries (floating error must not put p outside the interval).
    if successes == 0:
        low = 0.0
    if successes == n:
        high = 1.0
    return (low, high)
