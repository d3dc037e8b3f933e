/* The Gantt (#bs-gantt): one row per host phase and GPU stream, the mode, and the GPU idle gaps coloured by
 * what the host was doing meanwhile.
 *
 * The bars are painted on a canvas under Plotly's (transparent) SVG: Plotly keeps the axes, lane labels,
 * switch markers and zoom, while the canvas paints any number of spans in a few milliseconds. The ink is
 * each span's share of every pixel column (ink.js), so a lane's ink matches its share of time at every zoom.
 * Hover is ours too (gantt_hover.js): a Plotly marker per step cost more than the rest of the picture. */
import { state } from "./feed.js";
import { bindHover } from "./gantt_hover.js";
import { addSpan, coverage, paintInk, rgb } from "./ink.js";
import { causeHint, causeLabel } from "./names.js";
import { COLOR, GPU, HOST, LANES, LANE_Y, NO_WORK, baseLayout, causeColor, draw, fontPx, modeRuns, modeShapes, moveRange,
  textScale } from "./plot.js";
import { $, esc } from "./util.js";

export const GANTT_HEIGHT = 318;
const BAR = 0.36;                          // half a bar's height, in lanes
const GAP_WASH = { color: "#ef4444", alpha: 0.13 };   // host-caused idle, washed across the GPU lanes
const BAND = "#f8fafc";                    // the GPU lanes' background (CSS, so the canvas holds only ink)
const last = { layoutKey: "" };            // Plotly is asked again only when the axes or markers change

// The Gantt in two steps, so that the redraw can give each its own turn: prepareGantt works out the ink of
// every lane (the bulk of the work on a busy window), showGantt paints it and moves Plotly's axes.
export function prepareGantt(d, steps, lo, hi) {
  const el = $("bs-gantt");
  const geo = canvasGeometry(el);
  return { d, steps, lo, hi, el, geo, ...ganttLayers(steps, lo, (hi - lo) / geo.cols, geo) };
}

export function showGantt(g) {
  const { d, steps, lo, hi, el, geo } = g;
  sizeCanvas(geo);
  paintInk(geo.canvas, g.washes, g.lanes);
  setCauseLegend(g.causes);
  const ms = modeShapes(d, lo, hi, true, (hi - lo) / geo.w);
  const annotations = ms.annotations.concat(placeholderNote(steps, g.gpuSeen, g.hostCompute));
  // the markers and notes, apart from the window itself: when only the window moved, move the axis
  const key = [el.clientWidth, geo.margin.l, ms.shapes.map(s => s.path).join(),
               JSON.stringify(annotations.map(a => [a.x, a.text]))].join(";");
  if (key !== last.layoutKey || !el.layout) {
    draw(el, [], ganttLayout(lo, hi, ms.shapes, annotations, geo.margin));
    last.layoutKey = key;
  } else {
    const r = el.layout.xaxis.range;
    if (r[0] !== lo / 1e6 || r[1] !== hi / 1e6) moveRange(el, lo, hi);
  }
  bindHover(el, { steps, lo, hi, margin: geo.margin });
  // what was painted, for tests and curious readers: spans per row
  el.dataset.lanes = JSON.stringify(g.counts);
  el.dataset.spans = String(Object.entries(g.counts).reduce((a, [k, n]) => a + (k === "gap" ? 0 : n), 0));
  el.dataset.markers = String(ms.count);
}

// The canvas covers Plotly's plot area; its columns are device pixels. The margin holds the lane labels
// (wider in presentation mode, where the text is larger).
function canvasGeometry(el) {
  const k = textScale(), dpr = window.devicePixelRatio || 1;
  const m = { l: Math.round(118 * k), r: 12, t: 24, b: Math.round(26 * k) };
  const w = Math.max(10, el.clientWidth - m.l - m.r), h = GANTT_HEIGHT - m.t - m.b;
  const cols = Math.round(w * dpr), rows = Math.round(h * dpr);
  return { canvas: $("bs-gantt-canvas"), margin: m, w, h, cols, rows, lane: rows / LANES.length };
}

function sizeCanvas(geo) {
  const cv = geo.canvas, m = geo.margin;
  if (cv.width === geo.cols && cv.height === geo.rows && cv.style.left === m.l + "px") return;
  cv.width = geo.cols; cv.height = geo.rows;
  const bandTop = (100 * LANE_Y.h2d / LANES.length).toFixed(3) + "%";
  Object.assign(cv.style, { left: m.l + "px", top: m.t + "px", width: geo.w + "px", height: geo.h + "px",
    background: `linear-gradient(to bottom, transparent ${bandTop}, ${BAND} ${bandTop})` });
}

// Per-column coverage of every layer: the mode, host and GPU lanes, the idle lane split by cause, and a wash
// across the GPU lanes where the host kept the GPU waiting. Spans go straight into the columns: a busy
// 2 min window holds over a hundred thousand of them.
function ganttLayers(steps, lo, usPerCol, geo) {
  const cov = {};
  const add = (name, a, b) => addSpan(cov[name] || (cov[name] = coverage(geo.cols)), a, b, lo, usPerCol);
  let gpuSeen = false, hostCompute = false;
  const causes = new Set();
  for (const s of steps) {
    const cpu = s.cpu, gpu = s.gpu;
    if (cpu) for (const k of HOST) { const v = cpu[k]; if (v && v[0] !== null && v[1] !== null) add(k, v[0], v[1]); }
    if (gpu) for (const k of GPU) { const v = gpu[k]; if (v && v[0] !== null && v[1] !== null) { add(k, v[0], v[1]); gpuSeen = true; } }
    if (s._hostCompute) { add("compute (host)", s._cs[0], s._cs[1]); hostCompute = true; }
    const gap = s.gpu_idle_before_us;
    if (gap > 0) {
      const cause = s.idle_cause || "none";
      causes.add(cause);
      add("idle: " + cause, s._c - gap, s._c);
      if (!NO_WORK.has(cause)) add("gap", s._c - gap, s._c);   // no work at all is not the host's fault
    }
  }
  for (const r of modeRuns(steps)) add(r.mode, r.lo, r.hi);
  const layer = (name, color, alpha) => ({ name, cov: cov[name] || null, rgb: rgb(color), alpha: alpha || 1 });
  const lane = (key, layers) => ({ cy: (LANE_Y[key] + 0.5) * geo.lane, half: BAR * geo.lane, layers });
  const sortedCauses = Array.from(causes).sort();
  const lanes = [lane("mode", ["sync", "async"].map(m => layer(m, COLOR[m])))]
    .concat(HOST.map(k => lane(k, [layer(k, COLOR[k])])))
    .concat(GPU.map(k => lane(k, k === "compute" ? [layer(k, COLOR[k]), layer("compute (host)", COLOR.compute, 0.45)]
                                                    : [layer(k, COLOR[k])])))
    .concat([lane("idle", sortedCauses.map(c => layer("idle: " + c, causeColor(c))))]);
  const washes = cov.gap ? [{ top: LANE_Y.h2d * geo.lane, bottom: (LANE_Y.d2h + 1) * geo.lane, cov: cov.gap,
                              rgb: rgb(GAP_WASH.color), alpha: GAP_WASH.alpha }] : [];
  const counts = {};
  for (const k in cov) counts[k] = cov[k].spans;
  return { lanes, washes, counts, causes: sortedCauses, gpuSeen, hostCompute };
}

// What an empty window, or a run without GPU events, should say instead of bars.
function placeholderNote(steps, gpuSeen, hostCompute) {
  if (!steps.length) {
    return [{ xref: "paper", yref: "paper", x: 0.5, y: 0.5, showarrow: false, font: { size: 13, color: "#475569" },
      text: state.view.source === "replay" ? "no steps in this window" : "waiting for steps: type a prompt or fire a burst" }];
  }
  if (!gpuSeen) {
    return [{ xref: "paper", yref: "y", x: 0.99, xanchor: "right", y: LANE_Y.h2d, showarrow: false,
      font: { size: 10.5, color: "#64748b" }, bgcolor: "rgba(248,250,252,0.9)",
      text: hostCompute ? "CPU run: no CUDA events; the compute lane shows the host forward (launch span)"
                        : "no GPU stream events on this device" }];
  }
  return [];
}

function ganttLayout(lo, hi, markers, annotations, margin) {
  const shapes = [
    { type: "line", xref: "paper", yref: "y", x0: 0, x1: 1, y0: LANE_Y.schedule - 0.5, y1: LANE_Y.schedule - 0.5,
      line: { color: "#e2e8f0", width: 1 } },
    { type: "line", xref: "paper", yref: "y", x0: 0, x1: 1, y0: LANE_Y.h2d - 0.5, y1: LANE_Y.h2d - 0.5,
      line: { color: "#cbd5e1", width: 1 } },
  ].concat(markers);
  return baseLayout(lo, hi, {
    height: GANTT_HEIGHT, margin, showlegend: false, hovermode: false,
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",   // the canvas shows through
    xaxis: { range: [lo / 1e6, hi / 1e6], showgrid: false, zeroline: false, ticksuffix: " s", tickfont: { size: fontPx(11) } },
    yaxis: { range: [LANES.length - 0.5, -0.5], tickvals: LANES.map((_, i) => i), ticktext: LANES.map(l => l.label),
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
    .concat(["<b>GPU idle, by what the host was doing</b>", `<span id="bs-causes"></span>`,
             `<span class="bs-li"><i class="bs-gap"></i>GPU kept waiting by the host</span>`,
             `<span class="bs-li" title="The label names the new mode and the first step run in it">` +
             `<i class="bs-marker"></i>mode switch (→ new mode · first step)</span>`,
             `<span class="bs-li muted" title="Each lane's bar in a pixel column is as tall as the share of that ` +
             `column's time its spans cover, so ink matches time at every zoom">bar height = share of time</span>`]);
  $("bs-legend").innerHTML = parts.join("");
}

function setCauseLegend(causes) {
  const el = $("bs-causes");
  if (!el) return;
  const html = causes.map(c => `<span class="bs-li" title="${esc(causeHint(c) || c)}"><i style="background:${causeColor(c)}"></i>` +
                                 `${esc(causeLabel(c))}</span>`).join("") ||
    `<span class="bs-li muted">none in view</span>`;
  if (el.innerHTML !== html) el.innerHTML = html;
}
