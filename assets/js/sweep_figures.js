/* The Sweep tab's figures as Plotly traces and layouts: latency against throughput for each mode and each
 * foreign report overlaid, with knees and the rate where each mode leaves the SLOs; the engine's busy % and
 * ms/step with SLO attainment per point; and the latency distributions (CDFs or histograms) of chosen points or
 * load-test runs. A CDF's points carry the engine id of their request (customdata) when its values came with ids:
 * tail.js jumps the Gantt to that request's lifetime when one is clicked.
 *
 * Pure functions of the JSON the server serves (GET /api/sweep/{id}, /api/sweep/{id}.json and
 * /api/sweep/imports/{id}: app/loadtest/sweep/progress.py), so a test checks them without drawing; sweep.js
 * fetches and draws. A series is {name, color, points, summary, ours} (a mode of ours, or a foreign report's). */
import { FOREIGN_COLORS, busyLabel, modeColor } from "./palette.js";

export const X_AXES = { requests_per_s: "throughput (requests/s)",
                         output_tokens_per_s: "throughput (output tokens/s)" };
const CURVE_ROWS = [["ttft_ms", "TTFT (ms)"], ["itl_ms", "ITL (ms)"], ["e2e_ms", "E2E (ms)"]];
const DIST_ROWS = [["ttft_ms", "TTFT (ms)"], ["itl_ms", "ITL (ms)"], ["tpot_ms", "TPOT (ms)"], ["e2e_ms", "E2E (ms)"]];
const FONT = { family: "Inter, ui-sans-serif, system-ui, sans-serif", size: 11 };
const GRID = "#e5e7eb", SLO_GREY = "#9ca3af", MUTED = "#6b7280", EDGE = "#111827";
export const CLICK_HINT = "click: show this request's steps";
const KIND_TEXT = { synchronous: "synchronous", throughput: "throughput", constant: "constant rate",
                    poisson: "Poisson rate", concurrent: "concurrent", gamma: "gamma rate" };
const short = title => title.split(" ")[0];

// "3: constant rate @ 12.50 req/s" (the same words as the summary table's, app/ui/sweep_html.py point_text).
export function pointText(p) {
  if (!p) return "–";
  const rate = p.offered_rate ? ` @ ${p.offered_rate.toFixed(2)} req/s` : "";
  return `${p.index}: ${KIND_TEXT[p.kind] || p.kind}${rate}`;
}

// Our modes (in the order they ran), then every series of each foreign report, each with its colour.
export function seriesOf(status, imports) {
  const out = [];
  for (const [mode, curve] of Object.entries((status && status.modes) || {}))
    out.push({ name: mode, color: modeColor(mode), points: curve.points || [], summary: curve.summary, ours: true });
  let n = 0;
  for (const rep of imports || []) {
    for (const [name, curve] of Object.entries(rep.modes || {})) {
      out.push({ name, color: FOREIGN_COLORS[n % FOREIGN_COLORS.length], points: curve.points || [], summary: null,
                 ours: false });
      n++;
    }
  }
  return out;
}

// Points in the order of the load they offered: synchronous, rising rates (or concurrency), throughput last.
function loadOrder(points) {
  const rank = p => (p.kind === "synchronous" ? [0, 0] : p.kind === "throughput" ? [2, 0]
    : [1, p.offered_rate || p.concurrency || 0]);
  return points.filter(p => p.complete !== false)
    .sort((a, b) => { const x = rank(a), y = rank(b); return x[0] - y[0] || x[1] - y[1]; });
}

function what(p) {
  if (p.offered_rate) return `${p.kind} @ ${p.offered_rate.toFixed(2)} req/s`;
  if (p.kind === "concurrent" && p.concurrency) return `concurrent x${p.concurrency}`;
  return p.kind;
}

// n rows sharing the width, top to bottom: their y domains and a title above each.
function rowsLayout(titles, height, gap, extra) {
  const n = titles.length, h = (1 - gap * (n - 1)) / n;
  const layout = {
    height, margin: { l: 56, r: 12, t: 28, b: 40 }, font: FONT, hovermode: "closest",
    legend: { orientation: "h", y: -0.06, yanchor: "top", font: { size: 10 } },
    plot_bgcolor: "#ffffff", paper_bgcolor: "#ffffff", annotations: [], shapes: [],
  };
  titles.forEach((title, i) => {
    const top = 1 - i * (h + gap), suffix = i ? String(i + 1) : "";
    layout["yaxis" + suffix] = { domain: [top - h, top], anchor: "x" + suffix, gridcolor: GRID, zeroline: false };
    layout["xaxis" + suffix] = { anchor: "y" + suffix, gridcolor: GRID, zeroline: false };
    layout.annotations.push({ text: title, x: 0.5, y: top, xref: "paper", yref: "paper", xanchor: "center",
                              yanchor: "bottom", showarrow: false, font: { size: 12 } });
  });
  return Object.assign(layout, extra || {});
}

const axis = row => (row ? String(row + 1) : "");        // row 0: "x"/"y", row 1: "x2"/"y2"...
const onRow = (trace, row) => Object.assign(trace, { xaxis: "x" + axis(row), yaxis: "y" + axis(row) });

// Rows whose x axes move together (a zoom on one is a zoom on all), the labels on the bottom one only.
function shareX(layout, n, title) {
  for (let i = 1; i < n; i++) layout["xaxis" + axis(i)].matches = "x";
  for (let i = 0; i < n - 1; i++) layout["xaxis" + axis(i)].showticklabels = false;
  layout["xaxis" + axis(n - 1)].title = { text: title };
  // the legend under the axis title, not over it: room below the plot for both
  layout.margin.b = 100;
  layout.legend.y = -58 / (layout.height - layout.margin.t - layout.margin.b);
}

function empty(layout, text) {
  layout.annotations.push({ text, showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5,
                            font: { size: 13, color: MUTED } });
  layout.meta = { empty: text };
  return { data: [], layout };
}

// Latency (p50 solid, p99 dotted) against throughput, one row per latency, every series overlaid. Knees are
// stars; each SLO a grey dashed line; where a mode leaves the SLOs a dashed line in its colour.
export function curvesFigure(series, slo, xKey = "requests_per_s") {
  const layout = rowsLayout(CURVE_ROWS.map(r => r[1]), 720, 0.06);
  shareX(layout, CURVE_ROWS.length, X_AXES[xKey]);
  if (!series.some(s => s.points.length)) return empty(layout, "no sweep yet: start one in the Sweep tab on the left");
  const data = [];
  for (const s of series) {
    const pts = loadOrder(s.points);
    CURVE_ROWS.forEach(([metric, title], row) => {
      for (const [stat, dash] of [["p50", "solid"], ["p99", "dot"]]) {
        data.push(onRow({
          type: "scatter", mode: "lines+markers", name: `${s.name} ${stat}`, legendgroup: `${s.name} ${stat}`,
          showlegend: row === 0, x: pts.map(p => p[xKey] ?? null), y: pts.map(p => (p[metric] || {})[stat] ?? null),
          line: { color: s.color, dash, width: s.ours ? 2 : 1.5 },
          marker: { size: 6, symbol: stat === "p50" ? "circle" : "circle-open" },
          customdata: pts.map(p => [what(p), p.slo_attainment ?? null]),
          hovertemplate: `<b>${s.name}</b> %{customdata[0]}<br>%{x:,.2f} ${X_AXES[xKey]}<br>` +
            `${short(title)} ${stat} %{y:,.1f} ms<br>SLO attainment %{customdata[1]:.1%}<extra></extra>`,
        }, row));
      }
      data.push(...knees(s, metric, row, xKey));
    });
    data.push(...sloExit(s, layout, xKey));
  }
  data.push(...sloLines(series, slo || {}, xKey));
  CURVE_ROWS.forEach((_, row) => { layout["yaxis" + axis(row)].type = "log"; });
  return { data, layout };
}

function knees(s, metric, row, xKey) {
  const out = [];
  const of = (((s.summary || {}).knees || {})[metric]) || {};
  for (const [stat, k] of Object.entries(of)) {
    if (!k) continue;
    const p = s.points[k.index];
    out.push(onRow({
      type: "scatter", mode: "markers", name: `${s.name} knee`, legendgroup: `${s.name} knee`, showlegend: false,
      x: [p[xKey]], y: [(p[metric] || {})[stat]],
      marker: { symbol: "star", size: 14, color: s.color, line: { color: EDGE, width: 1 } },
      hovertemplate: `<b>${s.name} knee</b> (${metric.split("_")[0].toUpperCase()} ${stat})<br>%{x:,.2f}` +
        "<extra></extra>",
    }, row));
  }
  return out;
}

// Each SLO as a grey dashed trace across the curves (a trace, not a shape with a label: on a log axis a label's
// position is read as a power of ten).
function sloLines(series, slo, xKey) {
  const xs = series.flatMap(s => s.points.map(p => p[xKey])).filter(x => x !== null && x !== undefined);
  if (!xs.length) return [];
  const out = [];
  CURVE_ROWS.forEach(([metric, title], row) => {
    const limit = slo[metric];
    if (!limit) return;
    const name = `${short(title)} SLO` + (metric === "itl_ms" ? " (each request's mean gap)" : "");
    out.push(onRow({ type: "scatter", mode: "lines", name: "SLO", legendgroup: "SLO", showlegend: !out.length,
                     x: [Math.min(...xs), Math.max(...xs)], y: [limit, limit],
                     line: { color: SLO_GREY, dash: "dash", width: 1 },
                     hovertemplate: `${name}: ${limit} ms<extra></extra>` }, row));
  });
  return out;
}

// Where a mode leaves the SLOs: a dashed vertical line in its colour across the rows, named in the legend.
function sloExit(s, layout, xKey) {
  const leaves = (s.summary || {}).slo_exit;
  const x = leaves ? s.points[leaves.index][xKey] : null;
  if (x === null || x === undefined) return [];
  layout.shapes.push({ type: "line", xref: "x", yref: "paper", x0: x, x1: x, y0: 0, y1: 1,
                       line: { color: s.color, dash: "dash", width: 1.5 } });
  return [{ type: "scatter", mode: "lines", x: [null], y: [null], name: `${s.name} leaves the SLOs at ${fmt2(x)}`,
            line: { color: s.color, dash: "dash", width: 1.5 } }];
}

const fmt2 = x => x.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });

// Per point: busy % and ms/step (our modes: the engine's own telemetry), SLO attainment (every series).
export function engineFigure(series, target, xKey = "requests_per_s") {
  const basis = series.flatMap(s => s.points).map(p => p.busy_basis).find(b => b);
  const titles = [busyLabel(basis) + " %", "ms per step (median)", "SLO attainment"];
  const layout = rowsLayout(titles, 560, 0.08);
  shareX(layout, 3, X_AXES[xKey]);
  layout.yaxis3 = Object.assign(layout.yaxis3, { range: [0, 1.05], tickformat: ".0%" });
  if (!series.some(s => s.points.length)) return empty(layout, "no sweep yet");
  const rows = [["busy_pct", "%{y:.1f} %"], ["ms_per_step", "%{y:.2f} ms"], ["slo_attainment", "%{y:.1%}"]];
  const data = [];
  for (const s of series) {
    const pts = loadOrder(s.points);
    let shown = false;
    rows.forEach(([key, fmt], row) => {
      const ys = pts.map(p => p[key] ?? null);
      if ((!s.ours && key !== "slo_attainment") || ys.every(y => y === null)) return;
      data.push(onRow({
        type: "scatter", mode: "lines+markers", name: s.name, legendgroup: s.name, showlegend: !shown,
        x: pts.map(p => p[xKey] ?? null), y: ys, line: { color: s.color }, customdata: pts.map(what),
        hovertemplate: `<b>${s.name}</b> %{customdata}<br>%{x:,.2f}<br>${fmt}<extra></extra>`,
      }, row));
      shown = true;
    });
  }
  if (target) layout.shapes.push({ type: "line", xref: "x3 domain", yref: "y3", x0: 0, x1: 1, y0: target, y1: target,
                                   line: { color: SLO_GREY, dash: "dash", width: 1 } });
  return { data, layout };
}

// The engine ids that go with values[key], one per value, or null: the latency's own list (a continuous load's,
// and a sweep point's gaps), else, for a per-request latency, the shared request_id.
export function valueIds(values, key) {
  let ids = values[key.replace(/_ms$/, "_request_id")];
  if ((ids === undefined || ids === null) && key !== "itl_ms") ids = values.request_id;
  return ids && ids.length === (values[key] || []).length ? ids : null;
}

// Values with their ids left out: another server's requests, which no timeline here holds.
export function withoutIds(values) {
  return Object.fromEntries(Object.entries(values || {}).filter(([k]) => !k.endsWith("request_id")));
}

function sortedWithIds(values, key) {
  const vals = values[key] || [], ids = valueIds(values, key);
  const pairs = vals.map((v, i) => [v, ids ? ids[i] : null]).filter(p => p[0] !== null && p[0] !== undefined)
    .sort((a, b) => a[0] - b[0]);
  return [pairs.map(p => p[0]), ids ? pairs.map(p => p[1]) : null];
}

// TTFT, ITL, TPOT and E2E of each entry ({name, color, values}) overlaid: CDFs (the hover reads the percentile)
// or histograms (share of values per bin). A CDF point carries its request's engine id as customdata (each ITL
// gap the id of its request) when the values came with ids, and its hover says a click shows it.
export function distributionFigure(dists, kind = "cdf") {
  const layout = rowsLayout(DIST_ROWS.map(r => r[1]), 880, 0.07);
  if (!dists.some(d => DIST_ROWS.some(([k]) => ((d.values || {})[k] || []).length)))
    return empty(layout, "no values to draw: pick a sweep point or a load-test run");
  const data = [];
  DIST_ROWS.forEach(([key, title], row) => {
    for (const d of dists) {
      const [vals, ids] = sortedWithIds(d.values || {}, key);
      if (!vals.length) continue;
      const common = { name: d.name, legendgroup: d.name, showlegend: row === 0, marker: { color: d.color } };
      if (kind === "hist") {
        data.push(onRow(Object.assign({ type: "histogram", x: vals, histnorm: "percent", opacity: 0.55, nbinsx: 40,
          hovertemplate: `<b>${d.name}</b> %{x} ms<br>%{y:.1f} % of values<extra></extra>` }, common), row));
        continue;
      }
      const n = vals.length;
      const which = ids ? ` · %{customdata}<br><i>${CLICK_HINT}</i>` : "";
      data.push(onRow(Object.assign({
        type: "scatter", mode: "lines", x: vals, y: vals.map((_, i) => 100 * (i + 1) / n),
        line: { color: d.color, width: 2, shape: "hv" }, customdata: ids || undefined,
        hovertemplate: `<b>${d.name}</b> ${short(title)}<br>p%{y:.1f} = %{x:,.2f} ms${which}<extra></extra>`,
      }, common), row));
    }
  });
  DIST_ROWS.forEach((_, row) => {
    const y = layout["yaxis" + axis(row)];
    if (kind === "hist") Object.assign(y, { title: { text: "% of values" } });
    else Object.assign(y, { range: [0, 100.5], tickvals: [0, 25, 50, 75, 90, 99], title: { text: "percentile" } });
  });
  if (kind === "hist") layout.barmode = "overlay";
  return { data, layout };
}

// The distributions of point i of a sweep document (GET /api/sweep/{id}.json: per mode its points and their
// raw values), each foreign report's point nearest to ours in throughput beside them (without ids: another
// server's requests lead nowhere here).
export function pointDistributions(doc, i, imports) {
  const out = [];
  let ours = null;
  for (const [mode, curve] of Object.entries((doc && doc.modes) || {})) {
    if (i < curve.points.length && i < (curve.distributions || []).length) {
      ours = curve.points[i];
      out.push({ name: `${mode} · ${pointText(ours)}`, color: modeColor(mode), values: curve.distributions[i] });
    }
  }
  let n = 0;
  for (const rep of imports || []) {
    for (const [name, curve] of Object.entries(rep.modes || {})) {
      const near = nearest(curve, ours);
      if (near) out.push({ name: `${name} · ${pointText(near[0])}`, color: FOREIGN_COLORS[n % FOREIGN_COLORS.length],
                           values: withoutIds(near[1]) });
      n++;
    }
  }
  return out;
}

function nearest(curve, ours) {
  const pts = curve.points || [], dists = curve.distributions || [];
  const cands = pts.map((p, k) => [p, dists[k]])
    .filter(([, d]) => d && ["ttft_ms", "e2e_ms", "itl_ms"].some(k => (d[k] || []).length));
  if (!cands.length) return null;
  if (!ours || ours.requests_per_s === null || ours.requests_per_s === undefined) return cands[0];
  const gap = pd => Math.abs((pd[0].requests_per_s || 0) - ours.requests_per_s);
  return cands.reduce((a, b) => (gap(b) < gap(a) ? b : a));
}

// A load-test run's values ([[series, values], ...]: the newest burst, A/B or load), named with its run.
export function runDistributions(key, runs) {
  return (runs || []).map(([series, values]) => ({ name: `${series} · ${key}`,
    color: modeColor(series) === modeColor("") ? FOREIGN_COLORS[2] : modeColor(series), values }));
}
