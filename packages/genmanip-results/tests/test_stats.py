from __future__ import annotations

import pytest
from genmanip_results.stats import wilson_interval


def test_known_values() -> None:
    # Reference values of the Wilson score interval (z=1.96).
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-4)
    assert high == pytest.approx(0.9433, abs=1e-4)
    low, high = wilson_interval(50, 100)
    assert low == pytest.approx(0.4038, abs=1e-4)
    assert high == pytest.approx(0.5962, abs=1e-4)


def test_boundaries() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low, high = wilson_interval(0, 5)
    assert low == 0.0 and 0.4 < high < 0.6
    low, high = wilson_interval(5, 5)
    assert high == 1.0 and 0.4 < low < 0.6


@pytest.mark.parametrize("n", [1, 3, 17, 200])
def test_contains_point_estimate(n: int) -> None:
    for k in range(n + 1):
        low, high = wilson_interval(k, n)
        assert 0.0 <= low <= k / n <= high <= 1.0


def test_narrower_with_more_data() -> None:
    w_small = wilson_interval(5, 10)
    w_big = wilson_interval(500, 1000)
    assert (w_big[1] - w_big[0]) < (w_small[1] - w_small[0])


@pytest.mark.parametrize(("k", "n", "z"), [(1, -1, 1.96), (3, 2, 1.96), (-1, 2, 1.96), (1, 2, 0.0)])
def test_bad_input(k: int, n: int, z: float) -> None:
    with pytest.raises(ValueError):
        wilson_interval(k, n, z)
