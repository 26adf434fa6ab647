"""``gmp report``: one self-contained, offline HTML file about one or more recorded runs.

Everything is inside the file: the CSS, the plots (inline SVG drawn here, no script, no font or
image from anywhere), the thumbnails (small base64 JPEGs of the last frame of each failed
episode's first camera, decoded by :func:`genmanip_results.video.read_video_frames`). Links go to
the episode directories (relative to the report) and to their ``gmp viz`` pages; nothing is
loaded from them. Every string from a results tree (task names, ids, manifest values) is
HTML-escaped. The statistics are :mod:`genmanip_results.stats` and the paired comparison
:func:`genmanip_results.compare.compare_runs` (the numbers of ``gmp compare``).

Sections: the runs (success rate with its Wilson 95% interval), per task and per task group
(the component after the benchmark: ``testbed/<group>/<task>``) as a dot-and-whisker plot, the
EBench-style capability/generalization profile (capability = the task group; generalization =
the task's split, from ``run.json``'s ``task_axes`` or the name's ``_easy``/``_hard``/... suffix;
shown when an axis has two values or more), the paired comparison of the first two runs, the
failed episodes, the latency split (``steps.jsonl`` ``latency_ms``), the run manifests.

Size: about 4 KB per failed episode with a thumbnail (at most ``max_thumbnails``, 160x120 px,
JPEG quality 60) plus ~1 KB per task; a 100-episode run is well under 1 MB (docs/artifacts.md).
"""

from __future__ import annotations

import base64
import html
import io
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
from genmanip_protocol.errors import ExitCode
from genmanip_results.compare import compare_runs, resolve_run
from genmanip_results.discovery import EpisodeInfo, RunInfo, run_key, run_rel
from genmanip_results.series import load_series
from genmanip_results.stats import wilson_interval
from genmanip_results.video import read_video_frames
from genmanip_runtime.atomic import atomic_write_bytes
from genmanip_runtime.console import Console

__all__ = ["build_report", "report", "task_axes"]

#: Split names recognised as a generalization axis at the end of a task name (``..._hard``).
SPLITS = ("easy", "medium", "hard", "seen", "unseen", "id", "ood", "train", "test", "novel")

_THUMB = (160, 120)
_DASH = "\u2013"


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _num(x: float | None) -> str:
    return _DASH if x is None else f"{x:.3f}"


def _pct(x: float | None) -> str:
    return _DASH if x is None else f"{100 * x:.1f}%"


def task_axes(task: str, manifest: Mapping[str, Any] | None = None) -> dict[str, str | None]:
    """The profile axes of a task: ``group`` (capability) and ``split`` (generalization).

    ``run.json`` may state them: ``{"task_axes": {task: {"capability": str, "generalization":
    str}}}``; else ``group`` is the second ``/`` component of ``<benchmark>/<group>/...`` (None
    for shorter names) and ``split`` the last ``_`` token of the name when it is one of
    :data:`SPLITS`.
    """
    meta = (manifest or {}).get("task_axes")
    if isinstance(meta, Mapping) and isinstance(meta.get(task), Mapping):
        m = meta[task]
        return {"group": _str_or_none(m.get("capability")), "split": _str_or_none(m.get("generalization"))}
    parts = task.split("/")
    group = parts[1] if len(parts) >= 3 else None
    token = parts[-1].rsplit("_", 1)[-1].lower() if "_" in parts[-1] else None
    return {"group": group, "split": token if token in SPLITS else None}


def _str_or_none(v: Any) -> str | None:
    return None if v is None else str(v)


def _stats(eps: Sequence[EpisodeInfo]) -> dict[str, Any]:
    done = [e for e in eps if e.complete]
    k = sum(1 for e in done if e.success)
    lo, hi = wilson_interval(k, len(done))
    return {"n": len(done), "k": k, "sr": k / len(done) if done else None, "ci": (lo, hi)}


# ------------------------------------------------------------------------------------------
# SVG
# ------------------------------------------------------------------------------------------

_COLOURS = ("#1f5fa8", "#c2571a", "#2b8a3e", "#7b3fa0")


def _svg_intervals(rows: Sequence[tuple[str, list[dict[str, Any]]]], labels: Sequence[str]) -> str:
    """A horizontal dot-and-whisker plot: one line per ``(name, [stats per run])``, x in 0-100%."""
    if not rows:
        return ""
    left, width, line_h = 300, 420, 18
    n_runs = max(len(s) for _, s in rows)
    row_h = max(line_h, 8 + 8 * n_runs)
    height = 30 + row_h * len(rows) + 24
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" viewBox="0 0 {left + width + 20} '
           f'{height}" width="{left + width + 20}" height="{height}" role="img">']
    for tick in range(0, 101, 25):
        x = left + width * tick / 100
        out.append(f'<line x1="{x:.1f}" y1="20" x2="{x:.1f}" y2="{height - 20}" class="grid"/>'
                   f'<text x="{x:.1f}" y="{height - 6}" class="tick">{tick}%</text>')
    for i, lab in enumerate(labels):
        out.append(f'<circle cx="{left + 10 + i * 150}" cy="9" r="4" fill="{_COLOURS[i % 4]}"/>'
                   f'<text x="{left + 18 + i * 150}" y="13" class="legend">{esc(lab[:22])}</text>')
    for r, (name, per_run) in enumerate(rows):
        y0 = 30 + r * row_h
        shown = name if len(name) <= 44 else "…" + name[-43:]
        out.append(f'<text x="{left - 8}" y="{y0 + row_h / 2 + 4:.1f}" class="label">{esc(shown)}'
                   f"<title>{esc(name)}</title></text>")
        for j, st in enumerate(per_run):
            if st["sr"] is None:
                continue
            y = y0 + 6 + j * 8
            lo, hi = st["ci"]
            c = _COLOURS[j % 4]
            out.append(
                f'<line x1="{left + width * lo:.1f}" y1="{y}" x2="{left + width * hi:.1f}" y2="{y}" '
                f'stroke="{c}" stroke-width="2"/><circle cx="{left + width * st["sr"]:.1f}" cy="{y}" '
                f'r="3.5" fill="{c}"><title>{esc(name)}: {_pct(st["sr"])} [{_pct(lo)}, {_pct(hi)}] '
                f'n={st["n"]}</title></circle>'
            )
    out.append("</svg>")
    return "".join(out)


# ------------------------------------------------------------------------------------------
# Pieces
# ------------------------------------------------------------------------------------------


def _thumbnail(ep: EpisodeInfo) -> str | None:
    """A data: URL of the last frame of the episode's first camera (160x120 JPEG), or None."""
    if not ep.videos:
        return None
    from PIL import Image

    cam = sorted(ep.videos)[0]
    last: np.ndarray | None = None
    try:
        for frame in read_video_frames(ep.videos[cam], size=_THUMB, within=ep.containment):
            last = frame
    except Exception:
        return None
    if last is None:
        return None
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(last)).save(buf, format="JPEG", quality=60, optimize=True)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _latency(run: RunInfo) -> dict[str, dict[str, float]]:
    parts: dict[str, list[np.ndarray]] = {}
    for ep in run.episodes:
        if not ep.complete or ep.steps_file is None:
            continue
        try:
            s = load_series(ep)
        except Exception:  # noqa: S112 - an unreadable recording has no latency to show
            continue
        for name, values in s.latency_ms.items():
            parts.setdefault(name, []).append(values)
    out: dict[str, dict[str, float]] = {}
    for name, chunks in parts.items():
        v = np.concatenate(chunks) if chunks else np.zeros(0)
        v = v[np.isfinite(v)]
        if v.size:
            out[name] = {"n": float(v.size), "mean": float(v.mean()),
                         "p50": float(np.percentile(v, 50)), "p95": float(np.percentile(v, 95))}
    return out


def _viz_link(run: RunInfo, ep: EpisodeInfo, viz_url: str, viz_root: Path) -> str:
    """The ``gmp viz`` episode page: the run addressed by the key gmp viz gives it under the root
    ``gmp viz --root`` serves (:func:`genmanip_results.discovery.run_key`)."""
    key = run_key(run_rel(run.path, viz_root))
    return f"{viz_url.rstrip('/')}/episode/{key}/{quote(f'{ep.task_name}/{ep.seed}', safe='/')}"


def _manifest_rows(run: RunInfo) -> str:
    man = run.manifest or {}
    keys = ["run_id", "benchmark", "versions", "policy", "policy_args", "server_url", "robot_id",
            "workers", "codec", "chunk_size", "start", "end", "host"]
    rows = []
    for k in keys + sorted(k for k in man if k not in keys):
        if k in man and k != "task_axes":
            v = man[k]
            text = v if isinstance(v, str) else _compact(v)
            rows.append(f"<tr><th>{esc(k)}</th><td>{esc(text)}</td></tr>")
    seeds = {t: [str(e.seed) for e in eps] for t, eps in run.tasks().items()}
    rows.append("<tr><th>seeds</th><td>" + "<br>".join(
        f"{esc(t)}: {esc(', '.join(s))}" for t, s in seeds.items()) + "</td></tr>")
    return "<table class=kv>" + "".join(rows) + "</table>"


def _compact(v: Any) -> str:
    import json

    text = json.dumps(v, sort_keys=True, default=str)
    return text if len(text) <= 2000 else text[:2000] + " …"


_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1100px;
color:#1b1b1b;padding:0 16px}h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0}td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:left;
vertical-align:top}td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}.muted{color:#666}
.plot .grid{stroke:#e3e3e3}.plot .tick,.plot .legend{font-size:11px;fill:#444}.plot .tick{text-anchor:middle}
.plot .label{font-size:11px;text-anchor:end;fill:#222}.fails{display:flex;flex-wrap:wrap;gap:10px}
.fail{width:176px;border:1px solid #ddd;padding:6px;font-size:12px;break-inside:avoid}
.fail img{width:160px;height:120px;display:block;background:#eee}.kv th{width:130px;color:#444}
.pos{color:#2b8a3e}.neg{color:#b02a37}code{font-size:12px}
@media print{body{margin:0;max-width:none;font-size:11px}a{color:inherit;text-decoration:none}
h2{break-after:avoid}table,svg,.fail{break-inside:avoid}.noprint{display:none}}
"""


def _run_label(run: RunInfo) -> str:
    return run.key


def build_report(
    runs: Sequence[RunInfo],
    out: str | os.PathLike[str],
    *,
    alpha: float = 0.05,
    thumbnails: bool = True,
    max_thumbnails: int = 200,
    viz_url: str = "http://127.0.0.1:55077",
    viz_root: str | os.PathLike[str] = ".",
) -> dict[str, Any]:
    """Write the report of ``runs`` to ``out`` (atomically); return ``{"path", "bytes",
    "failed", "thumbnails"}``.

    Args:
        runs: one or more runs; with two or more, the second is compared against the first.
        out: the HTML file to write (its directory must exist).
        alpha: the level of the comparison's tests.
        thumbnails: add a thumbnail to each failed episode (the first ``max_thumbnails``).
        viz_url, viz_root: where ``gmp viz`` serves and which ``--root`` it serves, for links.
    """
    if not runs:
        raise ValueError("build_report needs at least one run")
    out_path = Path(out)
    out_dir = out_path.absolute().parent
    labels = [_run_label(r) for r in runs]
    parts: list[str] = []
    parts.append(f"<h1>gmp report</h1><p class=muted>{esc(', '.join(labels))} &middot; generated "
                 f"{esc(time.strftime('%Y-%m-%d %H:%M:%S %Z'))}</p>")

    # -- runs -----------------------------------------------------------------------------
    rows = []
    for r in runs:
        st = _stats(r.episodes)
        lo, hi = st["ci"]
        rows.append(f"<tr><td>{esc(r.key)}</td><td class=num>{st['n']}</td><td class=num>{st['k']}</td>"
                    f"<td class=num>{_pct(st['sr'])} [{_pct(lo)}, {_pct(hi)}]</td>"
                    f"<td class=num>{_num(r.mean_score)}</td></tr>")
    parts.append("<h2>Runs</h2><table><tr><th>run</th><th class=num>episodes</th>"
                 "<th class=num>successes</th><th class=num>success rate [Wilson 95%]</th>"
                 "<th class=num>mean score</th></tr>" + "".join(rows) + "</table>")

    # -- per task / group -------------------------------------------------------------------
    tasks = sorted({t for r in runs for t in r.tasks()})
    by_run = [r.tasks() for r in runs]
    task_rows = [(t, [_stats(br.get(t, [])) for br in by_run]) for t in tasks]
    manifest0 = runs[0].manifest
    axes = {t: task_axes(t, manifest0) for t in tasks}

    def grouped(axis: str) -> list[tuple[str, list[dict[str, Any]]]]:
        names = sorted({v for a in axes.values() if (v := a[axis]) is not None})
        return [(g, [_stats([e for t, eps in br.items() if axes.get(t, {}).get(axis) == g for e in eps])
                     for br in by_run]) for g in names]

    groups = grouped("group")
    splits = grouped("split")
    parts.append("<h2>Success rate per task</h2><p class=muted>dot: success rate; bar: Wilson 95% "
                 "interval.</p>" + _svg_intervals(task_rows, labels))
    if groups:
        parts.append("<h2>Per task group</h2>" + _svg_intervals(groups, labels))
    if len(groups) >= 2 or len(splits) >= 2:
        prof = []
        if len(groups) >= 2:
            prof.append("<h3>Capability (task group)</h3>" + _svg_intervals(groups, labels))
        if len(splits) >= 2:
            prof.append("<h3>Generalization (split)</h3>" + _svg_intervals(splits, labels))
        parts.append("<h2>Capability / generalization profile</h2>" + "".join(prof))

    # -- comparison ---------------------------------------------------------------------------
    if len(runs) >= 2:
        parts.append(_comparison_html(compare_runs(runs[0], runs[1], alpha=alpha)))

    # -- failures -----------------------------------------------------------------------------
    failed = [(r, e) for r in runs for e in sorted(r.episodes, key=lambda e: (e.task_name, e.seed))
              if e.complete and not e.success]
    n_thumbs = 0
    cards = []
    for r, e in failed:
        thumb = None
        if thumbnails and n_thumbs < max_thumbnails:
            thumb = _thumbnail(e)
            n_thumbs += thumb is not None
        rel = os.path.relpath(Path(e.path).absolute(), out_dir)
        img = f'<img alt="last frame" src="{thumb}">' if thumb else '<div class="muted">(no thumbnail)</div>'
        score = _DASH if e.score is None else f"{e.score:.2f}"
        cards.append(
            f'<div class=fail>{img}<div><b>{esc(e.task_name)}</b></div><div>seed {esc(e.seed)} &middot; '
            f'score {score}</div><div class=muted>{esc(r.key)}</div>'
            f'<div><a href="{esc(quote(Path(rel).as_posix(), safe="/.-_"))}/">episode dir</a> &middot; '
            f'<a href="{esc(_viz_link(r, e, viz_url, Path(viz_root)))}">gmp viz</a></div></div>'
        )
    parts.append(f"<h2>Failed episodes ({len(failed)})</h2>"
                 + (f'<div class=fails>{"".join(cards)}</div>' if cards else "<p>none</p>"))

    # -- latency ------------------------------------------------------------------------------
    lat_rows = []
    for r in runs:
        for name, v in sorted(_latency(r).items()):
            lat_rows.append(f"<tr><td>{esc(r.key)}</td><td>{esc(name)}</td><td class=num>{int(v['n'])}</td>"
                            f"<td class=num>{v['mean']:.2f}</td><td class=num>{v['p50']:.2f}</td>"
                            f"<td class=num>{v['p95']:.2f}</td></tr>")
    parts.append("<h2>Latency split (ms per request)</h2>" + (
        "<table><tr><th>run</th><th>part</th><th class=num>requests</th><th class=num>mean</th>"
        "<th class=num>p50</th><th class=num>p95</th></tr>" + "".join(lat_rows) + "</table>"
        if lat_rows else "<p class=muted>no latency recorded (server layout, or no steps.jsonl)</p>"))

    # -- manifests ----------------------------------------------------------------------------
    parts.append("<h2>Run manifests</h2>" + "".join(
        f"<h3>{esc(r.key)}</h3><p class=muted>{esc(r.path)}</p>" + _manifest_rows(r) for r in runs))

    doc = ("<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
           "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
           "img-src data:; style-src 'unsafe-inline'\">"
           f"<title>gmp report: {esc(', '.join(labels))}</title><style>{_CSS}</style></head><body>"
           + "".join(parts) + "</body></html>\n")
    data = doc.encode("utf-8")
    atomic_write_bytes(out_path, data)
    return {"path": str(out_path), "bytes": len(data), "failed": len(failed), "thumbnails": n_thumbs}


def _comparison_html(cmp: Mapping[str, Any]) -> str:
    def ci(c: Sequence[float] | None, signed: bool = True) -> str:
        if c is None:
            return _DASH
        f = "{:+.1f}" if signed else "{:.1f}"
        return "[" + f.format(100 * c[0]) + ", " + f.format(100 * c[1]) + "]"

    def row(name: str, g: Mapping[str, Any], p_holm: float | None) -> str:
        d = g["difference"]
        cls = "pos" if (d or 0) > 0 else "neg" if (d or 0) < 0 else ""
        sd = g["score"]["difference"]
        score = _DASH if sd is None else f"{sd:+.3f}"
        ph = _DASH if p_holm is None else f"{p_holm:.3g}"
        diff = _DASH if d is None else f"{100 * d:+.1f}"
        return (f"<tr><td>{esc(name)}</td><td class=num>{g['pairs']}</td>"
                f"<td class=num>{_pct(g['a']['rate'])} {ci(g['a']['ci95'], False)}</td>"
                f"<td class=num>{_pct(g['b']['rate'])} {ci(g['b']['ci95'], False)}</td>"
                f"<td class='num {cls}'>{diff} {ci(g['difference_ci95'])}</td>"
                f"<td class=num>{g['mcnemar_p']:.3g}</td><td class=num>{ph}</td>"
                f"<td>{esc(g.get('claim') or _DASH)}</td>"
                f"<td class=num>{score}</td>"
                f"<td class=num>{g['only_a']}/{g['only_b']}</td></tr>")

    rows = "".join(row(t["task"], t, t["p_holm"]) for t in cmp["tasks"])
    rows += row("overall", cmp["overall"], None)
    seq = cmp["sequential"]
    flips = "".join(f"<li>{esc(f['task'])} seed {esc(f['seed'])}: A {'success' if f['a'] else 'failure'}"
                    f" &rarr; B {'success' if f['b'] else 'failure'}</li>" for f in cmp["overall"]["flipped"])
    at = (f"after {seq['decided_at']} of {seq['n']} pairs "
          f"({seq['n'] - (seq['decided_at'] or 0)} episodes saved)"
          if seq["decided_at"] is not None else f"after all {seq['n']} pairs")
    d_all = cmp["overall"]["difference"]
    return (
        f"<h2>Paired comparison</h2><p>A = {esc(cmp['a']['run'])}, B = {esc(cmp['b']['run'])}; "
        f"<b id=compare-delta>&Delta; success (B &minus; A): {_DASH if d_all is None else f'{100 * d_all:+.1f}'} pp"
        f"</b> {ci(cmp['overall']['difference_ci95'])} (positive: B succeeds more often). "
        "Episodes paired on (task, seed), differences B &minus; A in points. Interval of the difference: "
        "Newcombe (1998) method 10; p: exact McNemar; per-task claims: Holm-adjusted p &le; "
        f"{cmp['alpha']:g}; score: paired t.</p>"
        "<table><tr><th>task</th><th class=num>pairs</th><th class=num>A [95%]</th>"
        "<th class=num>B [95%]</th><th class=num>&Delta; success (B &minus; A) pp [95%]</th>"
        "<th class=num>McNemar p</th>"
        "<th class=num>Holm p</th><th>claim</th><th class=num>score B&minus;A</th>"
        "<th class=num>unpaired A/B</th></tr>" + rows + "</table>"
        f"<p><b>Sequential verdict</b> (anytime-valid, &alpha; {seq['alpha']:g}, &delta; {100 * seq['delta']:g} pp): "
        f"{esc(seq['description'])} {at}.</p>"
        f"<h3>Flipped seeds ({len(cmp['overall']['flipped'])})</h3><ul>{flips}</ul>"
    )


def report(
    *,
    runs: Sequence[str],
    out: str,
    alpha: float,
    thumbnails: bool,
    viz_url: str,
    viz_root: str,
    root: str | None,
    console: Console,
) -> int:
    """``gmp report RUN [RUN...] -o FILE``: write the report; print its path on stdout."""
    console = console or Console()
    if not 0.0 < alpha < 1.0:
        console.error(f"--alpha must be within (0, 1), got {alpha:g}")
        return int(ExitCode.USAGE)
    infos = [resolve_run(r, root) for r in runs]
    res = build_report(infos, out, alpha=alpha, thumbnails=thumbnails, viz_url=viz_url,
                       viz_root=viz_root)
    console.info(f"report: {res['failed']} failed episodes, {res['thumbnails']} thumbnails, "
                 f"{res['bytes'] / 1024:.0f} KiB")
    sys.stdout.write(res["path"] + "\n")
    sys.stdout.flush()
    return int(ExitCode.OK)

