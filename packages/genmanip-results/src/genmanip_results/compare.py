"""Paired comparison of two recorded runs on shared (task, seed): the library of ``gmp compare``.

It lives here, on the results floor, because it only reads results trees (``discovery``) and
computes statistics (``stats``): genmanip-eval (floor 3) must be able to call it for
``gmp eval --compare-to RUN --stop-when-decided``, and the report (genmanip-artifacts) and the
browser (genmanip-viz) show the same numbers. Nothing here draws or serves anything.

A run is "A" (the baseline) and the other "B" (the candidate); every difference is ``B - A``.
Episodes are paired on ``(task_name, seed)`` among the *complete* episodes of both runs; an
episode only one run has is counted apart (``only_a`` / ``only_b``), never mixed into a paired
statistic. Per task and overall: both success rates over the pairs with Wilson 95% intervals,
the paired difference with Newcombe's interval, the exact McNemar p-value, the flipped seeds, the
mean partial-credit score difference with a paired t interval, per-task claims adjusted with
Holm's method (family-wise error over the tasks; Benjamini-Hochberg is given alongside), and the
sequential verdict of :class:`genmanip_results.stats.SequentialPairedTest` for the finished pair.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genmanip_protocol.errors import ExitCode

from .discovery import EpisodeInfo, RunInfo, find_runs, is_run_dir, load_run
from .errors import GenmanipResultsError
from .roots import search_roots
from .stats import (
    DEFAULT_DELTA,
    Decision,
    PairTable,
    SequentialPairedTest,
    bh_adjust,
    holm_adjust,
    pair_outcomes,
    paired_mean_difference,
    sequential_paired_test,
    wilson_interval,
)

__all__ = [
    "AmbiguousRun",
    "BaselineMonitor",
    "Outcome",
    "RunNotFound",
    "compare_runs",
    "comparison_table",
    "dumps",
    "load_outcomes",
    "outcomes_from_episodes",
    "resolve_run",
]

Key = tuple[str, str]


class RunNotFound(GenmanipResultsError):
    """``RUN`` names no run directory and no run id under the searched roots (or several:
    :class:`AmbiguousRun`)."""

    exit_code = ExitCode.INVALID_INPUT


class AmbiguousRun(RunNotFound):
    """``RUN`` is a run id several runs share; ``candidates`` are their ``<benchmark>/<run_id>``
    keys and ``paths`` their run directories, in the same order.

    A :class:`RunNotFound` (same exit code), so callers that only need "no single run" keep
    catching that.
    """

    def __init__(self, spec: str, runs: Sequence[RunInfo], *, hint: str | None = None) -> None:
        self.spec = spec
        self.candidates = [r.key for r in runs]
        self.paths = [Path(r.path) for r in runs]
        listing = "; ".join(f"{k} ({p})" for k, p in zip(self.candidates, self.paths, strict=True))
        if hint is None:
            # A key only helps when it is unique: two layouts of one benchmark share theirs.
            unique = [k for k in dict.fromkeys(self.candidates) if self.candidates.count(k) == 1]
            hint = ("give " + " or ".join(repr(k) for k in unique) + ", or the run directory"
                    if unique else "give the run directory")
        super().__init__(f"run id {spec!r} is ambiguous: {len(runs)} runs match: {listing}", hint=hint)


@dataclass(frozen=True)
class Outcome:
    """One complete episode: ``success`` (score == 1), ``score`` in [0, 1] (None when the result
    had none), ``finished`` (epoch seconds: ``result.json``'s ``finished``, else the file mtime),
    ``path`` (the episode directory, None for an episode given as a dict)."""

    success: bool
    score: float | None
    finished: float
    path: Path | None = None


def _finished(ep: EpisodeInfo) -> float:
    value = (ep.result or {}).get("finished") if isinstance(ep.result, Mapping) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return float(ep.mtime)


def load_outcomes(run: RunInfo | str | os.PathLike[str]) -> dict[Key, Outcome]:
    """Per-(task, seed) outcomes of a run's complete episodes (a :class:`RunInfo` or a run dir).

    The keys are ``(task_name, seed)`` with the seed as the string of the tree (``"003"``); the
    order is the task then seed order of :meth:`RunInfo.tasks`.
    """
    info = run if isinstance(run, RunInfo) else load_run(run)
    out: dict[Key, Outcome] = {}
    for task, eps in info.tasks().items():
        for ep in eps:
            if ep.complete and ep.success is not None:
                score = ep.score if ep.score is not None and math.isfinite(ep.score) else None
                out[(task, str(ep.seed))] = Outcome(bool(ep.success), score, _finished(ep), ep.path)
    return out


def resolve_run(
    spec: str, root: str | os.PathLike[str] | None = None, *, benchmark_id: str | None = None
) -> RunInfo:
    """A run from ``RUN`` as the readers take it: a run directory, else a run id
    (``<run_id>`` or ``<benchmark>/<run_id>``) under :func:`genmanip_results.roots.search_roots`.

    ``benchmark_id`` keeps the runs of that benchmark only (a caller that knows it: a run id
    is unique within a benchmark, not across them); a run directory is taken as given.

    Raises:
        AmbiguousRun: a run id several runs share (their ``<benchmark>/<run_id>`` keys listed).
        RunNotFound: no such run (under ``benchmark_id``, when given).
    """
    p = Path(spec)
    if p.is_dir() and is_run_dir(p):
        return load_run(p)
    roots = search_roots(root)
    seen: set[Path] = set()
    matches: list[RunInfo] = []
    names: set[str] = set()
    for r in roots:
        if not Path(r).is_dir():
            continue
        for info in find_runs(r):
            key = Path(info.path).resolve()
            if key in seen:
                continue
            seen.add(key)
            names.add(info.key)
            if spec in (info.run_id, info.key) and benchmark_id in (None, info.benchmark):
                matches.append(info)
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise AmbiguousRun(spec, matches)
    where = ", ".join(str(r) for r in roots)
    under = f" of benchmark {benchmark_id!r}" if benchmark_id is not None else ""
    known = sorted(names)
    listing = ", ".join(known[:15]) + (" ..." if len(known) > 15 else "") if known else "none"
    raise RunNotFound(
        f"no run {spec!r}{under} (not a run directory, not a run id under {where}); runs found: {listing}",
        hint="give a run directory or one of the <benchmark>/<run_id> found, or --root the "
        "directory holding the results",
    )


def _rate(k: int, n: int) -> dict[str, Any]:
    lo, hi = wilson_interval(k, n)
    return {"successes": k, "n": n, "rate": (k / n) if n else None, "ci95": [lo, hi]}


def _group(
    pairs: Sequence[tuple[Key, Outcome, Outcome]], only_a: int, only_b: int
) -> dict[str, Any]:
    table = PairTable.from_pairs((a.success, b.success) for _, a, b in pairs)
    scored = [(a.score, b.score) for _, a, b in pairs if a.score is not None and b.score is not None]
    md = paired_mean_difference([s for s, _ in scored], [s for _, s in scored])
    lo, hi = table.interval()
    return {
        "pairs": table.n,
        "only_a": only_a,
        "only_b": only_b,
        "a": _rate(table.both + table.a_only, table.n),
        "b": _rate(table.both + table.b_only, table.n),
        "table": {"both": table.both, "a_only": table.a_only, "b_only": table.b_only,
                  "neither": table.neither},
        "difference": table.difference,
        "difference_ci95": [lo, hi],
        "difference_method": "Newcombe (1998) method 10",
        "mcnemar_p": table.mcnemar_p(),
        "flipped": [
            {"task": k[0], "seed": k[1], "a": a.success, "b": b.success}
            for k, a, b in pairs
            if a.success != b.success
        ],
        "score": {
            "pairs": md.n,
            "mean_a": (math.fsum(s for s, _ in scored) / md.n) if md.n else None,
            "mean_b": (math.fsum(s for _, s in scored) / md.n) if md.n else None,
            "difference": md.mean,
            "difference_ci95": list(md.interval) if md.interval else None,
            "method": md.method,
        },
    }


def _claim(diff: float | None, p_adj: float, alpha: float) -> str | None:
    if diff is None or p_adj > alpha or diff == 0:
        return None
    return "better" if diff > 0 else "worse"


def compare_runs(
    run_a: RunInfo | Mapping[Key, Outcome],
    run_b: RunInfo | Mapping[Key, Outcome],
    *,
    alpha: float = 0.05,
    delta: float = DEFAULT_DELTA,
) -> dict[str, Any]:
    """The paired comparison of B against A (JSON-ready dict; the schema of ``gmp compare --json``).

    Keys: ``a`` / ``b`` (run names and paths), ``alpha``, ``delta``, ``overall`` and ``tasks``
    (a list; each entry as ``overall`` plus ``task``, ``p_holm``, ``p_bh`` and ``claim``:
    ``"better"``/``"worse"`` when the Holm-adjusted McNemar p is ``<= alpha``, else None),
    ``multiplicity`` (the method), ``sequential`` (:meth:`SequentialResult.to_json` over the
    pairs in B's finishing order). Rates are fractions; differences are B - A.
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be within (0, 1), got {alpha}")

    def outcomes(run: RunInfo | Mapping[Key, Outcome]) -> tuple[dict[Key, Outcome], dict[str, Any]]:
        if isinstance(run, RunInfo):
            return load_outcomes(run), {"run": run.key, "path": str(run.path)}
        return dict(run), {"run": None, "path": None}

    oa, meta_a = outcomes(run_a)
    ob, meta_b = outcomes(run_b)
    pairing = pair_outcomes(oa, ob)
    tasks = sorted({k[0] for k in oa} | {k[0] for k in ob})
    per_task: list[dict[str, Any]] = []
    for task in tasks:
        pt = [p for p in pairing.pairs if p[0][0] == task]
        entry = {"task": task, **_group(
            pt,
            sum(1 for k in pairing.only_a if k[0] == task),
            sum(1 for k in pairing.only_b if k[0] == task),
        )}
        per_task.append(entry)
    pvals = [t["mcnemar_p"] for t in per_task]
    for t, ph, pb in zip(per_task, holm_adjust(pvals), bh_adjust(pvals), strict=True):
        t["p_holm"] = ph
        t["p_bh"] = pb
        t["claim"] = _claim(t["difference"], ph, alpha)
    overall = _group(pairing.pairs, len(pairing.only_a), len(pairing.only_b))
    overall["claim"] = _claim(overall["difference"], overall["mcnemar_p"], alpha)
    ordered = sorted(pairing.pairs, key=lambda p: (p[2].finished, p[0]))
    seq = sequential_paired_test(((a.success, b.success) for _, a, b in ordered),
                                 alpha=alpha, delta=delta)
    return {
        "a": meta_a,
        "b": meta_b,
        "alpha": alpha,
        "delta": delta,
        "overall": overall,
        "tasks": per_task,
        "multiplicity": "Holm (family-wise error over the tasks; p_bh: Benjamini-Hochberg)",
        "sequential": {**seq.to_json(), "order": "B's finishing order"},
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _ci(ci: Sequence[float] | None, signed: bool = False) -> str:
    if ci is None:
        return "-"
    fmt = "{:+.1f}" if signed else "{:.1f}"
    return "[" + fmt.format(100 * ci[0]) + ", " + fmt.format(100 * ci[1]) + "]"


def _pvalue(p: float) -> str:
    return f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def comparison_table(result: Mapping[str, Any]) -> str:
    """The plain-text rendering of :func:`compare_runs` (no ANSI codes: the same on a TTY, in a
    pipe and under ``NO_COLOR``). Percentages are points; differences are B - A."""
    from genmanip_runtime.console import table
    from genmanip_runtime.text import safe_text

    headers = ["task", "pairs", "A SR [95% CI]", "B SR [95% CI]", "B-A pp [95% CI]", "McNemar p",
               "Holm p", "claim", "score B-A [95% CI]", "unpaired A/B"]

    def row(name: str, g: Mapping[str, Any], p_holm: float | None) -> list[Any]:
        diff = g["difference"]
        sd = g["score"]
        return [
            name,
            g["pairs"],
            f"{_pct(g['a']['rate'])} {_ci(g['a']['ci95'])}",
            f"{_pct(g['b']['rate'])} {_ci(g['b']['ci95'])}",
            "-" if diff is None else f"{100 * diff:+.1f} {_ci(g['difference_ci95'], True)}",
            _pvalue(g["mcnemar_p"]),
            "-" if p_holm is None else _pvalue(p_holm),
            g.get("claim") or "-",
            "-" if sd["difference"] is None else f"{sd['difference']:+.3f} "
            + ("-" if sd["difference_ci95"] is None else
               f"[{sd['difference_ci95'][0]:+.3f}, {sd['difference_ci95'][1]:+.3f}]"),
            f"{g['only_a']}/{g['only_b']}",
        ]

    rows = [row(t["task"], t, t["p_holm"]) for t in result["tasks"]]
    rows.append(row("overall", result["overall"], None))
    a = result["a"].get("run") or "A"
    b = result["b"].get("run") or "B"
    seq = result["sequential"]
    lines = [
        f"A = {safe_text(a)}",
        f"B = {safe_text(b)}",
        "",
        table(rows, headers).rstrip("\n"),
        "",
        f"per-task claims: Holm-adjusted exact McNemar p <= {result['alpha']:g}; "
        "difference interval: Newcombe (1998) method 10; score: paired t",
    ]
    flipped = result["overall"]["flipped"]
    lines.append(f"flipped seeds ({len(flipped)}):" + ("" if flipped else " none"))
    for f in flipped:
        lines.append(f"  {safe_text(f['task'])} seed {safe_text(f['seed'])}: A {'success' if f['a'] else 'failure'}"
                     f" -> B {'success' if f['b'] else 'failure'}")
    ev = seq["evidence"]
    verdict = seq["description"]
    at = f" after {seq['decided_at']} of {seq['n']} pairs ({seq['saved']} episodes saved)" \
        if seq["decided_at"] is not None else f" after all {seq['n']} pairs"
    lines.append(
        f"sequential verdict (alpha {seq['alpha']:g}, delta {100 * seq['delta']:g} pp): {verdict}{at}; "
        f"e-value {ev['e_difference']:.3g} (threshold {ev['threshold']:g})"
    )
    return "\n".join(lines) + "\n"


class BaselineMonitor:
    """The sequential test of a new run against a recorded baseline, fed one episode at a time
    (what ``gmp eval --compare-to RUN --stop-when-decided`` calls).

    Example::

        monitor = BaselineMonitor(load_outcomes(load_run(run_dir)), alpha=0.05, delta=0.1)
        for episode in finished_episodes:   # {"task_name", "seed", "success", "score", ...}
            decision = monitor.add(episode)
            if decision is not None:
                break                        # record monitor.summary() in run.json

    Episodes the baseline lacks are counted in ``unpaired`` and do not move the test.
    """

    def __init__(
        self, baseline: Mapping[Key, Outcome], *, alpha: float = 0.05, delta: float = DEFAULT_DELTA
    ) -> None:
        self.baseline = dict(baseline)
        self.test = SequentialPairedTest(alpha, delta)
        self.unpaired = 0
        self._seen: set[Key] = set()

    def add(self, episode: Mapping[str, Any]) -> Decision | None:
        """Add a finished episode of the new run; returns the decision once there is one."""
        key = (str(episode["task_name"]), str(episode["seed"]))
        base = self.baseline.get(key)
        if base is None or key in self._seen:
            self.unpaired += base is None
            return self.test.decision
        self._seen.add(key)
        return self.test.update(base.success, bool(episode["success"]))

    @property
    def remaining(self) -> int:
        """Baseline pairs not seen yet (the episodes a stop now saves)."""
        return len(self.baseline) - len(self._seen)

    def summary(self) -> dict[str, Any]:
        """JSON-ready record: the decision, the evidence, pairs seen, episodes saved."""
        res = self.test.result(len(self.baseline))
        out = res.to_json()
        out["saved"] = self.remaining if res.decision is not None else 0
        out["unpaired"] = self.unpaired
        return out


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(type(value).__name__)


def dumps(result: Mapping[str, Any]) -> str:
    """``result`` as the JSON text of ``gmp compare --json`` (ASCII, sorted keys)."""
    return json.dumps(result, indent=2, sort_keys=True, default=_json_default)


def outcomes_from_episodes(episodes: Iterable[Mapping[str, Any]]) -> dict[Key, Outcome]:
    """Outcomes from episode dicts ``{task_name, seed, success, score[, finished]}`` (the eval
    runner's summary rows), keyed like :func:`load_outcomes`."""
    out: dict[Key, Outcome] = {}
    for i, ep in enumerate(episodes):
        score = ep.get("score")
        out[(str(ep["task_name"]), str(ep["seed"]))] = Outcome(
            bool(ep["success"]),
            float(score) if isinstance(score, (int, float)) and math.isfinite(score) else None,
            float(ep.get("finished", i)),
        )
    return out


