// A results page's interactive parts (testbed.page inlines this file): the fabric's
// links coloured by the selected metric at the slider's time, a link's or a node's
// detail on click, the FCT CDF, and the slowest flows highlighting their paths.
// The page's data is the JSON in <script id="page-data">; no network, no library.
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("page-data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  const ser = data.series, T = ser.t, WHOLE = T.length;  // slider at WHOLE: the whole run
  const links = {};
  data.fabric.links.forEach(l => { links[l.id] = l; });
  const byIf = {};
  data.fabric.links.forEach(l => { byIf[l.ifname] = l; });
  const state = { metric: "util", at: WHOLE, link: null, flow: null };

  const SVG_TAGS = new Set(["svg", "line", "polyline", "text", "rect", "circle", "g"]);
  function el(tag, attrs, parent, text) {
    const e = SVG_TAGS.has(tag) ? document.createElementNS(NS, tag) : document.createElement(tag);
    Object.entries(attrs || {}).forEach(([k, v]) => e.setAttribute(k, v));
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  function fmt(v, unit) {
    if (v === null || v === undefined) return "n/a";
    if (unit === "bytes") {
      const u = ["B", "kB", "MB", "GB"]; let i = 0;
      while (Math.abs(v) >= 1000 && i < u.length - 1) { v /= 1000; i++; }
      return (i ? v.toPrecision(3) : String(v)) + " " + u[i];
    }
    if (typeof v === "number" && !Number.isInteger(v)) return String(+v.toPrecision(3));
    return String(v);
  }

  // -- what a link shows ------------------------------------------------------------
  function value(link, metric, at) {
    const tot = data.totals[link.ifname] || {};
    const s = ser.ports[link.ifname];
    if (at >= WHOLE || !data.metrics[metric][2]) return tot[metric] || 0;
    if (!s) return 0;
    return { util: s.util, bytes: s.bytes, pause: s.paused_s, drops: s.drops }[metric][at];
  }

  function scaleMax(metric) {
    if (metric === "util") return 1;
    let m = 0;
    Object.values(data.totals).forEach(t => { m = Math.max(m, t[metric] || 0); });
    return m;
  }

  // light grey for nothing, then yellow to red (a sequential scale)
  function colour(frac) {
    if (!(frac > 0)) return "#d5d8dc";
    const f = Math.min(1, frac);
    const stops = [[255, 237, 160], [254, 178, 76], [240, 59, 32], [128, 0, 38]];
    const x = f * (stops.length - 1), i = Math.min(stops.length - 2, Math.floor(x)),
      r = x - i;
    const c = stops[i].map((a, k) => Math.round(a + (stops[i + 1][k] - a) * r));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }

  function paint() {
    const max = scaleMax(state.metric);
    document.querySelectorAll("#fabric .link").forEach(line => {
      const v = value(links[line.dataset.link], state.metric, state.at);
      line.setAttribute("stroke", colour(max > 0 ? v / max : 0));
    });
    const [label, unit] = data.metrics[state.metric];
    document.getElementById("legend-max").textContent =
      state.metric === "util" ? "100 %" : fmt(max, unit === "bytes" ? "bytes" : "") +
      (unit === "bytes" ? "" : " " + unit);
    document.getElementById("legend-label").textContent = label;
    const when = state.at >= WHOLE ? "the whole run" + (state.metric === "util" ?
      " (mean over the workload)" : "") : `t = ${T[state.at].toFixed(3)} s`;
    document.getElementById("slider-time").textContent =
      data.metrics[state.metric][2] ? when : "the whole run (no series for this metric)";
    if (state.link) showLink(state.link);
  }

  // -- charts -----------------------------------------------------------------------
  function ticks(lo, hi, n) {
    const span = hi - lo || 1, step0 = span / n, mag = Math.pow(10, Math.floor(Math.log10(step0)));
    const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= step0);
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-12; v += step) out.push(+v.toPrecision(6));
    return out;
  }

  function chart(parent, xs, ys, opts) {
    const W = 460, H = 150, L = 58, B = 30, R = 10, Tp = 18;
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart " + (opts.cls || "") }, parent);
    const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = 0, y1 = Math.max(...ys, 1e-12);
    const px = x => L + (x - x0) / ((x1 - x0) || 1) * (W - L - R);
    const py = y => H - B - (y - y0) / ((y1 - y0) || 1) * (H - B - Tp);
    el("text", { x: L, y: 12, class: "ctitle" }, svg, opts.title);
    ticks(y0, y1, 3).forEach(v => {
      el("line", { x1: L, x2: W - R, y1: py(v), y2: py(v), class: "grid" }, svg);
      el("text", { x: L - 4, y: py(v) + 4, class: "tick", "text-anchor": "end" }, svg,
        fmt(v, opts.unit === "bytes" ? "bytes" : ""));
    });
    ticks(x0, x1, 5).forEach(v => {
      el("text", { x: px(v), y: H - B + 14, class: "tick", "text-anchor": "middle" }, svg, String(v));
    });
    el("text", { x: (L + W - R) / 2, y: H - 3, class: "tick", "text-anchor": "middle" }, svg, opts.xlabel);
    const pts = xs.map((x, i) => `${px(x).toFixed(1)},${py(ys[i]).toFixed(1)}`).join(" ");
    el("polyline", { points: pts, class: "series" }, svg);
    if (opts.marker !== undefined) {
      el("line", { x1: px(opts.marker), x2: px(opts.marker), y1: Tp, y2: H - B, class: "marker" }, svg);
    }
    return svg;
  }

  // -- the detail panel ---------------------------------------------------------------
  function panel(title) {
    const p = document.getElementById("detail");
    p.innerHTML = "";
    el("h3", {}, p, title);
    return p;
  }

  function table(parent, head, rows, onRow) {
    const t = el("table", { class: "small" }, parent);
    const h = el("tr", {}, t);
    head.forEach(x => el("th", {}, h, x));
    rows.forEach((r, i) => {
      const tr = el("tr", {}, t);
      r.forEach(x => el("td", {}, tr, x));
      if (onRow) { tr.classList.add("clickable"); tr.addEventListener("click", () => onRow(i)); }
    });
    return t;
  }

  function showLink(id) {
    const l = links[id];
    state.link = id;
    document.querySelectorAll("#fabric .link").forEach(x =>
      x.classList.toggle("selected", x.dataset.link === id));
    const p = panel(`${l.src} → ${l.dst} (${l.ifname})`);
    el("p", { class: "tip" }, p, l.tip);
    const tot = data.totals[l.ifname] || {};
    table(p, ["utilization", "bytes", "paused", "drops", "CE marks", "max queue"],
      [[(100 * (tot.util || 0)).toFixed(1) + " %", fmt(tot.bytes || 0, "bytes"),
        fmt(tot.pause || 0) + " s", String(tot.drops || 0), String(tot.ce || 0),
        fmt(tot.max_queue || 0, "bytes")]]);
    const s = ser.ports[l.ifname];
    if (!s) { el("p", {}, p, "This port sent nothing, queued nothing and was never paused."); return; }
    const mark = state.at < WHOLE ? T[state.at] : undefined;
    const xl = "time since the workload started (s)";
    chart(p, T, s.rate_mbps, { title: `rate (Mbit/s; the link's ${l.rate_mbps} Mbit/s)`,
      xlabel: xl, marker: mark, cls: "rate" });
    chart(p, T, s.queue, { title: "queue (bytes)", xlabel: xl, marker: mark, unit: "bytes", cls: "queue" });
    if (s.paused_s.some(v => v > 0)) {
      chart(p, T, s.paused_s, { title: "time paused so far (s)", xlabel: xl, marker: mark, cls: "paused" });
    }
    if (s.drops.some(v => v > 0)) {
      chart(p, T, s.drops, { title: "drops so far (frames)", xlabel: xl, marker: mark, cls: "drops" });
    }
    el("p", { class: "tip" }, p, `samples: ${ser.source}`);
  }

  function showNode(id) {
    const n = data.fabric.nodes.find(x => x.id === id);
    state.link = null;
    const p = panel(`${n.id} (${n.role})`);
    const out = data.fabric.links.filter(l => l.src === id);
    table(p, ["port", "to", "utilization", "bytes", "paused s", "drops", "CE", "max queue"],
      out.map(l => {
        const t = data.totals[l.ifname] || {};
        return [l.ifname, l.dst, (100 * (t.util || 0)).toFixed(1) + " %", fmt(t.bytes || 0, "bytes"),
          fmt(t.pause || 0), String(t.drops || 0), String(t.ce || 0), fmt(t.max_queue || 0, "bytes")];
      }), i => showLink(out[i].id));
  }

  // -- flows ------------------------------------------------------------------------
  function highlight(path) {
    const on = new Set();
    for (let i = 0; i + 1 < path.length; i++) on.add(`${path[i]}>${path[i + 1]}`);
    document.getElementById("fabric").classList.toggle("paths", on.size > 0);
    document.querySelectorAll("#fabric .link").forEach(x =>
      x.classList.toggle("onpath", on.has(x.dataset.link)));
  }

  function flows() {
    const f = data.flows, box = document.getElementById("fct-cdf");
    if (f.fct_s.length) {
      const n = f.fct_s.length, xs = [], ys = [];     // a step at each flow's FCT
      f.fct_s.forEach((x, i) => { xs.push(x, x); ys.push(i / n, (i + 1) / n); });
      chart(box, xs, ys, { title: `FCT CDF (${f.fct_s.length} flows)`, xlabel: "FCT (s)", cls: "cdf" });
    } else {
      box.textContent = "No flow completed.";
    }
    const rows = document.querySelectorAll("#slowest tr.flow");
    rows.forEach(tr => tr.addEventListener("click", () => {
      const i = +tr.dataset.flow, same = state.flow === i;
      state.flow = same ? null : i;
      rows.forEach(r => r.classList.toggle("selected", !same && r === tr));
      highlight(same ? [] : f.slowest[i].path);
    }));
  }

  // -- wiring -------------------------------------------------------------------------
  document.querySelectorAll("#fabric .link").forEach(x =>
    x.addEventListener("click", ev => { ev.stopPropagation(); showLink(x.dataset.link); }));
  document.querySelectorAll("#fabric .node").forEach(x =>
    x.addEventListener("click", ev => { ev.stopPropagation(); showNode(x.dataset.node); }));
  const metric = document.getElementById("metric");
  metric.addEventListener("change", () => { state.metric = metric.value; paint(); });
  const slider = document.getElementById("slider");
  slider.max = String(WHOLE);
  slider.value = String(WHOLE);
  slider.disabled = T.length === 0;
  slider.addEventListener("input", () => { state.at = +slider.value; paint(); });
  paint();
  flows();
  window.pageData = data;     // for a reader's console
})();
