/* From a tail request to its steps: the slowest requests (#bs-slowest, under the charts) and, for the one
 * clicked, the Gantt zoomed to its lifetime with its spans and steps marked (gantt.js draws state.focus) and a
 * line saying what it waited for (#bs-focus). The server splits the lifetime (GET /api/requests/{id}/waits,
 * telemetry/request_waits.py); the page only draws it. In replay both routes read the replay (replay=true).
 * A point of the Sweep tab's latency CDFs (#bs-sweep-dist: sweep_figures.js puts each point's request id in its
 * customdata) leads to the same jump when clicked. */
import { api } from "./api.js";
import { state } from "./feed.js";
import { causeLabel } from "./names.js";
import { $, esc, note } from "./util.js";

const SLOWEST = 10;
const LIVE_REFRESH_MS = 4000;              // live: looked at again this often, and only when requests finished
const PAD = 0.06;                          // the window shows this share of the lifetime on each side
export const PHASE_COLOR = { queue: "#f59e0b", prefill: "#8b5cf6", decode: "#16a34a", preempted: "#ef4444" };

const seen = { finished: -1, source: "" };        // finished: the latest finish_us the list was built after

export function buildTail(root) {
  const legend = $("bs-legend");
  if (!legend || $("bs-slowest")) return;
  // what the request picked waited for, under the legend; the list below the charts, so that it moves none of them,
  // in a box of fixed height, so that the page does not grow when rows arrive
  // (hidden, it takes no room: the charts stay where they were until a request is picked)
  const bar = document.createElement("div");
  bar.id = "bs-focus";
  bar.className = "bs-focus";
  bar.hidden = true;
  bar.innerHTML = `<span id="bs-focus-text"></span>
      <button id="bs-focus-clear" class="bs-btn" title="Take the highlight off the Gantt">clear</button>`;
  legend.after(bar);
  const box = document.createElement("div");
  box.className = "bs-tail bs-tail-list";
  box.innerHTML = `<details id="bs-slowest-box" class="bs-slowest-box" open><summary>Slowest requests
      <span class="muted">(click one: the Gantt jumps to its lifetime, the hover says what it waited for)</span>
      <button id="bs-slowest-refresh" class="bs-btn">refresh</button></summary>
      <div class="bs-slowest-scroll"><table id="bs-slowest" class="bs-slowest"><thead><tr><th>request</th><th>E2E ms</th><th>TTFT ms</th>
        <th>ITL max ms</th><th>prompt</th><th>out</th><th>preempted</th><th>modes</th></tr></thead><tbody></tbody></table></div>
    </details>`;
  root.appendChild(box);
  $("bs-slowest-refresh").onclick = ev => { ev.preventDefault(); refreshSlowest(); };
  $("bs-focus-clear").onclick = clearFocus;
  $("bs-slowest").onclick = ev => {
    const tr = ev.target.closest("tr[data-id]");
    if (tr) focusRequest(tr.dataset.id);
  };
  document.addEventListener("bs-source", () => { clearFocus(); refreshSlowest(); });
  if (!root.dataset.tailTimer) {
    root.dataset.tailTimer = "1";
    setInterval(liveRefresh, LIVE_REFRESH_MS);
  }
  refreshSlowest();
}

const inReplay = () => state.view.source === "replay";
const selector = () => (inReplay() ? "replay=true" : "");

// Live: a new list only when a request finished since last time (the route builds the whole live timeline). The
// latest finish, not a count: the page keeps the newest KEEP_REQUESTS requests, so after a long burst the count
// of finished ones stays at that cap while new ones keep finishing.
function liveRefresh() {
  if (inReplay() || document.hidden || !$("bs-slowest")) return;
  let latest = -1;
  for (const r of state.store.requests.values()) if (r.finish_us !== null && r.finish_us !== undefined) {
    latest = Math.max(latest, r.finish_us);
  }
  if (latest !== seen.finished) refreshSlowest();
  seen.finished = latest;
}

export async function refreshSlowest() {
  const table = $("bs-slowest");
  if (!table) return;
  let out;
  try {
    out = await api(`/api/requests/slowest?n=${SLOWEST}&${selector()}`);
  } catch (e) {
    table.dataset.error = e.message;
    return;
  }
  const ms = v => (v === null || v === undefined ? "–" : Number(v).toFixed(v >= 100 ? 0 : 2));
  const html = out.requests.map(r =>
    `<tr data-id="${esc(r.id)}" title="Show ${esc(r.id)} on the Gantt"><td>${esc(r.id)}</td><td>${ms(r.e2e_ms)}</td>` +
    `<td>${ms(r.ttft_ms)}</td><td>${ms(r.itl_max_ms)}</td><td>${r.prompt_tokens ?? "–"}</td><td>${r.output_tokens ?? "–"}</td>` +
    `<td>${r.preemptions || 0}</td><td>${esc((r.modes || []).join(", ") || "–")}</td></tr>`).join("") ||
    `<tr><td colspan="8" class="muted">${state.view.source === "live"
      ? "no finished request in this timeline yet: fire a burst"
      : "no finished request in this recording (a profiler trace holds none)"}</td></tr>`;
  const body = table.tBodies[0];
  if (body.innerHTML !== html) body.innerHTML = html;     // (a row under the cursor stays the same element)
  table.dataset.rows = String(out.requests.length);
  delete table.dataset.error;
  markChosen();
}

function markChosen() {
  const id = state.focus && state.focus.id;
  for (const tr of document.querySelectorAll("#bs-slowest tr[data-id]")) tr.classList.toggle("bs-chosen", tr.dataset.id === id);
}

// A click on a point of a latency CDF (sweep.js listens on its charts): the point's customdata is its request's id.
export function onCdfClick(ev) {
  const pt = ev && ev.points && ev.points[0];
  const id = pt && (Array.isArray(pt.customdata) ? pt.customdata[0] : pt.customdata);
  if (typeof id === "string" && id) focusRequest(id, "cdf");
}

// A CDF keeps its values after their steps left the live ring (or while the page shows a replay): said so.
function notHere(id, e, from) {
  if (from !== "cdf" || !/^no request/.test(e.message)) return `request ${id}: ${e.message}`;
  return inReplay() ? `request ${id} is not in the replay shown: the CDF's requests ran live (back to live to see it)`
                    : `request ${id} is no longer in the live timeline: the ring keeps only the newest steps`;
}

// The request's waits from the server, then the Gantt on its lifetime (frozen there like a zoom: a window
// button or a double-click goes back to the live window, the highlight stays until "clear"). `from` says
// where the pick came from ("cdf": a point of a latency CDF).
export async function focusRequest(id, from) {
  let w;
  try {
    w = await api(`/api/requests/${encodeURIComponent(id)}/waits?${selector()}`);
  } catch (e) {
    note(notHere(id, e, from), true);
    return;
  }
  const [a, b] = w.lifetime_us;
  if (a === null || b === null) { note(`request ${id}: its lifetime is not in this timeline`, true); return; }
  const pad = Math.max((b - a) * PAD, 500);
  state.focus = { ...w, source: state.view.source, stepSet: new Set(w.steps.map(d => d.step)),
                  byStep: new Map(w.steps.map(d => [d.step, d])) };
  Object.assign(state.view, { follow: false, range: [a - pad, b + pad], zoomed: true });
  showFocusText(w);
  markChosen();
  revealGantt();
  state.dirty = true;
}

// Scroll the Gantt into sight below the sticky header (which would otherwise cover its top lanes).
export function revealGantt() {
  const g = $("bs-gantt"), head = $("bs-header");
  if (!g) return;
  g.style.scrollMarginTop = Math.max(0, Math.round(head ? head.getBoundingClientRect().bottom : 0)) + 8 + "px";
  g.scrollIntoView({ block: "nearest" });
}

export function clearFocus() {
  if (!state.focus) return;
  state.focus = null;
  const f = $("bs-focus");
  if (f) f.hidden = true;
  markChosen();
  state.dirty = true;
}

const fms = us => (us === null || us === undefined ? "?" : us >= 1000 ? (us / 1000).toFixed(us >= 1e5 ? 0 : 2) + " ms"
                                                                   : Math.round(us) + " µs");

// What it waited for, in one line: the same words the hover uses for each step.
export function waitsText(w) {
  const x = w.waits, parts = [`queue ${fms(x.queue_us)}`];
  if (x.start_us !== null) parts.push(`to its first compute ${fms(x.start_us)}`);
  parts.push(`others' prefill ${fms(x.others_prefill_us)}` +
             (x.others_prefill_tokens ? ` (${x.others_prefill_tokens} tok in ${x.others_prefill_steps} steps)` : ""));
  parts.push(`preempted ${x.preemptions ? fms(x.preempted_us) + ` (${x.preemptions}×)` : "never"}`);
  const causes = Object.entries(x.gap_by_cause_us || {}).sort((p, q) => q[1] - p[1]).slice(0, 3)
    .map(([c, us]) => `${causeLabel(c)} ${fms(us)}`).join(", ");
  parts.push(`host gaps ${fms(x.gap_us)}` + (causes ? ` (${causes})` : ""));
  return parts.join(" · ");
}

function showFocusText(w) {
  const f = $("bs-focus");
  if (!f) return;
  const head = `<b>${esc(w.id)}</b> · E2E ${fms(w.e2e_us)} · TTFT ${fms(w.ttft_us)} · ${w.steps.length} steps · waited: `;
  $("bs-focus-text").innerHTML = head + esc(waitsText(w)) +
    (w.unknown.length ? `<br><span class="muted">not known: ${esc(w.unknown.join("; "))}</span>` : "");
  f.hidden = false;
}

// For the hover (gantt_hover.js): what the focused request did in step `s`, or was waiting in at time t.
export function focusLine(s, t) {
  const f = state.focus;
  if (!f || f.source !== state.view.source) return "";
  const d = f.byStep.get(s.step);
  if (d) {
    const bits = [`${d.phase}${d.resumed ? " (back from preemption)" : ""}`];
    if (d.others_prefill_tokens) bits.push(`waited on others' prefill ${fms(d.others_prefill_us)} (${d.others_prefill_tokens} tok)`);
    if (d.gap_us > 0 && d !== f.steps[0]) {
      const top = Object.entries(d.gap_by_cause_us || {}).sort((p, q) => q[1] - p[1])[0];
      bits.push(`host gap before ${fms(d.gap_us)}` + (top ? ` (most: ${causeLabel(top[0])})` : ""));
    }
    return `<br><span style="color:${PHASE_COLOR[d.phase] || "#fff"}">■</span> <b style="color:#fff">${esc(f.id)}</b>: ` + esc(bits.join(" · "));
  }
  const sp = f.spans.find(p => (p.phase === "queue" || p.phase === "preempted") && p.t0_us <= t && t <= (p.t1_us ?? Infinity));
  if (!sp) return "";
  const what = sp.phase === "queue" ? `waiting in the queue (${fms(f.waits.queue_us)} in all)`
                                    : `preempted, waiting to come back (${fms(sp.t1_us - sp.t0_us)})`;
  return `<br><span style="color:${PHASE_COLOR[sp.phase]}">■</span> <b style="color:#fff">${esc(f.id)}</b>: not in this step, ${what}`;
}
