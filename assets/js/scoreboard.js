/* The per-mode scoreboard (#bs-board, rendered empty by app/ui/page_html.py). It draws the server's board
 * (telemetry/figures.py): live, the websocket's "board" messages (each mode's newest 15 s, warm-up left out);
 * in replay, the board the server computed for the whole recording. The page computes no figure itself.
 *
 * The verdict is the board's: ratios only from matched decode steps, with their 90% interval and n, "within
 * noise" when the interval holds 1, nothing before enough steps, no winner before enough switches between the
 * modes or where compute runs on the host (telemetry/alternations.py). Large type: it is what a room reads. */
import { currentData, shownBoard, state } from "./feed.js";
import { NOT_IN_TRACE, notInTrace } from "./unknown.js";
import { rankTableHtml } from "./ranks.js";
import { causeLabel } from "./names.js";
import { busyLabel } from "./palette.js";
import { $, esc } from "./util.js";

const fmtNum = (v, digits) => (v === null || v === undefined || !isFinite(v) ? "–"
  : Number(v).toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits }));

const unit = u => `<small class="bs-unit">${u}</small>`;
const ROWS = [
  { key: "ms_per_step", label: "ms / step", hint: "median step time, compute start to the next step's (all steps of the stretch, warm-up left out)", fmt: v => fmtNum(v, 2) },
  { key: "decode_tokens_per_s", label: "decode tok/s", hint: "decode tokens per second: steps without prefill, over their own periods", fmt: v => fmtNum(v, 0) },
  { key: "busy_pct", label: busyLabel("events"), hint: "share of the working time the device computed (CUDA events on a GPU, the forward's host span on a CPU); pauses with no request left out", fmt: v => (v === null || v === undefined ? "–" : fmtNum(v, 1) + unit("%")) },
  { key: "idle_us_per_step", label: "idle / step", hint: "GPU idle gap before each step, on average (empty-queue time left out)", fmt: v => (v === null || v === undefined ? "–" : v >= 1000 ? fmtNum(v / 1000, 2) + unit("ms") : fmtNum(v, 0) + unit("µs")) },
];

const DEVICE_BASIS = "device_ops";
const DEVICE_HINT = "share of the time the device ran any op (the union of kernels, copies and memsets on all streams), " +
  "from the profiler trace: what the device did";
const STEPS_HINT = "share of the time the steps' compute spans cover (first to last op of each step): launch gaps " +
  "inside a step count as busy there, so it reads higher than the device's own figure";
// the board's figures made of a field an imported trace may not hold
const UNKNOWN_FROM = { decode_tokens_per_s: "tokens_out" };

const interval = ci => (ci ? `${ci[0].toFixed(2)}–${ci[1].toFixed(2)}` : "");

// The ratio column: only where the comparison stands on enough matched steps; else why not.
function ratioHtml(key, b) {
  const c = b.compare || {};
  const s = b.modes.sync || {}, a = b.modes.async || {};
  if (!c.ms_per_step) return key === "ms_per_step" ? `<small>${esc(c.verdict || "–")}</small>` : "";
  if (key === "ms_per_step") {
    const r = c.ms_per_step;
    const word = c.verdict === "async faster" ? "faster" : c.verdict === "async slower" ? "slower"
      : c.verdict === "within noise" ? "within noise" : "no winner";
    return `<b title="90% interval ${interval(r.ci)}">${r.ratio.toFixed(2)}×</b> <small>${word}</small>`;
  }
  if (key === "decode_tokens_per_s") {
    const r = c.tokens_per_s;
    return `<b title="90% interval ${interval(r.ci)}">×${r.ratio.toFixed(2)}</b>`;
  }
  if (key === "busy_pct" && s.busy_pct !== null && a.busy_pct !== null && s.busy_pct !== undefined && a.busy_pct !== undefined) {
    const d = a.busy_pct - s.busy_pct;
    return `<b>${d >= 0 ? "+" : "−"}${Math.abs(d).toFixed(1)}</b>&nbsp;<small>pts</small>`;
  }
  if (key === "idle_us_per_step" && s.idle_us_per_step && a.idle_us_per_step !== null && a.idle_us_per_step !== undefined) {
    const d = 100 * (a.idle_us_per_step - s.idle_us_per_step) / s.idle_us_per_step;
    return `<b>${d <= 0 ? "−" : "+"}${Math.abs(d).toFixed(0)}%</b>`;
  }
  return "";
}

// What the steps support, in one sentence: the verdict with its interval and n, or why there is none yet.
export function verdictHtml(c, cls = "bs-verdict-line", live = true) {
  if (!c) return "";
  const n = c.n ? `n = ${c.n.sync} / ${c.n.async} decode steps` : "";
  const sizes = c.batch_sizes && c.batch_sizes.length
    ? ` of batch ${c.batch_sizes.length > 3 ? c.batch_sizes[0] + "–" + c.batch_sizes[c.batch_sizes.length - 1] : c.batch_sizes.join(", ")}` : "";
  let head;
  if (c.verdict === "async faster" || c.verdict === "async slower") {
    head = `<b>async ${c.ms_per_step.ratio.toFixed(2)}× ${c.verdict === "async faster" ? "faster" : "slower"}</b>`;
  } else if (c.verdict === "within noise") {
    head = `<b>no clear difference</b>`;
  } else if (c.verdict === "not enough alternations") {
    head = `<b>no winner${live ? " yet" : ""}: switch ${live ? "again" : "more often"}</b>`;
  } else if (c.verdict === "no winner here") {
    head = `<b>no winner on this device</b>`;
  } else {
    head = live ? `<b>not enough steps yet</b>` : `<b>not enough steps</b>`;
  }
  // a finished recording will get no more steps: its reason loses the live engine's "so far"
  const reason = live ? c.reason || "" : (c.reason || "").replace(/ so far$/, "");
  const detail = c.ms_per_step ? `${esc(reason)} · ${n}${sizes}` : esc(reason);
  return `<div class="${cls}" data-verdict="${esc(c.verdict || "")}" title="${esc(c.basis || "")}">${head} ` +
    `<span>${detail}</span></div>`;
}

function topCause(f) {
  let best = null;
  for (const [c, us] of Object.entries((f && f.idle_us_by_cause) || {})) if (!best || us > best[1]) best = [c, us];
  return best ? causeLabel(best[0]) : "";
}

function forecastHtml(b, live) {
  const f = b.forecast || {};
  const why = [["sync", b.modes.sync], ["async", b.modes.async]].filter(([, fig]) => fig && fig.steps && topCause(fig))
    .map(([m, fig]) => `${m} idles most on <b>${esc(topCause(fig))}</b>`).join(" · ");
  const whyHtml = why ? `<span class="bs-board-why">${why}</span>` : "";
  if (!f.applicable) {
    return `<div class="bs-board-forecast" id="bs-forecast" data-applicable="0"><span class="bs-fc-label">async forecast</span> ` +
      `<span class="bs-fc-note">${esc(f.reason || "")}</span>${whyHtml}</div>`;
  }
  const fc = f.forecast_ms_per_step.p50, ma = f.measured_async_ms_per_step;
  const measured = ma && ma.p50 !== null
    ? `<span class="bs-fc-measured">measured async <b id="bs-fc-async">${fmtNum(ma.p50, 2)}</b> ms/step ` +
      `<span class="bs-fc-err">(forecast ${f.forecast_error_pct >= 0 ? "+" : "−"}${Math.abs(f.forecast_error_pct).toFixed(1)}%)</span></span>`
    : live ? `<span class="bs-fc-measured">switch to async (A) to check it</span>`
      : `<span class="bs-fc-measured">no async stretch in the recording to check it against</span>`;
  const bounds = f.stretches.reduce((acc, s) => { for (const k in s.bound_steps) acc[k] = (acc[k] || 0) + s.bound_steps[k]; return acc; }, {});
  const bound = (bounds.host || 0) > (bounds.gpu || 0) + (bounds.chain || 0) ? "host-bound: async hides the GPU time, the host's stays"
    : "GPU-bound: async would hide the host's work";
  return `<div class="bs-board-forecast" id="bs-forecast" data-applicable="1" title="From each sync step's own spans: ` +
    `GPU compute, host work and the chain between steps, replayed as the async loop would overlap them (docs/forecast.md). ${esc(bound)}.">` +
    `<span class="bs-fc-label">async forecast from the sync spans</span> ` +
    `<span class="bs-fc-value"><b id="bs-fc-ms">${fmtNum(fc, 2)}</b> ms/step ` +
    `<span class="bs-fc-speedup">(${f.speedup.toFixed(2)}× faster than sync)</span></span> ${measured}${whyHtml}</div>`;
}

// Which steps a mode's column stands on: one stretch's range, or how many stretches and steps.
function spanText(f, live) {
  if (!f || !f.steps) return live ? "no steps yet" : "no steps";
  const ranges = f.ranges || [];
  return ranges.length > 1 ? `${ranges.length} stretches · ${f.steps} steps` : `steps ${f.first_step}–${f.last_step}`;
}

// Two arrangements of the same figures: a table with a row per figure (the column beside the charts when
// presenting) and a strip with a row per mode (the band above the charts otherwise); style.css shows one.
function boardHtml(b, live) {
  const cur = live ? state.mode : null;
  const now = m => (cur === m ? " now" : "");
  const nowTag = m => (cur === m ? `<small class="bs-now-tag">running</small>` : "");
  const head = m => `<th class="bs-bm ${m}${now(m)}" scope="col">${m}${nowTag(m)}</th>`;
  const s = b.modes.sync || {}, a = b.modes.async || {};
  const hostBasis = s.busy_basis === "host" || a.busy_basis === "host";
  const deviceBasis = s.busy_basis === DEVICE_BASIS || a.busy_basis === DEVICE_BASIS;
  const label = r => (r.key === "busy_pct" ? busyLabel(hostBasis ? "host" : deviceBasis ? DEVICE_BASIS : "events")
    : r.label);
  const hint = r => (r.key === "busy_pct" && deviceBasis ? DEVICE_HINT : r.hint);
  const unknown = notInTrace(currentData());
  const cell = (r, f) => (f.steps && f[r.key] === null && UNKNOWN_FROM[r.key] && unknown.has(UNKNOWN_FROM[r.key])
    ? `<span class="bs-unknown">${NOT_IN_TRACE}</span>`
    : r.fmt(f[r.key]) + (r.key === "busy_pct" && f.busy_pct_steps !== undefined && f.busy_pct_steps !== null
      ? `<small class="bs-busy-steps" title="${esc(STEPS_HINT)}">steps ${fmtNum(f.busy_pct_steps, 1)}%</small>` : ""));
  const rows = ROWS.map(r => `<tr data-key="${r.key}"><th scope="row" title="${esc(hint(r))}">${label(r)}</th>` +
      `<td class="sync">${cell(r, s)}</td><td class="async">${cell(r, a)}</td>` +
      `<td class="bs-ratio">${ratioHtml(r.key, b)}</td></tr>`).join("");
  const warm = b.warmup_steps_per_stretch ? `, the first ${b.warmup_steps_per_stretch} steps of each stretch left out (warm-up)` : "";
  const scope = live ? `each mode's newest ${b.window_s} s${warm}` : `whole recording, per mode${warm}`;
  const table = `<div class="bs-board-head"><span class="bs-board-title">sync vs async</span>` +
    `<span class="bs-board-scope">${scope}</span></div>` +
    `<table class="bs-board-table"><thead><tr><th></th>${head("sync")}${head("async")}<th class="bs-ratio-h" scope="col">async vs sync</th></tr></thead>` +
    `<tbody>${rows}</tbody><tfoot><tr><th></th><td>${spanText(s, live)}</td><td>${spanText(a, live)}</td><td></td></tr></tfoot></table>`;
  const strip = `<table class="bs-board-strip"><thead><tr><th scope="col" title="${scope}"><span class="bs-board-title">sync vs async</span>` +
    `<small>${live ? "newest " + b.window_s + " s" : "whole recording"}</small></th>` + ROWS.map(r => `<th scope="col" title="${esc(hint(r))}">${label(r)}</th>`).join("") + `</tr></thead><tbody>` +
    ["sync", "async"].map(m => `<tr class="${m}"><th scope="row" class="bs-bm ${m}${now(m)}">${m}${nowTag(m)}<small>${spanText(b.modes[m], live)}</small></th>` +
      ROWS.map(r => `<td>${cell(r, b.modes[m] || {})}</td>`).join("") + `</tr>`).join("") +
    `<tr class="bs-ratio-row"><th scope="row">async vs sync</th>` + ROWS.map(r => `<td class="bs-ratio">${ratioHtml(r.key, b)}</td>`).join("") +
    `</tr></tbody></table>`;
  return headlineHtml(live) + traceNotesHtml(live) + table + strip + verdictHtml(b.compare, undefined, live) + forecastHtml(b, live) +
    rankTableHtml(currentData());
}

// An imported trace: what it under-records (said before any figure is read), and the import's other notes.
function traceNotesHtml(live) {
  const src = ((currentData() || {}).meta || {}).source;
  if (live || !src) return "";
  const under = src.under_recorded || [], notes = src.notes || [];
  if (!under.length && !notes.length) return "";
  const list = xs => xs.map(n => `<li>${esc(n)}</li>`).join("");
  return `<div class="bs-trace-notes" id="bs-trace-notes" data-under="${under.length}">` +
    (under.length ? `<b>The trace under-records:</b><ul class="bs-under">${list(under)}</ul>` : "") +
    (notes.length ? `<details><summary>${notes.length} note${notes.length > 1 ? "s" : ""} from the import</summary>` +
                    `<ul>${list(notes)}</ul></details>` : "") + `</div>`;
}

// An imported trace's headline: what the device did over the steps' window (the union of its ops), the steps'
// own figure beside it under its own name. batchscope's own recordings lead with the board's modes.
function headlineHtml(live) {
  const d = currentData(), sm = (d && d.summary) || {};
  if (live || sm.busy_basis !== DEVICE_BASIS) return "";
  const steps = sm.busy_pct_steps !== null && sm.busy_pct_steps !== undefined
    ? ` <small title="${esc(STEPS_HINT)}">· between steps only (the steps' compute spans): ${fmtNum(sm.busy_pct_steps, 1)}%</small>` : "";
  return `<div class="bs-board-device" id="bs-board-device" data-busy="${fmtNum(sm.busy_pct, 2)}" title="${esc(DEVICE_HINT)}">` +
    `device busy${Array.isArray(sm.ranks) && sm.ranks.length > 1 ? " (rank 0)" : ""} ` +
    `<b id="bs-board-busy">${fmtNum(sm.busy_pct, 1)}${unit("%")}</b> <small>of the steps' window, ` +
    `the union of its kernels, copies and memsets</small>${steps}</div>`;
}

// What tests and curious readers can check without parsing the text.
function expose(el, b, live) {
  const put = (k, v) => { el.dataset[k] = v === null || v === undefined || !isFinite(v) ? "" : String(Math.round(v * 1000) / 1000); };
  for (const m of ["sync", "async"]) {
    const f = b.modes[m] || {};
    put(m + "Ms", f.ms_per_step); put(m + "Tps", f.decode_tokens_per_s); put(m + "Busy", f.busy_pct);
    put(m + "Idle", f.idle_us_per_step); el.dataset[m + "Steps"] = String(f.steps || 0);
  }
  const c = b.compare || {};
  put("ratioMs", c.ms_per_step ? c.ms_per_step.ratio : null);
  put("ratioLo", c.ms_per_step ? c.ms_per_step.ci[0] : null);
  put("ratioHi", c.ms_per_step ? c.ms_per_step.ci[1] : null);
  put("ratioTps", c.tokens_per_s ? c.tokens_per_s.ratio : null);
  el.dataset.verdict = c.verdict || "";
  el.dataset.n = c.n ? `${c.n.sync}/${c.n.async}` : "";
  const f = b.forecast || {};
  put("forecastMs", f.applicable ? f.forecast_ms_per_step.p50 : null);
  put("forecastAsyncMs", f.applicable && f.measured_async_ms_per_step ? f.measured_async_ms_per_step.p50 : null);
  put("forecastError", f.applicable ? f.forecast_error_pct : null);
  el.dataset.scope = live ? "live" : "replay";
  const sm = (currentData() || {}).summary || {};
  put("deviceBusy", !live && sm.busy_basis === DEVICE_BASIS ? sm.busy_pct : null);
}

let last = { key: "" };

// Called often (stage.js); redraws when another board arrived, the view changed or the mode did.
export function updateBoard() {
  const el = $("bs-board");
  if (!el || !state.root) return;
  const live = state.view.source === "live";
  const b = shownBoard();
  const key = [state.view.source, state.view.replayName, state.boardGen, live ? state.mode : ""].join("|");
  if (key === last.key && el.childElementCount) return;
  last = { key };
  if (!b || !b.modes) { if (el.innerHTML) el.innerHTML = ""; return; }
  const html = boardHtml(b, live);
  if (el.innerHTML !== html) el.innerHTML = html;
  expose(el, b, live);
}
