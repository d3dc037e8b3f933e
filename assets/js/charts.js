/* The small charts under the Gantt, each one registerChart call (below): busy % (events vs NVML, with the SM
 * clock), throughput, batch composition, KV cache, queue depth, and step interval vs idle gap. Every chart shares
 * the x range and the sync/async tint.
 *
 * Each chart is drawn on its own (drawChart), from a context made once per picture (chartContext), so the
 * redraw scheduler can spread a picture over several turns of the event loop. The rates are re-binned to the
 * window (chart_rates.js): a fixed number of points across it, each the average over a window of at least four
 * steps, so a zoom narrower than a step still shows the local busy % and tokens/s instead of an empty chart. */
import { rates } from "./chart_rates.js";
import { shownBoard } from "./feed.js";
import { samplesAround, stepsAround } from "./slices.js";
import { notInTrace } from "./unknown.js";
import { COLOR, GRID, NO_WORK, bandShapes, baseLayout, chartMargin, draw, fontPx, modeRuns, modeShapes, presentHeight,
  titled, warmupShapes } from "./plot.js";
import { busyLabel } from "./palette.js";
import { $ } from "./util.js";

// ---------------------------------------------------------------- the registry
// A chart is one registerChart call: its element id, the function that draws it from a picture's context, and
// whether it shows per-step values only (then a picture that only slides the live window moves its axis instead
// of drawing it again). controls.js makes an element for each, in this order; redraw.js draws each.
const REGISTRY = new Map();
export const CHARTS = [];                  // the ids, in the order they are shown

export function registerChart(id, draw, { perStep = false } = {}) {
  if (!REGISTRY.has(id)) CHARTS.push(id);
  REGISTRY.set(id, { id, draw, perStep });
}

export const isPerStep = id => !!(REGISTRY.get(id) || {}).perStep;

registerChart("bs-c-busy", drawBusy);
registerChart("bs-c-tps", drawThroughput);
registerChart("bs-c-batch", drawBatch, { perStep: true });
registerChart("bs-c-kv", drawKv, { perStep: true });
registerChart("bs-c-queue", drawQueue, { perStep: true });
registerChart("bs-c-step", drawStepInterval, { perStep: true });

const CHART_HEIGHT = 210;
const LEGEND_ROW_PX = 19;                  // a row of a chart's legend
const MAX_LINE_POINTS = 1500;              // per-step series beyond this are bucketed (SVG paths stay short)
// ... into this many buckets: about one per pixel column of a chart in the three-column grid. More only made each
// redraw longer (600 took a 2-core box past 30 ms a task with 12,000 steps in view).
const LINE_BUCKETS = 300;

// What every chart of one picture needs, computed once; the rates only when a chart asks for them.
export function chartContext(d, lo, hi) {
  const near = stepsAround(d.steps, lo, hi, 1);
  const shapes = bandShapes(modeRuns(near)).concat(modeShapes(d, lo, hi, false).shapes,
                                                   warmupShapes(shownBoard(), lo, hi, false).shapes);
  const ctx = { d, lo, hi, near, shapes, _rates: null };
  const height = presentHeight("chart") || CHART_HEIGHT;
  ctx.layout = (title, extra) => baseLayout(lo, hi, Object.assign({ height, title: titled(title), shapes }, extra));
  ctx.rates = () => ctx._rates || (ctx._rates = rates(d, lo, hi));
  ctx.prepare = () => { ctx.rates(); return ctx; };
  return ctx;
}

export function drawChart(id, ctx) {
  const el = $(id);
  if (!el) return;
  if (el.dataset.empty) delete el.dataset.empty;
  REGISTRY.get(id).draw(el, ctx);
}

function duration(us) {
  return us >= 1e6 ? (us / 1e6).toFixed(us >= 1e7 ? 0 : 1) + " s" : us >= 1e3 ? Math.round(us / 1e3) + " ms" : Math.round(us) + " µs";
}

// ---------------------------------------------------------------- the charts

// The other ranks' busy lines and NVML's per-GPU lines, told apart by colour and dash.
const RANK_COLORS = ["#0d9488", "#65a30d", "#0891b2", "#4d7c0f", "#0f766e", "#15803d", "#0e7490"];
const GPU_LINES = [["#475569", "dash"], ["#94a3b8", "dot"], ["#334155", "dashdot"], ["#64748b", "longdash"]];

// GPU busy %: the share of each window the compute spans cover, measured with events; NVML beside it. Under
// tensor parallelism, one busy line per rank and one NVML line per GPU.
function drawBusy(el, ctx) {
  const r = ctx.rates();
  const samples = samplesAround(ctx.d.nvml, ctx.lo, ctx.hi);
  const { nv, nvKey, perGpu } = utilization(samples);
  const clock = smClock(samples);
  const nvName = nvKey === "gpu_util" ? "NVML util" : "host CPU % (no NVML)";
  const busyName = busyLabel(r.hostBasis ? "host" : r.deviceBasis ? "device_ops" : "events") + " %";   // palette.js's words
  // (short names under tensor parallelism: the legend holds a line per rank and per GPU; the title says what
  // the busy % is measured with)
  const rankName = rank => "rank " + rank + " busy %";
  const traces = [];
  if (r.gpuSeen) traces.push(line(r.ranks.length ? rankName(0) : busyName, { x: r.x, y: r.busy }, COLOR.compute,
                                  { fill: "tozeroy", fillcolor: "rgba(22,163,74,0.12)" }));
  // an imported trace: the steps' compute spans beside the device's ops (they see idle between steps only)
  if (r.deviceBasis && !r.ranks.length) traces.push(line("steps' spans % (between steps only)", { x: r.x, y: r.spanBusy },
    COLOR.compute, { line: { color: COLOR.compute, width: 1.1, dash: "dot" } }));
  for (const rk of r.ranks) {
    if (!rk.compute.n) continue;
    const c = RANK_COLORS[(rk.rank - 1) % RANK_COLORS.length];
    traces.push(line(rankName(rk.rank), { x: r.x, y: rk.busy }, c, { line: { color: c, width: 1.4 } }));
  }
  if (perGpu) {
    perGpu.forEach((g, i) => {
      const [c, dash] = GPU_LINES[i % GPU_LINES.length];
      traces.push(line("GPU" + g.gpu + " util", g, c, { mode: "lines", line: { color: c, width: 1.2, dash } }));
    });
  } else {
    traces.push(line(nvName, nv, "#475569", { mode: "lines", line: { color: "#475569", width: 1.2, dash: "dash" } }));
  }
  // The SM clock on its own axis: a GPU at its power limit stays 100% busy and gets slower, and this shows it.
  if (clock.x.length) traces.push(line(clock.name, clock, CLOCK_COLOR, {
    mode: "lines", yaxis: "y2", customdata: clock.w, line: { color: CLOCK_COLOR, width: 1.3 },
    hovertemplate: clock.w.some(v => v !== null) ? "%{y:.0f} MHz · %{customdata:.0f} W" : "%{y:.0f} MHz" }));
  // a line per rank and per GPU: the legend takes more rows (about two entries a row on a narrow chart), and
  // the chart grows by them instead of squeezing its plot
  const extraRows = Math.max(0, Math.ceil(traces.length / 2) - 2);
  const grow = extraRows ? { height: (presentHeight("chart") || CHART_HEIGHT) + LEGEND_ROW_PX * extraRows } : {};
  const right = clock.x.length ? {
    // the top clock at two thirds of the height: under the busy lines at 100%, with room to show a drop
    yaxis2: { overlaying: "y", side: "right", range: [0, 1.5 * Math.max(...clock.y)], showgrid: false, zeroline: false,
              ticksuffix: " MHz", tickfont: { size: fontPx(9), color: CLOCK_COLOR }, fixedrange: true },
    margin: chartMargin(Math.round(6.5 * fontPx(9))),   // room for "1980 MHz"
  } : {};
  draw(el, traces, ctx.layout("Busy %: " + (r.hostBasis ? "compute spans (host)" : r.deviceBasis ? "device ops (the trace)" : "CUDA events") +
                              (nvKey === "gpu_util" ? " vs NVML" : nvKey ? " vs host CPU" : "") +
                              (clock.x.length ? " · SM clock" : "") + ` · per ${duration(r.win)}`, Object.assign({
    yaxis: { range: [0, 105], gridcolor: GRID, ticksuffix: "%", tickfont: { size: fontPx(10) }, zeroline: false, fixedrange: true },
  }, grow, right)));
}

const CLOCK_COLOR = "#a16207";

// NVML's SM clock (MHz) and board power (W, for the hover) where the samples carry them; under tensor
// parallelism, the first GPU's (the ranks run in step, and one more line per GPU would crowd the legend).
function smClock(samples) {
  const gpus = samples.filter(s => typeof s.gpu === "number").map(s => s.gpu);
  const first = gpus.length ? Math.min(...gpus) : null;
  const out = { x: [], y: [], w: [], name: first === null ? "SM clock MHz" : "GPU" + first + " SM clock MHz" };
  for (const s of samples) {
    if (first !== null && s.gpu !== first) continue;
    if (typeof s.sm_clock_mhz !== "number") continue;
    out.x.push(s.t_us / 1e6); out.y.push(s.sm_clock_mhz);
    out.w.push(typeof s.power_w === "number" ? s.power_w : null);
  }
  return out;
}

// Generated tokens/s on the left axis, prefill tokens/s on its own right axis: a prefill burst is a hundred times
// the decode rate, and on one axis it would flatten the line the two loops differ on.
function drawThroughput(el, ctx) {
  const r = ctx.rates();
  if (r.noTokens) return drawEmpty(el, ctx, "Throughput (tokens/s)", "Not in the trace:<br>it holds no token counts.");
  draw(el, [
    line("generated tok/s", { x: r.x, y: r.tok }, COLOR.async, { fill: "tozeroy", fillcolor: "rgba(37,99,235,0.10)", hovertemplate: "%{y:.0f}" }),
    line("prefill tok/s (right axis)", { x: r.x, y: r.pre }, COLOR.fill, { yaxis: "y2", hovertemplate: "%{y:.0f}" }),
  ], ctx.layout(`Throughput (tokens/s) · per ${duration(r.win)}`, secondAxis(PREFILL_INK)));
}

// The prefill series' text shade: the chart pink as text reads 3.5:1 on white, this one 6:1 (WCAG AA).
const PREFILL_INK = "#be185d";

// A right-hand y axis for a series of another scale, its labels in that series' text shade.
function secondAxis(color) {
  return { yaxis2: { overlaying: "y", side: "right", rangemode: "tozero", showgrid: false, zeroline: false,
                     tickfont: { size: fontPx(9), color }, fixedrange: true },
           margin: chartMargin(Math.round(4.5 * fontPx(9))) };
}

// NVML utilization, or host CPU % where the samples carry no GPU utilization. Samples of a multi-GPU engine
// name their GPU (its NVML index): those give one line per GPU (perGpu, ordered by index).
function utilization(samples) {
  const nv = { x: [], y: [] };
  let nvKey = null, byGpu = null;
  for (const s of samples) {
    if (typeof s.gpu === "number") {
      if (s.gpu_util === undefined || s.gpu_util === null) continue;
      byGpu = byGpu || new Map();
      let g = byGpu.get(s.gpu);
      if (!g) byGpu.set(s.gpu, g = { gpu: s.gpu, x: [], y: [] });
      g.x.push(s.t_us / 1e6); g.y.push(s.gpu_util);
      nvKey = "gpu_util";
      continue;
    }
    const v = s.gpu_util !== undefined && s.gpu_util !== null ? (nvKey = nvKey || "gpu_util", s.gpu_util)
      : s.cpu_pct;
    if (v === undefined || v === null) continue;
    if (!nvKey) nvKey = "cpu";
    nv.x.push(s.t_us / 1e6); nv.y.push(v);
  }
  const perGpu = byGpu ? [...byGpu.values()].sort((a, b) => a.gpu - b.gpu) : null;
  return { nv, nvKey, perGpu };
}

// Batch: decode tokens per step and the batch size on the left, prefill tokens per step on the right axis (a
// chunk of hundreds of prompt tokens would flatten the decode rows on one axis).
function drawBatch(el, ctx) {
  const unknown = notInTrace(ctx.d);
  if (unknown.has("num_requests") && unknown.has("decode_tokens"))
    return drawEmpty(el, ctx, "Batch: tokens per step, prefill vs decode", "Not in the trace:<br>it holds no batch sizes or token counts.");
  const dec = perStep(ctx, s => s.decode_tokens || 0);
  const pf = perStep(ctx, s => s.prefill_tokens || 0);
  const bs = perStep(ctx, s => s.num_requests);
  draw(el, [
    line("decode tok/step", dec, COLOR.update, { fill: "tozeroy", fillcolor: "rgba(20,184,166,0.25)", line: { color: COLOR.update, width: 1, shape: "hv" } }),
    line("batch size", bs, "#0f172a", { line: { color: "#0f172a", width: 1.4, dash: "dot", shape: "hv" } }),
    line("prefill tok/step (right axis)", pf, COLOR.fill, { yaxis: "y2", line: { color: COLOR.fill, width: 1, shape: "hv" } }),
  ], ctx.layout("Batch: tokens per step, prefill vs decode", secondAxis(PREFILL_INK)));
}

function drawKv(el, ctx) {
  if (notInTrace(ctx.d).has("kv_blocks_used")) return drawEmpty(el, ctx, "KV cache usage", "Not in the trace:<br>it holds no KV cache usage.");
  draw(el, [
    line("KV used %", perStep(ctx, s => s.kv_blocks_total ? 100 * s.kv_blocks_used / s.kv_blocks_total : null),
         "#7c3aed", { fill: "tozeroy", fillcolor: "rgba(124,58,237,0.12)", line: { color: "#7c3aed", width: 1.6, shape: "hv" } }),
  ], ctx.layout("KV cache usage", {
    yaxis: { range: [0, 100], ticksuffix: "%", gridcolor: GRID, zeroline: false, tickfont: { size: fontPx(10) }, fixedrange: true } }));
}

function drawQueue(el, ctx) {
  if (notInTrace(ctx.d).has("queue_depth")) return drawEmpty(el, ctx, "Queue depth", "Not in the trace:<br>it holds no queue depth.");
  draw(el, [
    line("queue", perStep(ctx, s => s.queue_depth), "#dc2626", { line: { color: "#dc2626", width: 1.6, shape: "hv" } }),
    // `running` is optional in batchscope.timeline/1: older files have only the batch size
    line("running", perStep(ctx, s => s.running ?? s.num_requests), "#0f172a", { line: { color: "#0f172a", width: 1.2, shape: "hv" } }),
  ], ctx.layout("Queue depth"));
}

// Step interval (compute start to compute start) against the GPU idle gap before each step.
// A step after an empty queue is left out: its "interval" is the engine idling, not the loop's cost.
function drawStepInterval(el, ctx) {
  let prev = null;
  const busyStep = s => !NO_WORK.has(s.idle_cause);
  const interval = perStep(ctx, s => {
    const v = prev === null || !busyStep(s) ? null : (s._c - prev) / 1000; prev = s._c; return v; }, "max");
  const gap = perStep(ctx, s => busyStep(s) ? (s.gpu_idle_before_us || 0) / 1000 : null, "max");
  draw(el, [
    line("step interval ms", interval, "#334155", { line: { color: "#334155", width: 1.3 } }),
    line("GPU idle before step ms", gap, "#ef4444", { fill: "tozeroy", fillcolor: "rgba(239,68,68,0.12)", line: { color: "#ef4444", width: 1.2 } }),
  ], ctx.layout("Step interval vs GPU idle gap (ms)"));
}

// One point per step in the window and its neighbours (so a window inside one step still shows that step's
// value); past MAX_LINE_POINTS, one point per bucket (mean, or max for spiky series). fn is called on every
// step in order, so it may keep state (the step interval does).
// A stretch with no step (the engine idle, or a gap in a recording) breaks the per-step lines: a value is the
// state at a step, and nothing says it held while no step ran.
const GAP_US = 1e6;

function perStep(ctx, fn, agg) {
  const { near: steps, lo, hi } = ctx;
  const x = [], y = [];
  if (steps.length <= MAX_LINE_POINTS) {
    let prevEnd = null;
    for (const s of steps) {
      const v = fn(s);
      if (prevEnd !== null && s._s - prevEnd > GAP_US) { x.push(null); y.push(null); }
      prevEnd = s._e;
      if (v !== null && v !== undefined) { x.push(s._s / 1e6); y.push(v); }
    }
    return { x, y };
  }
  const n = LINE_BUCKETS, w = (hi - lo) / n, sum = new Float64Array(n), cnt = new Uint32Array(n), mx = new Float64Array(n).fill(-Infinity);
  const seen = new Uint8Array(n);
  for (const s of steps) {
    const i = Math.min(n - 1, Math.max(0, Math.floor((s._s - lo) / w)));
    seen[i] = 1;
    const v = fn(s);
    if (v === null || v === undefined) continue;
    sum[i] += v; cnt[i]++; if (v > mx[i]) mx[i] = v;
  }
  // a run of buckets wider than GAP_US without a step breaks the line there
  const gapBuckets = Math.max(1, Math.ceil(GAP_US / w));
  let empty = 0;
  for (let i = 0; i < n; i++) {
    if (!seen[i]) { empty++; continue; }
    if (empty >= gapBuckets && x.length) { x.push(null); y.push(null); }
    empty = 0;
    if (cnt[i]) { x.push((lo + (i + 0.5) * w) / 1e6); y.push(agg === "max" ? mx[i] : sum[i] / cnt[i]); }
  }
  return { x, y };
}

// A chart whose figure the data does not hold (an imported trace): its title and one sentence saying so, in
// place of a line at zero that would read as a measurement.
function drawEmpty(el, ctx, title, sentence) {
  el.dataset.empty = sentence.replace("<br>", " ");
  draw(el, [], ctx.layout(title, {
    yaxis: { visible: false, fixedrange: true },
    annotations: [{ text: sentence, xref: "paper", yref: "paper", x: 0.5, y: 0.5, showarrow: false,
                    font: { size: fontPx(13), color: "#475569" } }] }));
}

function line(name, xy, color, extra) {
  return Object.assign({ type: "scatter", mode: "lines", name, x: xy.x, y: xy.y, line: { color, width: 1.6 },
                         hovertemplate: "%{y:.1f}" }, extra || {});
}
