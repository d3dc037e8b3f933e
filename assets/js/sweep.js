/* The Sweep tab's charts, drawn here with the same Plotly as the live scope. The tab's Gradio handlers
 * (app/ui/sweep_tab.py) keep what is picked, and say it in the data-* attributes of an empty element per chart
 * (class "bs-sweep-fig" in #bs-sweep-curves, #bs-sweep-engine, #bs-sweep-dist):
 *
 *   data-fig      "curves", "engine" or "dist"
 *   data-sweep    the sweep's id (curves and engine: GET /api/sweep/{id}; a point's values: /api/sweep/{id}.json)
 *   data-points   how many points it had run when asked: a new point, a new picture
 *   data-imports  foreign reports to overlay, comma-separated ids (GET /api/sweep/imports/{id})
 *   data-x        the throughput axis: "requests_per_s" or "output_tokens_per_s"
 *   data-point    dist: the sweep point whose values to draw
 *   data-run      dist: a load-test run's name, its values in data-values ([[series, values], ...]: no route
 *                 serves a burst's raw values, so the handler hands them over)
 *   data-kind     dist: "cdf" or "hist"
 *
 * The element is looked at every LOOK_MS and drawn into when what it asks for changed (Gradio puts a new one in
 * place) and it is on screen (a chart drawn while its column is hidden would have no width). */
import { api } from "./api.js";
import { onCdfClick } from "./tail.js";
import { curvesFigure, distributionFigure, engineFigure, pointDistributions, runDistributions,
  seriesOf } from "./sweep_figures.js";

const LOOK_MS = 250;
const CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d"] };

async function imported(ids) {
  const out = [];
  for (const id of ids) {
    try { out.push(await api(`/api/sweep/imports/${encodeURIComponent(id)}`)); } catch (e) { /* forgotten */ }
  }
  return out;
}

async function figureFor(d) {
  const imports = await imported((d.imports || "").split(",").filter(Boolean));
  const x = d.x || "requests_per_s";
  if (d.fig === "dist") {
    if (d.run) return distributionFigure(runDistributions(d.run, JSON.parse(d.values || "[]")), d.kind);
    if (!d.sweep || d.point === undefined || d.point === "") return distributionFigure([], d.kind);
    const doc = await api(`/api/sweep/${encodeURIComponent(d.sweep)}.json`, "GET", undefined, 60000);
    return distributionFigure(pointDistributions(doc, +d.point, imports), d.kind);
  }
  const st = d.sweep ? await api(`/api/sweep/${encodeURIComponent(d.sweep)}`) : null;
  const series = seriesOf(st, imports);
  return d.fig === "engine" ? engineFigure(series, ((st && st.slo) || {}).target, x)
    : curvesFigure(series, st && st.slo, x);
}

const ASKED = ["fig", "sweep", "points", "imports", "x", "point", "run", "values", "kind"];
const wanted = el => JSON.stringify(ASKED.map(k => el.dataset[k] ?? null));

const drawn = new WeakMap();               // element -> what it was last drawn for

async function drawOne(el) {
  const key = wanted(el);
  drawn.set(el, key);
  let fig;
  try { fig = await figureFor({ ...el.dataset }); } catch (e) {
    fig = distributionFigure([], "cdf");
    fig.layout.annotations.push({ text: "cannot draw: " + e.message, xref: "paper", yref: "paper", x: 0.5, y: 0.4,
                                  showarrow: false, font: { color: "#b91c1c" } });
  }
  if (drawn.get(el) !== key || !document.body.contains(el)) return;    // picked again meanwhile
  await window.Plotly.react(el, fig.data, fig.layout, CONFIG);
  el.dataset.traces = String(fig.data.length);
  // a CDF point carries its request's id: a click shows that request on the Gantt (tail.js)
  if (el.dataset.fig === "dist" && !el.dataset.bsClickable) {
    el.on("plotly_click", onCdfClick);
    el.dataset.bsClickable = "1";
  }
}

function look() {
  if (!window.Plotly) return;
  for (const el of document.querySelectorAll(".bs-sweep-fig")) {
    if (drawn.get(el) === wanted(el) || !el.offsetParent) continue;
    drawOne(el);
  }
}

if (!window.batchscopeSweep) window.batchscopeSweep = { timer: setInterval(look, LOOK_MS), look };
