"""Server-rendered HTML of the results browser.

Every value that comes from disk (task names, run ids, instructions, worker ids, file names, ...)
goes through :func:`esc` (``html.escape`` with quotes) before it reaches the page; URLs are built
from opaque run keys, percent-encoded episode addresses and file names that passed
:func:`genmanip_results.paths.safe_component`. Pages load one local stylesheet and one local script
(``/static/app.css``, ``/static/app.js``): no inline script, no CDN.

Every element that shows a run's changing numbers carries ``data-run="<key>"`` and its fields
``data-field="state|done|sr|mean"``; :func:`run_status` is the same numbers as JSON (with their
display text, formatted here once), which app.js fetches from ``/api/...`` to keep a page of a live
run current.
"""

from __future__ import annotations

import datetime as _dt
import html
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple
from urllib.parse import quote

from genmanip_results.discovery import EpisodeInfo, policy_label, run_policy
from genmanip_results.layout import (
    ACTION_PLOT,
    MERGED_VIDEO,
    PLOT_IMAGES,
    STATE_PLOT,
    STEPS_JSONL,
    VIDEO_SUFFIX,
)

from .index import Comparison, GroupStats, LiveWorker, RunView, Snapshot, group_stats

__all__ = [
    "EpisodeFile",
    "episode_page",
    "error_page",
    "esc",
    "files_page",
    "live_page",
    "run_page",
    "run_status",
    "runs_page",
    "scanning_page",
]


_DASH = "\u2013"  # shown for missing values


def esc(value: object) -> str:
    """HTML-escape ``str(value)`` for text and double-quoted attribute positions."""
    return html.escape("" if value is None else str(value), quote=True)


def _url_rel(rel: str) -> str:
    return quote(rel, safe="/")


def episode_url(view: RunView, rel: str) -> str:
    """URL of an episode page (``rel`` = ``<task>/<seed>``)."""
    return f"/episode/{view.key}/{_url_rel(rel)}"


def file_url(view: RunView, rel: str, name: str) -> str:
    """URL of one file of an episode's directory (``name`` passed ``safe_component``)."""
    return f"/file/{view.key}/{quote(name, safe='')}/{_url_rel(rel)}"


class EpisodeFile(NamedTuple):
    """A regular file of an episode's directory that the pages may link (the server lists them:
    names that pass ``safe_component``, nothing hidden, nothing resolving out of the directory)."""

    name: str
    size: int
    mtime: float


def _pct(x: float | None) -> str:
    return _DASH if x is None else f"{100.0 * x:.1f}%"


def _diff_ci(ci: tuple[float, float]) -> str:
    return f"[{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}] pp"


#: How every comparison names its difference: which run is subtracted from which.
_DELTA_LABEL = "Δ success (B &minus; A)"


def _num(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return _DASH
    return f"{x:.{digits}f}"


def _when(ts: float | None) -> str:
    if not ts:
        return _DASH
    return _dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


def _ci_text(st: GroupStats) -> str:
    return "" if st.sr is None else f"[{_pct(st.ci[0])}, {_pct(st.ci[1])}]"


def _sr_cell(st: GroupStats, *, field: bool = False) -> str:
    attr = ' data-field="sr"' if field else ""
    return (
        f'<td class="num" data-v="{-1 if st.sr is None else st.sr:.6f}"{attr}><b>{_pct(st.sr)}</b>'
        f' <span class="ci">{_ci_text(st)}</span></td>'
    )


#: What each run state means, for the badge's tooltip (the rules: RunInfo.state).
_STATE_HELP = {
    "live": "live: its gmp eval is running",
    "interrupted": "interrupted: its gmp eval stopped (killed, crashed or Ctrl-C) before the run finished",
    "complete": "complete: every episode the server had was run",
    "stopped": "stopped early on purpose (--max-episodes, --stop-when-decided)",
    "failed": "failed: its gmp eval ended with an error",
    "finished": "finished",
}


def _state_class(state: str | None) -> str:
    return "live" if state == "live" else f"state {state or 'none'}"


def _state_text(state: str | None) -> str:
    # The normal end needs no badge; every other state says itself.
    return "" if state in (None, "complete", "finished") else state


def _state_title(view: RunView) -> str:
    tip, detail = _STATE_HELP.get(view.state or "", ""), view.info.state_detail
    return f"{tip} ({detail})" if tip and detail else tip or detail


def _state_badge(view: RunView) -> str:
    state = view.state
    return (
        f'<span class="{_state_class(state)}" data-field="state" data-state="{esc(state or "")}"'
        f' title="{esc(_state_title(view))}">{esc(_state_text(state))}</span>'
    )


def _done_text(view: RunView, st: GroupStats) -> str:
    total = view.info.total_episodes
    return f"{st.n}" + (f" / {total}" if total else "")


def run_status(view: RunView) -> dict[str, Any]:
    """The run's state and numbers as JSON (``/api/runs``, ``/api/run/<key>``), with the text the
    pages show for them under ``display`` (app.js puts it in place, formatted only here)."""
    info = view.info
    st = view.stats or group_stats(info.episodes)
    return {
        "key": view.key,
        "benchmark": info.benchmark,
        "run_id": info.run_id,
        "layout": info.layout,
        "state": view.state,
        "state_detail": info.state_detail,
        "live": view.live,
        "done": st.n,
        "total": info.total_episodes,
        "successes": st.successes,
        "sr": st.sr,
        "sr_ci95": list(st.ci) if st.sr is not None else None,
        "mean_score": st.mean_score,
        "updated": info.updated,
        "display": {
            "state": _state_text(view.state),
            "state_class": _state_class(view.state),
            "state_title": _state_title(view),
            "done": _done_text(view, st),
            "sr": _pct(st.sr),
            "ci": _ci_text(st),
            "mean": _num(st.mean_score),
        },
    }


def _layout(title: str, body: str, *, crumbs: Sequence[tuple[str, str | None]] = ()) -> str:
    nav = " / ".join(
        f'<a href="{esc(href)}">{esc(label)}</a>' if href else f"<span>{esc(label)}</span>"
        for label, href in crumbs
    )
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · gmp viz</title>"
        '<link rel="stylesheet" href="/static/app.css">'
        '<script src="/static/app.js" defer></script></head><body>'
        f'<header><a class="brand" href="/">gmp viz</a><nav>{nav}</nav></header>'
        f"<main>{body}</main></body></html>\n"
    )


def scanning_page() -> str:
    """Shown while the first scan of a large root is still running (reloads itself)."""
    return _layout(
        "scanning",
        '<p class="muted" data-reload="1000">Scanning the results root… this page reloads.</p>',
    )


def error_page(status: int, message: str) -> str:
    """A small error page; ``message`` is escaped."""
    return _layout(f"{status}", f'<h1>{status}</h1><p class="error">{esc(message)}</p>')


def runs_page(snap: Snapshot, root_label: str) -> str:
    """The runs table: one sortable row per run, newest first, live runs marked."""
    rows = []
    for v in snap.runs:
        info = v.info
        st = v.stats or group_stats(info.episodes)
        workers = ""
        if v.live:
            ids = sorted(
                {
                    str(lk.worker_id)
                    for lk in info.locks
                    if not lk.stale and lk.worker_id is not None
                }
            )
            workers = (
                f' <span class="muted">workers {esc(", ".join(ids))}</span>' if ids else ""
            ) + (f' <a href="/live/{v.key}">watch</a>' if v.workers else "")
        rows.append(
            f'<tr data-run="{v.key}">'
            f'<td data-v="{esc(info.benchmark)}">{esc(info.benchmark)}</td>'
            f'<td data-v="{esc(info.run_id)}"><a href="/run/{v.key}">{esc(info.run_id)}</a> '
            f"{_state_badge(v)}{workers}</td>"
            f'<td data-v="{esc(info.layout)}" class="muted">{esc(info.layout)}</td>'
            f'<td data-v="{esc(policy_label(run_policy(info)))}">{esc(policy_label(run_policy(info)))}</td>'
            f'<td data-v="{info.created or 0:.3f}">{esc(_when(info.created))}</td>'
            f'<td class="num" data-v="{st.n}" data-field="done">{esc(_done_text(v, st))}</td>'
            f"{_sr_cell(st, field=True)}"
            f'<td class="num" data-v="{-1 if st.mean_score is None else st.mean_score:.6f}"'
            f' data-field="mean">{_num(st.mean_score)}</td>'
            "</tr>"
        )
    if not rows:
        body = (
            f'<h1>Runs</h1><p class="muted">No runs found under <code>{esc(root_label)}</code>. '
            "Run <code>gmp demo</code> or <code>gmp eval</code> first, or pass <code>--root</code>.</p>"
        )
    else:
        body = (
            f'<h1>Runs <span class="muted small">{len(rows)} under <code>{esc(root_label)}</code></span></h1>'
            '<table class="sortable" id="runs" data-api="/api/runs"><thead><tr>'
            "<th>benchmark</th><th>run</th><th>layout</th><th>policy</th><th>created</th>"
            '<th class="num">episodes</th><th class="num">success rate [95% CI]</th>'
            '<th class="num">mean score</th></tr></thead><tbody>'
            + "".join(rows)
            + "</tbody></table>"
        )
    return _layout("Runs", body, crumbs=[("runs", None)])


def _dot(view: RunView, ep: EpisodeInfo) -> str:
    rel = f"{ep.task_name}/{ep.seed}"
    if not ep.complete:
        cls, label = "dot pending", "running / incomplete"
    else:
        s = ep.score if ep.score is not None else (1.0 if ep.success else 0.0)
        s = min(1.0, max(0.0, float(s))) if math.isfinite(float(s)) else 0.0
        # Ten score bands coloured by the stylesheet (the CSP allows no inline styles).
        band = round(10 * s)
        cls = f"dot s{band} " + ("ok" if ep.success else "fail")
        label = f"score {_num(ep.score)}" + (" (success)" if ep.success else "")
    return (
        f'<a class="{cls}" href="{esc(episode_url(view, rel))}" '
        f'title="seed {esc(ep.seed)}: {esc(label)}"></a>'
    )


def _suite(task: str) -> str:
    return task.rsplit("/", 1)[0] if "/" in task else "(no suite)"


#: What the episode dots mean (the classes :func:`_dot` gives them), shown above the tables.
_DOT_LEGEND = (
    '<p class="legend" id="dot-legend">one dot per episode (click: open it):'
    ' <span class="swatch dot s10 ok"></span> success'
    ' <span class="swatch dot s5 fail"></span> partial score, failure'
    ' <span class="swatch dot s0 fail"></span> failure, score 0'
    ' <span class="swatch dot pending"></span> running or incomplete'
    ' · colour: score <span class="scale">'
    + "".join(f'<span class="swatch dot s{i}"></span>' for i in range(11))
    + "</span> 0 → 1; a ring marks a success</p>"
)


def run_page(
    view: RunView,
    *,
    failures_only: bool,
    others: Iterable[RunView],
    comparison: tuple[RunView, Comparison] | None,
    workers: Sequence[LiveWorker],
) -> str:
    """One run: header stats, per suite and per task tables with episode dots, compare, live."""
    info = view.info
    st = view.stats or group_stats(info.episodes)
    tasks: dict[str, list[EpisodeInfo]] = {}
    for rel in view.order:
        ep = view.episodes[rel]
        tasks.setdefault(ep.task_name, []).append(ep)
    suites: dict[str, list[str]] = {}
    for task in tasks:
        suites.setdefault(_suite(task), []).append(task)

    detail = (
        f'<p class="muted small" data-field="detail">{esc(info.state_detail)}</p>'
        if view.state not in (None, "complete", "finished") and info.state_detail
        else ""
    )
    head = (
        f'<div class="runhead" data-run="{view.key}" data-api="/api/run/{view.key}">'
        f"<h1>{esc(info.benchmark)} / {esc(info.run_id)} {_state_badge(view)}</h1>{detail}"
        f'<p class="summary">complete episodes <b data-field="done">{esc(_done_text(view, st))}</b>'
        f' · success rate <span data-field="sr"><b>{_pct(st.sr)}</b> <span class="ci">'
        f"{_ci_text(st)}</span></span>"
        f' · mean score <span data-field="mean">{_num(st.mean_score)}</span>'
        f" · policy <code>{esc(policy_label(run_policy(info)))}</code>"
        f" · layout {esc(info.layout)} · created {esc(_when(info.created))}"
        ' <a href="" data-field="reload" hidden>new results since this page was loaded: reload</a>'
        "</p></div>"
    )
    toggle_href = f"/run/{view.key}" + ("" if failures_only else "?failures=1")
    toggle = (
        f'<p><a class="button" href="{esc(toggle_href)}">'
        + ("show all episodes" if failures_only else "show failures only")
        + "</a></p>"
    )
    parts = [head, toggle, _DOT_LEGEND]

    if workers:
        items = "".join(
            f'<li><a href="/live/{view.key}?worker={esc(quote(w.worker_id))}">worker {esc(w.worker_id)}</a>'
            f' <span class="muted">step {esc(w.state.get("step", "?"))}'
            + (" · fresh" if w.fresh else " · stale")
            + "</span></li>"
            for w in workers
        )
        parts.append(f"<h2>Live workers</h2><ul>{items}</ul>")

    for suite in sorted(suites):
        suite_eps = [e for t in suites[suite] for e in tasks[t]]
        sst = group_stats(suite_eps)
        rows = []
        for task in sorted(suites[suite]):
            eps = tasks[task]
            tst = group_stats(eps)
            shown = [e for e in eps if not failures_only or (e.complete and not e.success)]
            if failures_only and not shown:
                continue
            dots = "".join(_dot(view, e) for e in shown)
            rows.append(
                f'<tr><td data-v="{esc(task)}">{esc(task)}</td>'
                f'<td class="num" data-v="{tst.n}">{tst.n}</td>{_sr_cell(tst)}'
                f'<td class="num" data-v="{-1 if tst.mean_score is None else tst.mean_score:.6f}">{_num(tst.mean_score)}</td>'
                f'<td class="dots">{dots}</td></tr>'
            )
        if not rows:
            continue
        parts.append(
            f'<h2>{esc(suite)} <span class="muted small">n {sst.n} · SR {_pct(sst.sr)} '
            f"[{_pct(sst.ci[0])}, {_pct(sst.ci[1])}] · mean {_num(sst.mean_score)}</span></h2>"
            '<table class="sortable"><thead><tr><th>task</th><th class="num">n</th>'
            '<th class="num">success rate [95% CI]</th><th class="num">mean score</th>'
            "<th>episodes</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
        )
    if len(parts) == 3 and failures_only:
        parts.append('<p class="muted">No failed episodes.</p>')

    opts = "".join(
        f'<option value="{o.key}"'
        + (" selected" if comparison and comparison[0].key == o.key else "")
        + f">{esc(o.info.benchmark)} / {esc(o.info.run_id)}</option>"
        for o in others
        if o.key != view.key
    )
    parts.append(
        '<h2>Compare</h2><form method="get" action="/run/' + view.key + '" class="compare">'
        '<label>with run <select name="compare"><option value="">—</option>'
        + opts
        + "</select></label> "
        '<button type="submit">compare on shared seeds</button></form>'
    )
    if comparison is not None:
        other, cmp = comparison
        cmp_rows = "".join(
            f'<tr><td data-v="{esc(t)}">{esc(t)}</td><td class="num" data-v="{n}">{n}</td>'
            f'<td class="num" data-v="{a:.6f}">{_pct(a)}</td><td class="num" data-v="{b:.6f}">{_pct(b)}</td>'
            f'<td class="num {"pos" if d > 0 else "neg" if d < 0 else ""}" data-v="{d:.6f}">{100 * d:+.1f} pp</td>'
            f"<td class=\"num\">{_diff_ci(cmp.tables[t].interval())}</td>"
            f'<td class="num" data-v="{cmp.tables[t].mcnemar_p():.6f}">{cmp.tables[t].mcnemar_p():.3g}</td>'
            f'<td class="num" data-v="{cmp.p_holm[t]:.6f}">{cmp.p_holm[t]:.3g}</td></tr>'
            for t, n, a, b, d in cmp.tasks
        )
        flips = "".join(
            f'<li><a href="{esc(episode_url(view, f"{t}/{s}"))}">{esc(t)} seed {esc(s)}</a>: '
            f"A {'success' if sa else 'failure'} → "
            f'<a href="{esc(episode_url(other, f"{t}/{s}"))}">B {"success" if sb else "failure"}</a></li>'
            for t, s, sa, sb in cmp.flipped
        )
        diff = cmp.overall.difference
        parts.append(
            f'<p class="summary" id="compare-summary">A = this run ({esc(view.info.run_id)}), B = '
            f"{esc(other.info.run_id)}: {cmp.shared} shared episodes, paired on (task, seed) · "
            f"success A {_pct(cmp.sr_a)} · B {_pct(cmp.sr_b)} · "
            f'<b id="compare-delta">{_DELTA_LABEL}: '
            f"{_DASH if diff is None else f'{100 * diff:+.1f} pp'}</b> "
            f"{_diff_ci(cmp.overall.interval())} (Newcombe 95%; positive: B succeeds more often) · "
            f"exact McNemar p {cmp.overall.mcnemar_p():.3g}; per task: Holm-adjusted p "
            "(as gmp compare)</p>"
            '<table class="sortable" id="compare"><thead><tr><th>task</th><th class="num">shared</th>'
            f'<th class="num">A: this run</th><th class="num">B: {esc(other.info.run_id)}</th>'
            f'<th class="num">{_DELTA_LABEL}</th><th class="num">95% CI of Δ</th>'
            '<th class="num">McNemar p</th>'
            '<th class="num">Holm p</th></tr></thead><tbody>' + cmp_rows + "</tbody></table>"
            f'<h3>Flipped seeds ({len(cmp.flipped)})</h3><ul class="flips">{flips}</ul>'
        )
    return _layout(
        f"{info.benchmark}/{info.run_id}",
        "".join(parts),
        crumbs=[("runs", "/"), (f"{info.benchmark}/{info.run_id}", None)],
    )


def _frame_player(view: RunView, rel: str, frame_counts: Mapping[str, int]) -> str:
    """The JPEG frame player: one ``<img>`` per camera fed by ``/frame/...`` by index, a slider,
    play/pause and a state plot with a cursor at the shown frame (app.js); empty without frames."""
    if not frame_counts:
        return ""
    n = min(frame_counts.values())
    tail = _url_rel(rel)
    imgs = "".join(
        f'<figure><img class="framecam" alt="{esc(c)}" '
        f'data-base="/frame/{esc(view.key)}/{esc(quote(c, safe=""))}/" data-tail="/{esc(tail)}">'
        f"<figcaption>{esc(c)}</figcaption></figure>"
        for c in sorted(frame_counts)
    )
    return (
        f'<div id="player" data-n="{n}" data-timeline="/timeline/{esc(view.key)}/{esc(tail)}">'
        f'<div class="cams">{imgs}</div>'
        '<p class="controls"><button type="button" id="play" class="button">play</button> '
        f'<input type="range" id="scrub" min="0" max="{max(0, n - 1)}" value="0" step="1"> '
        f'frame <b id="frame-no">0</b> / {n} · step <b id="frame-step">{_DASH}</b></p>'
        '<canvas id="plot" width="960" height="160"></canvas></div>'
    )


_PLOT_LABELS = {STATE_PLOT: "state plot", ACTION_PLOT: "action plot"}


def _files_section(view: RunView, rel: str, ep: EpisodeInfo, files: Sequence[EpisodeFile]) -> str:
    """Links to the episode's plots, videos, ``steps.jsonl`` and directory: only files it has."""
    names = {f.name for f in files}
    items = []
    plots = [
        f'<a href="{esc(file_url(view, rel, n))}">{esc(_PLOT_LABELS[n])}</a>'
        for n in PLOT_IMAGES
        if n in names
    ]
    if plots:
        items.append("plots " + " · ".join(plots))
    videos = sorted(n for n in names if n.endswith(VIDEO_SUFFIX) and n != MERGED_VIDEO)
    links = [f'<a href="{esc(file_url(view, rel, n))}">{esc(n)}</a>' for n in videos]
    if MERGED_VIDEO in names:
        links.append(
            f'<a href="{esc(file_url(view, rel, MERGED_VIDEO))}">{esc(MERGED_VIDEO)}</a>'
            ' <span class="muted">(cameras over the plots)</span>'
        )
    if links:
        items.append("videos " + " · ".join(links))
    if STEPS_JSONL in names:
        items.append(f'steps <a href="{esc(file_url(view, rel, STEPS_JSONL))}">{esc(STEPS_JSONL)}</a>')
    items.append(
        f'<a href="/files/{view.key}/{esc(_url_rel(rel))}">episode directory</a>'
        f" <code>{esc(ep.path)}</code>"
    )
    return '<p class="files" id="files">' + " · ".join(items) + "</p>"


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    return f"{n / 1024:.1f} KiB" if n < 1024 * 1024 else f"{n / (1024 * 1024):.1f} MiB"


def files_page(view: RunView, rel: str, ep: EpisodeInfo, files: Sequence[EpisodeFile]) -> str:
    """The files of one episode's directory (the ones :class:`EpisodeFile` admits), linked."""
    rows = "".join(
        f'<tr><td data-v="{esc(f.name)}"><a href="{esc(file_url(view, rel, f.name))}">{esc(f.name)}</a></td>'
        f'<td class="num" data-v="{f.size}">{esc(_size(f.size))}</td>'
        f'<td data-v="{f.mtime:.3f}">{esc(_when(f.mtime))}</td></tr>'
        for f in files
    )
    body = (
        f"<h1>{esc(ep.task_name)} <span class=\"muted\">seed {esc(ep.seed)}</span>: files</h1>"
        f"<p>directory <code>{esc(ep.path)}</code> · "
        f'<a href="{esc(episode_url(view, rel))}">back to the episode</a></p>'
        + (
            '<table class="sortable" id="files"><thead><tr><th>file</th><th class="num">size</th>'
            f"<th>modified</th></tr></thead><tbody>{rows}</tbody></table>"
            if rows
            else '<p class="muted">No files to show.</p>'
        )
        + '<p class="muted small">Hidden files (caches, spools, recovery notes) are not listed.</p>'
    )
    return _layout(
        f"{ep.task_name} {ep.seed} files",
        body,
        crumbs=_episode_crumbs(view, ep, (episode_url(view, rel), "files")),
    )


def _episode_crumbs(view: RunView, ep: EpisodeInfo,
                    below: tuple[str, str] | None = None) -> list[tuple[str, str | None]]:
    """runs / run / episode (linked when ``below`` = (the episode's URL, the page under it))."""
    run = (f"{view.info.benchmark}/{view.info.run_id}", f"/run/{view.key}")
    episode = f"{ep.task_name}/{ep.seed}"
    if below is None:
        return [("runs", "/"), run, (episode, None)]
    return [("runs", "/"), run, (episode, below[0]), (below[1], None)]


def episode_page(
    view: RunView,
    rel: str,
    ep: EpisodeInfo,
    *,
    instruction: str,
    frame_counts: Mapping[str, int] | None = None,
    files: Sequence[EpisodeFile] = (),
) -> str:
    """One episode: metrics, previous/next links, links to its files (``files``: its directory's
    listing, see :func:`_files_section`), the JPEG frame player (``frame_counts``: the frames of
    each camera with a frame store) and the Rerun viewer (iframe) on its recording."""
    prev_rel, next_rel = view.neighbours(rel)
    links = []
    if prev_rel:
        links.append(
            f'<a class="button" href="{esc(episode_url(view, prev_rel))}" id="prev">← previous</a>'
        )
    if next_rel:
        links.append(
            f'<a class="button" href="{esc(episode_url(view, next_rel))}" id="next">next →</a>'
        )
    outcome = "incomplete" if not ep.complete else ("success" if ep.success else "failure")
    rrd_url = f"/rrd/{view.key}/{_url_rel(rel)}/recording.rrd"
    body = (
        f'<div class="ephead"><div><h1>{esc(ep.task_name)} <span class="muted">seed {esc(ep.seed)}</span></h1>'
        f'<p class="instruction">{esc(instruction) or "<span class=muted>(no instruction recorded)</span>"}</p>'
        f'<p class="summary"><span class="badge {esc(outcome)}">{esc(outcome)}</span> score {_num(ep.score)}'
        f" · steps {esc(ep.steps if ep.steps is not None else _DASH)}"
        f" · cameras {esc(', '.join(sorted(ep.videos)) or _DASH)}</p></div>"
        f'<div class="links">{"".join(links)} <a class="button" href="{esc(rrd_url)}" download>download .rrd</a></div></div>'
        + _files_section(view, rel, ep, files)
        + _frame_player(view, rel, frame_counts or {})
        + f'<iframe id="viewer" class="viewer" title="Rerun viewer" data-rrd="{esc(rrd_url)}"></iframe>'
    )
    return _layout(
        f"{ep.task_name} {ep.seed}",
        body,
        crumbs=_episode_crumbs(view, ep),
    )


def live_page(view: RunView, workers: Sequence[LiveWorker], chosen: LiveWorker | None) -> str:
    """Live frames of one worker of an active run (refreshed by app.js a few times a second)."""
    tabs = " ".join(
        f'<a class="button{" active" if chosen and w.worker_id == chosen.worker_id else ""}" '
        f'href="/live/{view.key}?worker={esc(quote(w.worker_id))}">worker {esc(w.worker_id)}</a>'
        for w in workers
    )
    if chosen is None:
        content = '<p class="muted">No worker publishes live frames for this run (start <code>gmp eval --live-every N</code>).</p>'
    else:
        base = f"/live/{view.key}/{quote(chosen.worker_id)}"
        cams = "".join(
            f'<figure><img class="livecam" alt="{esc(c)}" data-src="{esc(base)}/{esc(quote(c))}.jpg">'
            f"<figcaption>{esc(c)}</figcaption></figure>"
            for c in chosen.cameras
        )
        content = (
            f'<div id="live" data-state="{esc(base)}/state.json">'
            f'<p class="summary">step <b id="live-step">{_DASH}</b> · episode <span id="live-episode">{_DASH}</span>'
            f' · running success rate <b id="live-sr">{_DASH}</b> · updated <span id="live-updated">{_DASH}</span></p>'
            '<p class="instruction" id="live-instruction"></p>'
            f'<div class="cams">{cams}</div></div>'
        )
    return _layout(
        f"live {view.info.run_id}",
        f"<h1>Live: {esc(view.info.benchmark)} / {esc(view.info.run_id)}</h1><p>{tabs}</p>{content}",
        crumbs=[
            ("runs", "/"),
            (f"{view.info.benchmark}/{view.info.run_id}", f"/run/{view.key}"),
            ("live", None),
        ],
    )
