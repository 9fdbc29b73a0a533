"use strict";
// Play by hand (the Play page's second card) and the env cards of the Environments & tools page; uses page.js's
// helpers ($, esc, api, fill, guard). One episode per browser tab: the session id lives in sessionStorage.
const HAND = {sid: null, done: true, example: "", cards: {}};
function handSession() {
  let sid = sessionStorage.getItem("toolgym-hand");
  if (!sid) {
    sid = (window.crypto && crypto.randomUUID ? crypto.randomUUID() : Math.random().toString(36).slice(2) + Date.now().toString(36)).replace(/[^A-Za-z0-9-]/g, "");
    sessionStorage.setItem("toolgym-hand", sid);
  }
  return sid;
}
// the turn's tokens: runs of equal loss mask, coloured as the viewer colours them (mask 1 green, mask 0 blue-grey)
const tokenView = runs => `<div class="tok">${runs.map(r => `<span class="m${r.mask}" title="${r.n} token(s), loss mask ${r.mask}">${esc(r.text)}</span>`).join("")}</div>`;
function handTurn(t) {
  const byId = Object.fromEntries((t.results || []).map(r => [r.call?.id, r]));
  const calls = (t.calls || []).map(c => {
    const r = byId[c.id] || {}, args = JSON.stringify(c.arguments ?? {});
    const parsed = c.parse_error ? `<span class="err">not parsed: ${esc(c.parse_error)}</span>` : `<code>${esc(c.name)}</code> <code>${esc(args)}</code>`;
    return `<div class="call hand-call"><b>parsed call</b> ${parsed}` + (r.content === undefined ? "" :
      ` <span class="${r.error_kind ? "err" : "ok"}">${r.error_kind ? esc(r.error_kind) : "ok"}</span><div class="help">tool result (what the model reads)</div><pre class="obs hand-result">${esc(r.content)}</pre>`) + `</div>`;
  }).join("") || `<div class="help hand-nocall">no tool call parsed: the turn is an answer</div>`;
  const comps = Object.entries(t.reward_components || {}).map(([k, v]) => `${k} ${(+v).toFixed(3)}`).join(", ");
  return `<div class="turn hand-turn" data-turn="${esc(t.turn)}"><h4>turn ${esc((t.turn ?? 0) + 1)} \u00b7 reward <span class="hand-reward">${esc((+t.reward || 0).toFixed(3))}</span>` +
    (comps ? ` <span class="help">(${esc(comps)})</span>` : "") + `</h4><div class="help">you wrote</div><pre class="action">${esc(t.text)}</pre>${calls}` +
    `<div class="help">tokens of the turn (hover a run for its size and mask)</div>${tokenView(t.tokens || [])}` +
    (t.error ? `<div class="err">${esc(t.error)}</div>` : "") + `</div>`;
}
function handEnd(t) {
  const ok = (+t.outcome_reward || 0) >= 1, comps = Object.entries(t.outcome_components || {}).map(([k, v]) => `${k} ${(+v).toFixed(3)}`).join(", ");
  $("#hand-end").innerHTML = `<div class="${ok ? "ok" : "caution"}" id="hand-result">episode ${t.terminated ? "ended" : "truncated"}: outcome reward ` +
    `${esc((+t.outcome_reward || 0).toFixed(3))}${comps ? " (" + esc(comps) + ")" : ""}, answer ${esc(JSON.stringify(t.answer ?? ""))}. Reset plays another.</div>`;
  $("#hand-input").hidden = true;
}
function handCardNote() {
  const c = HAND.cards[$("#hand-env").value] || {};
  $("#hand-note").textContent = c.note || "";
  $("#hand-prompt-l").hidden = !(c.needs || []).includes("tasks");
}
$("#hand-env").onchange = () => {  // another env: nothing of the previous episode stays
  HAND.done = true; $("#hand-start").innerHTML = ""; $("#hand-turns").innerHTML = ""; $("#hand-end").innerHTML = "";
  $("#hand-input").hidden = true; $("#hand-error").textContent = ""; fill($("#hand-task"), []); $("#hand-task-l").hidden = true;
  handCardNote();
};
$("#hand-reset").onclick = guard($("#hand-error"), async () => {
  $("#hand-turns").innerHTML = ""; $("#hand-end").innerHTML = ""; $("#hand-start").innerHTML = "starting..."; $("#hand-input").hidden = true;
  HAND.sid = handSession();
  let d;
  try {
    d = await api("/api/hand/reset", {session: HAND.sid, env: $("#hand-env").value, seed: $("#hand-seed").value, task: $("#hand-task").value,
                                      config: $("#mcp-config").value, prompt: $("#hand-prompt").value});
  } catch (e) { $("#hand-start").innerHTML = ""; throw e; }
  HAND.done = false; HAND.example = d.example || "";
  if (d.tasks.length && !$("#hand-task").options.length) { fill($("#hand-task"), ["", ...d.tasks]); $("#hand-task-l").hidden = false; }
  const tools = d.tools.map(t => `<code>${esc(t.name)}</code>`).join(", ") || "(none)";
  $("#hand-start").innerHTML = `<div class="help">task ${esc(d.task.id ?? "")}: <b id="hand-prompt-shown">${esc(d.task.prompt ?? "")}</b></div>` +
    `<div class="help">tools: ${tools}; up to ${esc(d.max_turns ?? "?")} turns</div>` +
    Object.values(d.errors || {}).map(e => `<div class="err">${esc(e)}</div>`).join("") +
    `<details><summary class="help">the prompt as the model reads it (system prompt, tools, the task; loss mask 0)</summary><pre id="hand-prompt-text">${esc(d.prompt_text)}</pre></details>`;
  $("#hand-example").hidden = !HAND.example;
  $("#hand-text").value = ""; $("#hand-input").hidden = false;
});
$("#hand-example").onclick = ev => { ev.preventDefault(); $("#hand-text").value = HAND.example; $("#hand-text").focus(); };
$("#hand-send").onclick = guard($("#hand-error"), async () => {
  if (HAND.done) throw new Error("press Reset to start an episode");
  const t = await api("/api/hand/step", {session: HAND.sid, text: $("#hand-text").value});
  $("#hand-turns").insertAdjacentHTML("beforeend", handTurn(t));
  $("#hand-text").value = "";
  if (t.done) { HAND.done = true; handEnd(t); }
});
// ---- env cards: what each registered env needs, its per-task tools, nothing kept across a switch ----
function envCardNote() {
  const c = HAND.cards[$("#env-select").value] || {};
  $("#env-about").textContent = c.about || ""; $("#env-note").textContent = c.note || "";
}
$("#env-select").addEventListener("change", () => {
  $("#call-result").innerHTML = ""; $("#call-args").value = "{}"; $("#tools-error").textContent = "";
  showTools({source: "", tools: []}); fill($("#env-task"), []); $("#env-task-row").hidden = true; envCardNote();
});
$("#env-task").onchange = guard($("#tools-error"), async () => {
  $("#call-result").innerHTML = "";
  if (!$("#env-task").value) { showTools({source: "", tools: []}); return; }
  showTools(await api("/api/tools/task", {task: $("#env-task").value}));
});
(async () => {
  try {
    const d = await api("/api/envs");
    HAND.cards = Object.fromEntries(d.envs.map(c => [c.id, c]));
    fill($("#hand-env"), d.envs.map(c => c.id)); handCardNote(); envCardNote();
  } catch (e) { $("#hand-error").textContent = e.message; }
})();
