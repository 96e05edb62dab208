// The live dashboard page: overview (tiles, per-bucket table, a chart per metric), the rollout browser, and
// run comparison. Data comes from the read-only JSON API (server.py); /api/events pushes what each run appends,
// which is added to the charts in place. Charts are uPlot (vendored); sparklines are plain SVG. An online run
// (`flywheel serve`: an event log, online.db) gets the "Online" view (online.js), refreshed when its log grows.
"use strict";

const R = FlywheelRollouts;
const state = {runs: [], run: null, detail: null, charts: FlywheelCharts.charts, view: "overview", compare: new Set(),
  connected: false, rollout: null, group: null};
const $ = (sel) => document.querySelector(sel);

// Headline tiles, after the held-out result: the first key present in the run is shown (label, keys, scale, unit).
// Reward and pass rate are one tile when they are the same series (a 0/1 reward: every solved rollout scores 1).
const REWARD_KEYS = ["rollout/reward_all", "reward/mean"], PASS_KEYS = ["rollout/pass_rate_all", "rollout/pass_rate"];
const TILES = [
  ["mean reward (all rollouts)", REWARD_KEYS, 1, ""],
  ["solved: every hidden test passed (all rollouts)", PASS_KEYS, 1, ""],
  ["staleness mean", ["staleness/mean"], 1, " versions"],
  ["staleness max", ["staleness/max"], 1, " versions"],
  ["mismatch k3", ["mismatch/k3"], 1, ""],
  ["max |Δ log p|", ["mismatch/max_abs_diff"], 1, ""],
  ["clip fraction", ["clip_frac"], 1, ""],
  ["policy entropy", ["entropy", "policy/entropy"], 1, " nats"],
  ["tokens/s (sampled)", ["throughput/tokens_per_s_k"], 1000, ""],
  ["trainer tokens/s", ["tokens_per_s"], 1, ""],
  ["trainer busy", ["trainer/busy"], 1, ""],
  ["engine busy", ["engine/busy"], 1, ""],
  ["weight sync MB", ["weights/bytes_mb"], 1, " MB"],
  ["weight fetch+apply", ["weights/apply_ms"], 1, " ms"],
  ["engine pause", ["weights/pause_ms"], 1, " ms"],
  ["tool errors / rollout", ["rollout/tool_errors"], 1, ""],
  ["env failures", ["buffer/env_failures"], 1, ""],
  ["sandbox start-up p50", ["sandbox/startup_ms_p50"], 1, " ms"],
  ["sandbox start failures", ["sandbox/failures"], 1, ""],
  ["sandbox leaks", ["sandbox/leaks"], 1, ""],
  ["anti-cheat flags", ["flags/total"], 1, ""],
];
// and every key about sandboxes, timeouts, truncation, failures, leaks, or a flag kind
const EXTRA_TILE = /^(sandbox\/|flags\/(?!total))|timeout|trunc|fail|leak/;

async function api(path) {
  const resp = await fetch(path);
  const data = await resp.json().catch(() => ({error: `${path}: HTTP ${resp.status}, not JSON`}));
  if (!resp.ok || data.error) throw new Error(data.error || `${path}: HTTP ${resp.status}`);
  return data;
}

function banner(notes) {
  const el = $("#banner");
  el.hidden = !notes.length;
  el.innerHTML = notes.map((n) => `<div>${R.esc(n)}</div>`).join("");
}

function stepOf(rec, i) { return typeof rec.step === "number" ? rec.step : i; }

function keysOf(records) {
  const keys = new Set();
  for (const r of records) for (const [k, v] of Object.entries(r)) {
    if (typeof v === "number" && k !== "step" && k !== "time") keys.add(k);
  }
  return [...keys].sort();
}

function series(records, key) {
  const xs = [], ys = [];
  records.forEach((r, i) => { if (typeof r[key] === "number") { xs.push(stepOf(r, i)); ys.push(r[key]); } });
  return [xs, ys];
}

function spark(ys) {
  if (ys.length < 2) return "";
  const lo = Math.min(...ys), hi = Math.max(...ys), span = hi - lo || 1;
  const pts = ys.map((y, i) => `${(i / (ys.length - 1) * 100).toFixed(1)},${(28 - (y - lo) / span * 26).toFixed(1)}`);
  return `<svg viewBox="0 0 100 30" preserveAspectRatio="none"><polyline points="${pts.join(" ")}"/></svg>`;
}

// a tile's number: whole numbers as they are, tiny ones (a mismatch of 3e-6) in exponent form, else 3 decimals
function tileValue(x) {
  if (x === null) return "–";
  const a = Math.abs(x);
  return a > 0 && a < 1e-3 ? x.toExponential(2) : R.fmt(x, a >= 100 ? 0 : 3);
}

// The first tile: held-out pass@1 before → after RL, with the paired standard error of the gain when the job wrote it
function heldoutTile(h) {
  if (!h || typeof h.pass1_before !== "number") return "";
  const after = typeof h.pass1_after === "number";
  const gain = after ? h.pass1_after - h.pass1_before : null;
  const sub = after ? `gain ${gain >= 0 ? "+" : ""}${R.fmt(gain)}` + (typeof h.pass1_gain_se === "number" ?
    ` ± ${R.fmt(h.pass1_gain_se)} SE (paired over tasks)` : "") : "after: not evaluated yet";
  return `<div class="tile heldout" data-key="heldout" title="held-out pass@1 before and after RL (${R.esc(h.source)})">` +
    `<div class="label">held-out pass@1, before → after RL</div>` +
    `<div class="value">${R.fmt(h.pass1_before)} → ${after ? R.fmt(h.pass1_after) : "…"}</div>` +
    `<div class="sub">${R.esc(sub)}</div></div>`;
}

function sameSeries(records, a, b) {
  const ya = series(records, a)[1], yb = series(records, b)[1];
  return ya.length === yb.length && ya.every((y, i) => y === yb[i]);
}

function renderTiles(records) {
  const keys = keysOf(records);
  const tiles = [];
  const used = new Set();
  const reward = REWARD_KEYS.find((k) => keys.includes(k)), pass = PASS_KEYS.find((k) => keys.includes(k));
  const merged = reward && pass && sameSeries(records, reward, pass);
  for (const [label, cands, scale, unit] of TILES) {
    const key = cands.find((k) => keys.includes(k));
    if (!key) continue;
    if (merged && key === pass) { used.add(key); continue; }
    tiles.push([merged && key === reward ? "reward = pass rate (all rollouts)" : label, key, scale, unit,
      merged && key === reward ? `${reward} and ${pass} are the same series: the reward is 0 or 1 (solved or not)` :
        key]);
    used.add(key);
  }
  for (const k of keys) if (EXTRA_TILE.test(k) && !used.has(k)) tiles.push([k, k, 1, "", k]);
  $("#tiles").innerHTML = heldoutTile(state.detail && state.detail.heldout) + tiles.map(([label, key, scale, unit, title]) => {
    const ys = series(records, key)[1].map((y) => y * scale);
    const last = ys.length ? ys[ys.length - 1] : null;
    return `<div class="tile" data-key="${R.esc(key)}" title="${R.esc(title)}"><div class="label">${R.esc(label)}</div>` +
      `<div class="value">${tileValue(last)}${unit}</div>` +
      `${spark(ys.slice(-60))}</div>`;
  }).join("") || "<p class='hint'>no metrics yet</p>";
}

const HEALTH = [["env_failure_rate", "env failures"], ["unsubmitted_rate", "not submitted"],
  ["max_turns_rate", "hit the turn limit"], ["context_full_rate", "hit the context limit"],
  ["tool_error_rate", "with an unusable tool call"]];

// How sessions ended, over every rollout the run recorded (errors, timeouts and truncation)
function renderHealth(health) {
  $("#health").innerHTML = HEALTH.filter(([k]) => k in (health || {})).map(([k, label]) =>
    `<div class="tile" data-key="${k}"><div class="label">${R.esc(label)}</div>` +
    `<div class="value">${(100 * health[k]).toFixed(1)} %</div></div>`).join("");
}

function renderBuckets(buckets) {
  const rows = Object.entries(buckets || {});
  $("#buckets").innerHTML = rows.length ? "<table class='buckets'><tr><th>bucket</th><th>rollouts</th>" +
    "<th>mean reward</th><th>pass@1</th><th>pass@group (≥1 of the group)</th></tr>" +
    rows.map(([b, s]) => `<tr><td>${R.esc(b)}</td><td>${s.rollouts}</td><td>${R.fmt(s.reward)}</td>` +
      `<td>${R.fmt(s.pass1)}</td><td>${R.fmt(s.pass_group)}</td></tr>`).join("") + "</table>"
    : "<p class='hint'>no rollouts recorded yet</p>";
}

function chartOpts(title, labels, width = 330) { return FlywheelCharts.opts(title, labels, width); }

// Charts are drawn when the overview is on screen (a page opened on the rollouts skips every chart).
function drawChartsIfShown() {
  if (state.view !== "overview" || !state.detail) return;
  if (state.chartsStale) FlywheelCharts.render($("#charts"), state.detail.records);
  state.chartsStale = false;
}

function appendRecords(records) {
  const all = state.detail.records;
  const before = keysOf(all).join();
  all.push(...records);
  renderTiles(all);
  if (keysOf(all).join() !== before || state.chartsStale) {
    state.chartsStale = true;
    drawChartsIfShown();
  } else FlywheelCharts.append(all);
  showStep();
}

// The badge: "live" only while the event stream is up and the run is still being written; a run whose summary
// holds its RL result is "finished", one interrupted, halted or silent for a while "stopped" (server.py's state)
function showBadge() {
  const el = $("#live");
  const st = (state.detail && state.detail.state) || {};
  const [text, cls] = !state.connected ? ["○ reconnecting", ""] : !state.detail ? ["● connected", "on"] :
    st.state === "finished" ? ["✓ finished", "done"] : st.state === "stopped" ? ["■ stopped", "stopped"] :
      st.state === "waiting" ? ["○ waiting for data", ""] : ["● live", "on"];
  el.textContent = text;
  el.className = cls;
  el.dataset.state = st.state || "";
  el.title = st.why || (cls === "on" ? "the run is being written; updates arrive by server-sent events" : "");
}

function showStep() {
  const d = state.detail;
  if (d && d.online && !d.records.length && !d.num_rollouts) return;  // a serving run: online.js says what serves
  $("#live-step").textContent = d ? `step ${d.records.length ? stepOf(d.records.at(-1), d.records.length - 1) : "–"}` +
    (d.num_steps ? ` of ${d.num_steps}` : "") + ` · ${d.num_rollouts} rollouts` : "";
}

function renderSummary(d) {
  const s = d.summary || {};
  const parts = [];
  if (s.rl) parts.push(`RL: ${s.rl.steps} steps in ${R.fmt(s.rl.wall_s, 0)} s, trainer busy ${R.fmt(s.rl.trainer_busy, 2)}`);
  const cfg = d.config || {};
  if (cfg.orchestrator) parts.push(`mode ${cfg.orchestrator.mode}, max staleness ${cfg.orchestrator.max_staleness}`);
  if (cfg.model) parts.push(`model ${cfg.model.path || cfg.model.preset}`);
  $("#summary").innerHTML = parts.map((p) => `<span>${R.esc(p)}</span>`).join(" · ");
}

// ---------------------------------------------------------------------------------------------- deep links

// The address says what is on screen: #run=NAME&view=VIEW[&rollout=ID][&group=GID]. It is written as the user
// opens a run, a view, a transcript or a group, and read when the page loads (or the address is edited).
const readHash = () => new URLSearchParams(location.hash.slice(1));

function writeHash() {
  const p = new URLSearchParams();
  if (state.run) p.set("run", state.run);
  p.set("view", state.view);
  if (state.view === "rollouts" && state.rollout !== null) p.set("rollout", String(state.rollout));
  if (state.view === "rollouts" && state.group !== null) p.set("group", state.group);  // shown over the transcript
  const hash = `#${p}`;
  if (location.hash !== hash) history.replaceState(null, "", hash);
}

// What the address asked for beyond run and view, once the run's rollouts are listed
async function restoreDetail(asked) {
  if (!asked || state.view !== "rollouts") return;
  if (asked.get("rollout") !== null && asked.get("rollout") !== "") await openRollout(Number(asked.get("rollout")));
  if (asked.get("group")) await openGroup(asked.get("group"));
}

async function loadRun(name, asked = null) {
  if (state.run !== name) { state.rollout = null; state.group = null; closeGroup(false); }
  state.run = name;
  try {
    state.detail = await api(`api/run/${encodeURIComponent(name)}`);
  } catch (err) {
    banner([`run ${name}: ${err.message}`]);
    return;
  }
  const d = state.detail;
  banner(d.notes);
  showBadge();
  $("#nav-online").hidden = !d.online;
  FlywheelOnline.forget();
  if (d.online) {
    await loadOnline();
    // a serving run has no trainer metrics: open on its online view unless the address asked for another
    if (!d.records.length && state.view === "overview" && !(asked && asked.get("view"))) show("online");
  } else if (state.view === "online") show("overview");
  $("#run-title").textContent = `run ${name}`;
  renderSummary(d);
  renderTiles(d.records);
  renderBuckets(d.buckets);
  renderHealth(d.health);
  state.chartsStale = true;
  drawChartsIfShown();
  showStep();
  const form = $("#filters");
  form.bucket.innerHTML = "<option value=''>any</option>" +
    d.facets.buckets.map((b) => `<option>${R.esc(b)}</option>`).join("");
  form.flag.innerHTML = "<option value=''>any or none</option><option value='any'>some flag</option>" +
    d.facets.flags.map((f) => `<option>${R.esc(f)}</option>`).join("");
  if (state.view === "rollouts") await listRollouts();
  writeHash();
  await restoreDetail(asked);
}

// ---------------------------------------------------------------------------------------------- rollouts

async function listRollouts() {
  const params = new URLSearchParams();
  for (const [k, v] of new FormData($("#filters"))) if (v !== "") params.set(k, v);
  params.set("limit", "200");
  let data;
  try {
    data = await api(`api/run/${encodeURIComponent(state.run)}/rollouts?${params}`);
  } catch (err) {
    $("#rollout-count").textContent = err.message;
    return;
  }
  $("#rollout-count").textContent = `${data.total} rollouts match` + (data.total > data.rows.length ?
    ` (the first ${data.rows.length} shown)` : "");
  const list = $("#rollout-list");
  list.innerHTML = "";
  list.appendChild(R.listTable(data.rows, openRollout, openGroup));
}

async function openRollout(id) {
  const el = $("#rollout-detail");
  closeGroup(false);
  state.rollout = id;
  state.group = null;
  writeHash();
  document.querySelectorAll("tr.rollout-row.open").forEach((tr) => tr.classList.remove("open"));
  const row = document.querySelector(`tr.rollout-row[data-id="${id}"]`);
  if (row) row.classList.add("open");
  el.innerHTML = "<p class='hint'>loading…</p>";
  try {
    R.transcript(el, await api(`api/run/${encodeURIComponent(state.run)}/rollout/${id}`));
  } catch (err) {
    el.innerHTML = `<p class="error">${R.esc(err.message)}</p>`;
  }
}

// A group takes the whole width (the list steps aside): its members wrap in a grid, each scrolling on its own
async function openGroup(gid) {
  const el = $("#rollout-detail");
  state.group = gid;
  writeHash();
  $("#rollout-split").classList.add("group-open");
  try {
    R.group(el, await api(`api/run/${encodeURIComponent(state.run)}/group?id=${encodeURIComponent(gid)}`));
    const back = document.createElement("button");
    back.className = "back";
    back.textContent = "← back to the list";
    back.addEventListener("click", () => closeGroup(true));
    el.prepend(back);
  } catch (err) {
    el.innerHTML = `<p class="error">${R.esc(err.message)}</p>`;
  }
}

function closeGroup(rewrite) {
  $("#rollout-split").classList.remove("group-open");
  if (!rewrite) return;
  state.group = null;
  $("#rollout-detail").innerHTML = "<p class='hint'>Pick a rollout to read its transcript.</p>";
  if (state.rollout !== null) openRollout(state.rollout); else writeHash();
}

// ---------------------------------------------------------------------------------------------- online

async function loadOnline() {
  const name = state.run;
  try {
    const view = await api(`api/run/${encodeURIComponent(name)}/online`);
    if (name === state.run) FlywheelOnline.render($("#view-online"), view);
  } catch (err) {
    banner([`run ${name}: ${err.message}`]);
  }
}

// ---------------------------------------------------------------------------------------------- compare

async function renderCompare() {
  const box = $("#compare-runs");
  if (!state.compare.size) state.runs.forEach((r) => state.compare.add(r.name));
  box.innerHTML = state.runs.map((r) => `<label><input type="checkbox" value="${R.esc(r.name)}"` +
    `${state.compare.has(r.name) ? " checked" : ""}> ${R.esc(r.name)}</label>`).join(" ");
  box.querySelectorAll("input").forEach((cb) => cb.addEventListener("change", () => {
    cb.checked ? state.compare.add(cb.value) : state.compare.delete(cb.value);
    renderCompare();
  }));
  const details = [];
  for (const name of state.compare) {
    try { details.push(await api(`api/run/${encodeURIComponent(name)}`)); } catch (err) { banner([err.message]); }
  }
  const keys = [...new Set(details.flatMap((d) => keysOf(d.records)))];
  const sel = $("#compare-key");
  const chosen = sel.value || (keys.includes("rollout/reward_all") ? "rollout/reward_all" : keys[0]);
  sel.innerHTML = keys.map((k) => `<option${k === chosen ? " selected" : ""}>${R.esc(k)}</option>`).join("");
  const steps = [...new Set(details.flatMap((d) => series(d.records, chosen)[0]))].sort((a, b) => a - b);
  const data = [steps, ...details.map((d) => {
    const [xs, ys] = series(d.records, chosen);
    const at = new Map(xs.map((x, i) => [x, ys[i]]));
    return steps.map((s) => at.has(s) ? at.get(s) : null);
  })];
  const el = $("#compare-chart");
  el.innerHTML = "";
  if (chosen) new uPlot({...chartOpts(chosen, details.map((d) => d.name), 700), height: 300}, data, el);
  const kinds = [...new Set(details.flatMap((d) => Object.values(d.evals || {}).flatMap((e) => Object.keys(e))))];
  $("#compare-evals").innerHTML = kinds.length ? "<table><tr><th>run</th><th>eval</th>" +
    kinds.map((k) => `<th>${R.esc(k)}</th>`).join("") + "</tr>" + details.flatMap((d) =>
    Object.entries(d.evals || {}).map(([e, byKind]) => `<tr><td>${R.esc(d.name)}</td><td>${R.esc(e)}</td>` +
      kinds.map((k) => `<td>${byKind[k] ? `${R.fmt(byKind[k].pass1)} (${byKind[k].num_tasks} tasks)` : "–"}</td>`)
        .join("") + "</tr>")).join("") + "</table>" : "<p class='hint'>no held-out evaluations in these runs</p>";
}

// ---------------------------------------------------------------------------------------------- shell

function show(view) {
  state.view = view;
  writeHash();
  for (const v of ["overview", "rollouts", "compare", "online"]) $(`#view-${v}`).hidden = v !== view;
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.view === view));
  if (view === "overview") drawChartsIfShown();
  if (view === "rollouts" && state.run) listRollouts();
  if (view === "compare") renderCompare();
}

function connect() {
  const es = new EventSource("api/events");
  es.onopen = () => { state.connected = true; showBadge(); };
  es.onerror = () => { state.connected = false; showBadge(); };
  es.addEventListener("update", async (msg) => {
    const ev = JSON.parse(msg.data);
    if (ev.new_run || !state.run) return loadRuns();
    if (ev.run !== state.run || !state.detail) return;
    if (ev.files_changed) return loadRun(state.run);
    banner(ev.notes || []);
    if (ev.state) { state.detail.state = ev.state; showBadge(); }
    if (ev.online) loadOnline();
    state.detail.num_rollouts = ev.num_rollouts;
    // `first`: the index of the event's first record; the page may already hold some (it fetched the run after
    // the server read them) or have missed some (then it fetches the run again)
    const have = state.detail.records.length;
    if (ev.first > have) return loadRun(state.run);
    const fresh = (ev.records || []).slice(have - ev.first);
    if (fresh.length) appendRecords(fresh); else showStep();
  });
}

async function loadRuns() {
  let data;
  try {
    data = await api("api/runs");
  } catch (err) {
    banner([`the dashboard server did not answer: ${err.message}`]);
    return;
  }
  state.runs = data.runs;
  if (!data.runs.length) {
    banner([`no run directories under ${data.root} yet (a run directory holds metrics.jsonl, config.json, ` +
      "trajectories/ or online.db); this page updates when one appears"]);
    return;
  }
  const sel = $("#run-select");
  const asked = state.asked;
  state.asked = null;
  const wanted = asked && asked.get("run");
  const name = state.run || (data.runs.find((r) => r.name === wanted) || data.runs[0]).name;
  sel.innerHTML = data.runs.map((r) => `<option${r.name === name ? " selected" : ""}>${R.esc(r.name)}</option>`).join("");
  await loadRun(name, asked);
}

document.querySelectorAll("nav a").forEach((a) => a.addEventListener("click", (ev) => {
  ev.preventDefault();
  show(a.dataset.view);
}));
$("#run-select").addEventListener("change", (ev) => loadRun(ev.target.value));
$("#filters").addEventListener("submit", (ev) => { ev.preventDefault(); listRollouts(); });
$("#compare-key").addEventListener("change", renderCompare);
$("#chart-search").addEventListener("input", (ev) => FlywheelCharts.filter(ev.target.value));
let smoothTimer = null;
$("#smooth").addEventListener("input", (ev) => {
  $("#smooth-value").textContent = Number(ev.target.value).toFixed(2);
  clearTimeout(smoothTimer);
  smoothTimer = setTimeout(() => FlywheelCharts.setSmoothing(Number(ev.target.value)), 120);
});
$("#x-axis").addEventListener("change", (ev) => FlywheelCharts.setAxis(ev.target.value));
$("#expand-all").addEventListener("click", () => FlywheelCharts.expandAll(true));
$("#collapse-all").addEventListener("click", () => FlywheelCharts.expandAll(false));
window.addEventListener("hashchange", () => {  // an address edited or pasted into this tab
  const asked = readHash();
  if (asked.get("view") && asked.get("view") !== state.view) show(asked.get("view"));
  if (asked.get("run") && asked.get("run") !== state.run) loadRun(asked.get("run"), asked);
  else restoreDetail(asked);
});
state.asked = readHash();
show(state.asked.get("view") || "overview");
loadRuns().then(() => {  // the moment the page shows its data (the benchmark's first paint)
  window.flywheelReadyMs = performance.now();
  document.body.dataset.ready = "1";
});
connect();
