/* What the Gantt and the small charts share: colours and lanes, the Plotly layout they start from, mode-switch
 * markers, and `draw`, which also makes a zoom on any chart apply to all of them. */
import { replayRange, state } from "./feed.js";
import { switchLabel, switchesLabel } from "./names.js";
import { MODE_COLOR, MODE_INK } from "./palette.js";

export const HOST = ["schedule", "fill", "launch", "wait", "update"];
export const GPU = ["h2d", "compute", "d2h"];
export const COLOR = {
  schedule: "#6366f1", fill: "#ec4899", launch: "#06b6d4", wait: "#cbd5e1", update: "#14b8a6",
  h2d: "#f59e0b", compute: "#16a34a", d2h: "#a855f7", allreduce: "#14532d",
  ...MODE_COLOR,
};
// Idle gaps are coloured by what the host was doing meanwhile: a host phase keeps that phase's colour.
// "empty_queue" (no request at all) is not the host's fault: grey. "host_other" is loop overhead between spans;
// "gc", the garbage collector stopping every Python thread; "preempted", the engine thread kept from running
// (the GIL, busy cores). The causes only an imported trace tells apart
// (docs/import.md) get colours of their own, each far enough from every other cause's to tell apart on the lane
// (tests/browser/test_import_page.py measures it): the host's in reds and oranges, the device's in blues, greens and a
// yellow, "unattributed" a dark slate.
const CAUSE_COLOR = {
  empty_queue: "#94a3b8", none: "#94a3b8", host_other: "#ef4444", h2d: "#f59e0b", d2h: "#a855f7", gc: "#854d0e",
  telemetry: "#65a30d", host_sync: "#9f1239", host_op: "#fdba74", stream_wait: "#1e3a8a", copy: "#0e7490",
  collective: "#14532d", other_work: "#d4d400", unattributed: "#334155", preempted: "#701a75",
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
// A tensor-parallel engine's other ranks: their GPU lanes below rank 0's idle lane, keyed "r<rank>:<phase>".
// With no other rank the Gantt has exactly LANES.
const BASE_LANES = { lanes: LANES, y: LANE_Y, groups: [] };
export const rankLaneKey = (rank, phase) => "r" + rank + ":" + phase;

// "GPU1 · compute" on a CUDA rank (its device's index: the name NVML and nvidia-smi use), "rank 1 · compute"
// where there is no GPU.
export function rankLaneLabel(r, phase) {
  const m = /^cuda:(\d+)$/.exec(r.device || "");
  const name = r.host || !m ? "rank " + r.rank : "GPU" + m[1];
  if (phase === "idle") return "GPU idle · " + name;          // one GPU idle lane per GPU, suffixed with its rank
  return name + " · " + (phase === "compute" ? "compute" : phase.toUpperCase());
}

// The lanes for the ranks of tensorParallel(d): {lanes, y (key -> row), groups: [{rank, device, first}]}.
export function ganttLanes(tp) {
  if (!tp || !tp.ranks.length) return BASE_LANES;
  const lanes = LANES.slice();
  const groups = [{ rank: 0, device: tp.rank0Device, first: LANE_Y.h2d }];
  for (const r of tp.ranks) {
    groups.push({ rank: r.rank, device: r.device, first: lanes.length });
    for (const k of r.phases) lanes.push({ key: rankLaneKey(r.rank, k), rank: r.rank, phase: k, label: rankLaneLabel(r, k) });
  }
  return { lanes, y: Object.fromEntries(lanes.map((l, i) => [l.key, i])), groups };
}
const FONT = { family: "Inter, system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", size: 11, color: "#334155" };
export const GRID = "#eef1f5";
const PLOT_CONFIG = {
  displaylogo: false, responsive: true, displayModeBar: "hover",
  // Plotly's default double-click restores the range of the first draw (long gone in a live view): an empty
  // window. "autosize" reports an autorange instead, which followZoom takes as "back to the whole view".
  doubleClick: "autosize",
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

// Charts whose zoom is already followed, and how many of our own redraws are under way: the relayout events
// Plotly fires for those are not the user zooming.
const drawing = { bound: new WeakSet(), own: 0 };

// Plotly's default for tick labels ("hide past div") measures the box of every label of every axis at every
// redraw to hide the ones that stick out: much of a picture's time on a 2-core machine. Ours sit inside fixed
// margins, so nothing needs hiding.
function unmeasured(layout) {
  for (const key of Object.keys(layout)) {
    if (/^[xy]axis\d*$/.test(key) && layout[key] && layout[key].ticklabeloverflow === undefined) {
      layout[key].ticklabeloverflow = "allow";
    }
  }
  return layout;
}

export function draw(el, traces, layout) {
  if (!el || !window.Plotly) return;
  drawing.own++;
  // Every chart has its own height: given its width too, Plotly's responsive handler leaves it alone (with the
  // width alone missing it drops our height for the div's and the Gantt's canvas no longer matches its axes);
  // a window resize asks for a new picture instead (main.js), at the new width.
  if (layout.height && layout.width === undefined && el.clientWidth) layout.width = el.clientWidth;
  try { window.Plotly.react(el, traces, unmeasured(layout), PLOT_CONFIG); } finally { drawing.own--; }
  if (!drawing.bound.has(el)) {
    drawing.bound.add(el);
    el.on("plotly_relayout", followZoom);
  }
}

// Only the window moved: relayout of the range costs a fraction of a react. Plotly reports a relayout after
// its promise settles, so our count of own redraws drops only then.
export function moveRange(el, lo, hi) {
  drawing.own++;
  let p;
  try { p = window.Plotly.relayout(el, { "xaxis.range": [lo / 1e6, hi / 1e6] }); } catch (e) { drawing.own--; throw e; }
  Promise.resolve(p).finally(() => { drawing.own--; });
}

// The window changed under the user's hand: the controls (controls.js, which draws through this module, so it
// listens rather than being called) show it, and the charts redraw.
function viewChanged() {
  document.dispatchEvent(new Event(VIEW_CHANGED));
  state.dirty = true;
}
export const VIEW_CHANGED = "bs-view-changed";

// Zooming any chart freezes the window on that range and applies it to every chart; a double-click goes back
// to the live view (live) or to the whole recording (replay).
function followZoom(ev) {
  const view = state.view;
  if (drawing.own || !ev) return;
  if (ev["xaxis.autorange"]) {
    view.zoomed = false;
    if (view.source === "live") { view.follow = true; view.range = null; view.paused = false; }
    else { view.span = Infinity; view.range = replayRange(); }
    viewChanged();
    return;
  }
  const a = ev["xaxis.range[0]"] !== undefined ? ev["xaxis.range[0]"] : ev["xaxis.range"] && ev["xaxis.range"][0];
  const b = ev["xaxis.range[1]"] !== undefined ? ev["xaxis.range[1]"] : ev["xaxis.range"] && ev["xaxis.range"][1];
  if (a === undefined || b === undefined) return;
  view.follow = false;
  view.zoomed = true;                      // a zoom is no window width: the window buttons go dark
  view.range = [a * 1e6, b * 1e6];
  viewChanged();
}

// Presentation mode (stage.js puts bs-present on <html>) enlarges the charts' text for a projector, more on a
// larger screen: stage.js sets --bs-scale from the viewport (1 at 1280x720, up to 3 at 3840x2160).
export function textScale() {
  const root = document.documentElement;
  if (!root.classList.contains("bs-present")) return 1;
  const k = parseFloat(root.style.getPropertyValue("--bs-scale"));
  return 1.25 * (isFinite(k) && k > 0 ? k : 1);
}

// Presentation mode fills the screen: the Gantt takes about half of its height, each chart of the row below
// about a quarter (the rest is the header, the toolbar and the legend). null outside it (the usual heights).
export function presentHeight(kind) {
  if (!document.documentElement.classList.contains("bs-present")) return null;
  const h = window.innerHeight;
  return kind === "gantt" ? Math.max(290, Math.round(0.42 * h)) : Math.max(165, Math.round(0.25 * h));
}

// A font size in px, scaled for presentation mode.
export function fontPx(size) {
  return Math.round(size * textScale() * 2) / 2;
}

// A chart's margins at the page's text size; `right` widens the right one (for a second y axis's labels).
export function chartMargin(right = 10) {
  const k = textScale();
  return { l: Math.round(48 * k), r: right, t: Math.round(44 * k), b: Math.round(24 * k) };
}

export function baseLayout(lo, hi, extra) {
  return Object.assign({
    font: Object.assign({}, FONT, { size: fontPx(FONT.size) }), paper_bgcolor: "#ffffff", plot_bgcolor: "#ffffff",
    margin: chartMargin(),
    xaxis: { range: [lo / 1e6, hi / 1e6], gridcolor: GRID, zeroline: false, ticksuffix: " s", tickfont: { size: fontPx(10) } },
    // y is fixed: a drag zooms time only, the axis every chart shares
    // (a fixed margin: measuring the tick labels for an automatic one costs a millisecond a chart every redraw)
    yaxis: { gridcolor: GRID, zeroline: false, rangemode: "tozero", tickfont: { size: fontPx(10) }, fixedrange: true },
    showlegend: true,
    legend: { orientation: "h", x: 0, xanchor: "left", y: 1.0, yanchor: "bottom", font: { size: fontPx(10) },
              bgcolor: "rgba(0,0,0,0)" },
    hovermode: "x unified", uirevision: "keep",
  }, extra || {});
}

export function titled(text) {
  // title on the first line of the top margin, legend on the second: they never collide on narrow charts
  return { text, x: 0.012, xanchor: "left", xref: "container", y: 1, yanchor: "top", yref: "container", pad: { t: 4 },
           font: { size: fontPx(12), color: "#0f172a" } };
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

// A dotted line at every mode switch in [lo, hi]; with labels, "→ mode at step N" above it. Labels never overprint:
// switches closer than their labels are wide get one label for the group ("3 switches (steps 380–402)"), and a
// label near an edge is anchored inside the plot. The lines of each colour are one path shape: Plotly's cost
// grows with the number of shapes, not their size.
export function modeShapes(d, lo, hi, withLabels, usPerPx) {
  const paths = {}, inView = [];
  for (const c of d.mode_changes) {
    if (c.t_us < lo || c.t_us > hi) continue;
    inView.push(c);
    const col = COLOR[c.to] || "#0f172a";
    paths[col] = (paths[col] || "") + `M${c.t_us / 1e6},0V1`;
  }
  const shapes = Object.entries(paths).map(([col, path]) => ({ type: "path", xref: "x", yref: "paper", path,
                                                               line: { color: col, width: 2, dash: "dot" } }));
  const annotations = withLabels && usPerPx ? switchLabels(inView, lo, hi, usPerPx) : [];
  return { shapes, annotations, count: inView.length };
}

// Groups of switches whose labels would touch, each group one label (merged until no two labels touch).
function switchLabels(changes, lo, hi, usPerPx) {
  const px = fontPx(11), width = text => (text.length * 0.62 * px + 14) * usPerPx;
  const text = g => (g.length > 1 ? switchesLabel(g) : switchLabel(g[0]));
  const centre = g => (g[0].t_us + g[g.length - 1].t_us) / 2;
  // where a label lies once placed: centred on its switches, or anchored inside the plot near an edge
  const extent = g => {
    const t = centre(g), w = width(text(g));
    return t - w / 2 < lo ? [t, t + w] : t + w / 2 > hi ? [t - w, t] : [t - w / 2, t + w / 2];
  };
  const touch = (a, b) => extent(a)[1] > extent(b)[0];
  let groups = changes.map(c => [c]);
  for (let merged = true; merged;) {
    merged = false;
    const out = [];
    for (const g of groups) {
      if (out.length && touch(out[out.length - 1], g)) { out[out.length - 1] = out[out.length - 1].concat(g); merged = true; }
      else out.push(g);
    }
    groups = out;
  }
  return groups.map(g => {
    const t = centre(g), label = text(g), half = width(label) / 2;
    const anchor = t - half < lo ? "left" : t + half > hi ? "right" : "center";
    return { x: t / 1e6, y: 1, xref: "x", yref: "paper", yanchor: "bottom", xanchor: anchor, showarrow: false,
             text: label, font: { size: px, color: g.length > 1 ? "#0f172a" : MODE_INK[g[0].to] || "#0f172a" },
             bgcolor: "rgba(255,255,255,0.85)", hovertext: g.map(switchLabel).join("<br>") };
  });
}

// The warm-up the scoreboard leaves out (the first steps of every stretch): a grey band, labelled on the Gantt.
export function warmupShapes(board, lo, hi, withLabels) {
  const bands = ((board && board.warmup) || []).filter(w => w.t0_us !== null && w.t1_us !== null && w.t1_us >= lo && w.t0_us <= hi);
  const path = bands.map(w => `M${w.t0_us / 1e6},0H${w.t1_us / 1e6}V1H${w.t0_us / 1e6}Z`).join("");
  const shapes = path ? [{ type: "path", xref: "x", yref: "paper", path, layer: "below", line: { width: 0 },
                           fillcolor: "rgba(100,116,139,0.13)" }] : [];
  // labelled where the band is wide enough to hold the word (at a recording's full width it is a sliver)
  const px = fontPx(9), usPerPx = (hi - lo) / Math.max(1, window.innerWidth);
  const annotations = withLabels ? bands.filter(w => (w.t1_us - w.t0_us) / usPerPx > 5 * px).map(w => ({
    x: (w.t0_us + w.t1_us) / 2e6, y: 0.5, xref: "x", yref: "paper", showarrow: false, text: "warm-up",
    font: { size: px, color: "#334155" }, bgcolor: "rgba(255,255,255,0.85)" })) : [];
  return { shapes, annotations };
}

export function bandShapes(runs) {
  // a faint tint behind sync stretches makes the before/after of a switch readable on every chart
  const path = runs.filter(r => r.mode === "sync").map(r => `M${r.lo / 1e6},0H${r.hi / 1e6}V1H${r.lo / 1e6}Z`).join("");
  return path ? [{ type: "path", xref: "x", yref: "paper", path, layer: "below", line: { width: 0 },
                   fillcolor: "rgba(234,88,12,0.06)" }] : [];
}
