// The "Online" view of the dashboard: an online run's (`flywheel serve`) accept rate over time with its deploys
// and rollbacks marked, the history of deploys, rollbacks and gate rejections with their reasons, and traffic per
// served version. Data: /api/run/<name>/online (metrics/dashboard/online.py); app.js fetches it again whenever
// the event stream says the run's event log grew.
"use strict";

const FlywheelOnline = (() => {
  const R = FlywheelRollouts;
  const MARK = {deploy: "#2ca02c", rollback: "#d62728", gate_reject: "#ff7f0e", learner_reset: "#999999"};
  const LABEL = {deploy: "deploy", rollback: "rollback", gate_reject: "gate rejected", learner_reset: "learner reset"};
  const st = {chart: null, view: null};

  const when = (s) => s ? new Date(s * 1000).toISOString().replace("T", " ").slice(0, 19) : "–";
  const pct = (x) => x === null || x === undefined ? "–" : `${(100 * x).toFixed(1)} %`;

  // vertical lines at each deploy (green), rollback (red), gate rejection (orange, dashed), learner reset (grey)
  function markers(u) {
    const ctx = u.ctx, top = u.bbox.top, height = u.bbox.height;
    for (const h of (st.view ? st.view.history : [])) {
      const x = Math.round(u.valToPos(h.time_s, "x", true));
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
      ctx.save();
      ctx.strokeStyle = MARK[h.kind] || "#999999";
      ctx.lineWidth = 2 * devicePixelRatio;
      if (h.kind === "gate_reject" || h.kind === "learner_reset") ctx.setLineDash([5, 4]);
      ctx.beginPath();
      ctx.moveTo(x, top);
      ctx.lineTo(x, top + height);
      ctx.stroke();
      ctx.fillStyle = ctx.strokeStyle;
      ctx.font = `${11 * devicePixelRatio}px sans-serif`;
      if (h.version !== null) ctx.fillText(`v${h.version}`, x + 3, top + 12 * devicePixelRatio);
      ctx.restore();
    }
  }

  function chartData(v) {
    return [v.accept_series.time_s, v.accept_series.rate];
  }

  function xRange(u, lo, hi) {
    const times = (st.view ? st.view.history : []).map((h) => h.time_s).concat(lo === null ? [] : [lo, hi]);
    if (!times.length) return [0, 1];
    const a = Math.min(...times), b = Math.max(...times), pad = (b - a) * 0.03 || 5;
    return [a - pad, b + pad];
  }

  function drawChart(el, v) {
    if (st.chart && st.chart.root.parentNode === el) {
      st.chart.setData(chartData(v));  // setData redraws: the markers come with it
      return;
    }
    el.innerHTML = "";
    st.chart = new uPlot({
      width: 900, height: 260, scales: {x: {time: true, range: xRange}, y: {range: [0, 1]}},
      axes: [{}, {size: 50, values: (u, ticks) => ticks.map((t) => `${Math.round(100 * t)} %`)}],
      series: [{label: "time"}, {label: `accept rate (newest ${v.window} accept/reject)`, stroke: "#1f77b4",
        width: 1.5, points: {size: 4}, value: (u, x) => pct(x)}],
      hooks: {draw: [markers]},
    }, chartData(v), el);
  }

  function tiles(v) {
    const t = [["serving version", v.deployed_version === null ? "–" : `v${v.deployed_version}`, "deployed_version"],
      ["live accept rate", pct(v.live_accept_rate), "live_accept_rate", `over the newest ${v.window} accept/reject`],
      ["accept rate (all feedback)", pct(v.accept_rate_all), "accept_rate_all"],
      ["completions served", v.num_completions, "num_completions"], ["feedback events", v.num_feedback, "num_feedback"],
      ["deploys", v.num_deploys, "num_deploys"], ["rollbacks", v.num_rollbacks, "num_rollbacks"],
      ["gate rejections", v.num_gate_rejects, "num_gate_rejects"]];
    return t.map(([label, value, key, title]) => `<div class="tile" data-key="${key}" title="${R.esc(title || "")}">` +
      `<div class="label">${R.esc(label)}` +
      `</div><div class="value">${R.esc(String(value))}</div></div>`).join("");
  }

  function gateCell(g) {
    if (!g) return "";
    const parts = [];
    if ("wins" in g) parts.push(`won ${g.wins}, lost ${g.losses}`);
    if (typeof g.p_worse === "number") parts.push(`p_worse ${g.p_worse.toPrecision(2)}`);
    if (typeof g.mean_delta === "number") parts.push(`mean Δ ${R.fmt(g.mean_delta)}`);
    if ("num_prompts" in g) parts.push(`${g.num_prompts} prompts`);
    return parts.join(" · ");
  }

  function historyTable(v) {
    if (!v.history.length) return "<p class='hint'>no deploy yet</p>";
    const rows = [...v.history].reverse().map((h) => `<tr class="online-event ${h.kind}" data-kind="${h.kind}" ` +
      `data-version="${h.version}"><td>${when(h.time_s)}</td><td>${LABEL[h.kind] || R.esc(h.kind)}</td>` +
      `<td>${h.version === null ? "" : "v" + h.version}</td>` +
      `<td>${h.from_version === null || h.from_version === undefined ? "" : "v" + h.from_version}</td>` +
      `<td class="reason">${R.esc(h.reason)}</td><td>${R.esc(gateCell(h.gate))}</td></tr>`);
    return "<table class='online-history'><tr><th>time (UTC)</th><th>event</th><th>version</th><th>from</th>" +
      "<th>reason</th><th>gate</th></tr>" + rows.join("") + "</table>";
  }

  function versionsTable(v) {
    const rows = Object.entries(v.versions);
    if (!rows.length) return "<p class='hint'>nothing served yet</p>";
    return "<table class='online-versions'><tr><th>version</th><th>completions</th><th>feedback</th><th>accept</th>" +
      "<th>reject</th><th>accept rate</th><th>other signals</th></tr>" + rows.map(([ver, s]) => {
      const other = Object.entries(s.signals).filter(([k]) => k !== "accept" && k !== "reject")
        .map(([k, n]) => `${k} ${n}`).join(", ");
      const now = String(v.deployed_version) === ver ? " <b title='serving now'>● serving</b>" : "";
      return `<tr data-version="${ver}"><td>v${ver}${now}</td><td>${s.completions}</td><td>${s.feedback}</td>` +
        `<td>${s.accepts}</td><td>${s.rejects}</td><td>${pct(s.accept_rate)}</td><td>${R.esc(other)}</td></tr>`;
    }).join("") + "</table>";
  }

  // Draw the whole view from one /api/run/<name>/online answer (the tables are small; the chart is updated in place).
  function render(root, v) {
    st.view = v;
    root.querySelector("#online-title").textContent = `online run · event log ${v.db}`;
    root.querySelector("#online-tiles").innerHTML = tiles(v);
    drawChart(root.querySelector("#online-chart"), v);
    root.querySelector("#online-legend").innerHTML = Object.entries(MARK).map(([k, c]) =>
      `<span style="color:${c}">▮</span> ${LABEL[k]}`).join(" &nbsp; ") +
      ` — accept rate: share of accept among accept and reject feedback over the newest ${v.window} such events`;
    root.querySelector("#online-history").innerHTML = historyTable(v);
    root.querySelector("#online-versions").innerHTML = versionsTable(v);
    document.querySelector("#live-step").textContent = v.deployed_version === null ? "" :
      `serving v${v.deployed_version} · ${v.num_completions} completions · ${v.num_feedback} feedback`;
    document.body.dataset.online = `${v.num_feedback}:${v.history.length}`;
  }

  function forget() {
    if (st.chart) st.chart.destroy();
    st.chart = null;
    st.view = null;
  }

  return {render, forget, state: st};
})();
