// Glue between the catalog's JSON and the DOM: draw each package, search and filter the list,
// copy an install command. The data and its meaning live in Python (envhub/hub/catalog.py).
"use strict";
const CATALOG = JSON.parse(document.getElementById("catalog-data").textContent);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c);
  return node;
}

function table(columns, rows) {
  return el("table", {}, el("tr", {}, ...columns.map((c) => el("th", {}, c))),
    ...rows.map((r) => el("tr", {}, ...r.map((c) => el("td", {}, c)))));
}

function fillSelect(id, values) {
  const select = document.getElementById(id);
  for (const v of [...new Set(values)].sort()) select.append(el("option", { value: v }, v));
  select.addEventListener("change", applyFilters);
}

// The command goes to the clipboard; where the page may not write it (no permission, an old
// browser), the command's text is selected instead, for Ctrl+C.
function copyCommand(button, code) {
  const selectIt = () => {
    const range = document.createRange();
    range.selectNodeContents(code);
    getSelection().removeAllRanges();
    getSelection().addRange(range);
    button.textContent = "selected: press Ctrl+C";
  };
  if (!navigator.clipboard) return selectIt();
  navigator.clipboard.writeText(code.textContent)
    .then(() => { button.textContent = "copied"; }, selectIt);
}

function envsTable(p) {
  const rows = p.envs.map((e) => [e.name, e.kind || "?", e.tools.join(", ") || "-",
    e.audit ? e.audit.summary : "not audited"]);
  return table(["env", "kind", "tools", "reward audit"], rows);
}

// A leaderboard, with a column of links to the results' trajectories when any has them.
function boardTable(board) {
  if (!board.trajectories.some((url) => url)) return table(board.columns, board.rows);
  const rows = board.rows.map((r, i) => [...r, board.trajectories[i]
    ? el("a", { href: board.trajectories[i], class: "trajectories" }, "dataset") : "-"]);
  return table([...board.columns, "trajectories"], rows);
}

function details(p) {
  const code = el("code", { class: "command" }, p.install);
  const button = el("button", { class: "copy", type: "button" }, "copy");
  button.addEventListener("click", () => copyCommand(button, code));
  const check = p.check.passed === null ? "note" : p.check.passed ? "good" : "bad";
  const board = p.leaderboard;
  const body = el("div", { class: "details" },
    el("div", { class: "install" }, code, button),
    el("p", {}, "Versions: ", p.versions.join(", "), ` · updated ${p.updated}`),
    el("p", { class: "check " + check }, "envhub check: " + p.check.summary),
    el("h3", {}, "Envs"), envsTable(p),
    el("h3", {}, `Leaderboard of version ${board.version}`),
    board.rows.length ? boardTable(board)
      : el("p", { class: "note" }, `No results for version ${board.version} yet.`));
  if (board.others) body.append(el("p", { class: "others" }, board.others));
  if (p.performance) {
    body.append(el("h3", {}, "Performance"),
      el("p", { class: "note" }, "Measured by envhub check on " + p.performance.machine),
      table(p.performance.columns, p.performance.rows));
  }
  return body;
}

function drawPackage(p) {
  const summary = el("summary", {},
    el("span", { class: "repo" }, p.repo), ` ${p.version} `,
    ...p.kinds.map((k) => el("span", { class: "badge kind" }, k)),
    ...p.tools.map((t) => el("span", { class: "badge tool" }, t)),
    ...p.tags.map((t) => el("span", { class: "badge tag" }, t)),
    el("div", { class: "description" }, p.description));
  const box = el("details", { class: "package", "data-repo": p.repo }, summary);
  box.addEventListener("toggle", () => {
    if (box.open && box.children.length === 1) box.append(details(p)); // drawn when first opened
  });
  return box;
}

function matches(p, words, kind, tool, tag) {
  const text = [p.repo, p.description, ...p.envs.map((e) => e.name), ...p.tools, ...p.tags,
    ...p.kinds, ...p.leaderboard.models].join(" ").toLowerCase();
  return words.every((w) => text.includes(w)) && (!kind || p.kinds.includes(kind))
    && (!tool || p.tools.includes(tool)) && (!tag || p.tags.includes(tag));
}

function applyFilters() {
  const words = document.getElementById("search").value.toLowerCase().split(/\s+/).filter(Boolean);
  const [kind, tool, tag] = ["kind", "tool", "tag"].map((id) => document.getElementById(id).value);
  let shown = 0;
  CATALOG.packages.forEach((p, i) => {
    const visible = matches(p, words, kind, tool, tag);
    document.getElementById("package-" + i).hidden = !visible;
    shown += visible;
  });
  document.getElementById("count").textContent = `${shown} of ${CATALOG.packages.length}`;
  document.getElementById("empty").hidden = shown > 0;
}

function draw() {
  const where = CATALOG.author ? ` by ${CATALOG.author}` : "";
  const query = CATALOG.query ? ` matching "${CATALOG.query}"` : "";
  document.getElementById("subtitle").textContent = `${CATALOG.packages.length} env packages` +
    `${where}${query} on ${CATALOG.hub} · built ${CATALOG.built} with envhub ${CATALOG.envhub_version}`;
  const list = document.getElementById("packages");
  CATALOG.packages.forEach((p, i) => {
    const box = drawPackage(p);
    box.id = "package-" + i;
    list.append(box);
  });
  fillSelect("kind", CATALOG.packages.flatMap((p) => p.kinds));
  fillSelect("tool", CATALOG.packages.flatMap((p) => p.tools));
  fillSelect("tag", CATALOG.packages.flatMap((p) => p.tags));
  document.getElementById("search").addEventListener("input", applyFilters);
  if (CATALOG.skipped.length) {
    document.getElementById("skipped-section").hidden = false;
    for (const s of CATALOG.skipped) {
      document.getElementById("skipped").append(el("li", {}, `${s.repo}: ${s.skipped}`));
    }
  }
  applyFilters();
}

draw();
