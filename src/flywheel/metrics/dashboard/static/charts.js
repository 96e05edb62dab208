// The overview's charts: one uPlot chart per metric of metrics.jsonl, in collapsible sections by the prefix before
// "/" (unprefixed trainer keys form "trainer"), a search box that filters charts by name, EMA smoothing, a trainer
// step or wall-time x axis, and tick labels that stay readable for 1e-5 and for 3M. A section is drawn only while
// open, so a run with a hundred metrics paints at once. Used by app.js (the live dashboard); pure client code.
"use strict";

const FlywheelCharts = (() => {
  const R = FlywheelRollouts;
  // Sections in the order an RL engineer reads them; sections not listed follow, by name. OPEN: open on first view.
  const ORDER = ["rollout", "reward", "trainer", "staleness", "mismatch", "flags", "throughput", "weights", "engine",
    "buffer", "node", "sandbox"];
  const OPEN = new Set(["rollout", "reward", "trainer", "staleness", "mismatch"]);
  const FIRST = 8;  // charts drawn before the overview counts as shown; the rest follow in batches
  const COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"];
  const st = {charts: new Map(), records: [], smooth: 0, xaxis: "step", query: "", open: new Set(OPEN),
    generation: 0, pending: new Map()};

  const sectionOf = (k) => k.includes("/") ? k.split("/")[0] : "trainer";

  function keysOf(records) {
    const keys = new Set();
    for (const r of records) for (const [k, v] of Object.entries(r)) {
      if (typeof v === "number" && k !== "step" && k !== "time") keys.add(k);
    }
    return [...keys].sort();
  }

  // A tick label a person can read: k/M for large values, exponent form below 1e-3 (9.0e-6, 1.0e-5), else as
  // many decimals as the tick spacing needs. `top`: the largest |value| on the axis, `digits`: the mantissa digits
  // the closest ticks need, so that every label of one axis has the same form and precision.
  const log10 = (x) => Math.floor(Math.log10(x) + 1e-9);
  const clamp = (d) => Math.min(3, Math.max(0, d));
  function tick(v, incr, top = Math.abs(v), digits = null) {
    if (v === null || v === undefined) return "";
    if (v === 0) return "0";
    const step = Math.abs(incr) || Math.abs(v);
    if (top >= 1e6) return `${(v / 1e6).toFixed(clamp(6 - log10(step)))}M`;
    if (top >= 1e4) return `${(v / 1e3).toFixed(clamp(3 - log10(step)))}k`;
    if (top < 1e-3) return v.toExponential(digits === null ? clamp(log10(Math.abs(v)) - log10(step)) : digits);
    return v.toFixed(Math.min(6, Math.max(0, -log10(step))));
  }
  function ticks(splits, incr) {
    const nonzero = splits.filter((v) => v);
    const top = Math.max(0, ...nonzero.map(Math.abs));
    const digits = Math.max(0, ...nonzero.map((v) => clamp(log10(Math.abs(v)) - log10(Math.abs(incr) || Math.abs(v)))));
    return splits.map((v) => tick(v, incr, top, digits));
  }

  // wall time since the run's first record: 45 s, 12.5 min, 3.2 h
  function duration(s, incr) {
    const d = (x, unit, scale) => `${+(x / scale).toFixed(incr / scale >= 1 ? 0 : 1)} ${unit}`;
    return s < 120 ? d(s, "s", 1) : s < 7200 ? d(s, "min", 60) : d(s, "h", 3600);
  }

  function xOf(rec, i, t0) {
    if (st.xaxis === "time") {
      if (typeof rec["time/elapsed_s"] === "number") return rec["time/elapsed_s"];
      return typeof rec.time === "number" ? rec.time - t0 : null;
    }
    return typeof rec.step === "number" ? rec.step : i;
  }

  // [xs, ys] of one metric; with smoothing, a third array: the debiased EMA (TensorBoard's), ys kept as drawn faintly
  function series(records, key) {
    const t0 = (records.find((r) => typeof r.time === "number") || {}).time || 0;
    const xs = [], ys = [];
    records.forEach((r, i) => {
      const x = xOf(r, i, t0);
      if (typeof r[key] === "number" && x !== null) { xs.push(x); ys.push(r[key]); }
    });
    if (!st.smooth) return [xs, ys];
    const a = st.smooth, out = [];
    let m = 0, n = 0;
    for (const y of ys) { m = a * m + (1 - a) * y; n++; out.push(m / (1 - a ** n)); }
    return [xs, ys, out];
  }

  function opts(title, labels, width = 330, height = 160) {
    // a flat series gets a visible band around it (uPlot's default for all-zero data is 0..100)
    const range = (u, lo, hi) => lo === hi ? [lo - (Math.abs(lo) || 1) * 0.1, hi + (Math.abs(hi) || 1) * 0.1]
      : [lo - (hi - lo) * 0.05, hi + (hi - lo) * 0.05];
    const time = st.xaxis === "time";
    const ser = [{label: time ? "wall time" : "step", value: (u, v) => v === null ? "–" : time ? duration(v, 1) : v}];
    labels.forEach((l, i) => {
      const c = COLOURS[i % COLOURS.length];
      ser.push({label: l, stroke: st.smooth ? c + "55" : c, width: st.smooth ? 1 : 1.5, points: {size: 4},
        value: (u, v) => v === null ? "–" : tick(v, Math.abs(v) / 1000)});
      if (st.smooth) ser.push({label: `${l} (EMA ${st.smooth})`, stroke: c, width: 2, points: {show: false},
        value: (u, v) => v === null ? "–" : tick(v, Math.abs(v) / 1000)});
    });
    // steps are whole numbers: integer tick spacings only; wall time in s, min or h
    const stepIncrs = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5];
    return {title, width, height, scales: {x: {time: false}, y: {range}}, series: ser,
      axes: [{size: 30, ...(time ? {} : {incrs: stepIncrs}), values: (u, splits, ax, space, incr) =>
        time ? splits.map((v) => duration(v, incr)) : ticks(splits, incr)},
      {size: 62, values: (u, splits, ax, space, incr) => ticks(splits, incr)}]};
  }

  function drawOne(key, el) {
    el.innerHTML = "";
    st.charts.set(key, new uPlot(opts(key, [key]), series(st.records, key), el));
  }

  function destroyAll() {
    for (const u of st.charts.values()) u.destroy();
    st.charts.clear();
  }

  function matches(key) {
    const q = st.query.trim().toLowerCase();
    return !q || q.split(/\s+/).every((w) => key.toLowerCase().includes(w));
  }

  // Draw the open sections' visible charts: the first FIRST now, the rest in batches (body[data-charts] says when)
  function drawOpen() {
    const generation = ++st.generation;
    const todo = [];
    document.querySelectorAll("#charts details.chart-group[open] .chart").forEach((el) => {
      if (!el.hidden && !st.charts.has(el.dataset.key)) todo.push(el);
    });
    todo.splice(0, FIRST).forEach((el) => drawOne(el.dataset.key, el));
    const done = () => {
      window.flywheelChartsDoneMs = performance.now();
      document.body.dataset.charts = "done";
    };
    document.body.dataset.charts = "drawing";
    const next = () => {
      if (generation !== st.generation) return;  // re-rendered meanwhile
      todo.splice(0, 6).forEach((el) => drawOne(el.dataset.key, el));
      if (todo.length) setTimeout(next, 0); else done();
    };
    if (todo.length) setTimeout(next, 0); else done();
  }

  // Sections, search and counts from scratch (a new run, or a new metric key)
  function render(root, records) {
    destroyAll();
    st.records = records;
    const groups = new Map();
    for (const k of keysOf(records)) {
      const g = sectionOf(k);
      if (!groups.has(g)) groups.set(g, []);
      groups.get(g).push(k);
    }
    const rank = (g) => ORDER.includes(g) ? ORDER.indexOf(g) : ORDER.length;
    const ordered = [...groups].sort(([a], [b]) => rank(a) - rank(b) || a.localeCompare(b));
    root.innerHTML = ordered.map(([g, keys]) => `<details class="chart-group" data-group="${R.esc(g)}"` +
      `${st.open.has(g) ? " open" : ""}><summary>${R.esc(g)} <span class="count">${keys.length}</span></summary>` +
      `<div class="charts">${keys.map((k) => `<div class="chart" data-key="${R.esc(k)}"></div>`).join("")}` +
      "</div></details>").join("") || "<p class='hint'>no metrics yet</p>";
    root.querySelectorAll("details.chart-group").forEach((d) => d.addEventListener("toggle", () => {
      if (d.open) st.open.add(d.dataset.group); else st.open.delete(d.dataset.group);
      if (d.open) drawOpen();
    }));
    filter(st.query);
  }

  // Show only charts whose name holds every word of `query`; sections with a match open, the others hide
  function filter(query) {
    st.query = query;
    let shown = 0, total = 0;
    document.querySelectorAll("#charts details.chart-group").forEach((d) => {
      let n = 0;
      d.querySelectorAll(".chart").forEach((el) => {
        el.hidden = !matches(el.dataset.key);
        n += !el.hidden;
      });
      d.hidden = n === 0;
      d.querySelector(".count").textContent = n === d.querySelectorAll(".chart").length ? `${n}` :
        `${n} of ${d.querySelectorAll(".chart").length}`;
      if (st.query.trim() && n) d.open = true;
      shown += n;
      total += d.querySelectorAll(".chart").length;
    });
    const count = document.querySelector("#chart-count");
    if (count) count.textContent = st.query.trim() ? `${shown} of ${total} metrics` : `${total} metrics`;
    drawOpen();
  }

  // Smoothing or the x axis changed: every drawn chart is built again (uPlot fixes its series at creation)
  function redraw() {
    destroyAll();
    document.querySelectorAll("#charts .chart").forEach((el) => { el.innerHTML = ""; });
    drawOpen();
  }

  // New records of the same keys: the drawn charts take the new data in place
  function append(records) {
    st.records = records;
    for (const [k, u] of st.charts) u.setData(series(records, k));
  }

  function setSmoothing(a) { st.smooth = a; redraw(); }
  function setAxis(x) { st.xaxis = x; redraw(); }
  function expandAll(open) {
    document.querySelectorAll("#charts details.chart-group").forEach((d) => { if (!d.hidden) d.open = open; });
  }

  return {keysOf, series, opts, tick, duration, render, filter, append, setSmoothing, setAxis, expandAll,
    state: st, charts: st.charts};
})();
