"use strict";
const $ = s => document.querySelector(s);
const esc = s => String(s ?? "").replace(/[&<>"']/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;","'":"&#39;"}[c]));
async function api(path, body) {
  const opt = body === undefined ? {} : {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)};
  let r;
  try { r = await fetch(path, opt); } catch (e) { throw new Error("the UI server is not answering: " + e.message); }
  const text = await r.text();
  let data; try { data = JSON.parse(text); } catch (e) { data = {error: text}; }
  if (!r.ok) throw new Error(data.error || data.detail && JSON.stringify(data.detail) || ("HTTP " + r.status));
  return data;
}
// help texts (TRL's are markdown): escaped first, then `code`, **bold** and [links](https://...) only
function md(s) {
  return esc(s).replace(/`([^`]+)`/g, "<code>$1</code>").replace(/\*\*([^*]+)\*\*/g, "<b>$1</b>")
    .replace(/\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g, '<a href="$2" target="_blank" rel="noopener noreferrer">$1</a>');
}
// a typed widget for a config field: checkbox, number box, list of choices or text
function widget(f, v) {
  const k = f.kind || {type: "text"}, a = `class="tf" data-key="${esc(f.key)}" data-orig="${esc(f.value)}" data-kind="${esc(k.type)}"`;
  if (k.type === "bool" && (v === "true" || v === "false")) return `<input type="checkbox" ${a} ${v === "true" ? "checked" : ""}>`;
  if ((k.type === "int" || k.type === "float") && v !== "" && !isNaN(+v))
    return `<input type="number" ${a} step="${k.type === "int" ? 1 : "any"}" value="${esc(v)}" size="12">`;
  if (k.type === "choice") {
    const opts = [...new Set([...(k.choices || []), v, ...(k.nullable ? ["null"] : [])])];
    return `<select ${a}>${opts.map(o => `<option value="${esc(o)}" ${o === v ? "selected" : ""}>${esc(o)}</option>`).join("")}</select>`;
  }
  return `<input ${a} value="${esc(v)}" size="16">`;
}
const fieldValue = i => i.type === "checkbox" ? (i.checked ? "true" : "false") : i.value;
function fill(sel, items, keep) {
  const old = keep ? sel.value : null;
  sel.innerHTML = items.map(x => `<option value="${esc(x.value ?? x)}">${esc(x.label ?? x)}</option>`).join("");
  if (old && [...sel.options].some(o => o.value === old)) sel.value = old;
}
function guard(errEl, fn) {
  return async (...a) => { errEl.textContent = ""; try { await fn(...a); } catch (e) { errEl.textContent = e.message; } };
}
let INFO = null;
document.querySelectorAll("nav button").forEach(b => b.onclick = () => {
  document.querySelectorAll("nav button").forEach(x => x.classList.toggle("on", x === b));
  document.querySelectorAll("section.page").forEach(p => p.classList.toggle("on", p.id === "page-" + b.dataset.page));
  if (b.dataset.page === "runs") loadRuns();
  if (b.dataset.page !== "tools") refreshFiles().then(() => { if (b.dataset.page === "rewards") rewardDefaults(false); });
});
async function refreshFiles() {
  const [j, m, e] = await Promise.all(["jsonl", "model", "eval"].map(k => api("/api/files?kind=" + k).then(d => d.files)));
  fill($("#rw-file"), j, true); fill($("#view-file"), j, true); fill($("#view-compare"), ["", ...j], true);
  fill($("#ev-ckpt"), ["oracle", "tiny", "embedded", ...m], true); fill($("#rg-ckpt"), m, true);
  fill($("#play-policy"), ["oracle", "embedded", "tiny", ...m], true);
  fill($("#rg-eval"), ["", ...e], true);
}
// ---- curves ----
const COLORS = ["#2a5bd7", "#d7552a", "#1e7a34", "#8a2ad7", "#b38f00", "#0097a7", "#c2185b"];
// exponential moving average (the smoothing slider; 0 = raw), as TensorBoard draws it
function smooth(points, a) {
  let m = null; return a > 0 ? points.map(p => [p[0], m = m === null ? p[1] : a * m + (1 - a) * p[1]]) : points;
}
// what a metric measures, for a chart's y axis (the trainers log fractions of episodes as 0..1)
function unitOf(key) {
  if (/success|rate|frac_|heldout/.test(key)) return key + " (fraction, 0-1)";
  if (/toolgym\/errors\//.test(key)) return "errors per episode";
  if (/seconds|_s$/.test(key)) return key + " (s)";
  if (/calls_per_episode|turns/.test(key)) return key + " (per episode)";
  return key;
}
function drawCurves(svg, series, title, ylabel) {
  const W = +svg.getAttribute("width"), L = 52, R = 14, T = 22, B = 40, PH = 200;
  const a = +($("#smooth")?.value || 0);
  // series drawn on the same points (e.g. all at 0) share one line and one legend entry
  const merged = [];
  for (const s of series) {
    const same = merged.find(m => JSON.stringify(m.points) === JSON.stringify(s.points));
    if (same) same.name += " = " + s.name; else merged.push({...s, raw: s.points, points: smooth(s.points, a)});
  }
  series = merged;
  // the legend below the plot, one full name a line: the chart grows with it, nothing is cut
  const H = T + PH + B + Math.max(1, series.length) * 16; svg.setAttribute("height", H); svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const pts = series.flatMap(s => s.points), bottom = T + PH;
  let h = `<text x="${L}" y="15" font-size="12" font-weight="600">${esc(title)}</text>`;
  if (!pts.length) { svg.innerHTML = h + `<text x="${L}" y="${T + PH / 2}" font-size="12" fill="#667">no data yet</text>`; return; }
  const xs = pts.map(p => p[0]), ys = pts.map(p => p[1]);
  let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(0, ...ys), y1 = Math.max(...ys);
  if (x1 === x0) x1 = x0 + 1; if (y1 === y0) y1 = y0 + 1;
  const X = x => L + (x - x0) / (x1 - x0) * (W - L - R), Y = y => bottom - (y - y0) / (y1 - y0) * PH;
  h += `<line x1="${L}" y1="${bottom}" x2="${W - R}" y2="${bottom}" stroke="#999"/><line x1="${L}" y1="${T}" x2="${L}" y2="${bottom}" stroke="#999"/>`;
  h += `<text x="${L - 4}" y="${Y(y1) + 4}" font-size="10" text-anchor="end">${+y1.toPrecision(3)}</text><text x="${L - 4}" y="${Y(y0)}" font-size="10" text-anchor="end">${+y0.toPrecision(3)}</text>`;
  h += `<text x="${L}" y="${bottom + 13}" font-size="10">${x0}</text><text x="${W - R}" y="${bottom + 13}" font-size="10" text-anchor="end">${x1}</text>`;
  h += `<text class="xlabel" x="${(L + W - R) / 2}" y="${bottom + 26}" font-size="11" text-anchor="middle">step</text>`;
  h += `<text class="ylabel" transform="translate(12 ${T + PH / 2}) rotate(-90)" font-size="11" text-anchor="middle">${esc(ylabel || title)}</text>`;
  series.forEach((s, k) => {
    const c = COLORS[k % COLORS.length], p = s.points.map(q => `${X(q[0]).toFixed(1)},${Y(q[1]).toFixed(1)}`).join(" ");
    h += `<polyline class="curve" data-name="${esc(s.name)}" fill="none" stroke="${c}" stroke-width="2" points="${p}"/>`;
    h += s.points.map((q, i) => `<circle class="pt" cx="${X(q[0]).toFixed(1)}" cy="${Y(q[1]).toFixed(1)}" r="3.5" fill="${c}"><title>${esc(s.name)}: step ${esc(q[0])}: ${esc(+(+s.raw[i][1]).toPrecision(4))}${a > 0 ? " (smoothed " + esc(+q[1].toPrecision(4)) + ")" : ""}</title></circle>`).join("");
    const ly = bottom + B + k * 16;
    h += `<rect x="${L}" y="${ly - 9}" width="10" height="10" fill="${c}"/><text class="legend" x="${L + 14}" y="${ly}" font-size="11">${esc(s.name)}</text>`;
  });
  svg.innerHTML = h;
}
// ---- tools ----
function showTools(d) {
  $("#tools-source").textContent = d.source ? "(" + d.source + ")" : "";
  $("#tools-list tbody").innerHTML = d.tools.map(t => `<tr class="tool" data-name="${esc(t.name)}"><td><b>${esc(t.name)}</b></td><td>${esc(t.description)}</td><td><pre>${esc(JSON.stringify(t.parameters, null, 1))}</pre></td></tr>`).join("");
  fill($("#call-tool"), d.tools.map(t => t.name));
}
// a failed load leaves nothing of the previous source listed (the server dropped it too) and says so
const loadTools = body => guard($("#tools-error"), async () => {
  try {
    const d = await api("/api/tools/load", body()); showTools(d);
    const tasks = d.tasks || [];  // tools per task: none until a task is picked
    fill($("#env-task"), ["", ...tasks]); $("#env-task-row").hidden = !tasks.length;
    if (tasks.length) $("#tools-source").textContent = `(${d.source}: ${tasks.length} tasks, each with its own tools: pick one)`;
  }
  catch (e) { showTools({source: "", tools: []}); $("#tools-source").textContent = "(load failed)"; throw e; }
});
$("#env-load").onclick = () => { $("#tools-source").textContent = "(loading...)";
  return loadTools(() => ({env: $("#env-custom").value.trim() || $("#env-select").value, config: $("#mcp-config").value}))(); };
$("#mcp-file").onchange = async e => { const f = e.target.files[0]; if (f) $("#mcp-config").value = await f.text(); };
$("#mcp-load").onclick = () => { $("#tools-source").textContent = "(starting servers...)";
  $("#env-task-row").hidden = true; return loadTools(() => ({config: $("#mcp-config").value}))(); };
$("#call-run").onclick = guard($("#tools-error"), async () => {
  $("#call-result").innerHTML = "";
  const r = await api("/api/tools/call", {name: $("#call-tool").value, arguments: $("#call-args").value});
  $("#call-result").innerHTML = `<div class="row"><span id="call-kind" class="${r.error_kind ? "err" : "ok"}">${r.error_kind ? "error: " + esc(r.error_kind) : "ok"}</span><span class="help">${(r.latency_s * 1000).toFixed(1)} ms, ${r.attempts} attempt(s)</span></div><pre id="call-content">${esc(r.content)}</pre>${r.note ? `<div id="call-note" class="help">${esc(r.note)}</div>` : ""}`;
});
// ---- rewards ----
function rewardRows() {
  $("#rw-parts tbody").innerHTML = INFO.rewards.map((r, k) => `<tr data-name="${esc(r.name)}"><td><input type="checkbox" class="rw-use" ${k < 2 || r.per_turn ? "checked" : ""}></td><td><b>${esc(r.name)}</b>${r.per_turn ? ' <span class="badge">per turn</span>' : ""}</td><td><input class="rw-weight" size="5" value="${r.per_turn ? 0.5 : 1}"></td><td>${r.has_field ? '<input class="rw-field" size="14" placeholder="default">' : ""}</td><td class="help">${esc(r.help)}</td></tr>`).join("");
}
// the composition that fits the file's tasks (their gold field and its kind), proposed once each time another file
// is picked: `rwAsked` is the file last asked for, so coming back to the page or picking the same file again does not
// ask again and overwrite the user's edits (`force`: a new upload under that name); only the latest answer applies
let rwAsked = null, rwSeq = 0;
const rewardDefaults = guard($("#rw-error"), async force => {
  const file = $("#rw-file").value; if (!file || (file === rwAsked && !force)) return;
  rwAsked = file; const seq = ++rwSeq;
  let d;
  try { d = await api("/api/rewards/defaults?file=" + encodeURIComponent(file)); }
  catch (e) { if (seq === rwSeq) rwAsked = null; throw e; }  // picking the file again asks again
  if (seq !== rwSeq || file !== $("#rw-file").value) return;  // asked again, or another file was picked meanwhile
  for (const p of d.parts) {
    const tr = document.querySelector(`#rw-parts tr[data-name="${CSS.escape(p.name)}"]`); if (!tr) continue;
    tr.querySelector(".rw-use").checked = p.use; tr.querySelector(".rw-weight").value = p.weight;
    const f = tr.querySelector(".rw-field"); if (f) f.value = p.field;
  }
  $("#rw-why").textContent = "defaults for this file: " + d.why; $("#rw-why").dataset.file = file;
});
$("#rw-file").onchange = () => rewardDefaults(false);
$("#rw-upload").onchange = guard($("#rw-error"), async e => {
  const f = e.target.files[0]; if (!f) return;
  if (f.size > INFO.max_upload) throw new Error(`${f.name} is ${f.size} bytes; uploads are limited to ${INFO.max_upload}`);
  const d = await api("/api/upload", {name: f.name, content: await f.text()});
  await refreshFiles(); $("#rw-file").value = d.path; await rewardDefaults(true);
});
$("#rw-run").onclick = guard($("#rw-error"), async () => {
  const parts = [...document.querySelectorAll("#rw-parts tbody tr")].filter(tr => tr.querySelector(".rw-use").checked).map(tr => ({
    name: tr.dataset.name, weight: tr.querySelector(".rw-weight").value, field: tr.querySelector(".rw-field")?.value || ""}));
  $("#rw-out").innerHTML = "scoring...";
  const d = await api("/api/rewards/score", {file: $("#rw-file").value, parts});
  const names = Object.keys(d.weights);
  let h = (d.warnings || []).map(w => `<div class="caution rw-warning">${esc(w)}</div>`).join("");
  h += `<div class="help">${d.shown} of ${d.n} episodes; total = ${names.map(n => d.weights[n] + " x " + n).join(" + ")}: the sum of the weighted contributions ` +
    `(each cell: weight x raw value, the raw value in brackets; a per-turn reward's raw value is its sum over the turns)</div>`;
  h += `<table id="rw-table"><thead><tr><th>episode</th><th>task</th><th class="num">total</th>${names.map(n => `<th class="num rw-h" data-name="${esc(n)}">${esc(n)} <span class="help">x ${esc(d.weights[n])}: weighted (raw)</span></th>`).join("")}<th>per turn, weighted</th><th>answer</th></tr></thead><tbody>`;
  for (const e of d.episodes) {
    const turns = e.turns.map(t => `t${t.turn}: ${t.value.toFixed(2)}`).join(", ");
    const cell = n => { if (!(n in e.components)) return `<td class="num rw-c" data-name="${esc(n)}">-</td>`;
      const raw = e.components[n], w = +d.weights[n];
      return `<td class="num rw-c" data-name="${esc(n)}" data-raw="${raw}" data-contrib="${w * raw}">${(w * raw).toFixed(3)} <span class="help">(${raw.toFixed(3)})</span></td>`; };
    h += `<tr class="rw-ep"><td>${e.episode}</td><td>${esc(e.task)}</td><td class="num">${e.value.toFixed(3)}</td>${names.map(cell).join("")}<td class="help">${esc(turns)}</td><td>${esc(e.answer)}</td></tr>`;
  }
  $("#rw-out").innerHTML = h + "</tbody></table>";
});
// ---- train ----
let JOB = null;
async function trainConfig() {
  const d = await api("/api/train/config?name=" + encodeURIComponent($("#train-config").value));
  if (d.algorithm) $("#train-algo").value = d.algorithm;
  // runs are tracked in the UI's MLflow store by default (the Runs page reads it): report_to starts as [mlflow]
  const value = f => f.key === "report_to" && !/mlflow/.test(f.value) ? "[mlflow]" : f.value;
  $("#train-fields tbody").innerHTML = d.fields.filter(f => !["output_dir", "toolgym.trajectory_dir"].includes(f.key)).map(f =>
    `<tr><td><code>${esc(f.key)}</code></td><td>${widget(f, value(f))}</td><td class="help">${md(f.help)}</td></tr>`).join("");
  $("#train-gpu").textContent = d.needs_gpu && !INFO.gpu ? "This config is written for GPUs (" + d.needs_gpu + "); this machine has none: " +
    "it would run on the CPU, slowly, or fail. The *_cpu configs are sized for a CPU." : "";
  if (!$("#train-name").value || $("#train-name").dataset.auto === "1") {  // a free name: never another run's
    $("#train-name").value = (await api("/api/train/run_name?base=" + encodeURIComponent($("#train-config").value.replace(/\.yaml$/, "")))).run_name;
    $("#train-name").dataset.auto = "1";
  }
  trainCommand();
}
function trainRequest() {
  const overrides = {};
  document.querySelectorAll("#train-fields .tf").forEach(i => { if (fieldValue(i) !== i.dataset.orig) overrides[i.dataset.key] = fieldValue(i); });
  for (const line of $("#train-extra").value.split("\n")) {
    if (!line.trim()) continue;
    const k = line.indexOf("=");
    if (k < 1) throw new Error(`"${line}": more fields are name=value`);
    overrides[line.slice(0, k).trim().replace(/^--/, "")] = line.slice(k + 1).trim();
  }
  return {algorithm: $("#train-algo").value, config: $("#train-config").value, run_name: $("#train-name").value, overrides};
}
// ---- saved setups: the algorithm, the config and every field changed, under a name, in the runs directory ----
async function refreshSetups() { fill($("#setup-list"), (await api("/api/setups")).setups, true); }
$("#setup-save").onclick = guard($("#train-error"), async () => {
  const r = trainRequest(), d = await api("/api/setups", {name: $("#setup-name").value, setup: r});
  fill($("#setup-list"), d.setups); $("#setup-list").value = d.name; $("#setup-msg").textContent = `saved ${d.name}`;
});
$("#setup-load").onclick = guard($("#train-error"), async () => {
  const name = $("#setup-list").value; if (!name) throw new Error("no saved setup yet");
  const s = await api("/api/setups/" + encodeURIComponent(name));
  $("#train-algo").value = s.algorithm; $("#train-config").value = s.config; await trainConfig();
  const extra = [];
  for (const [k, v] of Object.entries(s.overrides || {})) {
    const i = document.querySelector(`#train-fields .tf[data-key="${CSS.escape(k)}"]`);
    if (!i) { extra.push(k + "=" + v); continue; }
    if (i.type === "checkbox") i.checked = v === "true";
    else { if (i.tagName === "SELECT" && ![...i.options].some(o => o.value === v)) i.add(new Option(v, v)); i.value = v; }
  }
  $("#train-extra").value = extra.join("\n"); $("#setup-name").value = name; $("#setup-msg").textContent = `loaded ${name}`;
  trainCommand();
});
async function allFields() {
  const d = await api("/api/train/fields?algorithm=" + encodeURIComponent($("#train-algo").value));
  $("#train-all-fields tbody").innerHTML = d.fields.map(f => `<tr><td><a href="#" class="add-field" data-key="${esc(f.key)}"><code>${esc(f.key)}</code></a></td><td class="help">${md(f.help)}</td></tr>`).join("");
  document.querySelectorAll(".add-field").forEach(a => a.onclick = ev => {
    ev.preventDefault(); const t = $("#train-extra");
    t.value = (t.value && !t.value.endsWith("\n") ? t.value + "\n" : t.value) + a.dataset.key + "="; t.focus(); });
}
$("#train-all").addEventListener("toggle", () => { if ($("#train-all").open) guard($("#train-error"), allFields)(); });
let COMMAND_SEQ = 0;  // answers can arrive out of order: only the latest request's command is shown
const trainCommand = guard($("#train-error"), async () => {
  const seq = ++COMMAND_SEQ, c = (await api("/api/train/command", trainRequest())).command;
  if (seq === COMMAND_SEQ) $("#train-command").textContent = c;
});
$("#train-config").onchange = guard($("#train-error"), trainConfig);
["#train-name", "#train-extra"].forEach(s => $(s).onchange = trainCommand);
$("#train-name").addEventListener("input", () => { $("#train-name").dataset.auto = ""; });
$("#train-algo").onchange = () => { trainCommand(); if ($("#train-all").open) guard($("#train-error"), allFields)(); };
$("#train-fields").addEventListener("change", trainCommand);
$("#train-launch").onclick = guard($("#train-error"), async () => {
  const j = await api("/api/train/launch", trainRequest()); JOB = j.id; await refreshJobs(); await showJob();
  $("#job-card").scrollIntoView({block: "start"}); $("#job-card").focus({preventScroll: true});
  // the form keeps every edit; only the run name moves on to a free one (never the one just launched)
  const base = $("#train-name").value.replace(/-\d+$/, "");
  $("#train-name").value = (await api("/api/train/run_name?base=" + encodeURIComponent(base))).run_name;
  trainCommand();
});
async function refreshJobs() {
  const d = await api("/api/jobs");
  $("#jobs tbody").innerHTML = d.jobs.map(j => `<tr class="job ${j.id === JOB ? "sel" : ""}" data-id="${esc(j.id)}"><td><a href="#" class="job-link">${esc(j.title)}</a><div class="help">${esc(j.id)}</div></td><td>${esc(j.kind)}</td><td><span class="badge ${esc(j.status)}">${esc(j.status)}</span></td><td>${j.rc ?? ""}</td></tr>`).join("");
  document.querySelectorAll("#jobs .job-link").forEach(a => a.onclick = ev => { ev.preventDefault(); JOB = a.closest("tr").dataset.id; refreshJobs(); showJob(); });
  if (!JOB && d.jobs.length) { JOB = d.jobs[0].id; }
}
async function showJob() {
  if (!JOB) return;
  const j = await api("/api/jobs/" + JOB);
  $("#job-id").textContent = j.title + " (" + j.id + ")";
  $("#job-status").textContent = j.status; $("#job-status").className = "badge " + j.status;
  $("#job-command").textContent = j.command || "";
  $("#job-stop").disabled = !["running", "starting"].includes(j.status);
  const m = j.metrics || [], total = j.max_steps || 0;
  $("#job-progress").textContent = m.length ? `step ${m.length}${total ? " of " + total : ""}` : "";
  const frac = total ? Math.min(1, m.length / total) : 0, live = ["running", "starting"].includes(j.status);
  $("#job-bar").hidden = !total; $("#job-bar").firstElementChild.style.width = (100 * (j.status === "finished" ? 1 : frac)).toFixed(1) + "%";
  const spent = Date.now() / 1000 - j.created, eta = m.length && live ? spent / m.length * (total - m.length) : null;
  $("#job-eta").textContent = live && total ? (eta == null ? "waiting for the first step" : `about ${eta < 90 ? Math.round(eta) + " s" : Math.round(eta / 60) + " min"} left`) : "";
  const ser = keys => keys.filter(k => m.some(r => k in r)).map(k => ({name: k, points: m.filter(r => k in r).map(r => [r.step, r[k]])}));
  drawCurves($("#job-curves"), ser(["reward", "toolgym/success", "toolgym/tool_call_rate", "loss"]), "reward and success", "value (reward, loss; success and call rate as 0-1)");
  const errKeys = [...new Set(m.flatMap(r => Object.keys(r).filter(k => k.startsWith("toolgym/errors/"))))];
  drawCurves($("#job-errors"), ser(errKeys).map(s => ({...s, name: s.name.replace("toolgym/errors/", "")})), "tool errors by kind", "errors per episode");
  const lastRow = m[m.length - 1] || {}, keys = Object.keys(lastRow).filter(k => k !== "step").sort((x, y) => (x.startsWith("toolgym/") ? 0 : 1) - (y.startsWith("toolgym/") ? 0 : 1) || x.localeCompare(y));
  $("#job-latest").innerHTML = keys.length ? `<caption class="help">step ${esc(lastRow.step ?? m.length)}: ${keys.length} metrics</caption>` + keys.map(k => `<tr><td>${esc(k)}</td><td class="num">${esc(typeof lastRow[k] === "number" ? +lastRow[k].toPrecision(4) : lastRow[k])}</td></tr>`).join("") : "";
  $("#job-error").textContent = j.error ? "last error lines:\n" + j.error : "";
  const log = $("#job-log"), atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 20;
  log.textContent = j.log || ""; if (atEnd) log.scrollTop = log.scrollHeight;
  if (j.kind === "eval" && j.summary) showEval(j);
}
$("#smooth").oninput = () => { showJob(); drawRuns(); };
$("#job-stop").onclick = guard($("#job-error"), async () => { await api("/api/jobs/" + JOB + "/stop", {}); await showJob(); });
// evaluations written by other jobs or programs appear without a reload: on the page regaining focus, and while
// the Evaluate & registry page is open
window.addEventListener("focus", () => { if (INFO) refreshFiles().catch(() => {}); });
document.addEventListener("visibilitychange", () => { if (INFO && !document.hidden) refreshFiles().catch(() => {}); });
let TICKS = 0;
setInterval(async () => {
  const page = document.querySelector("section.page.on").id;
  if (page === "page-registry" && ++TICKS % 3 === 0) refreshFiles().catch(() => {});
  if (page !== "page-train" && page !== "page-registry") return;
  try { await refreshJobs(); await showJob(); } catch (e) { /* shown on the next action */ }
}, 2000);
// ---- runs ----
let RUNS = [];
async function loadRuns() {
  try {
    const ticked = new Set([...document.querySelectorAll(".run-pick:checked")].map(c => c.closest("tr").dataset.id));
    $("#runs-loading").hidden = false;
    const d = await api("/api/runs").finally(() => { $("#runs-loading").hidden = true; }); RUNS = d.runs; $("#runs-error").textContent = "";
    $("#runs-table tbody").innerHTML = RUNS.map(r => `<tr data-id="${esc(r.id)}"><td><input type="checkbox" class="run-pick"></td><td>${esc(r.name)}<div class="help">${esc(r.id.slice(0, 12))}</div></td><td>${esc(r.experiment)}</td><td><span class="badge ${esc(r.status)}">${esc(r.status)}</span></td><td class="num">${r.metrics.reward?.toFixed?.(3) ?? ""}</td><td class="num">${r.metrics["toolgym/success"]?.toFixed?.(3) ?? ""}</td></tr>`).join("") || `<tr><td colspan="6" class="help">no runs yet in ${esc(d.tracking_uri)}</td></tr>`;
    document.querySelectorAll(".run-pick").forEach(c => { c.checked = ticked.has(c.closest("tr").dataset.id); c.onchange = drawRuns; });
    const sel = $("#runs-metric"), was = sel.value, known = [...new Set(["reward", "toolgym/success", "toolgym/tool_call_rate", "loss", ...RUNS.flatMap(r => Object.keys(r.metrics))])];
    sel.innerHTML = known.map(k => `<option>${esc(k)}</option>`).join(""); sel.value = known.includes(was) ? was : "reward";
  } catch (e) { $("#runs-error").textContent = e.message; }
}
$("#runs-refresh").onclick = loadRuns; $("#runs-metric").onchange = () => drawRuns();
async function drawRuns() {
  const ids = [...document.querySelectorAll(".run-pick:checked")].map(c => c.closest("tr").dataset.id), metric = $("#runs-metric").value;
  try {
    const hist = await Promise.all(ids.map(id => api(`/api/runs/${id}/metrics`)));
    const byId = Object.fromEntries(RUNS.map(r => [r.id, r]));
    const names = ids.map(id => byId[id].name || id.slice(0, 8)), dup = names.filter((n, i) => names.indexOf(n) !== i);
    const label = (id, k) => dup.includes(names[k]) ? `${names[k]} (${id.slice(0, 8)})` : names[k];
    drawCurves($("#runs-curves"), ids.map((id, k) => ({name: label(id, k), points: hist[k].metrics[metric] || []})), metric, unitOf(metric));
    if (ids.length < 2) { $("#runs-compare").innerHTML = '<tr><td class="help">tick two runs or more</td></tr>'; $("#runs-same").hidden = true; return; }
    const d = await api("/api/runs/compare?ids=" + ids.slice(0, 8).join(","));
    const cell = v => v == null ? '<td class="help">(not set)</td>' : `<td>${esc(typeof v === "number" ? +v.toPrecision(4) : v)}</td>`;
    const row = (k, vals, cls) => `<tr class="${cls}"><td>${esc(k)}</td>${vals.map(cell).join("")}</tr>`;
    $("#runs-compare").innerHTML = `<thead><tr><th></th>${d.runs.map((r, k) => `<th>${esc(label(r.id, ids.indexOf(r.id)))}</th>`).join("")}</tr></thead><tbody>`
      + d.differ.map(p => row("param " + p.key, p.values, "differ")).join("")
      + d.metrics.map(m => row("metric " + m.key, m.values, new Set(m.values.map(String)).size > 1 ? "metric" : "metric same")).join("") + "</tbody>";
    $("#runs-same").hidden = false;
    $("#runs-same summary").textContent = `${d.same.length} parameters the same in ${d.runs.length === 2 ? "both" : "all " + d.runs.length} (${d.differ.length} differ)`;
    $("#runs-same tbody").innerHTML = d.same.map(p => `<tr><td>${esc(p.key)}</td><td>${esc(p.value ?? "")}</td></tr>`).join("");
  } catch (e) { $("#runs-error").textContent = e.message; }
}
$("#view-open").onclick = guard($("#view-error"), async () => {
  const q = "file=" + encodeURIComponent($("#view-file").value) + ($("#view-compare").value ? "&compare=" + encodeURIComponent($("#view-compare").value) : "");
  const r = await fetch("/view?" + q);
  if (!r.ok) { const t = await r.text(); let m = t; try { m = JSON.parse(t).error; } catch (e) {} throw new Error(m); }
  $("#viewer").src = "/view?" + q;
});
// ---- play one episode ----
let PLAY = null;  // {ep, shown}
function turnView(t, i) {
  const calls = (t.results || []).map(r => {
    const c = r.call || {}, args = typeof c.arguments === "string" ? c.arguments : JSON.stringify(c.arguments ?? {});
    return `<div class="call"><b>tool call</b> <code>${esc(c.name || "?")}</code> <code>${esc(args)}</code> ` +
      (r.error_kind ? `<span class="err">${esc(r.error_kind)}</span>` : `<span class="ok">ok</span>`) +
      ` <span class="help">${esc(((+r.latency_s || 0) * 1000).toFixed(1))} ms</span><pre class="obs">${esc(r.content)}</pre></div>`;
  }).join("");
  return `<div class="turn" data-turn="${i}"><h4>turn ${i + 1} \u00b7 reward ${esc((+t.reward || 0).toFixed(3))}` +
    (t.cut ? ' <span class="caution">cut at the turn budget</span>' : "") + `</h4><div class="help">model</div>` +
    `<pre class="action">${esc(t.text)}</pre>${calls}</div>`;
}
function showPlay() {
  const ep = PLAY.ep, turns = ep.turns || [], n = Math.min(PLAY.shown, turns.length), task = ep.task || {};
  const ok = (+ep.outcome_reward || 0) >= 1;
  let h = `<div class="help">task ${esc(task.id ?? "")}: <b>${esc(task.prompt ?? "")}</b></div>`;
  h += turns.slice(0, n).map(turnView).join("");
  if (n >= turns.length) h += `<div class="${ok ? "ok" : "caution"}" id="play-result">episode ${ep.terminated ? "ended" : "truncated"}: ` +
    `outcome reward ${esc((+ep.outcome_reward || 0).toFixed(3))}, answer ${esc(JSON.stringify(PLAY.answer ?? ""))}</div>`;
  $("#play-out").innerHTML = h;
  $("#play-at").textContent = `turn ${n} of ${turns.length}`;
  $("#play-prev").disabled = n <= 1; $("#play-next").disabled = n >= turns.length;
}
$("#play-prev").onclick = () => { PLAY.shown = Math.max(1, PLAY.shown - 1); showPlay(); };
$("#play-next").onclick = () => { PLAY.shown += 1; showPlay(); };
$("#play-all").onclick = () => { PLAY.shown = Infinity; showPlay(); };
$("#play-run").onclick = guard($("#play-error"), async () => {
  $("#play-out").innerHTML = ""; $("#play-controls").hidden = true; PLAY = null;
  $("#play-status").textContent = "starting...";
  const j = await api("/api/play", {env: $("#play-env").value, policy: $("#play-policy").value,
                                    split: $("#play-split").value, seed: $("#play-seed").value});
  for (;;) {
    await new Promise(r => setTimeout(r, 700));
    const s = await api("/api/play/" + j.id);
    if (s.status === "running" || s.status === "starting") { $("#play-status").textContent = `${s.status}: ${s.command}`; continue; }
    $("#play-status").textContent = s.command;
    if (!s.episode) throw new Error(`the episode ${s.status}` + (s.rc != null ? ` (exit ${s.rc})` : "") + (s.error ? ":\n" + s.error : ""));
    PLAY = {ep: s.episode, answer: s.answer, shown: 1};
    $("#play-view").href = "/view?file=" + encodeURIComponent(s.view) + "#open=0";
    $("#play-view").target = "_blank"; $("#play-view").rel = "noopener";
    $("#play-controls").hidden = false; showPlay();
    // then the rest of the episode, one turn at a time
    const id = j.id, step = () => { if (PLAY && PLAY.ep === s.episode && PLAY.shown < (s.episode.turns || []).length) {
      PLAY.shown += 1; showPlay(); setTimeout(step, 900); } };
    setTimeout(step, 900);
    return id;
  }
});
// ---- evaluate and registry ----
function showEval(j) {
  const s = j.summary, ci = s.success_ci95 || [];
  $("#ev-summary").innerHTML = `<div class="${s.success > 0 ? "ok" : "caution"}" id="ev-result">success ${(s.success * 100).toFixed(1)}% (95% CI ${(ci[0] * 100).toFixed(1)}-${(ci[1] * 100).toFixed(1)}%) on ${s.n_tasks} tasks of ${esc(s.env_id)}/${esc(s.split)}</div><div class="help">saved as ${esc(j.eval_json)}</div>`;
}
$("#ev-launch").onclick = guard($("#ev-error"), async () => {
  $("#ev-summary").innerHTML = "";
  const j = await api("/api/eval/launch", {checkpoint: $("#ev-ckpt").value, env: $("#ev-env").value, split: $("#ev-split").value, tasks: $("#ev-tasks").value, name: $("#ev-name").value});
  JOB = j.id; $("#ev-summary").innerHTML = `<div class="help" id="ev-status">job ${esc(j.id)} started: <code>${esc(j.command)}</code></div>`;
  watchEval(j.id);
});
// the evaluation's outcome where it was asked for: its progress, its summary, or why it failed
function watchEval(id) {
  const tick = async () => {
    let j;
    try { j = await api("/api/jobs/" + id); } catch (e) { $("#ev-error").textContent = e.message; return; }
    if (j.status === "running" || j.status === "starting") {
      const st = $("#ev-status"); if (st) st.firstChild.textContent = `job ${j.id} ${j.status}: `;
      setTimeout(tick, 1000); return;
    }
    refreshFiles().catch(() => {});  // its eval.json is offered for registering at once
    if (j.status === "finished" && j.summary) showEval(j);
    else {
      $("#ev-summary").innerHTML = "";
      $("#ev-error").textContent = `the evaluation ${j.status}` + (j.rc != null ? ` (exit ${j.rc})` : "") +
        (j.error ? ":\n" + j.error : "");
    }
  };
  setTimeout(tick, 500);
}
function registryResult(el, r, okText) {
  el.innerHTML = r.ok ? `<div class="ok">${okText(r.result)}</div><div class="help"><code>${esc(r.command)}</code></div>`
    : `<div class="err refused">${esc(r.error || "failed (exit " + r.rc + ")")}</div><div class="help">exit ${r.rc}: <code>${esc(r.command)}</code></div>`;
}
$("#rg-register").onclick = guard($("#rg-result"), async () => {
  $("#rg-result").textContent = "registering...";
  const r = await api("/api/registry/register", {checkpoint: $("#rg-ckpt").value, name: $("#rg-name").value, eval: $("#rg-eval").value});
  registryResult($("#rg-result"), r, x => `registered ${esc(x.name)} v${esc(x.version)}` + (x.success == null ? "" : `, success ${x.success.toFixed(3)}`));
  if (r.ok) { $("#pr-name").value = r.result.name; $("#pr-version").value = r.result.version; }
});
$("#pr-promote").onclick = guard($("#pr-result"), async () => {
  $("#pr-result").textContent = "comparing...";
  const r = await api("/api/registry/promote", {name: $("#pr-name").value, version: $("#pr-version").value, force: $("#pr-force").checked, reason: $("#pr-reason").value});
  registryResult($("#pr-result"), r, x => x.promoted ? `promoted: champion is now v${x.to}` + (x.forced ? " (forced: " + esc(x.reason) + ")" : "") + ` (${esc(x.why)})` : `unchanged: ${esc(x.why)}`);
});
$("#rg-list").onclick = guard($("#pr-result"), async () => {
  const r = await api("/api/registry/list", {name: $("#pr-name").value});
  if (!r.ok) { registryResult($("#pr-result"), r, () => ""); return; }
  const cols = ["version", "aliases", "success", "env_id", "split", "n_tasks"];
  $("#rg-versions").innerHTML = `<thead><tr>${cols.map(c => `<th>${c}</th>`).join("")}</tr></thead>` + r.result.map(v => `<tr>${cols.map(c => `<td>${esc(Array.isArray(v[c]) ? v[c].join(",") : v[c])}</td>`).join("")}</tr>`).join("");
});
// ---- start ----
(async () => {
  try {
    INFO = await api("/api/info");
    $("#runs-dir").textContent = INFO.runs; $("#tracking-uri").textContent = INFO.tracking_uri;
    fill($("#env-select"), INFO.envs); if (typeof envCardNote === "function") envCardNote(); fill($("#ev-env"), INFO.envs); fill($("#play-env"), INFO.envs);
    fill($("#train-algo"), INFO.algorithms);
    fill($("#train-config"), INFO.configs.map(c => ({value: c.name, label: c.name + (c.algorithm ? "" : " (any)")})));
    const g = INFO.configs.find(c => c.name.startsWith("grpo")); if (g) $("#train-config").value = g.name;
    rewardRows(); await refreshFiles(); await trainConfig(); await refreshSetups(); await refreshJobs(); await showJob();
  } catch (e) { document.body.insertAdjacentHTML("afterbegin", `<div class="err" id="fatal">${esc(e.message)}</div>`); }
})();
