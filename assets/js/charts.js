/* The six small charts under the Gantt: busy % (events vs NVML), throughput, batch composition, KV cache,
 * queue depth, and step interval vs idle gap. Every chart shares the x range and the sync/async tint. */
import { state } from "./feed.js";
import { COLOR, GRID, NO_WORK, bandShapes, baseLayout, draw, modeRuns, modeShapes, titled } from "./plot.js";
import { $ } from "./util.js";

const CHART_HEIGHT = 210;
const BINS = 100;

export function renderCharts(d, steps, lo, hi) {
  const dataEnd = state.view.source === "live" ? Math.min(hi, state.store.lastT) : hi;
  const bins = makeBins(lo, hi, dataEnd, BINS, steps);
  const shapes = bandShapes(modeRuns(steps)).concat(modeShapes(d, lo, hi, false).shapes);
  const layout = (title, extra) => baseLayout(lo, hi, Object.assign({ height: CHART_HEIGHT, title: titled(title), shapes }, extra));
  drawBusyAndThroughput(d, steps, bins, lo, hi, layout);
  drawBatchKvQueue(steps, lo, hi, layout);
  drawStepInterval(steps, lo, hi, layout);
}

// GPU busy %: union of compute spans per bin, measured with events; NVML beside it. Then tokens/s per bin.
function drawBusyAndThroughput(d, steps, bins, lo, hi, layout) {
  const busy = new Float64Array(bins.count), tok = new Float64Array(bins.count), pre = new Float64Array(bins.count);
  let gpuSeen = false, hostBasis = false;
  for (const s of steps) {
    const c = s._cs;
    if (c) { gpuSeen = true; hostBasis = hostBasis || s._hostCompute; addOverlap(busy, bins, c[0], c[1]); }
    const i = Math.floor((s._e - bins.lo) / bins.w);
    if (i >= 0 && i < bins.count) { tok[i] += s._tok; pre[i] += s.prefill_tokens || 0; }
  }
  const bx = [], by = [], tx = [], ty = [], py = [];
  for (let i = 0; i < bins.count; i++) {
    bx.push(bins.mid(i)); by.push(Math.min(100, 100 * busy[i] / bins.w));
    tx.push(bins.mid(i)); ty.push(tok[i] / (bins.w / 1e6)); py.push(pre[i] / (bins.w / 1e6));
  }
  const { nv, nvKey } = utilization(d.nvml, lo, hi);
  const nvName = nvKey === "gpu_util" ? "NVML util" : "host CPU % (no NVML)";
  const busyName = hostBasis ? "compute busy % (host spans)" : "event busy %";
  const busyTraces = [];
  if (gpuSeen) busyTraces.push(line(busyName, { x: bx, y: by }, COLOR.compute, { fill: "tozeroy", fillcolor: "rgba(22,163,74,0.12)" }));
  busyTraces.push(line(nvName, nv, "#475569", { mode: "lines", line: { color: "#475569", width: 1.2, dash: "dash" } }));
  draw($("bs-c-busy"), busyTraces, layout("Busy %: " + (hostBasis ? "compute spans (host)" : "CUDA events") +
                                          (nvKey === "gpu_util" ? " vs NVML" : nvKey ? " vs host CPU" : ""), {
    yaxis: { range: [0, 105], gridcolor: GRID, ticksuffix: "%", tickfont: { size: 10 }, zeroline: false },
  }));

  draw($("bs-c-tps"), [
    line("generated tok/s", { x: tx, y: ty }, COLOR.async, { fill: "tozeroy", fillcolor: "rgba(37,99,235,0.10)", hovertemplate: "%{y:.0f}" }),
    line("prefill tok/s", { x: tx, y: py }, COLOR.fill, { hovertemplate: "%{y:.0f}" }),
  ], layout("Throughput (tokens/s)"));
}

// NVML utilization in [lo, hi], or host CPU % where the samples carry no GPU utilization.
function utilization(samples, lo, hi) {
  const nv = { x: [], y: [] };
  let nvKey = null;
  for (const s of samples) {
    if (s.t_us < lo || s.t_us > hi) continue;
    const v = s.gpu_util !== undefined && s.gpu_util !== null ? (nvKey = nvKey || "gpu_util", s.gpu_util)
      : s.cpu_pct;
    if (v === undefined || v === null) continue;
    if (!nvKey) nvKey = "cpu";
    nv.x.push(s.t_us / 1e6); nv.y.push(v);
  }
  return { nv, nvKey };
}

function drawBatchKvQueue(steps, lo, hi, layout) {
  // Batch: tokens per step split prefill / decode (stacked), and the batch size.
  const dec = perStep(steps, lo, hi, s => s.decode_tokens || 0);
  const pf = perStep(steps, lo, hi, s => (s.decode_tokens || 0) + (s.prefill_tokens || 0));
  const bs = perStep(steps, lo, hi, s => s.num_requests);
  draw($("bs-c-batch"), [
    line("decode tok/step", dec, COLOR.update, { fill: "tozeroy", fillcolor: "rgba(20,184,166,0.25)", line: { color: COLOR.update, width: 1, shape: "hv" } }),
    line("+ prefill tok/step", pf, COLOR.fill, { fill: "tonexty", fillcolor: "rgba(236,72,153,0.18)", line: { color: COLOR.fill, width: 1, shape: "hv" } }),
    line("batch size", bs, "#0f172a", { line: { color: "#0f172a", width: 1.4, dash: "dot", shape: "hv" } }),
  ], layout("Batch: tokens per step, prefill vs decode"));

  draw($("bs-c-kv"), [
    line("KV used %", perStep(steps, lo, hi, s => s.kv_blocks_total ? 100 * s.kv_blocks_used / s.kv_blocks_total : null),
         "#7c3aed", { fill: "tozeroy", fillcolor: "rgba(124,58,237,0.12)", line: { color: "#7c3aed", width: 1.6, shape: "hv" } }),
  ], layout("KV cache usage", {
    yaxis: { range: [0, 100], ticksuffix: "%", gridcolor: GRID, zeroline: false, tickfont: { size: 10 } } }));

  draw($("bs-c-queue"), [
    line("queue", perStep(steps, lo, hi, s => s.queue_depth), "#dc2626", { line: { color: "#dc2626", width: 1.6, shape: "hv" } }),
    // `running` is optional in batchscope.timeline/1: older files have only the batch size
    line("running", perStep(steps, lo, hi, s => s.running ?? s.num_requests), "#0f172a", { line: { color: "#0f172a", width: 1.2, shape: "hv" } }),
  ], layout("Queue depth"));
}

// Step interval (compute start to compute start) against the GPU idle gap before each step.
// A step after an empty queue is left out: its "interval" is the engine idling, not the loop's cost.
function drawStepInterval(steps, lo, hi, layout) {
  let prev = null;
  const busyStep = s => !NO_WORK.has(s.idle_cause);
  const interval = perStep(steps, lo, hi, s => {
    const v = prev === null || !busyStep(s) ? null : (s._c - prev) / 1000; prev = s._c; return v; }, "max");
  const gap = perStep(steps, lo, hi, s => busyStep(s) ? (s.gpu_idle_before_us || 0) / 1000 : null, "max");
  draw($("bs-c-step"), [
    line("step interval ms", interval, "#334155", { line: { color: "#334155", width: 1.3 } }),
    line("GPU idle before step ms", gap, "#ef4444", { fill: "tozeroy", fillcolor: "rgba(239,68,68,0.12)", line: { color: "#ef4444", width: 1.2 } }),
  ], layout("Step interval vs GPU idle gap (ms)"));
}

// ---------------------------------------------------------------- binning

// Fixed-width bins across [lo, hi]; the trailing partial bin of a live window is dropped (it would dip).
// A bin spans at least four step intervals, or a busy % made of whole and empty bins would saw up and down.
function makeBins(lo, hi, dataEnd, n, steps) {
  const k = steps.length;
  const interval = k > 1 ? (steps[k - 1]._c - steps[0]._c) / (k - 1) : 0;
  const w = Math.max((hi - lo) / n, 4 * interval, 500);
  const count = Math.max(1, Math.floor((Math.min(hi, dataEnd) - lo) / w));
  return { lo, w, count, mid: i => (lo + (i + 0.5) * w) / 1e6 };
}

function addOverlap(arr, bins, a, b) {
  let i = Math.max(0, Math.floor((a - bins.lo) / bins.w));
  for (; i < bins.count; i++) {
    const bl = bins.lo + i * bins.w, br = bl + bins.w;
    if (bl >= b) break;
    const o = Math.min(b, br) - Math.max(a, bl);
    if (o > 0) arr[i] += o;
  }
}

// Too many per-step points for SVG: keep one point per bucket (mean, or max for spiky series).
function perStep(steps, lo, hi, fn, agg) {
  const x = [], y = [];
  if (steps.length <= 1500) {
    for (const s of steps) { const v = fn(s); if (v !== null && v !== undefined) { x.push(s._s / 1e6); y.push(v); } }
    return { x, y };
  }
  const n = 600, w = (hi - lo) / n, sum = new Float64Array(n), cnt = new Uint32Array(n), mx = new Float64Array(n).fill(-Infinity);
  for (const s of steps) {
    const v = fn(s);
    if (v === null || v === undefined) continue;
    const i = Math.min(n - 1, Math.max(0, Math.floor((s._s - lo) / w)));
    sum[i] += v; cnt[i]++; if (v > mx[i]) mx[i] = v;
  }
  for (let i = 0; i < n; i++) if (cnt[i]) { x.push((lo + (i + 0.5) * w) / 1e6); y.push(agg === "max" ? mx[i] : sum[i] / cnt[i]); }
  return { x, y };
}

function line(name, xy, color, extra) {
  return Object.assign({ type: "scatter", mode: "lines", name, x: xy.x, y: xy.y, line: { color, width: 1.6 },
                         hovertemplate: "%{y:.1f}" }, extra || {});
}
