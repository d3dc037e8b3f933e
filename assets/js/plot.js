/* What the Gantt and the small charts share: colours and lanes, the Plotly layout they start from, mode-switch
 * markers, and `draw`, which also makes a zoom on any chart apply to all of them. */
import { replayRange, state } from "./feed.js";
import { syncControls } from "./controls.js";

export const HOST = ["schedule", "fill", "launch", "wait", "update"];
export const GPU = ["h2d", "compute", "d2h"];
export const COLOR = {
  schedule: "#6366f1", fill: "#ec4899", launch: "#06b6d4", wait: "#cbd5e1", update: "#14b8a6",
  h2d: "#f59e0b", compute: "#16a34a", d2h: "#a855f7",
  sync: "#ea580c", async: "#2563eb",
};
// Idle gaps are coloured by what the host was doing meanwhile: a host phase keeps that phase's colour.
// "empty_queue" (no request at all) is not the host's fault: grey. "host_other" is loop overhead between spans.
const CAUSE_COLOR = {
  empty_queue: "#94a3b8", none: "#94a3b8", host_other: "#ef4444", h2d: "#f59e0b", d2h: "#a855f7",
};
export const NO_WORK = new Set(["empty_queue", "none"]);
const SPARE = ["#b91c1c", "#0f766e", "#7c2d12", "#4d7c0f", "#be185d", "#1e40af"];
// The Gantt's rows, top to bottom. The labels are firm names: checks outside the repository look for
// "mode", "GPU · compute" and "GPU idle".
export const LANES = [{ key: "mode", label: "mode" }]
  .concat(HOST.map(k => ({ key: k, group: "cpu", label: "host · " + k })))
  .concat(GPU.map(k => ({ key: k, group: "gpu", label: "GPU · " + (k === "compute" ? "compute" : k.toUpperCase()) })))
  .concat([{ key: "idle", label: "GPU idle" }]);
export const LANE_Y = Object.fromEntries(LANES.map((l, i) => [l.key, i]));
const FONT = { family: "Inter, system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", size: 11, color: "#334155" };
export const GRID = "#eef1f5";
const PLOT_CONFIG = {
  displaylogo: false, responsive: true, displayModeBar: "hover",
  modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d", "toImage"],
};

export function causeColor(cause) {
  if (!cause) return CAUSE_COLOR.none;
  if (HOST.includes(cause)) return COLOR[cause];
  if (CAUSE_COLOR[cause]) return CAUSE_COLOR[cause];
  let h = 0;
  for (const ch of String(cause)) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
  return SPARE[h % SPARE.length];
}

// ---------------------------------------------------------------- drawing

// Charts whose zoom is already followed, and whether the relayout Plotly is firing is our own redraw.
const drawing = { bound: new WeakSet(), ownRedraw: false };

export function draw(el, traces, layout) {
  if (!el || !window.Plotly) return;
  drawing.ownRedraw = true;
  try { window.Plotly.react(el, traces, layout, PLOT_CONFIG); } finally { drawing.ownRedraw = false; }
  if (!drawing.bound.has(el)) {
    drawing.bound.add(el);
    el.on("plotly_relayout", followZoom);
  }
}

// Zooming any chart freezes the window on that range and applies it to every chart.
function followZoom(ev) {
  const view = state.view;
  if (drawing.ownRedraw || !ev) return;
  if (ev["xaxis.autorange"]) {
    if (view.source === "live") { view.follow = true; view.range = null; }
    else { view.span = Infinity; view.range = replayRange(); }
    syncControls(); state.dirty = true;
    return;
  }
  const a = ev["xaxis.range[0]"] !== undefined ? ev["xaxis.range[0]"] : ev["xaxis.range"] && ev["xaxis.range"][0];
  const b = ev["xaxis.range[1]"] !== undefined ? ev["xaxis.range[1]"] : ev["xaxis.range"] && ev["xaxis.range"][1];
  if (a === undefined || b === undefined) return;
  view.follow = false;
  view.range = [a * 1e6, b * 1e6];
  syncControls(); state.dirty = true;
}

export function baseLayout(lo, hi, extra) {
  return Object.assign({
    font: FONT, paper_bgcolor: "#ffffff", plot_bgcolor: "#ffffff",
    margin: { l: 44, r: 10, t: 44, b: 24 },
    xaxis: { range: [lo / 1e6, hi / 1e6], gridcolor: GRID, zeroline: false, ticksuffix: " s", tickfont: { size: 10 } },
    yaxis: { gridcolor: GRID, zeroline: false, rangemode: "tozero", tickfont: { size: 10 }, automargin: true },
    showlegend: true,
    legend: { orientation: "h", x: 0, xanchor: "left", y: 1.0, yanchor: "bottom", font: { size: 10 },
              bgcolor: "rgba(0,0,0,0)" },
    hovermode: "x unified", uirevision: "keep",
  }, extra || {});
}

export function titled(text) {
  // title on the first line of the top margin, legend on the second: they never collide on narrow charts
  return { text, x: 0.012, xanchor: "left", xref: "container", y: 1, yanchor: "top", yref: "container", pad: { t: 4 },
           font: { size: 12, color: "#0f172a" } };
}

// ---------------------------------------------------------------- modes

// Consecutive steps of one mode, as [lo, hi] µs stretches.
export function modeRuns(steps) {
  const runs = [];
  for (const s of steps) {
    const last = runs[runs.length - 1];
    if (last && last.mode === s.mode) last.hi = Math.max(last.hi, s._e);
    else runs.push({ mode: s.mode, lo: s._s, hi: s._e });
  }
  return runs;
}

// A dotted line at every mode switch in [lo, hi]; with labels, "→ mode @step" above it where there is room.
export function modeShapes(d, lo, hi, withLabels, usPerPx) {
  const shapes = [], annotations = [];
  let lastLabel = -Infinity;
  for (const c of d.mode_changes) {
    if (c.t_us < lo || c.t_us > hi) continue;
    const x = c.t_us / 1e6;
    const col = COLOR[c.to] || "#0f172a";
    shapes.push({ type: "line", xref: "x", yref: "paper", x0: x, x1: x, y0: 0, y1: 1,
                  line: { color: col, width: 2, dash: "dot" } });
    // labels closer than ~80 px would overprint each other: the line alone marks that switch
    const crowded = usPerPx && c.t_us - lastLabel < 80 * usPerPx;
    if (withLabels && !crowded) lastLabel = c.t_us;
    if (withLabels && !crowded) annotations.push({ x, y: 1, xref: "x", yref: "paper", yanchor: "bottom", showarrow: false,
      text: "→ " + c.to + (c.step !== undefined ? " @" + c.step : ""), font: { size: 10, color: col },
      bgcolor: "rgba(255,255,255,0.85)" });
  }
  return { shapes, annotations };
}

export function bandShapes(runs) {
  // a faint tint behind sync stretches makes the before/after of a switch readable on every chart
  return runs.filter(r => r.mode === "sync").map(r => ({
    type: "rect", xref: "x", yref: "paper", x0: r.lo / 1e6, x1: r.hi / 1e6, y0: 0, y1: 1, layer: "below",
    line: { width: 0 }, fillcolor: "rgba(234,88,12,0.06)" }));
}
