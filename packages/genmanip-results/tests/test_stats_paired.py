"""Paired statistics against published values and independent computations; the sequential
test's error rate by a small deterministic simulation (the full one is bench/sequential_test.py)."""

from __future__ import annotations

import math
import random

import pytest
from genmanip_results.stats import (
    Decision,
    PairTable,
    SequentialPairedTest,
    bh_adjust,
    holm_adjust,
    mcnemar_exact_p,
    newcombe_paired_interval,
    pair_outcomes,
    paired_mean_difference,
    sequential_paired_test,
    student_t_quantile,
)


@pytest.mark.parametrize(
    ("cells", "expected"),
    [
        # Newcombe (1998), Stat Med 17:2635, Table II, method 10 (a, b, c, d) -> (L, U)
        ((36, 12, 2, 0), (0.0569, 0.3404)),
        ((18, 12, 2, 18), (0.0562, 0.3290)),
        ((53, 0, 0, 1), (-0.0729, 0.0729)),
    ],
)
def test_newcombe_method_10_published_examples(
    cells: tuple[int, int, int, int], expected: tuple[float, float]
) -> None:
    lo, hi = newcombe_paired_interval(*cells)
    assert lo == pytest.approx(expected[0], abs=1e-4)
    assert hi == pytest.approx(expected[1], abs=1e-4)


def test_newcombe_edges() -> None:
    assert newcombe_paired_interval(0, 0, 0, 0) == (-1.0, 1.0)
    lo, hi = newcombe_paired_interval(0, 10, 0, 0)  # first always, second never
    assert -1.0 <= lo < 1.0 and hi == pytest.approx(1.0)
    with pytest.raises(ValueError):
        newcombe_paired_interval(-1, 0, 0, 0)


def _binom_two_sided(b: int, c: int) -> float:
    m = b + c
    if m == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(m, i) for i in range(min(b, c) + 1)) / 2**m)


def test_mcnemar_exact_matches_binomial_and_known_values() -> None:
    # 2 vs 12 discordant: 2 * (1 + 14 + 91) / 2^14
    assert mcnemar_exact_p(2, 12) == pytest.approx(2 * 106 / 16384)
    assert mcnemar_exact_p(0, 0) == 1.0
    assert mcnemar_exact_p(5, 5) == 1.0
    assert mcnemar_exact_p(0, 6) == pytest.approx(2 / 64)
    for b in range(8):
        for c in range(8):
            assert mcnemar_exact_p(b, c) == pytest.approx(_binom_two_sided(b, c))
            assert mcnemar_exact_p(b, c) == mcnemar_exact_p(c, b)


def test_t_quantiles_known_values() -> None:
    assert student_t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-4)
    assert student_t_quantile(0.975, 9) == pytest.approx(2.2622, abs=1e-4)
    assert student_t_quantile(0.975, 30) == pytest.approx(2.0423, abs=1e-4)
    assert student_t_quantile(0.025, 9) == pytest.approx(-2.2622, abs=1e-4)


def test_paired_mean_difference() -> None:
    a = [0.0, 0.5, 1.0, 0.2, 0.4]
    b = [0.5, 0.5, 1.0, 0.6, 1.0]
    md = paired_mean_difference(a, b)
    d = [y - x for x, y in zip(a, b, strict=True)]
    mean = sum(d) / 5
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 4)
    assert md.mean == pytest.approx(mean) and md.sd == pytest.approx(sd)
    assert md.interval is not None
    assert md.interval[0] == pytest.approx(mean - 2.7764451 * sd / math.sqrt(5), abs=1e-6)
    assert paired_mean_difference([], []).mean is None
    assert paired_mean_difference([0.0], [1.0]).interval is None


def test_holm_and_bh() -> None:
    p = [0.01, 0.04, 0.03, 0.005]
    assert holm_adjust(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert bh_adjust(p) == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert holm_adjust([]) == [] and bh_adjust([]) == []


def test_pairing_and_table() -> None:
    a = {("t", "0"): True, ("t", "1"): False, ("t", "2"): True, ("u", "0"): False}
    b = {("t", "0"): True, ("t", "1"): True, ("t", "3"): True, ("u", "0"): False}
    pr = pair_outcomes(a, b)
    assert [k for k, _, _ in pr.pairs] == [("t", "0"), ("t", "1"), ("u", "0")]
    assert pr.only_a == [("t", "2")] and pr.only_b == [("t", "3")]
    t = PairTable.from_pairs((x, y) for _, x, y in pr.pairs)
    assert (t.both, t.a_only, t.b_only, t.neither) == (1, 0, 1, 1)
    assert t.difference == pytest.approx(1 / 3)


def test_sequential_decides_the_obvious_cases() -> None:
    t = SequentialPairedTest(0.05, 0.1)
    decisions = [t.update(False, True) for _ in range(10)]
    assert decisions[-1] is Decision.BETTER and t.decided_at is not None and t.decided_at <= 10
    assert decisions[: t.decided_at - 1] == [None] * (t.decided_at - 1)
    assert t.update(True, False) is Decision.BETTER  # decisions stay
    w = sequential_paired_test([(True, False)] * 20)
    assert w.decision is Decision.WORSE and w.saved == 20 - (w.decided_at or 0)
    # Identical policies for many episodes: "no difference larger than delta" eventually.
    eq = sequential_paired_test([(True, True), (False, False)] * 200, delta=0.1)
    assert eq.decision is Decision.NO_DIFFERENCE
    assert eq.to_json()["description"] == "no difference larger than 10 pp"
    with pytest.raises(ValueError):
        SequentialPairedTest(0.0)


def test_sequential_a_a_false_decisions_stay_below_alpha_small() -> None:
    """Small CI version of the bench: 300 A/A comparisons of 100 pairs, stopping at the first
    decision after any episode; "better"/"worse" are the false decisions."""
    rng = random.Random(20260101)
    alpha, runs, false = 0.05, 300, 0
    for _ in range(runs):
        p = rng.choice([0.2, 0.5, 0.8])
        res = sequential_paired_test(
            ((rng.random() < p, rng.random() < p) for _ in range(100)), alpha=alpha
        )
        false += res.decision in (Decision.BETTER, Decision.WORSE)
    # Ville: <= alpha in expectation; the binomial 99.9% upper margin of 300 draws is ~+0.04.
    assert false / runs <= alpha


def test_sequential_finds_a_large_difference_early() -> None:
    rng = random.Random(7)
    used = []
    for _ in range(100):
        res = sequential_paired_test(
            ((rng.random() < 0.3, rng.random() < 0.9) for _ in range(100)), alpha=0.05
        )
        assert res.decision is Decision.BETTER
        used.append(res.decided_at or 100)
    assert sum(used) / len(used) < 40
