// gmp viz: table sorting, viewer embedding, live refresh, following live runs. Local file, no dependencies.
"use strict";
(function () {
  function cellValue(row, i) {
    const c = row.children[i];
    if (!c) return "";
    const v = c.getAttribute("data-v");
    return v === null ? c.textContent : v;
  }
  function sortTable(table, i, th) {
    const body = table.tBodies[0];
    const asc = !th.classList.contains("asc");
    table.querySelectorAll("th").forEach((h) => h.classList.remove("asc", "desc"));
    th.classList.add(asc ? "asc" : "desc");
    const rows = Array.from(body.rows);
    rows.sort((a, b) => {
      const x = cellValue(a, i), y = cellValue(b, i);
      const nx = parseFloat(x), ny = parseFloat(y);
      const r = !isNaN(nx) && !isNaN(ny) && String(nx) !== "NaN" && /^-?[0-9.eE+-]+$/.test(x) && /^-?[0-9.eE+-]+$/.test(y)
        ? nx - ny : String(x).localeCompare(String(y));
      return asc ? r : -r;
    });
    rows.forEach((r) => body.appendChild(r));
  }
  function initSorting() {
    document.querySelectorAll("table.sortable").forEach((table) => {
      table.querySelectorAll("thead th").forEach((th, i) => {
        th.addEventListener("click", () => sortTable(table, i, th));
      });
    });
  }
  function initViewer() {
    const frame = document.getElementById("viewer");
    if (!frame) return;
    // The viewer needs an absolute URL; build it from wherever the page was reached (ssh -L, proxy).
    const rrd = new URL(frame.getAttribute("data-rrd"), window.location.href).href;
    frame.src = "/viewer/index.html?hide_welcome_screen&url=" + encodeURIComponent(rrd);
  }
  function initReload() {
    const el = document.querySelector("[data-reload]");
    if (el) setTimeout(() => window.location.reload(), parseInt(el.getAttribute("data-reload"), 10));
  }
  function initLive() {
    const live = document.getElementById("live");
    if (!live) return;
    const stateUrl = live.getAttribute("data-state");
    const imgs = Array.from(document.querySelectorAll("img.livecam"));
    let busy = false;
    function text(id, v) { const e = document.getElementById(id); if (e) e.textContent = v; }
    async function tick() {
      if (busy || document.hidden) return;
      busy = true;
      try {
        const r = await fetch(stateUrl, { cache: "no-store", credentials: "same-origin" });
        if (r.ok) {
          const s = await r.json();
          text("live-step", s.step ?? "–");
          text("live-episode", s.episode_id ?? "–");
          text("live-instruction", s.instruction ?? "");
          // gmp eval writes sr (+ sr_ci95, episodes); success_rate is accepted too.
          const sr = typeof s.sr === "number" ? s.sr : s.success_rate;
          let srText = typeof sr === "number" ? (100 * sr).toFixed(1) + "%" : "–";
          if (Array.isArray(s.sr_ci95) && s.sr_ci95.length === 2) {
            srText += " [" + (100 * s.sr_ci95[0]).toFixed(1) + "%, " + (100 * s.sr_ci95[1]).toFixed(1) + "%]";
          }
          if (typeof s.episodes === "number") srText += " of " + s.episodes + " episodes";
          text("live-sr", srText);
          text("live-updated", s.updated ? new Date(s.updated * 1000).toLocaleTimeString() : "–");
        }
        const t = Date.now();
        imgs.forEach((img) => { img.src = img.getAttribute("data-src") + "?t=" + t; });
      } catch (e) {
        // transient: the next tick retries
      } finally {
        busy = false;
      }
    }
    tick();
    setInterval(tick, 300);
  }
  // The episode's JPEG frames, shown by index (/frame/<key>/<camera>/<i>/<episode>): scrub, play,
  // and a state plot whose cursor follows the shown frame (/timeline: frame -> step, state series).
  function initPlayer() {
    const player = document.getElementById("player");
    if (!player) return;
    const n = parseInt(player.getAttribute("data-n"), 10) || 0;
    const imgs = Array.from(player.querySelectorAll("img.framecam"));
    const scrub = document.getElementById("scrub");
    const label = document.getElementById("frame-no");
    const stepLabel = document.getElementById("frame-step");
    const canvas = document.getElementById("plot");
    let timeline = null, cur = 0, timer = null;
    const frameStep = new Map();
    function stepOf(i) { return frameStep.has(i) ? frameStep.get(i) : null; }
    function draw() {
      if (!canvas || !timeline) return;
      const ctx = canvas.getContext("2d");
      const w = canvas.width, h = canvas.height;
      ctx.clearRect(0, 0, w, h);
      const series = timeline.state.joints || Object.values(timeline.state)[0];
      let tmax = 1;
      if (series && series.t.length) tmax = Math.max(1, series.t[series.t.length - 1]);
      if (series) {
        let lo = Infinity, hi = -Infinity;
        series.v.forEach((dim) => dim.forEach((x) => { if (x !== null) { lo = Math.min(lo, x); hi = Math.max(hi, x); } }));
        if (hi <= lo) { hi = lo + 1; }
        const colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];
        series.v.forEach((dim, j) => {
          ctx.strokeStyle = colours[j % colours.length];
          ctx.beginPath();
          let pen = false;
          dim.forEach((x, k) => {
            if (x === null) { pen = false; return; }
            const px = (series.t[k] / tmax) * (w - 1), py = h - 1 - ((x - lo) / (hi - lo)) * (h - 2);
            if (pen) ctx.lineTo(px, py); else ctx.moveTo(px, py);
            pen = true;
          });
          ctx.stroke();
        });
      }
      const s = stepOf(cur);
      if (s !== null) {
        ctx.strokeStyle = "#000";
        ctx.beginPath();
        ctx.moveTo((s / tmax) * (w - 1), 0);
        ctx.lineTo((s / tmax) * (w - 1), h);
        ctx.stroke();
      }
    }
    function show(i) {
      cur = Math.max(0, Math.min(n - 1, i));
      imgs.forEach((img) => { img.src = img.getAttribute("data-base") + cur + img.getAttribute("data-tail"); });
      if (scrub) scrub.value = String(cur);
      if (label) label.textContent = String(cur);
      const s = stepOf(cur);
      if (stepLabel) stepLabel.textContent = s === null ? "–" : String(s);
      draw();
    }
    if (scrub) scrub.addEventListener("input", () => show(parseInt(scrub.value, 10)));
    const play = document.getElementById("play");
    if (play) play.addEventListener("click", () => {
      if (timer) { clearInterval(timer); timer = null; play.textContent = "play"; return; }
      play.textContent = "pause";
      timer = setInterval(() => { if (cur >= n - 1) { clearInterval(timer); timer = null; play.textContent = "play"; } else show(cur + 1); }, 1000 / 30);
    });
    show(0);
    fetch(player.getAttribute("data-timeline"), { credentials: "same-origin" })
      .then((r) => (r.ok ? r.json() : null))
      .then((t) => {
        if (!t) return;
        timeline = t;
        (t.frame_steps || []).forEach(([step, frame]) => { if (!frameStep.has(frame)) frameStep.set(frame, step); });
        show(cur);
      })
      .catch(() => {});
  }
  // Pages of a live run follow it: while a run shown is live, its state and numbers come from
  // /api/... every 2 s (the text is formatted by the server, under "display"). Nothing is fetched
  // on pages without a live run; a fetch cut short by leaving the page is expected and ignored.
  function initFollow() {
    const box = document.querySelector("[data-api]");
    if (!box) return;
    const url = box.getAttribute("data-api");
    const shownDone = new Map();
    document.querySelectorAll("[data-run]").forEach((el) => {
      const done = el.querySelector('[data-field="done"]');
      shownDone.set(el.getAttribute("data-run"), done ? done.textContent : "");
    });
    function anyLive() {
      return document.querySelector('[data-run] [data-field="state"][data-state="live"]') !== null;
    }
    function put(el, field, text, sortValue) {
      const f = el.querySelector('[data-field="' + field + '"]');
      if (!f) return null;
      const b = f.querySelector("b");
      if (field === "sr" && b) {
        b.textContent = text.sr;
        const ci = f.querySelector(".ci");
        if (ci) ci.textContent = text.ci;
      } else {
        f.textContent = text;
      }
      if (sortValue !== undefined && f.hasAttribute("data-v")) f.setAttribute("data-v", String(sortValue));
      return f;
    }
    function apply(run) {
      const d = run.display;
      document.querySelectorAll('[data-run="' + run.key + '"]').forEach((el) => {
        const st = put(el, "state", d.state);
        if (st) {
          st.className = d.state_class;
          st.setAttribute("data-state", run.state || "");
          st.title = d.state_title;
        }
        put(el, "detail", run.state_detail || "");
        put(el, "done", d.done, run.done);
        put(el, "sr", d, run.sr === null ? -1 : run.sr);
        put(el, "mean", d.mean, run.mean_score === null ? -1 : run.mean_score);
        const reload = el.querySelector('[data-field="reload"]');
        if (reload && shownDone.get(run.key) !== d.done) reload.hidden = false;
      });
    }
    async function tick() {
      if (!document.hidden) {
        try {
          const r = await fetch(url, { cache: "no-store", credentials: "same-origin" });
          if (r.ok) (await r.json()).runs.forEach(apply);
        } catch (e) {
          // the page is being left, or gmp viz restarts: the next tick (if any) tries again
        }
      }
      if (anyLive()) setTimeout(tick, 2000);
    }
    if (anyLive()) setTimeout(tick, 2000);
  }
  document.addEventListener("DOMContentLoaded", () => { initSorting(); initViewer(); initReload(); initLive(); initPlayer(); initFollow(); });
})();
