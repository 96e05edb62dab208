// The rollout browser's views: a list of rollouts, one transcript, a GRPO group side by side.
// Used by the live dashboard (app.js fetches the data from /api) and inlined into the static report
// (metrics/report.py embeds a sample of transcripts). Pure rendering: data in, DOM out.
"use strict";

const FlywheelRollouts = (() => {
  const esc = (s) => String(s ?? "").replace(/[&<>"']/g,
    (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  const fmt = (x, d = 3) => (x === null || x === undefined) ? "–" :
    (typeof x === "number" ? (Number.isInteger(x) ? String(x) : x.toFixed(d)) : esc(x));

  function listTable(rows, onOpen, onGroup) {
    const table = document.createElement("table");
    table.className = "rollouts";
    // compact headers (their full meaning in the title) so every column fits half of a 1,400 px window
    const head = [["#", "row id"], ["task", "task id"], ["bucket", "task bucket"], ["ver", "weight version that sampled it"],
      ["reward", "reward"], ["tests", "hidden tests passed / total"], ["turns", "turns"],
      ["calls", "tool calls (unusable ones)"], ["tokens", "sampled tokens"], ["flags", "anti-cheat flags"],
      ["group", "the GRPO group side by side"]];
    table.innerHTML = "<thead><tr>" + head.map(([h, t]) => `<th title="${t}">${h}</th>`).join("") + "</tr></thead>";
    const body = document.createElement("tbody");
    for (const r of rows) {
      const tr = document.createElement("tr");
      tr.className = "rollout-row" + (r.passed ? " passed" : "") + (r.flags.length ? " flagged" : "");
      tr.dataset.id = r.id;
      tr.innerHTML = `<td>${r.id}</td><td class="task" title="${esc(r.task)}">${esc(r.task)}</td>` +
        `<td class="bucket" title="${esc(r.bucket)}">${esc(r.bucket)}</td><td>${r.version}</td>` +
        `<td class="num">${r.env_failure ? "env failure" : fmt(r.reward)}</td>` +
        `<td>${r.tests_passed}/${r.tests_total}</td><td>${r.turns}</td>` +
        `<td>${r.tool_calls} (${r.tool_errors})</td><td>${r.sampled_tokens}</td>` +
        `<td class="flags">${r.flags.map((f) => `<span class="flag">${esc(f)}</span>`).join(" ")}</td>` +
        `<td><a href="#" class="group-link" title="the whole group side by side">side by side</a></td>`;
      tr.addEventListener("click", (ev) => {
        ev.preventDefault();
        if (ev.target.classList.contains("group-link")) onGroup(r.group); else onOpen(r.id);
      });
      body.appendChild(tr);
    }
    table.appendChild(body);
    return table;
  }

  function verdict(reward, envFailure, compact = false) {
    if (envFailure) return `<div class="verdict env-failure">environment failure: ${esc(envFailure)}</div>`;
    if (!reward) return `<div class="verdict">not graded</div>`;
    const tests = Object.entries(reward.tests || {});
    const passed = tests.filter(([, v]) => v === "passed").length;
    const comps = Object.entries(reward.components || {}).map(([k, v]) => `${esc(k)} ${fmt(v)}`).join(", ");
    return `<div class="verdict"><span class="reward">reward ${fmt(reward.value)}</span> ` +
      `<span>hidden tests ${passed}/${tests.length} passed</span> <span class="components">${comps}</span> ` +
      (reward.flags || []).map((f) => `<span class="flag">${esc(f)}</span>`).join(" ") +
      (compact ? "</div>" : `<table class="tests">${tests.map(([id, v]) =>
        `<tr class="test ${esc(v)}"><td>${esc(id)}</td><td>${esc(v)}</td></tr>`).join("")}</table></div>`);
  }

  // how far a |Δ log p| is along the mismatch scale: 0 at 0 (and below 1e-7), 1 at 0.1 and above (log scale)
  function mismatchLevel(d) {
    const a = Math.abs(d);
    return a <= 1e-7 ? 0 : Math.min(1, Math.max(0, (Math.log10(a) + 7) / 6));
  }

  // colour of a sampled token: by probability (red = unlikely), by the weight version that sampled it, or by the
  // train–inference mismatch |Δ log p| (trainer − sampler; white = none, red = 0.1 or more; grey = not recomputed)
  function tokenStyle(tok, mode, maxVersion) {
    const [, lp, version, dlp] = tok;
    if (lp === null) return "background:#eee";
    if (mode === "mismatch") {
      if (dlp === undefined || dlp === null) return "background:#eee";
      const s = mismatchLevel(dlp);
      return `background:hsl(${Math.round(50 - 50 * s)},90%,${Math.round(97 - 37 * s)}%)`;
    }
    if (mode === "logprob") {
      const p = Math.exp(lp);
      return `background:hsl(${Math.round(120 * p)},80%,${Math.round(75 + 15 * p)}%)`;
    }
    if (mode === "version") {
      const age = Math.max(0, maxVersion - version);
      return `background:hsl(210,70%,${Math.max(55, 92 - 8 * age)}%)`;
    }
    return "";
  }

  function turnBody(turn, mode, maxVersion) {
    if (mode !== "text" && turn.tokens) {
      return `<pre class="text tokens">${turn.tokens.map((t) =>
        `<span style="${tokenStyle(t, mode, maxVersion)}" title="${t[1] === null ? "not sampled" :
          `log p ${t[1]}, version ${t[2]}` + (t.length > 3 && t[3] !== null ? `, Δ log p ${t[3]}` : "")}"` +
        `${t.length > 3 && t[3] !== null ? ` data-dlogp="${t[3]}"` : ""}>${esc(t[0])}</span>`).join("")}</pre>`;
    }
    return `<pre class="text">${esc(turn.text)}${turn.truncated ? "\n[… cut in this view …]" : ""}</pre>`;
  }

  function turnHtml(turn, mode, maxVersion) {
    let calls = "";
    for (const c of turn.tool_calls || []) {
      calls += `<div class="tool-call"><b>${esc(c.name)}</b> <code>${esc(JSON.stringify(c.arguments))}</code></div>`;
    }
    for (const e of turn.tool_errors || []) {
      calls += `<div class="tool-call error"><b>unusable call (${esc(e.kind)})</b> ${esc(e.message)}</div>`;
    }
    const stats = (turn.num_sampled ? ` · ${turn.num_sampled} sampled tokens, mean log p ${fmt(turn.mean_logprob)}` : "") +
      (turn.max_abs_dlogp !== undefined ? ` · max |Δ log p| ${turn.max_abs_dlogp === 0 ? "0" :
        turn.max_abs_dlogp.toExponential(1)}` : "");
    return `<div class="turn ${esc(turn.role)}"><div class="role">${esc(turn.role)}${stats}</div>` +
      turnBody(turn, mode, maxVersion) + calls + "</div>";
  }

  function transcript(container, view, mode = "text") {
    const maxVersion = Math.max(0, ...view.segments.flatMap((s) => s.turns.flatMap(
      (t) => (t.tokens || []).map((x) => x[2]))));
    const meta = Object.entries(view.meta || {}).map(([k, v]) => `${esc(k)}: ${esc(JSON.stringify(v))}`).join(" · ");
    let html = `<div class="transcript" data-id="${view.id}"><h3>${esc(view.task)} <small>${esc(view.group)}</small></h3>` +
      verdict(view.reward, view.env_failure) +
      `<div class="meta">turns ${view.num_turns} · tool calls ${view.num_tool_calls} (errors ${view.num_tool_errors})` +
      ` · first sampled by version ${view.min_version} · ${meta}</div>` +
      (maxVersion >= 0 && view.segments.some((s) => s.turns.some((t) => t.tokens)) ?
        `<label>colour tokens <select class="colour-mode">` +
        ["text", "logprob", "version", ...(view.trainer_step != null ? ["mismatch"] : [])].map((m) =>
          `<option value="${m}"${m === mode ? " selected" : ""}>${{text: "plain text", logprob: "by sampler probability",
            version: "by weight version", mismatch: "by train–inference mismatch |Δ log p|"}[m]}</option>`).join("") +
        `</select></label> <span class="hint">${view.trainer_step != null ?
          `Δ log p = trainer − sampler, recomputed at trainer step ${view.trainer_step} (white 0, red ≥ 0.1, log scale)` :
          "no trainer log-probs for this rollout: the trainer writes them for metrics.trainer_logprobs_per_step " +
          "trajectories of each batch"}</span>`
        : "");
    for (const seg of view.segments) {
      if (seg.after_summary) {
        html += `<div class="segment-mark">segment ${seg.index}: context rebuilt from the self-summary</div>`;
      }
      html += seg.turns.map((t) => turnHtml(t, mode, maxVersion)).join("");
    }
    const note = view.diff_note ? `<p class="hint">${esc(view.diff_note)}</p>` : "";
    html += "<h4>Final diff</h4>" + (typeof view.diff !== "string" ? note || "<p class='hint'>not available</p>" :
      (view.diff ? `<pre class="diff">${esc(view.diff)}</pre>` : "<p class='hint'>no change to the task's files</p>")
      + note);
    container.innerHTML = html + "</div>";
    const select = container.querySelector(".colour-mode");
    if (select) select.addEventListener("change", (ev) => transcript(container, view, ev.target.value));
  }

  function group(container, data) {
    const cols = data.members.map((m) => {
      const turns = m.turns.map((t) => turnHtml(t, "text", 0)).join("");
      return `<div class="member" data-id="${m.id}"><h4>#${m.id}</h4>${verdict(m.reward, m.env_failure, true)}${turns}</div>`;
    }).join("");
    container.innerHTML = `<div class="group-view"><h3>group ${esc(data.group)} · ${data.members.length} rollouts</h3>` +
      `<div class="members">${cols}</div></div>`;
  }

  return {esc, fmt, listTable, transcript, group};
})();
