/* Hover on the Gantt: the step under the cursor, its spans and the idle gap before it, in a small box.
 * Found by binary search in the steps drawn last, so it costs nothing at redraw time, whatever the number of
 * steps (one Plotly marker per step made every redraw of a busy window slow). Over another tensor-parallel
 * rank's lanes it is that rank's part of the step; at every rank the box estimates the step's all-reduce time. */
import { currentData } from "./feed.js";
import { findStep, span } from "./records.js";
import { allreduceEstimate, stepRows } from "./tensor_parallel.js";
import { NOT_IN_TRACE, notInTrace } from "./unknown.js";
import { causeLabel } from "./names.js";
import { GPU, HOST } from "./plot.js";
import { focusLine } from "./tail.js";
import { esc } from "./util.js";

const view = { steps: [], lo: 0, hi: 1, margin: null, plotH: 0, spec: null, tp: null, rankSteps: {}, bound: null, box: null };
const NEAR_PX = 24;                        // farther from any step's compute than this: no box

export function bindHover(el, picture) {
  Object.assign(view, picture);
  if (view.bound === el) return;
  view.bound = el;
  el.addEventListener("mousemove", ev => show(el, ev));
  el.addEventListener("mouseleave", hide);
  el.addEventListener("mousedown", hide);  // a zoom drag: the box would sit on the selection
}

function box(el) {
  if (view.box && view.box.isConnected) return view.box;
  const b = document.createElement("div");
  b.id = "bs-gantt-hover";
  Object.assign(b.style, {
    position: "absolute", zIndex: 5, pointerEvents: "none", display: "none", maxWidth: "560px",
    background: "rgba(15,23,42,0.94)", color: "#f8fafc", font: "12px/1.45 Inter, system-ui, sans-serif",
    padding: "6px 9px", borderRadius: "6px", boxShadow: "0 2px 8px rgba(15,23,42,0.25)", whiteSpace: "nowrap",
  });
  el.parentElement.appendChild(b);
  view.box = b;
  return b;
}

function hide() { if (view.box) view.box.style.display = "none"; }

function show(el, ev) {
  const m = view.margin, steps = view.steps;
  if (ev.buttons || !m || !steps.length) return hide();
  const rect = el.getBoundingClientRect();
  const w = rect.width - m.l - m.r, x = ev.clientX - rect.left - m.l, y = ev.clientY - rect.top;
  if (x < 0 || x > w || y < m.t || y > rect.height - m.b) return hide();
  const usPerPx = (view.hi - view.lo) / w;
  // which rank's lanes the cursor is on: another rank's show its own records
  const lanes = view.spec ? view.spec.lanes : null;
  const lane = lanes && view.plotH ? lanes[Math.floor((y - m.t) / (view.plotH / lanes.length))] : null;
  const rank = lane && lane.rank ? lane.rank : 0;
  const list = rank ? view.rankSteps[rank] || [] : steps;
  const s = nearest(list, view.lo + x * usPerPx);
  if (!s || Math.abs(s._c - (view.lo + x * usPerPx)) > Math.max(NEAR_PX * usPerPx, s._e - s._s)) return hide();
  const b = box(el);
  // (and what the request picked in the slowest list did there, or was waiting in: tail.js)
  b.innerHTML = (rank ? describeRank(s, findStep(steps, s.step), view.tp.ranks.find(r => r.rank === rank)) : describe(s)) +
    focusLine(s, view.lo + x * usPerPx);
  b.style.display = "block";
  // beside the cursor, flipped to the left near the right edge
  const bw = b.offsetWidth, left = ev.clientX - rect.left + 14;
  b.style.left = (left + bw > rect.width ? Math.max(0, ev.clientX - rect.left - bw - 14) : left) + "px";
  // (above the cursor on the lowest lanes: the Gantt of a tensor-parallel engine is tall)
  const bh = b.offsetHeight;
  b.style.top = (y - 10 + bh > rect.height ? Math.max(0, y - bh - 6) : Math.max(0, y - 10)) + "px";
}

// The step whose compute start (where an idle gap ends) is nearest to t; steps are ordered by index, so by _c.
function nearest(steps, t) {
  let a = 0, b = steps.length;
  while (a < b) { const mid = (a + b) >> 1; if (steps[mid]._c < t) a = mid + 1; else b = mid; }
  const l = steps[a - 1], r = steps[a];
  if (!l) return r;
  if (!r) return l;
  return t - l._c <= r._c - t ? l : r;
}

// The step's counts, or what the trace does not hold (an imported trace has no request or token counts).
function countsText(s, unknown) {
  const req = unknown.has("num_requests") ? "requests " + NOT_IN_TRACE : `${s.num_requests} req`;
  const tok = unknown.has("prefill_tokens") || unknown.has("decode_tokens") ? "tokens " + NOT_IN_TRACE
    : `${s.prefill_tokens} prefill + ${s.decode_tokens} decode tok`;
  return `${req} · ${tok}`;
}

// At TP > 1: the step's collective time as the trace measured it (imported), else its estimated all-reduce
// time from the measurement the engine made at start-up.
function allreduceLine(step, rec) {
  const tp = view.tp;
  if (!tp || tp.size < 2 || !step) return "";
  const measured = (rec || step).collective_us;
  if (typeof measured === "number") return `<br>collectives (in the trace): ${(measured / 1000).toFixed(3)} ms`;
  const est = allreduceEstimate(tp, stepRows(step));
  if (!est) return "<br>all-reduce: not measured by this engine";
  const one = est.one >= 1000 ? (est.one / 1000).toFixed(3) + " ms" : est.one.toFixed(1) + " µs";
  return `<br>all-reduce ≈ ${(est.us / 1000).toFixed(3)} ms (measured at start-up)` +
    `<span style="color:#cbd5e1"> · ${est.count} × ${one} for ${est.scaled ? "" : "≤ "}${est.rows} rows` +
    `${est.scaled ? ", scaled" : ""}</span>`;
}

// Another rank's part of step `s0` (rank 0's record, which holds the step's counts; null when out of view).
function describeRank(r, s0, rank) {
  const ms = v => ((v[1] - v[0]) / 1000).toFixed(3);
  const host = rank && rank.host;
  const dev = host ? (r._cs ? `compute (host) ${ms(r._cs)}` : "")
    : GPU.map(k => { const v = span(r, "gpu", k); return v ? `${k} ${ms(v)}` : ""; }).filter(Boolean).join(", ");
  const lag = s0 && s0._cs && r._cs ? ((r._cs[0] - s0._cs[0]) / 1000).toFixed(3) : null;
  const head = `<b style="color:#fff">rank ${r.rank}${rank && rank.device ? " · " + esc(rank.device) : ""} · step ${r.step}</b>` +
    (r.mode ? " · " + esc(r.mode) : "") + (s0 ? " · " + countsText(s0, notInTrace(currentData())) : "");
  return head + (dev ? `<br>device ms: ${dev}` : "") +
    (lag !== null ? `<br>compute starts ${lag >= 0 ? "+" : ""}${lag} ms from rank 0's` : "") + allreduceLine(s0, r);
}

// An imported step: how much of its own part of the span the device ran anything (the union of its ops).
function deviceLine(s) {
  if (typeof s.device_ops_us !== "number" || !s._cs || !(s._cs[1] > s._cs[0])) return "";
  return `<br>device ran ops ${(s.device_ops_us / 1000).toFixed(3)} ms of the step's span`;
}

function describe(s) {
  const ms = v => v ? ((v[1] - v[0]) / 1000).toFixed(3) : null;
  const list = (group, keys) => keys.map(k => { const v = ms(span(s, group, k)); return v === null ? "" : `${k} ${v}`; })
    .filter(Boolean).join(", ");
  const dev = s.gpu ? list("gpu", GPU) : (s._hostCompute ? `compute (host) ${ms(s._cs)}` : "");
  const idle = s.gpu_idle_before_us > 0
    ? `<br>GPU idle before: ${(s.gpu_idle_before_us / 1000).toFixed(3)} ms (${esc(causeLabel(s.idle_cause || "none"))})` : "";
  // imported traces: the idle stretches inside the step's compute span (another place than the gap before it),
  // by cause, the largest first
  const inside = s.gpu_idle_inside_us > 0
    ? `<br>GPU idle inside the step: ${(s.gpu_idle_inside_us / 1000).toFixed(3)} ms (` +
      Object.entries(s.idle_inside_by_cause_us || {}).sort((a, b) => b[1] - a[1]).slice(0, 3)
        .map(([c, us]) => `${esc(causeLabel(c))} ${(us / 1000).toFixed(3)}`).join(", ") + ")" : "";
  const host = list("cpu", HOST);
  const unknown = notInTrace(currentData());
  // (the page styles <b> dark for its light panels: this box is dark)
  return `<b style="color:#fff">step ${s.step}</b> · ${esc(s.mode)}${unknown.size ? "" : " · slot " + s.slot} · ` +
    `${countsText(s, unknown)}<br>host ms: ${host || (unknown.size ? "host phases " + NOT_IN_TRACE : "none")}` +
    (dev ? `<br>device ms: ${dev}` : "") + deviceLine(s) + idle + inside + allreduceLine(s);
}
