/* What the Gantt draws over its lanes: the steps marked in the Compare view and the request focused in the
 * slowest list, as Plotly shapes and annotations. */
import { state } from "./feed.js";
import { fontPx } from "./plot.js";
import { findStep } from "./records.js";
import { PHASE_COLOR } from "./tail.js";
import { esc } from "./util.js";

// The typical steps of the bucket picked in the Compare view (state.marks, set by analysis.js): each step's span
// outlined across the lanes, named above them.
export function markShapes(d, lo, hi) {
  const shapes = [], annotations = [], keys = [], byStep = new Map();
  for (const m of state.marks || []) {
    if (m.source !== state.view.source) continue;
    const s = findStep(d.steps, m.step);
    if (!s || s._e < lo || s._s > hi) continue;
    keys.push(`${m.side}:${m.step}`);
    const same = byStep.get(m.step);           // both sides on one step (a timeline compared with itself): one label
    if (same) { same.text = `${esc(m.side)} · ${same.text}`; continue; }
    const x0 = s._s / 1e6, x1 = Math.max(s._e, s._s + (hi - lo) / 400) / 1e6;   // a sliver at least
    shapes.push({ type: "rect", xref: "x", yref: "paper", x0, x1, y0: 0, y1: 1, layer: "above", fillcolor: m.color,
                  opacity: 0.12, line: { width: 0 } });
    shapes.push({ type: "rect", xref: "x", yref: "paper", x0, x1, y0: 0, y1: 1, layer: "above",
                  fillcolor: "rgba(0,0,0,0)", line: { color: m.color, width: 1.5, dash: "dot" } });
    const label = { xref: "x", yref: "paper", x: (x0 + x1) / 2, y: 1.025, showarrow: false, bgcolor: m.color,
                    text: `${esc(m.side)} #${m.step}`, font: { size: fontPx(9.5), color: "#fff" } };
    annotations.push(label);
    byStep.set(m.step, label);
  }
  return { shapes, annotations, key: keys.join(",") };
}

// The focused request (state.focus, set by tail.js): each span of its lifetime washed across the lanes with a
// strip above them naming it, and an outline round the compute of each of its steps in view.
const FOCUS_STEPS_MAX = 400;               // outlines drawn at most (a long decode: the strip still shows it)

export function focusShapes(lo, hi, spec) {
  const f = state.focus;
  const none = { shapes: [], annotations: [], key: "", id: "", spans: 0, steps: 0 };
  if (!f || f.source !== state.view.source) return none;
  const shapes = [], annotations = [];
  let spans = 0, steps = 0;
  for (const sp of f.spans) {
    const a = sp.t0_us, b = sp.t1_us ?? hi;
    if (a === null || b < lo || a > hi) continue;
    const color = PHASE_COLOR[sp.phase] || "#64748b";
    shapes.push({ type: "rect", xref: "x", yref: "paper", x0: a / 1e6, x1: b / 1e6, y0: 0, y1: 1, layer: "above",
                  fillcolor: color, opacity: sp.phase === "decode" ? 0.07 : 0.14, line: { width: 0 } });
    shapes.push({ type: "rect", xref: "x", yref: "paper", x0: a / 1e6, x1: b / 1e6, y0: 1.005, y1: 1.045,
                  fillcolor: color, opacity: 0.9, line: { width: 0 } });
    annotations.push({ xref: "x", yref: "paper", x: (Math.max(a, lo) + Math.min(b, hi)) / 2e6, y: 1.025, showarrow: false,
                       text: sp.phase, font: { size: fontPx(9.5), color: "#fff" } });
    spans++;
  }
  const y = spec.y.compute;
  for (const d of f.steps) {
    const c = d.compute_us;
    if (!c || c[0] === null || c[1] > hi + 1 || c[1] < lo || steps >= FOCUS_STEPS_MAX) continue;
    shapes.push({ type: "rect", xref: "x", yref: "y", x0: c[0] / 1e6, x1: c[1] / 1e6, y0: y - 0.46, y1: y + 0.46,
                  line: { color: "#0f172a", width: 1.5 }, fillcolor: "rgba(0,0,0,0)" });
    steps++;
  }
  return { shapes, annotations, key: `${f.id}|${spans}|${steps}`, id: f.id, spans, steps };
}
