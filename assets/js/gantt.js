/* The Gantt (#bs-gantt): one row per host phase and GPU stream, the mode, and the GPU idle gaps coloured by
 * what the host was doing meanwhile.
 *
 * The bars are painted on a canvas under Plotly's (transparent) SVG: Plotly keeps the axes, lane labels,
 * switch markers, hover and zoom, while the canvas fills thousands of spans in a few milliseconds, where the
 * same spans as SVG paths took a hundred or more (and starved the engine on a small machine). */
import { span, state } from "./feed.js";
import { COLOR, GPU, HOST, LANES, LANE_Y, NO_WORK, baseLayout, causeColor, draw, modeRuns, modeShapes } from "./plot.js";
import { $, esc } from "./util.js";

const GANTT_HEIGHT = 318, GANTT_MARGIN = { l: 108, r: 12, t: 24, b: 26 };
const BAR = 0.36;                          // half a bar's height, in lanes
const MAX_HOVER_STEPS = 3000;              // one SVG node per step beyond this would cost more than it helps

export function renderGantt(d, steps, lo, hi) {
  const el = $("bs-gantt");
  const width = Math.max(200, (el.clientWidth || 900) - 120);
  const px = (hi - lo) / width;                    // µs per pixel
  const { bars, causes, gpuSeen, hostCompute } = ganttBars(steps, lo, hi, px);
  setCauseLegend(causes);
  const traces = steps.length <= MAX_HOVER_STEPS ? [hoverTrace(steps)] : [];   // Plotly: hover targets only
  const ms = modeShapes(d, lo, hi, true, px);
  const annotations = ms.annotations.concat(placeholderNote(steps, gpuSeen, hostCompute));
  draw(el, traces, ganttLayout(lo, hi, ms.shapes, annotations));
  paintBars(bars, lo, hi);
  // what was painted, for tests and curious readers: spans per row
  const painted = {};
  for (const b of bars) if (b.name !== "band") painted[b.name] = (painted[b.name] || 0) + b.spans.length;
  el.dataset.lanes = JSON.stringify(painted);
  el.dataset.spans = String(Object.values(painted).reduce((a, n) => a + n, 0));
  el.dataset.markers = String(ms.shapes.length);
}

// The rows of bars, back to front: a light band grouping the GPU lanes, the faint red highlight of every idle
// gap across them, the host and GPU lanes, the mode, then the idle lane split by cause.
function ganttBars(steps, lo, hi, px) {
  const bars = [rects([[lo, hi]], LANE_Y.h2d - 0.5, LANE_Y.idle + 0.5, "#f8fafc", "band")];
  const lanes = {};
  for (const k of HOST.concat(GPU)) lanes[k] = [];
  const hostCompute = [];                          // CPU runs: the host span that did the forward
  const gaps = {};                                 // cause -> spans
  let gpuSeen = false;
  for (const s of steps) {
    for (const k of HOST) { const v = span(s, "cpu", k); if (v) lanes[k].push([v[0], v[1]]); }
    for (const k of GPU) { const v = span(s, "gpu", k); if (v) { lanes[k].push([v[0], v[1]]); gpuSeen = true; } }
    if (s._hostCompute) hostCompute.push([s._cs[0], s._cs[1]]);
    const gap = s.gpu_idle_before_us;
    if (gap > 0) {
      const cause = s.idle_cause || "none";
      (gaps[cause] = gaps[cause] || []).push([s._c - gap, s._c]);
    }
  }
  const allGaps = [];
  // (gaps while the engine simply had no work are not the host's fault: they stay grey and unhighlighted)
  for (const c in gaps) if (!NO_WORK.has(c)) for (const g of gaps[c]) if (g[1] - g[0] > 2 * px) allGaps.push(g.slice());
  if (allGaps.length) bars.push(rects(merged(allGaps, px), LANE_Y.h2d - 0.5, LANE_Y.d2h + 0.5, "rgba(239,68,68,0.13)", "gap"));
  for (const k of HOST.concat(GPU)) {
    const y = LANE_Y[k];
    if (lanes[k].length) bars.push(rects(merged(lanes[k], px), y - BAR, y + BAR, COLOR[k], k));
  }
  if (hostCompute.length) {
    bars.push(rects(merged(hostCompute, px), LANE_Y.compute - BAR, LANE_Y.compute + BAR, "rgba(22,163,74,0.45)", "compute (host)"));
  }
  for (const r of modeRuns(steps)) {
    bars.push(rects([[Math.max(r.lo, lo), Math.min(r.hi, hi)]], LANE_Y.mode - BAR, LANE_Y.mode + BAR,
                    COLOR[r.mode] || "#64748b", r.mode));
  }
  const causes = Object.keys(gaps).sort();
  for (const c of causes) bars.push(rects(merged(gaps[c], px), LANE_Y.idle - BAR, LANE_Y.idle + BAR, causeColor(c), "idle: " + c));
  return { bars, causes, gpuSeen, hostCompute: hostCompute.length > 0 };
}

// One row of bars from y0 to y1 (lane units); painted on the canvas by paintBars.
function rects(spans, y0, y1, color, name) {
  return { spans, y0, y1, color, name };
}

// Merge spans closer than one pixel: the picture is the same, the canvas has less to fill.
function merged(spans, minGap) {
  spans.sort((a, b) => a[0] - b[0]);
  const out = [];
  for (const s of spans) {
    const last = out[out.length - 1];
    if (last && s[0] - last[1] < minGap) { if (s[1] > last[1]) last[1] = s[1]; }
    else out.push([s[0], Math.max(s[1], s[0] + minGap)]);   // at least a pixel wide, or short spans vanish
  }
  return out;
}

// Hover: one invisible marker per step (an SVG node each, so one per step, not per span) whose label lists
// the step's spans; hovermode "x" picks the step nearest the cursor, whichever lane it points at.
function hoverTrace(steps) {
  const ms_ = v => v ? ((v[1] - v[0]) / 1000).toFixed(3) : null;
  const hx = [], ht = [];
  for (const s of steps) {
    const host = HOST.map(k => { const v = ms_(span(s, "cpu", k)); return v === null ? "" : `${k} ${v}`; }).filter(Boolean);
    const dev = s.gpu ? GPU.map(k => { const v = ms_(span(s, "gpu", k)); return v === null ? "" : `${k} ${v}`; }).filter(Boolean)
      : (s._hostCompute ? [`compute (host) ${ms_(s._cs)}`] : []);
    const idle = s.gpu_idle_before_us > 0 ? `<br>GPU idle before: ${(s.gpu_idle_before_us / 1000).toFixed(3)} ms (${s.idle_cause || "?"})` : "";
    hx.push(s._c / 1e6);
    ht.push(`<b>step ${s.step}</b> · ${s.mode} · slot ${s.slot} · ${s.num_requests} req · ` +
            `${s.prefill_tokens} prefill + ${s.decode_tokens} decode tok<br>host ms: ${host.join(", ")}` +
            (dev.length ? `<br>device ms: ${dev.join(", ")}` : "") + idle);
  }
  return { type: "scatter", mode: "markers", x: hx, y: hx.map(() => LANE_Y.compute), text: ht,
           hovertemplate: "%{text}<extra></extra>", marker: { size: 6, opacity: 0 }, showlegend: false,
           name: "hover" };
}

// What an empty window, or a run without GPU events, should say instead of bars.
function placeholderNote(steps, gpuSeen, hostCompute) {
  if (!steps.length) {
    return [{ xref: "paper", yref: "paper", x: 0.5, y: 0.5, showarrow: false, font: { size: 13, color: "#94a3b8" },
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

function ganttLayout(lo, hi, markers, annotations) {
  const shapes = [
    { type: "line", xref: "paper", yref: "y", x0: 0, x1: 1, y0: LANE_Y.schedule - 0.5, y1: LANE_Y.schedule - 0.5,
      line: { color: "#e2e8f0", width: 1 } },
    { type: "line", xref: "paper", yref: "y", x0: 0, x1: 1, y0: LANE_Y.h2d - 0.5, y1: LANE_Y.h2d - 0.5,
      line: { color: "#cbd5e1", width: 1 } },
  ].concat(markers);
  return baseLayout(lo, hi, {
    height: GANTT_HEIGHT, margin: GANTT_MARGIN, showlegend: false, hovermode: "x",
    hoverlabel: { align: "left", font: { size: 11 } },
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",   // the canvas shows through
    xaxis: { range: [lo / 1e6, hi / 1e6], showgrid: false, zeroline: false, ticksuffix: " s", tickfont: { size: 10 } },
    yaxis: { range: [LANES.length - 0.5, -0.5], tickvals: LANES.map((_, i) => i), ticktext: LANES.map(l => l.label),
             fixedrange: true, showgrid: false, zeroline: false, tickfont: { size: 10.5 } },
    shapes, annotations, dragmode: "zoom",
  });
}

function paintBars(bars, lo, hi) {
  const cv = $("bs-gantt-canvas"), el = $("bs-gantt");
  const m = GANTT_MARGIN;
  const w = Math.max(10, el.clientWidth - m.l - m.r), h = GANTT_HEIGHT - m.t - m.b;
  const dpr = window.devicePixelRatio || 1;
  if (cv.width !== Math.round(w * dpr) || cv.height !== Math.round(h * dpr)) {
    cv.width = Math.round(w * dpr); cv.height = Math.round(h * dpr);
    Object.assign(cv.style, { left: m.l + "px", top: m.t + "px", width: w + "px", height: h + "px" });
  }
  const ctx = cv.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  const lane = h / LANES.length, sx = w / (hi - lo);
  for (const b of bars) {
    ctx.fillStyle = b.color;
    const top = (b.y0 + 0.5) * lane, height = (b.y1 - b.y0) * lane;   // y axis runs top-down from -0.5
    for (const [a, e] of b.spans) {
      const x0 = (a - lo) * sx, x1 = (e - lo) * sx;
      if (x1 < 0 || x0 > w) continue;
      ctx.fillRect(x0, top, Math.max(1, x1 - x0), height);
    }
  }
}

// ---------------------------------------------------------------- legend

export function buildLegend() {
  const item = (c, label, cls) => `<span class="bs-li ${cls || ""}"><i style="background:${c}"></i>${esc(label)}</span>`;
  const parts = [item(COLOR.sync, "sync", "mode"), item(COLOR.async, "async", "mode"), "<b>host</b>"]
    .concat(HOST.map(k => item(COLOR[k], k)))
    .concat(["<b>GPU</b>"]).concat(GPU.map(k => item(COLOR[k], k === "compute" ? "compute" : k.toUpperCase())))
    .concat(["<b>idle gap, by host cause</b>", `<span id="bs-causes"></span>`,
             `<span class="bs-li"><i class="bs-gap"></i>gap on GPU lanes</span>`,
             `<span class="bs-li"><i class="bs-marker"></i>mode switch</span>`]);
  $("bs-legend").innerHTML = parts.join("");
}

function setCauseLegend(causes) {
  const el = $("bs-causes");
  if (!el) return;
  const html = causes.map(c => `<span class="bs-li"><i style="background:${causeColor(c)}"></i>${esc(c)}</span>`).join("") ||
    `<span class="bs-li muted">none in view</span>`;
  if (el.innerHTML !== html) el.innerHTML = html;
}
