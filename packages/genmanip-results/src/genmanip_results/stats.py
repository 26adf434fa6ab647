"""The one statistics module of gmp: success rates, paired comparisons and sequential tests.

Every success rate gmp prints comes with a Wilson score interval, which stays inside [0, 1] and
behaves at 0 and n successes (unlike the normal approximation). Two runs are compared on the
(task, seed) pairs both finished (the paired design: the same scene for both policies), never on
their marginal rates alone. What is here, and who uses it: the eval progress line and summary,
the viz compare page, ``gmp compare``, ``gmp report`` and (later) ``gmp eval --compare-to``.

Methods and references:

* :func:`wilson_interval`: E. B. Wilson (1927), "Probable inference, the law of succession, and
  statistical inference", JASA 22:209-212.
* :func:`newcombe_paired_interval`: R. G. Newcombe (1998), "Improved confidence intervals for the
  difference between binomial proportions based on paired data", Statistics in Medicine
  17:2635-2650, method 10 (Wilson score intervals of both margins, no continuity correction,
  combined with the phi correlation of the 2x2 table, which Newcombe shrinks by ``n/2`` when
  ``ad > bc``).
* :func:`mcnemar_exact_p`: the exact (conditional binomial) McNemar test on the discordant pairs,
  two-sided ``p = min(1, 2 * P[Bin(m, 1/2) <= min(b, c)])`` with ``m = b + c``.
* :func:`paired_mean_difference`: the paired Student t interval of a mean difference.
* :func:`holm_adjust`: S. Holm (1979), "A simple sequentially rejective multiple test procedure",
  Scand. J. Statist. 6:65-70 (family-wise error). :func:`bh_adjust`: Y. Benjamini and
  Y. Hochberg (1995), "Controlling the false discovery rate", JRSS B 57:289-300.
* :class:`SequentialPairedTest`: an anytime-valid sequential paired test built from
  e-processes (test supermartingales), implemented from the published methods, not from any
  code: the mixture sequential probability ratio test of H. Robbins (1970), "Statistical methods
  related to the law of the iterated logarithm", Ann. Math. Statist. 41:1397-1409 (after
  A. Wald (1945), "Sequential tests of statistical hypotheses"), on the discordant pairs, with
  Ville's inequality (J. Ville 1939) for the level; and the testing-by-betting e-processes of
  I. Waudby-Smith and A. Ramdas (2024), "Estimating means of bounded random variables by
  betting", JRSS B 86:1-27 (their aGRAPA bet) for "no difference larger than delta". See
  D. Snyder et al. (2025), "Is your imitation learning policy better than mine? Policy
  comparison with near-optimal stopping" (arXiv:2503.10966, TRI's STEP) for the robotics use.

Conventions: a paired comparison is "B against A": every difference is ``B - A`` (``A`` the
baseline, e.g. the run given to ``--compare-to``, ``B`` the candidate), so "better" means B is
better than A. Probabilities and rates are fractions in [0, 1]; differences are in [-1, 1].
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = [
    "DEFAULT_DELTA",
    "DEFAULT_PRIOR",
    "Decision",
    "MeanDifference",
    "PairTable",
    "Pairing",
    "SequentialPairedTest",
    "SequentialResult",
    "bh_adjust",
    "holm_adjust",
    "mcnemar_exact_p",
    "newcombe_paired_interval",
    "pair_outcomes",
    "paired_mean_difference",
    "sequential_paired_test",
    "student_t_quantile",
    "wilson_interval",
]

#: The default equivalence margin of the sequential test: 0.10 = 10 percentage points.
DEFAULT_DELTA = 0.10

#: The default mixing distribution of the sequential test on discordant pairs: the probability
#: ``q`` that a discordant pair is won by B, at these points (each mirrored around 1/2, equal
#: weights). A discrete mixture puts its power where robot comparisons worth stopping early live
#: (one policy wins 75-85% of the seeds on which they differ; bench/sequential_test.py); any symmetric mixture is valid.
DEFAULT_PRIOR: tuple[float, ...] = (0.75, 0.85)


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


# --------------------------------------------------------------------------------------------
# Pairing
# --------------------------------------------------------------------------------------------

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True)
class Pairing(Generic[K, V]):
    """Two outcome maps matched on their keys (gmp's key is ``(task_name, seed)``).

    ``pairs``: ``(key, a_value, b_value)`` for every key both have, in ``a``'s key order, then
    sorted where ``a`` gave no order (dict order is kept); ``only_a`` / ``only_b``: the keys one
    side lacks (counted apart, never mixed into a paired statistic).
    """

    pairs: list[tuple[K, V, V]]
    only_a: list[K]
    only_b: list[K]


def pair_outcomes(a: Mapping[K, V], b: Mapping[K, V]) -> Pairing[K, V]:
    """Match ``a`` and ``b`` on their keys (e.g. ``{(task, seed): outcome}``).

    Returns:
        a :class:`Pairing`; the keys of ``pairs`` follow ``a``'s iteration order.
    """
    pairs = [(k, va, b[k]) for k, va in a.items() if k in b]
    only_a = [k for k in a if k not in b]
    only_b = [k for k in b if k not in a]
    return Pairing(pairs=pairs, only_a=only_a, only_b=only_b)


@dataclass(frozen=True)
class PairTable:
    """The paired 2x2 table of successes (Newcombe's a, b, c, d), A the baseline, B the candidate.

    ``both``: both succeed; ``a_only``: A succeeds, B fails; ``b_only``: B succeeds, A fails;
    ``neither``: both fail. Discordant pairs are ``a_only + b_only``.
    """

    both: int = 0
    a_only: int = 0
    b_only: int = 0
    neither: int = 0

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[bool, bool]]) -> PairTable:
        """Count ``(a_success, b_success)`` pairs."""
        n11 = n10 = n01 = n00 = 0
        for sa, sb in pairs:
            if sa and sb:
                n11 += 1
            elif sa:
                n10 += 1
            elif sb:
                n01 += 1
            else:
                n00 += 1
        return cls(n11, n10, n01, n00)

    @property
    def n(self) -> int:
        """Number of pairs."""
        return self.both + self.a_only + self.b_only + self.neither

    @property
    def discordant(self) -> int:
        return self.a_only + self.b_only

    @property
    def sr_a(self) -> float | None:
        """A's success rate over the pairs (None without pairs)."""
        return (self.both + self.a_only) / self.n if self.n else None

    @property
    def sr_b(self) -> float | None:
        return (self.both + self.b_only) / self.n if self.n else None

    @property
    def difference(self) -> float | None:
        """``sr_b - sr_a`` = ``(b_only - a_only) / n`` (None without pairs)."""
        return (self.b_only - self.a_only) / self.n if self.n else None

    def interval(self, z: float = 1.96) -> tuple[float, float]:
        """Newcombe's interval of :attr:`difference` (see :func:`newcombe_paired_interval`)."""
        return newcombe_paired_interval(self.both, self.b_only, self.a_only, self.neither, z=z)

    def mcnemar_p(self) -> float:
        """The exact McNemar p-value of the discordant pairs."""
        return mcnemar_exact_p(self.a_only, self.b_only)


def newcombe_paired_interval(
    both: int, first_only: int, second_only: int, neither: int, z: float = 1.96
) -> tuple[float, float]:
    """Newcombe's (1998) method 10 interval for a paired difference of proportions.

    In Newcombe's notation the table is ``a = both``, ``b = first_only``, ``c = second_only``,
    ``d = neither``, ``n = a + b + c + d``; the difference is ``theta = (a + b)/n - (a + c)/n =
    (b - c)/n`` (the first proportion minus the second). With ``(l1, u1)``, ``(l2, u2)`` the
    Wilson intervals of both margins and ``phi = (ad - bc) / sqrt((a+b)(c+d)(a+c)(b+d))`` (0 when
    a margin is empty; when ``ad > bc`` the numerator is ``max(ad - bc - n/2, 0)``, Newcombe's
    correction):
    ``L = theta - sqrt((p1-l1)^2 - 2 phi (p1-l1)(u2-p2) + (u2-p2)^2)`` and
    ``U = theta + sqrt((u1-p1)^2 - 2 phi (u1-p1)(p2-l2) + (p2-l2)^2)``.

    gmp calls it with the candidate as the first proportion: ``(both, b_only, a_only, neither)``
    gives the interval of ``sr_b - sr_a``.

    Args:
        both, first_only, second_only, neither: the cell counts (non-negative integers).
        z: the normal quantile (1.96: 95%).

    Returns:
        ``(low, high)`` within ``[-1, 1]``; ``(-1.0, 1.0)`` without pairs.

    Raises:
        ValueError: a negative count.
    """
    a, b, c, d = both, first_only, second_only, neither
    if min(a, b, c, d) < 0:
        raise ValueError(f"counts must be >= 0, got {(a, b, c, d)}")
    n = a + b + c + d
    if n == 0:
        return (-1.0, 1.0)
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson_interval(a + b, n, z)
    l2, u2 = wilson_interval(a + c, n, z)
    denom = float(a + b) * float(c + d) * float(a + c) * float(b + d)
    # Newcombe's phi, continuity-corrected towards 0 when ad > bc (as his method 10 prescribes).
    num = float(a * d - b * c)
    if num > 0:
        num = max(num - n / 2.0, 0.0)
    phi = num / math.sqrt(denom) if denom > 0 else 0.0
    theta = p1 - p2
    dl = (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2
    du = (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2
    low = theta - math.sqrt(max(0.0, dl))
    high = theta + math.sqrt(max(0.0, du))
    return (max(-1.0, low), min(1.0, high))


def mcnemar_exact_p(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p-value on the discordant pairs.

    ``p = min(1, 2 * P[Bin(m, 1/2) <= min(a_only, b_only)])`` with ``m = a_only + b_only``
    (exact integer arithmetic; 1.0 without discordant pairs).

    Raises:
        ValueError: a negative count.
    """
    if a_only < 0 or b_only < 0:
        raise ValueError(f"counts must be >= 0, got {(a_only, b_only)}")
    m = a_only + b_only
    if m == 0:
        return 1.0
    k = min(a_only, b_only)
    tail = sum(math.comb(m, i) for i in range(k + 1))
    return min(1.0, float(2 * tail / 2**m))


# --------------------------------------------------------------------------------------------
# Mean partial-credit score: paired t interval
# --------------------------------------------------------------------------------------------


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta ``I_x(a, b)`` for ``a, b > 0``, ``0 <= x <= 1``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(ln)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _t_cdf(t: float, df: float) -> float:
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def student_t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on the CDF).

    Raises:
        ValueError: ``p`` outside (0, 1) or ``df <= 0``.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be within (0, 1), got {p}")
    if df <= 0:
        raise ValueError(f"df must be > 0, got {df}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class MeanDifference:
    """A paired mean difference ``mean(b - a)`` with its Student t interval.

    ``n``: pairs with both scores; ``mean``: the mean difference (None when ``n == 0``);
    ``interval``: ``mean +- t_{1-(1-conf)/2, n-1} * sd / sqrt(n)`` clipped to ``bounds``
    (None when ``n < 2``: one pair has no spread); ``sd``: the sample standard deviation of the
    differences; ``method``: ``"paired t"``.
    """

    n: int
    mean: float | None
    interval: tuple[float, float] | None
    sd: float | None
    method: str = "paired t"


def paired_mean_difference(
    a: Sequence[float],
    b: Sequence[float],
    *,
    confidence: float = 0.95,
    bounds: tuple[float, float] = (-1.0, 1.0),
) -> MeanDifference:
    """Mean of ``b[i] - a[i]`` with a paired Student t interval (partial-credit scores in [0, 1]).

    The t interval is the textbook choice for a mean of paired differences; its coverage is
    close to nominal for bounded scores from about ten pairs on. When every difference is equal
    the interval collapses to that value (report ``n`` next to it).

    Args:
        a, b: the two score sequences, same length, paired by index.
        confidence: the interval's confidence level in (0, 1).
        bounds: the possible range of a difference (scores in [0, 1]: ``(-1, 1)``).

    Raises:
        ValueError: different lengths, or ``confidence`` outside (0, 1).
    """
    if len(a) != len(b):
        raise ValueError(f"a and b must have the same length, got {len(a)} and {len(b)}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be within (0, 1), got {confidence}")
    diffs = [float(y) - float(x) for x, y in zip(a, b, strict=True)]
    n = len(diffs)
    if n == 0:
        return MeanDifference(0, None, None, None)
    mean = math.fsum(diffs) / n
    if n < 2:
        return MeanDifference(n, mean, None, None)
    sd = math.sqrt(math.fsum((d - mean) ** 2 for d in diffs) / (n - 1))
    t = student_t_quantile(0.5 + confidence / 2.0, n - 1)
    half = t * sd / math.sqrt(n)
    lo, hi = max(bounds[0], mean - half), min(bounds[1], mean + half)
    return MeanDifference(n, mean, (lo, hi), sd)


# --------------------------------------------------------------------------------------------
# Multiplicity
# --------------------------------------------------------------------------------------------


def holm_adjust(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error), in the input order.

    ``adj_(i) = max_{j <= i} min(1, (m - j + 1) p_(j))`` over the ascending order; a claim is
    made for a hypothesis whose adjusted p-value is ``<= alpha``.
    """
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        out[i] = running
    return out


def bh_adjust(pvalues: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (false discovery rate), in the input order.

    ``adj_(i) = min_{j >= i} min(1, m p_(j) / j)`` over the ascending order.
    """
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out = [1.0] * m
    running = 1.0
    for rank in range(m - 1, -1, -1):
        i = order[rank]
        running = min(running, 1.0, m * float(pvalues[i]) / (rank + 1))
        out[i] = running
    return out


# --------------------------------------------------------------------------------------------
# Anytime-valid sequential paired test
# --------------------------------------------------------------------------------------------


class Decision(str, enum.Enum):
    """What the sequential test decided (B against A). The values are the JSON spellings."""

    BETTER = "better"
    WORSE = "worse"
    NO_DIFFERENCE = "no_difference"

    def describe(self, delta: float) -> str:
        """Human wording, e.g. ``"no difference larger than 10 pp"``."""
        if self is Decision.NO_DIFFERENCE:
            return f"no difference larger than {100 * delta:g} pp"
        return str(self.value)


@dataclass(frozen=True)
class SequentialResult:
    """The outcome of a sequential paired test over a finished sequence of pairs.

    ``decision``: None when undecided at the end; ``decided_at``: the number of pairs seen when it
    was decided (None when undecided); ``n``: pairs available; ``saved``: ``n - decided_at`` (0
    when undecided): the episodes a run stopped at the decision would not have needed;
    ``evidence``: :meth:`SequentialPairedTest.evidence` at the decision (else at the end).
    """

    decision: Decision | None
    decided_at: int | None
    n: int
    saved: int
    alpha: float
    delta: float
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "decision": self.decision.value if self.decision else None,
            "description": self.decision.describe(self.delta) if self.decision else "undecided",
            "decided_at": self.decided_at,
            "n": self.n,
            "saved": self.saved,
            "alpha": self.alpha,
            "delta": self.delta,
            "evidence": self.evidence,
        }


class SequentialPairedTest:
    """Anytime-valid sequential test of B against A on paired episodes, one pair at a time.

    Call :meth:`update` after every finished pair (same task and seed for both policies); stop
    as soon as it returns a :class:`Decision`. Whatever the stopping rule (after any episode, or
    never), each wrong claim has probability at most ``alpha``:

    * **better / worse** (the paired difference is not zero): a mixture sequential probability
      ratio on the discordant pairs. A discordant pair is won by B with probability
      ``q = p01 / (p01 + p10)``; "no difference" is ``q = 1/2``. The e-value after ``w`` B-wins
      and ``l`` A-wins is ``E = sum_j pi_j (2 q_j)^w (2 (1 - q_j))^l`` over a symmetric mixture
      ``pi`` (:data:`DEFAULT_PRIOR`), a nonnegative martingale with mean 1 under ``q = 1/2``
      (concordant pairs leave it unchanged). "better" is decided when ``E >= 1/alpha`` with
      ``w > l``: its ``q > 1/2`` half alone then exceeds ``1/alpha``, and that half is a
      supermartingale under every ``q <= 1/2``, so by Ville's inequality P(ever claim "better"
      | B not better) <= alpha; "worse" likewise.
    * **no difference larger than delta**: two testing-by-betting e-processes on the per-pair
      difference ``X = b - a`` in {-1, 0, 1} (mean ``d = sr_b - sr_a``), one against
      ``d >= delta`` (wealth ``prod (1 - lam_i (X_i - delta))``), one against ``d <= -delta``
      (``prod (1 + lam_i (X_i + delta))``), with predictable aGRAPA bets ``lam_i`` (Waudby-Smith
      and Ramdas). Both past ``1/alpha``: P(claim | |d| >= delta) <= alpha (intersection-union).
      This one is valid when the per-episode differences share their mean given the past (e.g.
      tasks interleaved or episodes in a random order); the better/worse test needs no such
      condition (each pair's ``q_i`` may differ).

    Once decided, the decision stays (later updates only count pairs).

    Args:
        alpha: the level, in (0, 1).
        delta: the equivalence margin in (0, 1) (fraction: 0.1 = 10 points).
        prior: the points ``q_j > 1/2`` of the mixture (each mirrored to ``1 - q_j``, equal
            weights).
    """

    def __init__(
        self,
        alpha: float = 0.05,
        delta: float = DEFAULT_DELTA,
        *,
        prior: Sequence[float] = DEFAULT_PRIOR,
    ) -> None:
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be within (0, 1), got {alpha}")
        if not 0.0 < delta < 1.0:
            raise ValueError(f"delta must be within (0, 1), got {delta}")
        if not prior or any(not 0.5 < q < 1.0 for q in prior):
            raise ValueError(f"prior points must be within (1/2, 1), got {list(prior)}")
        self.alpha = float(alpha)
        self.delta = float(delta)
        self.prior = tuple(float(q) for q in prior)
        self._threshold = math.log(1.0 / self.alpha)
        self.table = PairTable()
        self.decision: Decision | None = None
        self.decided_at: int | None = None
        # betting state
        self._log_k_hi = 0.0  # against d >= delta
        self._log_k_lo = 0.0  # against d <= -delta
        self._sum = 0.0
        self._sum_hi2 = 0.0
        self._sum_lo2 = 0.0

    # -- evidence -----------------------------------------------------------------------------
    @property
    def n(self) -> int:
        """Pairs seen."""
        return self.table.n

    def _log_mixture(self, w: int, lo: int) -> tuple[float, float]:
        """log of the ``q > 1/2`` and ``q < 1/2`` halves (each normalized to mean 1)."""
        up: list[float] = []
        down: list[float] = []
        for q in self.prior:
            a, b = math.log(2 * q), math.log(2 * (1 - q))
            up.append(w * a + lo * b)
            down.append(w * b + lo * a)
        return _logmeanexp(up), _logmeanexp(down)

    @property
    def log_e_difference(self) -> float:
        """log of the two-sided mixture e-value against "no difference" (``(E+ + E-)/2``)."""
        up, down = self._log_mixture(self.table.b_only, self.table.a_only)
        return _logmeanexp([up, down])

    def evidence(self) -> dict[str, Any]:
        """The current evidence, JSON-ready: counts, the e-values (as floats, capped at 1e300)
        and the thresholds."""
        t = self.table
        return {
            "pairs": t.n,
            "b_wins": t.b_only,
            "a_wins": t.a_only,
            "concordant": t.both + t.neither,
            "e_difference": _cap_exp(self.log_e_difference),
            "e_not_above_delta": _cap_exp(self._log_k_hi),
            "e_not_below_minus_delta": _cap_exp(self._log_k_lo),
            "threshold": 1.0 / self.alpha,
        }

    # -- update -------------------------------------------------------------------------------
    def _bet(self, t: int, sign: int) -> float:
        """aGRAPA bet against ``d >= delta`` (sign +1) or ``d <= -delta`` (sign -1), from the
        first ``t`` pairs only (predictable)."""
        delta = self.delta
        # shrunk running moments: one pseudo-observation at X = 0 with E[X^2] = 1/2
        mean = self._sum / (t + 1)
        if sign > 0:
            m2 = (self._sum_hi2 + 0.5 + delta * delta) / (t + 1)
            gap = delta - mean
        else:
            m2 = (self._sum_lo2 + 0.5 + delta * delta) / (t + 1)
            gap = mean + delta
        lam = gap / max(m2, 1e-9)
        cap = 0.5 / (1.0 + delta)
        return min(max(lam, 0.0), cap)

    def update(self, a_success: bool, b_success: bool) -> Decision | None:
        """Add one pair (A's and B's success on the same task and seed); return the decision,
        or None while undecided. Once decided, the same decision is returned."""
        t = self.table.n
        x = int(bool(b_success)) - int(bool(a_success))
        lam_hi, lam_lo = self._bet(t, +1), self._bet(t, -1)
        self._log_k_hi += math.log1p(-lam_hi * (x - self.delta))
        self._log_k_lo += math.log1p(lam_lo * (x + self.delta))
        self._sum += x
        self._sum_hi2 += (x - self.delta) ** 2
        self._sum_lo2 += (x + self.delta) ** 2
        tb = self.table
        self.table = PairTable(
            tb.both + (a_success and b_success),
            tb.a_only + (bool(a_success) and not b_success),
            tb.b_only + (bool(b_success) and not a_success),
            tb.neither + (not a_success and not b_success),
        )
        if self.decision is not None:
            return self.decision
        if self.log_e_difference >= self._threshold and self.table.b_only != self.table.a_only:
            self.decision = Decision.BETTER if self.table.b_only > self.table.a_only else Decision.WORSE
        elif self._log_k_hi >= self._threshold and self._log_k_lo >= self._threshold:
            self.decision = Decision.NO_DIFFERENCE
        if self.decision is not None:
            self.decided_at = self.table.n
        return self.decision

    def result(self, n_available: int | None = None) -> SequentialResult:
        """A :class:`SequentialResult` of the pairs seen so far (``n_available``: the budget,
        default the pairs seen, for :attr:`SequentialResult.saved`)."""
        n = self.table.n if n_available is None else int(n_available)
        return SequentialResult(
            decision=self.decision,
            decided_at=self.decided_at,
            n=n,
            saved=(n - self.decided_at) if self.decided_at is not None else 0,
            alpha=self.alpha,
            delta=self.delta,
            evidence=self.evidence(),
        )


def sequential_paired_test(
    pairs: Iterable[tuple[bool, bool]],
    *,
    alpha: float = 0.05,
    delta: float = DEFAULT_DELTA,
    prior: Sequence[float] = DEFAULT_PRIOR,
) -> SequentialResult:
    """Run :class:`SequentialPairedTest` over finished ``(a_success, b_success)`` pairs, in the
    order given, stopping at the first decision (what an early-stopped evaluation would have
    decided, and how many episodes it would have saved)."""
    test = SequentialPairedTest(alpha, delta, prior=prior)
    items = list(pairs)
    for sa, sb in items:
        if test.update(sa, sb) is not None:
            break
    return test.result(len(items))


def _logmeanexp(values: Sequence[float]) -> float:
    top = max(values)
    return top + math.log(math.fsum(math.exp(v - top) for v in values) / len(values))


def _cap_exp(log_value: float) -> float:
    return math.exp(min(log_value, 690.0))
