// gmp viz: table sorting, viewer embedding, live refresh. Local file, no dependencies.
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
  document.addEventListener("DOMContentLoaded", () => { initSorting(); initViewer(); initReload(); initLive(); });
})();
