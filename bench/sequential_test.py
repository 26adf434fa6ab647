"""Benchmark: the anytime-valid sequential paired test (genmanip_results.stats) by simulation.

* A/A: ``--sims`` comparisons of two identical policies over ``--seeds`` paired episodes, the test
  consulted after every episode and the comparison stopped at its first decision. A "better" or
  "worse" decision is a false decision; its rate must stay <= alpha (Ville's inequality), with
  the Wilson 95% upper bound of the estimate shown. "no difference" (|d| < delta) is a correct
  decision here.
* A true 20-point difference over ``--seeds`` seeds: the sequential test's power (it decides
  "better") and its average number of episodes (ASN; an undecided comparison counts the whole
  budget), against the fixed-size exact McNemar test at equal power: the smallest n whose exact
  power (computed, not simulated) reaches the sequential test's power. "fewer" = 1 - ASN / n.
  Savings grow with the power the budget gives: where 100 seeds barely suffice (40% -> 60%,
  half the pairs discordant), a fixed-size test needs fewer episodes than any anytime-valid one.

Usage: python bench/sequential_test.py [--sims 2000] [--seeds 100] [--alpha 0.05] [--seed 1]
Prints markdown tables.
"""

from __future__ import annotations

import argparse
import math
import random
from functools import cache

from genmanip_results.stats import (
    Decision,
    SequentialPairedTest,
    mcnemar_exact_p,
    wilson_interval,
)

#: (name, P(A succeeds), P(A fails and B succeeds) = p01, P(A succeeds and B fails) = p10)
DIFF_SCENARIOS = [
    ("75% -> 95%, independent", 0.75, 0.2375, 0.0375),
    ("70% -> 90%, correlated", 0.70, 0.22, 0.02),
    ("50% -> 70%, correlated", 0.50, 0.25, 0.05),
    ("40% -> 60%, independent", 0.40, 0.36, 0.16),
]
AA_RATES = [0.2, 0.5, 0.8]


def draw(rng: random.Random, pa: float, p01: float, p10: float) -> tuple[bool, bool]:
    """One paired episode (A's and B's success) from the 2x2 cell probabilities."""
    u = rng.random()
    if u < p10:
        return True, False
    if u < p10 + p01:
        return False, True
    # concordant: both succeed with P(A) - p10, both fail otherwise
    return (True, True) if u < p10 + p01 + (pa - p10) else (False, False)


def run_sequential(rng: random.Random, n: int, pa: float, p01: float, p10: float,
                   alpha: float) -> tuple[Decision | None, int]:
    t = SequentialPairedTest(alpha)
    for i in range(n):
        d = t.update(*draw(rng, pa, p01, p10))
        if d is not None:
            return d, i + 1
    return None, n


@cache
def _critical(m: int, alpha: float) -> int:
    """Largest k with McNemar p(k, m - k) <= alpha (-1: none)."""
    k = -1
    for i in range(m // 2 + 1):
        if mcnemar_exact_p(i, m - i) <= alpha:
            k = i
    return k


def fixed_power(n: int, p01: float, p10: float, alpha: float) -> float:
    """Exact power of the two-sided exact McNemar test at n pairs (rejecting in B's favour)."""
    r = p01 + p10
    q = p01 / r
    total = 0.0
    for m in range(n + 1):
        pm = math.comb(n, m) * r**m * (1 - r) ** (n - m)
        k = _critical(m, alpha)
        if k < 0 or pm < 1e-300:
            continue
        # B wins at least m - k of the m discordant pairs
        total += pm * sum(math.comb(m, w) * q**w * (1 - q) ** (m - w) for w in range(m - k, m + 1))
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=2000, help="simulated comparisons per row")
    ap.add_argument("--seeds", type=int, default=100, help="paired episodes per comparison")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1, help="random seed (deterministic)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    alpha, n = args.alpha, args.seeds

    print(f"A/A: {args.sims} comparisons x {n} paired episodes, alpha {alpha:g}, "
          "stopped at the first decision (optional stopping after every episode)\n")
    print("| success rate (both) | false decisions | rate | 95% upper | no-difference decided | mean episodes |")
    print("|---|---:|---:|---:|---:|---:|")
    total_false = 0
    for p in AA_RATES:
        false = nodiff = used = 0
        for _ in range(args.sims):
            # independent policies of equal success rate: p10 = p01 = p (1 - p)
            d, k = run_sequential(rng, n, p, p * (1 - p), p * (1 - p), alpha)
            false += d in (Decision.BETTER, Decision.WORSE)
            nodiff += d is Decision.NO_DIFFERENCE
            used += k
        total_false += false
        hi = wilson_interval(false, args.sims)[1]
        print(f"| {100 * p:.0f}% | {false}/{args.sims} | {false / args.sims:.4f} | {hi:.4f} | "
              f"{nodiff / args.sims:.3f} | {used / args.sims:.1f} |")
    all_n = args.sims * len(AA_RATES)
    print(f"| all | {total_false}/{all_n} | {total_false / all_n:.4f} | "
          f"{wilson_interval(total_false, all_n)[1]:.4f} | | |")

    print(f"\nTrue 20-point difference, budget {n} seeds: sequential test vs fixed-size exact "
          f"McNemar at equal power ({args.sims} comparisons per row)\n")
    print("| scenario | discordant rate | sequential power | ASN (episodes) | fixed n at equal power | "
          "ASN / fixed n | fewer episodes |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, pa, p01, p10 in DIFF_SCENARIOS:
        better = used = 0
        for _ in range(args.sims):
            d, k = run_sequential(rng, n, pa, p01, p10, alpha)
            better += d is Decision.BETTER
            used += k
        power = better / args.sims
        asn = used / args.sims
        # (an estimated power of 1 is matched at 1 - 1/(2 sims): no finite n has power 1)
        target = min(power, 1 - 0.5 / args.sims)
        n_fix = next((m for m in range(1, 4 * n) if fixed_power(m, p01, p10, alpha) >= target), None)
        if n_fix is None:
            print(f"| {name} | {p01 + p10:.3f} | {power:.3f} | {asn:.1f} | - | - | - |")
            continue
        ratio = asn / n_fix
        print(f"| {name} | {p01 + p10:.3f} | {power:.3f} | {asn:.1f} | {n_fix} | {ratio:.2f} | "
              f"{100 * (1 - ratio):.0f}% |")


if __name__ == "__main__":
    main()
