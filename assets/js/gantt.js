/* The Gantt (#bs-gantt): one row per host phase and GPU stream, the mode, and the GPU idle gaps coloured by
 * what the host was doing meanwhile. A tensor-parallel engine adds the other ranks' GPU lanes below (the lanes
 * above are rank 0's, which plans the steps), and each compute bar wide enough to show it ends in a darker
 * stripe: the step's all-reduce time, estimated from the all-reduce the engine measured at start-up.
 *
 * The bars are painted on a canvas under Plotly's (transparent) SVG: Plotly keeps the axes, lane labels,
 * switch markers and zoom, while the canvas paints any number of spans in a few milliseconds. The ink is
 * each span's share of every pixel column (ink.js), so a lane's ink matches its share of time at every zoom.
 * Hover is ours too (gantt_hover.js): a Plotly marker per step cost more than the rest of the picture. */
import { currentData, shownBoard, state } from "./feed.js";
import { bindHover } from "./gantt_hover.js";
import { addSpan, coverage, paintInk, rgb } from "./ink.js";
import { causeHint, causeLabel } from "./names.js";
import { COLOR, GPU, HOST, LANES, NO_WORK, baseLayout, causeColor, draw, fontPx, ganttLanes, modeRuns, modeShapes,
  moveRange, presentHeight, rankLaneKey, textScale, warmupShapes } from "./plot.js";
import { insideInk, setInsideLegend } from "./gantt_inside.js";
import { focusShapes, markShapes } from "./gantt_overlays.js";
import { findStep } from "./records.js";
import { stepsIn } from "./slices.js";
import { allreduceEstimate, stepRows, tensorParallel } from "./tensor_parallel.js";
import { $, esc } from "./util.js";

export const GANTT_HEIGHT = 318;           // with the ten lanes of one rank
const LANE_PX = 27;                        // each further lane (another rank's): as tall as those ten
const STRIPE_MIN_PX = 4;                   // a compute bar this wide (CSS px) shows its all-reduce share
const BAR = 0.36;                          // half a bar's height, in lanes
const GAP_WASH = { color: "#ef4444", alpha: 0.13 };   // host-caused idle, washed across the GPU lanes
const BAND = "#f8fafc";                    // the GPU lanes' background (CSS, so the canvas holds only ink)
const last = { layoutKey: "" };            // Plotly is asked again only when the axes or markers change

// The Gantt in steps, so that the redraw can give each its own turn: prepareGantt works out the ink of rank
// 0's lanes (the bulk of the work on a busy window), prepareRanks that of the other tensor-parallel ranks'
// lanes (as much again per rank), and showGantt paints it and moves Plotly's axes.
export function prepareGantt(d, steps, lo, hi) {
  const el = $("bs-gantt");
  const tp = tensorParallel(d);
  const spec = ganttLanes(tp);
  const geo = canvasGeometry(el, spec);
  const g = { d, steps, lo, hi, el, geo, tp, spec, rankSteps: {}, ink: inkContext(steps, lo, (hi - lo) / geo.cols, geo, tp) };
  rank0Ink(g.ink, steps);
  return g;
}

// The other ranks' records in the window (each rank's ordered by step, like rank 0's) and their ink.
export function prepareRanks(g) {
  if (!g || g.ranksDone) return;
  g.ranksDone = true;
  const d = g.d;
  for (const r of g.tp.ranks) {
    g.rankSteps[r.rank] = stepsIn((d.rankSteps && d.rankSteps[r.rank]) || [], g.lo, g.hi);
    rankInk(g.ink, r, g.rankSteps[r.rank]);
  }
}

export function showGantt(g) {
  prepareRanks(g);                          // (done already when the redraw gave it its own turn)
  Object.assign(g, ganttLayers(g.ink, g.geo, g.tp, g.spec));
  const { d, steps, lo, hi, el, geo, tp, spec } = g;
  sizeCanvas(geo);
  paintInk(geo.canvas, g.washes, g.lanes);
  setCauseLegend(g.causes);
  setInsideLegend(g.ink.inside);
  setRankLegend(tp, steps);
  const usPerPx = (hi - lo) / geo.w;
  const ms = modeShapes(d, lo, hi, true, usPerPx);
  const wu = warmupShapes(shownBoard(), lo, hi, true);
  const annotations = ms.annotations.concat(wu.annotations, gapLabels(steps, usPerPx, spec),
                                            placeholderNote(steps, g.gpuSeen, g.hostCompute, spec), rankTags(spec));
  const focus = focusShapes(lo, hi, spec);
  const marked = markShapes(d, lo, hi);
  const shapes = ms.shapes.concat(wu.shapes, focus.shapes, marked.shapes);
  annotations.push(...focus.annotations, ...marked.annotations);
  // the markers and notes, apart from the window itself: when only the window moved, move the axis
  const key = [el.clientWidth, geo.margin.l, geo.height, spec.lanes.map(l => l.label).join(), shapes.map(s => s.path).join(),
               JSON.stringify(annotations.map(a => [a.x, a.text])), focus.key, marked.key].join(";");
  if (key !== last.layoutKey || !el.layout) {
    draw(el, [], ganttLayout(lo, hi, shapes, annotations, geo, spec));
    last.layoutKey = key;
  } else {
    const r = el.layout.xaxis.range;
    if (r[0] !== lo / 1e6 || r[1] !== hi / 1e6) moveRange(el, lo, hi);
  }
  bindHover(el, { steps, lo, hi, margin: geo.margin, plotH: geo.h, spec, tp, rankSteps: g.rankSteps });
  // what was painted, for tests and curious readers: spans per row
  el.dataset.lanes = JSON.stringify(g.counts);
  el.dataset.insideDrawn = String(Math.round(g.ink.inside.drawn));    // µs of idle inside steps on the idle lane
  el.dataset.spans = String(Object.entries(g.counts).reduce((a, [k, n]) => a + (k === "gap" ? 0 : n), 0));
  el.dataset.markers = String(ms.count);
  el.dataset.ranks = String(tp.size);       // tensor-parallel ranks drawn (1: rank 0's lanes only)
  el.dataset.stripes = String(g.stripes);   // compute bars drawn with their all-reduce stripe
  // the request clicked in the slowest list (tail.js): its id, its spans and its steps marked in view
  el.dataset.focus = focus.id;
  el.dataset.focusspans = String(focus.spans);
  el.dataset.focussteps = String(focus.steps);
  // the typical steps of a compared bucket (analysis.js): "side:step" of each one marked in view
  el.dataset.marks = marked.key;
}

// The canvas covers Plotly's plot area; its columns are device pixels. The margin holds the lane labels
// (wider in presentation mode, where the text is larger).
function canvasGeometry(el, spec) {
  const k = textScale(), dpr = window.devicePixelRatio || 1;
  const n = spec.lanes.length, height = presentHeight("gantt") || GANTT_HEIGHT + Math.max(0, n - LANES.length) * LANE_PX;
  const m = { l: Math.round(118 * k), r: 12, t: Math.round(24 * k), b: Math.round(26 * k) };
  const w = Math.max(10, el.clientWidth - m.l - m.r), h = height - m.t - m.b;
  const cols = Math.round(w * dpr), rows = Math.round(h * dpr);
  // the GPU lanes (rank 0's and any other rank's, all below it) sit on a band
  const bandTop = (100 * spec.y.h2d / n).toFixed(3) + "%";
  return { canvas: $("bs-gantt-canvas"), margin: m, w, h, cols, rows, lane: rows / n, height, bandTop };
}

function sizeCanvas(geo) {
  const cv = geo.canvas, m = geo.margin;
  if (cv.width === geo.cols && cv.height === geo.rows && cv.style.left === m.l + "px" && cv.dataset.band === geo.bandTop) return;
  cv.width = geo.cols; cv.height = geo.rows;
  cv.dataset.band = geo.bandTop;
  Object.assign(cv.style, { left: m.l + "px", top: m.t + "px", width: geo.w + "px", height: geo.h + "px",
    background: `linear-gradient(to bottom, transparent ${geo.bandTop}, ${BAND} ${geo.bandTop})` });
}

// Per-column coverage of every layer: the mode, host and GPU lanes, the idle lane split by cause, and a wash
// across the GPU lanes where the host kept the GPU waiting. Spans go straight into the columns: a busy
// 2 min window holds over a hundred thousand of them. The other ranks' lanes take the same ink.
function inkContext(steps, lo, usPerCol, geo, tp) {
  const cov = {};
  const add = (name, a, b) => addSpan(cov[name] || (cov[name] = coverage(geo.cols)), a, b, lo, usPerCol);
  const addW = (name, a, b, w) => addSpan(cov[name] || (cov[name] = coverage(geo.cols)), a, b, lo, usPerCol, w);
  const ink = { cov, add, addW, steps, gpuSeen: false, hostCompute: false, stripes: 0, causes: new Set(),
                inside: { us: 0, byCause: {}, drawn: 0 } };
  // Under tensor parallelism a compute bar wide enough to show it ends in its estimated all-reduce time (the
  // bar's ink is split, not added to: the lane's ink still matches the compute time). Narrower bars do not:
  // an estimate drawn as a share of every pixel would look measured.
  const striped = tp.ranks.length > 0 && tp.perStep > 0;
  const minStripeUs = STRIPE_MIN_PX * usPerCol * geo.cols / geo.w;
  // (`step` is rank 0's record of the step, or a function finding it: looked up only for a bar that wide)
  ink.addCompute = (name, arName, a, b, step) => {
    if (striped && b - a >= minStripeUs && (step = typeof step === "function" ? step() : step)) {
      const est = allreduceEstimate(tp, stepRows(step));
      if (est && est.us > 0) {
        const cut = Math.max(a, b - est.us);
        if (cut > a) add(name, a, cut);
        add(arName, cut, b);
        ink.stripes++;
        return;
      }
    }
    add(name, a, b);
  };
  return ink;
}

function rank0Ink(ink, steps) {
  const { add, addCompute, causes } = ink;
  for (const s of steps) {
    const cpu = s.cpu, gpu = s.gpu;
    if (cpu) for (const k of HOST) { const v = cpu[k]; if (v && v[0] !== null && v[1] !== null) add(k, v[0], v[1]); }
    if (gpu) for (const k of GPU) {
      const v = gpu[k];
      if (!v || v[0] === null || v[1] === null) continue;
      if (k === "compute") addCompute(k, "allreduce", v[0], v[1], s); else add(k, v[0], v[1]);
      ink.gpuSeen = true;
    }
    if (s._hostCompute) { addCompute("compute (host)", "allreduce", s._cs[0], s._cs[1], s); ink.hostCompute = true; }
    const gap = s.gpu_idle_before_us;
    if (gap > 0) {
      const cause = s.idle_cause || "none";
      causes.add(cause);
      add("idle: " + cause, s._c - gap, s._c);
      if (!NO_WORK.has(cause)) add("gap", s._c - gap, s._c);   // no work at all is not the host's fault
    }
    // idle inside the step's compute span (imported traces): on the idle lane by cause, and out of the compute bar
    if (s.gpu_idle_inside_us > 0) {
      ink.inside.us += s.gpu_idle_inside_us;
      const by = ink.inside.byCause;
      for (const [c, us] of Object.entries(s.idle_inside_by_cause_us || {})) by[c] = (by[c] || 0) + us;
      insideInk(ink, s, "compute", "idle: ");
    }
  }
  for (const r of modeRuns(steps)) add(r.mode, r.lo, r.hi);
}

// Another rank: its own spans of the steps rank 0 planned (a step's counts are in rank 0's record).
// An imported trace's ranks have an idle lane of their own: the gap before each of its steps and the idle inside
// them, by cause, as rank 0's.
function rankInk(ink, r, records) {
  const arKey = rankLaneKey(r.rank, "allreduce"), steps = ink.steps;
  const idle = r.phases.includes("idle") ? rankLaneKey(r.rank, "idle") + ": " : null;
  for (const rec of records) {
    if (rec.gpu_idle_inside_us > 0) insideInk(ink, rec, rankLaneKey(r.rank, "compute"), idle);
    if (idle && rec.gpu_idle_before_us > 0 && rec._cs) {
      const cause = rec.idle_cause || "none";
      ink.causes.add(cause);
      ink.add(idle + cause, rec._c - rec.gpu_idle_before_us, rec._c);
    }
    for (const k of r.phases) {
      if (k === "idle") continue;
      const v = k === "compute" ? rec._cs : rec.gpu && rec.gpu[k];
      if (!v || v[0] === null || v[1] === null) continue;
      const key = rankLaneKey(r.rank, k);
      if (k === "compute") ink.addCompute(key, arKey, v[0], v[1], () => findStep(steps, rec.step)); else ink.add(key, v[0], v[1]);
    }
  }
}

// The coverage as lanes of layers to paint, and the wash.
function ganttLayers(ink, geo, tp, spec) {
  const { cov, hostCompute } = ink;
  const layer = (name, color, alpha) => ({ name, cov: cov[name] || null, rgb: rgb(color), alpha: alpha || 1 });
  const lane = (key, layers) => ({ cy: (spec.y[key] + 0.5) * geo.lane, half: BAR * geo.lane, layers });
  const sortedCauses = Array.from(ink.causes).sort();
  const lanes = [lane("mode", ["sync", "async"].map(m => layer(m, COLOR[m])))]
    .concat(HOST.map(k => lane(k, [layer(k, COLOR[k])])))
    .concat(GPU.map(k => lane(k, k === "compute" ? [layer(k, COLOR[k]), layer("compute (host)", COLOR.compute, 0.45),
                                                    layer("allreduce", COLOR.allreduce, hostCompute ? 0.7 : 1)]
                                                    : [layer(k, COLOR[k])])))
    .concat([lane("idle", sortedCauses.map(c => layer("idle: " + c, causeColor(c))))]);
  for (const r of tp.ranks) {
    for (const k of r.phases) {
      const key = rankLaneKey(r.rank, k);
      // a CPU rank's compute is its host forward: drawn as rank 0's host compute is
      lanes.push(lane(key, k === "compute" ? [layer(key, COLOR.compute, r.host ? 0.45 : 1),
                                              layer(rankLaneKey(r.rank, "allreduce"), COLOR.allreduce, r.host ? 0.7 : 1)]
                         : k === "idle" ? sortedCauses.map(c => layer(key + ": " + c, causeColor(c)))
                         : [layer(key, COLOR[k])]));
    }
  }
  const washes = cov.gap ? [{ top: spec.y.h2d * geo.lane, bottom: (spec.y.d2h + 1) * geo.lane, cov: cov.gap,
                              rgb: rgb(GAP_WASH.color), alpha: GAP_WASH.alpha }] : [];
  const counts = {};
  for (const k in cov) counts[k] = cov[k].spans;
  return { lanes, washes, counts, causes: sortedCauses, gpuSeen: ink.gpuSeen, hostCompute, stripes: ink.stripes };
}

// Zoomed to a few steps (the switch view, key W), each GPU idle gap wide enough to hold it says how long it was
// and what share of its step's period it took, on the idle lane: the seesaw, read off the picture.
const GAP_LABEL_STEPS = 24;

function gapLabels(steps, usPerPx, spec) {
  if (!steps.length || steps.length > GAP_LABEL_STEPS) return [];
  const px = fontPx(10), out = [];
  for (let i = 1; i < steps.length; i++) {
    const s = steps[i], p = steps[i - 1], gap = s.gpu_idle_before_us;
    if (!s._cs || !p._cs || gap === null || gap === undefined || NO_WORK.has(s.idle_cause)) continue;
    const text = (gap >= 1000 ? (gap / 1000).toFixed(gap >= 1e4 ? 0 : 1) + " ms" : Math.round(gap) + " µs") + " · " +
      Math.round(100 * gap / Math.max(1, s._cs[0] - p._cs[0])) + "%";
    if (gap / usPerPx < text.length * 0.55 * px) continue;     // no room: the hover says it
    out.push({ x: (s._cs[0] - gap / 2) / 1e6, y: spec.y.idle, xref: "x", yref: "y", showarrow: false, text,
               font: { size: px, color: "#7f1d1d" }, bgcolor: "rgba(255,255,255,0.85)" });
  }
  return out;
}

// Under tensor parallelism, a tag at the top of each rank's GPU lanes: "rank 1 · cuda:1".
function rankTags(spec) {
  return spec.groups.map(g => ({ xref: "paper", yref: "y", x: 0.002, xanchor: "left", y: g.first - 0.5, yanchor: "middle",
    showarrow: false, text: "rank " + g.rank + (g.device ? " · " + esc(g.device) : ""),
    font: { size: fontPx(10), color: "#1e293b" }, bgcolor: "rgba(255,255,255,0.9)", bordercolor: "#94a3b8",
    borderwidth: 1, borderpad: 1 }));
}

// What an empty window, or a run without GPU events, should say instead of bars.
function placeholderNote(steps, gpuSeen, hostCompute, spec) {
  if (!steps.length) {
    return [{ xref: "paper", yref: "paper", x: 0.5, y: 0.5, showarrow: false, font: { size: fontPx(13), color: "#475569" },
      text: state.view.source === "replay" ? "no steps in this window" : "waiting for steps: type a prompt or fire a burst" }];
  }
  if (!gpuSeen) {
    return [{ xref: "paper", yref: "y", x: 0.99, xanchor: "right", y: spec.y.h2d, showarrow: false,
      font: { size: fontPx(10.5), color: "#64748b" }, bgcolor: "rgba(248,250,252,0.9)",
      text: hostCompute ? "CPU run: no CUDA events; the compute lane shows the host forward (launch span)"
                        : "no GPU stream events on this device" }];
  }
  return [];
}

function ganttLayout(lo, hi, markers, annotations, geo, spec) {
  const y = spec.y, lanes = spec.lanes;
  const rule = (at, color, width) => ({ type: "line", xref: "paper", yref: "y", x0: 0, x1: 1, y0: at - 0.5, y1: at - 0.5,
                                        line: { color, width } });
  const shapes = [rule(y.schedule, "#e2e8f0", 1), rule(y.h2d, "#cbd5e1", 1)]
    .concat(spec.groups.filter(g => g.rank > 0).map(g => rule(g.first, "#94a3b8", 1.5)))   // between ranks
    .concat(markers);
  return baseLayout(lo, hi, {
    height: geo.height, margin: geo.margin, showlegend: false, hovermode: false,
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",   // the canvas shows through
    xaxis: { range: [lo / 1e6, hi / 1e6], showgrid: false, zeroline: false, ticksuffix: " s", tickfont: { size: fontPx(11) } },
    yaxis: { range: [lanes.length - 0.5, -0.5], tickvals: lanes.map((_, i) => i), ticktext: lanes.map(l => l.label),
             fixedrange: true, showgrid: false, zeroline: false, tickfont: { size: fontPx(12) } },
    shapes, annotations, dragmode: "zoom",
  });
}

// ---------------------------------------------------------------- legend

export function buildLegend() {
  const item = (c, label, cls) => `<span class="bs-li ${cls || ""}"><i style="background:${c}"></i>${esc(label)}</span>`;
  const parts = [item(COLOR.sync, "sync", "mode"), item(COLOR.async, "async", "mode"), "<b>host</b>"]
    .concat(HOST.map(k => item(COLOR[k], k)))
    .concat(["<b>GPU</b>"]).concat(GPU.map(k => item(COLOR[k], k === "compute" ? "compute" : k.toUpperCase())))
    .concat(["<b>GPU idle before a step, by cause</b>", `<span id="bs-causes"></span>`,
             // imported traces only (setInsideLegend shows it)
             `<span id="bs-legend-inside" class="bs-li" hidden></span>`,
             `<span class="bs-li"><i class="bs-gap"></i>GPU kept waiting by the host</span>`,
             `<span class="bs-li" title="The label names the new mode and the first step run in it">` +
             `<i class="bs-marker"></i>mode switch (→ new mode · first step)</span>`,
             `<span class="bs-li muted" title="Each lane's bar in a pixel column is as tall as the share of that ` +
             `column's time its spans cover, so ink matches time at every zoom">bar height = share of time</span>`,
             // tensor parallel only (setRankLegend shows it)
             `<span id="bs-legend-tp" class="bs-li" hidden><i style="background:${COLOR.allreduce}"></i>` +
             `<span id="bs-legend-tp-text"></span></span>`]);
  $("bs-legend").innerHTML = parts.join("");
}

// Tensor parallel: what the darker end of a compute bar is, and the all-reduce the engine measured.
function setRankLegend(tp, steps) {
  const el = $("bs-legend-tp");
  if (!el) return;
  const on = tp.size > 1;
  if (el.hidden === on) el.hidden = !on;
  if (!on) return;
  const last = steps[steps.length - 1];
  const est = allreduceEstimate(tp, last ? stepRows(last) : 1);
  const ranks = (currentData().summary || {}).ranks;
  const traced = Array.isArray(ranks) && ranks.some(r => typeof r.collective_us === "number") ? ranks : null;
  const text = `tensor parallel ×${tp.size}: ` + (traced
    ? "collectives in the trace " + traced.map(r => `rank ${r.rank} ${fmtUs(r.collective_us)}`).join(", ") +
      " (the rank table under the scoreboard)"
    : est
    ? `all-reduce ≈ ${(est.us / 1000).toFixed(3)} ms a step (${est.count} × ${fmtUs(est.one)} at ${est.rows} rows, ` +
      `measured at start-up; the dark end of a compute bar when zoomed in)`
    : "no all-reduce measurement from the engine");
  const title = "One all-reduce of [rows, hidden], measured at start-up: " +
    (tp.rows.map(r => `${r} rows ${fmtUs(tp.measured[r])}`).join(", ") || "none") +
    `. ${tp.perStep} all-reduces a step (after attention and after the MLP of every layer).`;
  const t = $("bs-legend-tp-text");
  if (t && t.textContent !== text) t.textContent = text;
  if (el.title !== title) el.title = title;
}

const fmtUs = us => (us >= 1000 ? (us / 1000).toFixed(2) + " ms" : (+us).toFixed(us < 10 ? 1 : 0) + " µs");

function setCauseLegend(causes) {
  const el = $("bs-causes");
  if (!el) return;
  const html = causes.map(c => `<span class="bs-li" title="${esc(causeHint(c) || c)}"><i style="background:${causeColor(c)}"></i>` +
                                 `${esc(causeLabel(c))}</span>`).join("") ||
    `<span class="bs-li muted">none in view</span>`;
  if (el.innerHTML !== html) el.innerHTML = html;
}
