// Glue between the report's JSON and Plotly / the DOM. The data and its meaning live in Python
// (envhub/report/data.py); this script only draws it.
"use strict";
const REPORT = JSON.parse(document.getElementById("report-data").textContent);
const parsed = {}; // step key -> block, parsed the first time the step is chosen

function stepData(key) {
  if (!(key in parsed)) {
    parsed[key] = JSON.parse(document.getElementById("step-data-" + key).textContent);
  }
  return parsed[key];
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c);
  return node;
}

function drawHeader() {
  const config = REPORT.config || {};
  document.getElementById("title").textContent = REPORT.name;
  const envs = (config.envs || []).map((e) => e.name).join(", ");
  const model = (config.model && config.model.name) || config.model || "";
  document.getElementById("subtitle").textContent =
    `${REPORT.kind === "eval" ? "envhub eval" : "envhub train"} · model ${model}` +
    (envs ? ` · envs ${envs}` : "") + (config.steps ? ` · ${config.steps} steps` : "");
  const rows = Object.entries(REPORT.summary || {}).filter(([, v]) => v !== null);
  if (!rows.length) return;
  document.getElementById("summary-section").hidden = false;
  const table = document.getElementById("summary");
  for (const [k, v] of rows) {
    const text = typeof v === "object" ? JSON.stringify(v) : String(v);
    table.append(el("tr", {}, el("th", {}, k), el("td", {}, text)));
  }
}

function drawCharts() {
  const box = document.getElementById("charts");
  document.getElementById("no-charts").hidden = REPORT.charts.length > 0;
  REPORT.charts.forEach((chart, i) => {
    const div = el("div", { class: "chart", id: "chart-" + i, "data-title": chart.title });
    box.append(div);
    const traces = chart.series.map((s) => ({
      x: s.x, y: s.y, name: s.name, type: "scatter", mode: s.mode || "lines+markers",
    }));
    const yaxis = { title: { text: chart.yaxis } };
    if (chart.yrange) yaxis.range = chart.yrange;
    const layout = {
      title: { text: chart.note ? `${chart.title} (${chart.note})` : chart.title }, height: 340,
      margin: { l: 55, r: 15, t: 40, b: 40 }, xaxis: { title: { text: chart.xaxis || "step" } },
      yaxis, legend: { orientation: "h", y: -0.25 }, showlegend: true,
    };
    Plotly.newPlot(div, traces, layout, { displaylogo: false, displayModeBar: false, responsive: true });
  });
}

function fillSteps() {
  const select = document.getElementById("step");
  for (const s of REPORT.steps) {
    // A multi-role step: its episodes, then the records they made (one per actor).
    const records = s.trajectories ? `, ${s.trajectories} trajectories` : "";
    select.append(el("option", { value: s.key }, `${s.label} (${s.episodes} episodes${records})`));
  }
  select.addEventListener("change", () => fillEpisodes(select.value));
  document.getElementById("episode").addEventListener("change", showEpisode);
  document.getElementById("shade").addEventListener("change", showEpisode);
  if (!REPORT.steps.length) return;
  // Open on an episode the run trained on: the first step's first episode may not be one.
  const first = REPORT.first_trained;
  document.getElementById("first-note").textContent = first
    ? `Shown first: ${first.label}, episode #${first.episode} (task ${first.task}, group ` +
      `${first.group}), the first episode the run trained on.`
    : REPORT.kind === "train"
      ? "No episode carries the trainer's logprobs (every step trained on nothing, or the " +
        "backend saves none): shown first is the first step's first episode."
      : "";
  select.value = first ? first.step : REPORT.steps[0].key;
  fillEpisodes(select.value, first ? first.episode : undefined);
}

function fillEpisodes(key, chosen) {
  const select = document.getElementById("episode");
  select.replaceChildren();
  for (const e of stepData(key).episodes) {
    const flag = (e.outcome === "ok" ? "" : ` [${e.outcome}]`) + (e.trained ? " · trained" : "");
    const role = e.role ? ` · ${e.role}` : "";
    select.append(el("option", { value: e.index },
      `#${e.index} task ${e.task}${role} · reward ${e.reward.toFixed(3)}${flag}`));
  }
  if (chosen !== undefined) select.value = chosen;
  showEpisode();
}

function showEpisode() {
  const view = document.getElementById("episode-view");
  view.replaceChildren();
  const key = document.getElementById("step").value;
  const index = document.getElementById("episode").value;
  if (key === "" || index === "") return;
  const block = stepData(key);
  const e = block.episodes[Number(index)];
  view.append(facts(e), ...problems(e), el("h3", {}, "Conversation"));
  e.messages.forEach((m) => view.append(message(m)));
  view.append(el("h3", {}, `Tokens (${e.token_ids.length})`), ...shadeNote(e),
    tokens(e, block.vocab));
}

function facts(e) {
  const parts = [`reward ${e.reward}`, `outcome ${e.outcome}`, `stop ${e.stop_reason}`,
    `group ${e.group}`];
  if (e.role) parts.unshift(`role ${e.role}${e.role_result ? " (" + e.role_result + ")" : ""}`);
  if (e.trained !== null) parts.push(e.trained ? "trained on" : "not trained on");
  for (const [k, v] of Object.entries(e.components)) parts.push(`${k} ${v}`);
  return el("p", { class: "facts" }, ...parts.map((p) => el("span", {}, p)));
}

function problems(e) {
  const out = [];
  for (const err of e.errors) {
    const turn = err.turn === null || err.turn === undefined ? "" : ` (turn ${err.turn})`;
    out.push(el("p", { class: "bad error" }, `error at ${err.stage}${turn}: ${err.type}: ${err.message}`));
  }
  for (const d of e.drift) {
    out.push(el("p", { class: "bad drift-note" },
      `token drift at turn ${d.turn}, token ${d.position}: re-rendering did not reproduce the sampled tokens`));
  }
  return out;
}

function message(m) {
  const box = el("div", { class: "message " + m.role });
  const who = m.role === "tool" ? `tool result${m.name ? " · " + m.name : ""}` : m.role;
  // In a multi-role episode: whose turn produced the message.
  const turn = m.actor ? ` · ${m.actor}'s turn` : "";
  box.append(el("div", { class: "role" }, who + turn));
  if (m.content) box.append(el("pre", {}, m.content));
  for (const call of m.tool_calls || []) {
    box.append(el("pre", { class: "tool-call" }, `→ ${call.function.name}(${call.function.arguments})`));
  }
  return box;
}

// A policy token is red when sampler and trainer logprobs differ by this much (nats) or more.
const GAP_RED = 0.25;

function tokens(e, vocab) {
  const box = el("div", { class: "tokens", id: "tokens" });
  const drift = new Set(e.drift.map((d) => d.position));
  const trainer = e.trainer_logprobs || [];
  const byGap = document.getElementById("shade").value === "gap" && trainer.length > 0;
  e.token_ids.forEach((id, i) => {
    const policy = e.loss_mask[i] === 1;
    const lp = e.logprobs[i] ?? 0;
    const tlp = trainer[i] ?? null;
    const text = id in vocab ? vocab[id] : `[${id}]`;
    let title = `#${i} id ${id}`;
    if (policy) title += ` · sampler logprob ${lp} · p ${Math.exp(lp).toFixed(3)}`;
    const span = el("span", {
      class: `tok ${policy ? "policy" : "context"}${drift.has(i) ? " drift" : ""}`,
    }, text.replace(/\n/g, "↵\n"));
    if (policy && tlp !== null) {
      const gap = Math.abs(lp - tlp);
      span.dataset.gap = gap.toFixed(3);
      title += ` · trainer logprob ${tlp} · gap ${gap.toFixed(3)}`;
    }
    span.title = title;
    // Green: sampler and trainer agree (or the sampler found the token likely); red: they
    // differ by GAP_RED or more (or the token was unlikely).
    const likely = byGap ? 1 - Math.min(Number(span.dataset.gap ?? 0) / GAP_RED, 1) : Math.exp(lp);
    if (policy && (!byGap || tlp !== null)) {
      span.style.background = `hsl(${Math.round(120 * likely)}, 70%, 80%)`;
    }
    box.append(span);
  });
  return box;
}

function shadeNote(e) {
  const shade = document.getElementById("shade").value;
  if (shade === "gap" && !(e.trainer_logprobs || []).length) {
    return [el("p", { class: "note" },
      "No trainer logprobs for this episode (an eval, a step that trained on nothing, or a " +
      "backend that does not return them): tokens are shaded by the sampler's probability.")];
  }
  return [];
}

drawHeader();
drawCharts();
fillSteps();
