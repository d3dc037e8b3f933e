/* The per-mode scoreboard (#bs-board, rendered empty by app/ui/page_html.py): ms/step, decode tok/s, GPU busy % and
 * idle per step for sync and for async side by side, how async compares, and what the sync steps forecast for
 * async (figures.js). Live it covers the newest LIVE_WINDOW_US of each mode's latest stretch, so a switch
 * shows within seconds; in replay it covers the whole recording, per mode, as the replay summary does.
 * Large type: it is what a room reads from the back. */
import { currentData, state } from "./feed.js";
import { figures, forecastAsync, forecastOf, stretches } from "./figures.js";
import { causeLabel } from "./names.js";
import { $, esc } from "./util.js";

const LIVE_WINDOW_US = 15e6;

const fmtNum = (v, digits) => (v === null || v === undefined || !isFinite(v) ? "–"
  : Number(v).toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits }));

// The newest part of the latest stretch of each mode (live), or every stretch of each mode (replay).
export function modeRuns(steps, live) {
  const out = { sync: [], async: [] };
  if (!live) {
    for (const run of stretches(steps)) if (out[run[0].mode]) out[run[0].mode].push(run);
    return out;
  }
  // walk back from the newest step: the latest run of each mode, cut to its newest LIVE_WINDOW_US
  let end = steps.length;
  while (end > 0 && (!out.sync.length || !out.async.length)) {
    let start = end - 1;
    while (start > 0 && steps[start - 1].mode === steps[end - 1].mode && steps[start - 1].step === steps[start].step - 1) start--;
    const mode = steps[end - 1].mode;
    if (out[mode] && !out[mode].length) {
      const last = steps[end - 1], tEnd = last._e !== undefined ? last._e : (last.compute_us || [0, 0])[1];
      let a = start;
      while (a < end - 1 && (steps[a]._c !== undefined ? steps[a]._c : steps[a].compute_us[0]) < tEnd - LIVE_WINDOW_US) a++;
      out[mode].push(steps.slice(a, end));
    }
    end = start;
  }
  return out;
}

export function computeBoard(d, live) {
  const runs = modeRuns(d.steps, live);
  const sync = figures(runs.sync), async = figures(runs.async);
  const forecast = live ? forecastOf(runs.sync, runs.async) : forecastAsync(d.steps);
  return { sync, async, forecast, live };
}

// How async compares with sync, in words that say which way is better; HTML (the number large, the word small).
function ratioHtml(key, s, a) {
  if (s === null || a === null || s === undefined || a === undefined || !isFinite(s) || !isFinite(a)) return "";
  if (key === "busyPct") return `<b>${a - s >= 0 ? "+" : "−"}${Math.abs(a - s).toFixed(1)}</b> <small>pts</small>`;
  if (!s || !a) return "–";
  if (key === "msPerStep") return `<b>${(s / a).toFixed(2)}×</b> <small>${a <= s ? "faster" : "slower"}</small>`;
  if (key === "idleUsPerStep") return `<b>${a <= s ? "−" : "+"}${Math.abs(100 * (a - s) / s).toFixed(0)}%</b>`;
  return `<b>×${(a / s).toFixed(2)}</b>`;
}

const unit = u => `<small class="bs-unit">${u}</small>`;
const ROWS = [
  { key: "msPerStep", label: "ms / step", hint: "median step time: compute start to the next step's", fmt: v => fmtNum(v, 2) },
  { key: "decodeTokensPerS", label: "tok/s", hint: "decode tokens per second (steps without prefill, so the arrivals of new prompts do not sway it)", fmt: v => fmtNum(v, 0) },
  { key: "busyPct", label: "GPU busy", hint: "share of the working time the device computed (CUDA events on a GPU, the forward's host span on a CPU); pauses with no request left out", fmt: v => (v === null ? "–" : fmtNum(v, 1) + unit("%")) },
  { key: "idleUsPerStep", label: "idle / step", hint: "GPU idle gap before each step, on average", fmt: v => (v === null ? "–" : v >= 1000 ? fmtNum(v / 1000, 2) + unit("ms") : fmtNum(v, 0) + unit("µs")) },
];

function topCause(f) {
  let best = null;
  for (const [c, us] of Object.entries(f.idleByCause || {})) if (!best || us > best[1]) best = [c, us];
  return best ? causeLabel(best[0]) : "";
}

function forecastHtml(b) {
  const f = b.forecast;
  const why = [["sync", b.sync], ["async", b.async]].filter(([, fig]) => fig.steps && topCause(fig))
    .map(([m, fig]) => `${m} idles most on <b>${esc(topCause(fig))}</b>`).join(" · ");
  const whyHtml = why ? `<span class="bs-board-why">${why}</span>` : "";
  if (!f.applicable) {
    return `<div class="bs-board-forecast" id="bs-forecast" data-applicable="0"><span class="bs-fc-label">async forecast</span> ` +
      `<span class="bs-fc-note">${esc(f.reason)}</span>${whyHtml}</div>`;
  }
  const measured = f.asyncMs !== null && f.asyncMs !== undefined
    ? `<span class="bs-fc-measured">measured async <b id="bs-fc-async">${fmtNum(f.asyncMs, 2)}</b> ms/step ` +
      `<span class="bs-fc-err">(forecast ${f.errorPct >= 0 ? "+" : "−"}${Math.abs(f.errorPct).toFixed(1)}%)</span></span>`
    : `<span class="bs-fc-measured">switch to async (A) to check it</span>`;
  const bound = f.bounds.host > f.bounds.gpu + f.bounds.chain ? "host-bound: async hides the GPU time, the host's stays"
    : "GPU-bound: async would hide the host's work";
  return `<div class="bs-board-forecast" id="bs-forecast" data-applicable="1" title="From each sync step's own spans: ` +
    `GPU compute, host work and the chain between steps, replayed as the async loop would overlap them (docs/forecast.md). ${esc(bound)}.">` +
    `<span class="bs-fc-label">async forecast from the sync spans</span> ` +
    `<span class="bs-fc-value"><b id="bs-fc-ms">${fmtNum(f.forecastMs, 2)}</b> ms/step ` +
    `<span class="bs-fc-speedup">(${f.speedup.toFixed(2)}× faster than sync)</span></span> ${measured}${whyHtml}</div>`;
}

// Two arrangements of the same figures: a table with a row per figure (the column beside the charts when
// presenting) and a strip with a row per mode (the band above the charts otherwise); style.css shows one.
function boardHtml(b) {
  const cur = b.live ? state.mode : null;
  const now = m => (cur === m ? " now" : "");
  const nowTag = m => (cur === m ? "<small>now</small>" : "");
  const head = m => `<th class="bs-bm ${m}${now(m)}" scope="col">${m}${nowTag(m)}</th>`;
  const hostBasis = b.sync.hostBasis || b.async.hostBasis;
  const label = r => (r.key === "busyPct" && hostBasis ? "busy (host)" : r.label);
  const ratio = r => ratioHtml(r.key, b.sync[r.key], b.async[r.key]);
  const rows = ROWS.map(r => `<tr data-key="${r.key}"><th scope="row" title="${esc(r.hint)}">${label(r)}</th>` +
      `<td class="sync">${r.fmt(b.sync[r.key])}</td><td class="async">${r.fmt(b.async[r.key])}</td>` +
      `<td class="bs-ratio">${ratio(r)}</td></tr>`).join("");
  const span = f => (f.steps ? `steps ${f.firstStep}–${f.lastStep}` : "no steps yet");
  const scope = b.live ? `newest ${LIVE_WINDOW_US / 1e6} s of each mode's latest stretch` : "whole recording, per mode";
  const table = `<div class="bs-board-head"><span class="bs-board-title">sync vs async</span>` +
    `<span class="bs-board-scope">${scope}</span></div>` +
    `<table class="bs-board-table"><thead><tr><th></th>${head("sync")}${head("async")}<th class="bs-ratio-h" scope="col">async vs sync</th></tr></thead>` +
    `<tbody>${rows}</tbody><tfoot><tr><th></th><td>${span(b.sync)}</td><td>${span(b.async)}</td><td></td></tr></tfoot></table>`;
  const strip = `<table class="bs-board-strip"><thead><tr><th scope="col" title="${scope}"><span class="bs-board-title">sync vs async</span>` +
    `<small>${b.live ? "newest " + LIVE_WINDOW_US / 1e6 + " s" : "whole recording"}</small></th>` + ROWS.map(r => `<th scope="col" title="${esc(r.hint)}">${label(r)}</th>`).join("") + `</tr></thead><tbody>` +
    ["sync", "async"].map(m => `<tr class="${m}"><th scope="row" class="bs-bm ${m}${now(m)}">${m}${nowTag(m)}<small>${span(b[m])}</small></th>` +
      ROWS.map(r => `<td>${r.fmt(b[m][r.key])}</td>`).join("") + `</tr>`).join("") +
    `<tr class="bs-ratio-row"><th scope="row">async vs sync</th>` + ROWS.map(r => `<td class="bs-ratio">${ratio(r)}</td>`).join("") +
    `</tr></tbody></table>`;
  return table + strip + forecastHtml(b);
}

// What tests and curious readers can check without parsing the text.
function expose(el, b) {
  const put = (k, v) => { el.dataset[k] = v === null || v === undefined || !isFinite(v) ? "" : String(Math.round(v * 1000) / 1000); };
  for (const m of ["sync", "async"]) {
    put(m + "Ms", b[m].msPerStep); put(m + "Tps", b[m].decodeTokensPerS); put(m + "Busy", b[m].busyPct);
    put(m + "Idle", b[m].idleUsPerStep); el.dataset[m + "Steps"] = String(b[m].steps);
  }
  put("ratioMs", b.sync.msPerStep && b.async.msPerStep ? b.sync.msPerStep / b.async.msPerStep : null);
  put("forecastMs", b.forecast.applicable ? b.forecast.forecastMs : null);
  put("forecastAsyncMs", b.forecast.applicable ? b.forecast.asyncMs : null);
  put("forecastError", b.forecast.applicable ? b.forecast.errorPct : null);
  el.dataset.scope = b.live ? "live" : "replay";
}

let last = { key: "", at: 0 };

// Called often (stage.js); recomputes when the data changed, at most once a second live.
export function updateBoard() {
  const el = $("bs-board");
  if (!el || !state.root) return;
  const d = currentData();
  const live = state.view.source === "live";
  const key = [state.view.source, state.view.replayName, d.steps.length, d.steps.length ? d.steps[d.steps.length - 1].step : -1,
               live ? state.mode : "", d.mode_changes.length].join("|");
  const now = performance.now();
  if (key === last.key || (live && now - last.at < 1000 && el.childElementCount)) return;
  last = { key, at: now };
  const b = computeBoard(d, live);
  const html = boardHtml(b);
  if (el.innerHTML !== html) el.innerHTML = html;
  expose(el, b);
}
