/* batchscope live timelines: the entry module.
 *
 * Loaded from the page <head> (app/ui/page.py) as <script type="module">. It draws into #bs-scope (a gr.HTML block)
 * and keeps the sticky header (#bs-header) current. Data comes from the websocket /ws/telemetry (live) or from a
 * timeline JSON (replay); feed.js holds both. Plain ES modules, no build step; Plotly is a classic script the
 * app serves at /batchscope-static/plotly.min.js, so it is window.Plotly here and may arrive after us.
 *
 *   api.js       HTTP and the websocket          feed.js    the state object, the live store, what to draw
 *   records.js   step records, a timeline read   slices.js  the steps and samples in a window
 *   tensor_parallel.js  the other ranks and the all-reduce estimate
 *   header.js    mode, counters, status line     controls.js toolbar, recordings, replay
 *   redraw.js    when to draw, in slices         view.js    Pause and the window buttons
 *   plot.js      colours, lanes, layout, zoom    gantt.js   the Gantt (ink.js, gantt_hover.js, gantt_inside.js,
 *                                                           gantt_overlays.js)
 *   charts.js    the small charts (chart_rates.js)
 *   still.js     no animation frames for Gradio's lost trackers
 *   tail.js      the slowest requests, one request's waits on the Gantt
 *   analysis.js  the Compare and What-if boxes under the charts (compare_view.js, whatif_view.js), a compared
 *                bucket's typical steps on the Gantt
 *   scoreboard.js the board (ranks.js: an imported trace's rank table; unknown.js: what a trace does not hold)
 *   palette.js   every colour and the words for "busy"   sweep.js the Sweep tab's charts (sweep_figures.js)
 *
 * After each picture the page fires a "bs-picture" event on document (detail: {lo, hi, steps}), for any part
 * of the page that follows the window shown.
 */
import "./palette.js";               // first: it sets the stylesheet's mode colours
import { mountAnalysis } from "./analysis.js";
import { api, connect, socket } from "./api.js";
import { buildScope, refreshRecordings, showReplay, backToLive, syncControls } from "./controls.js";
import { handle, state } from "./feed.js";
import { buildLegend } from "./gantt.js";
import * as header from "./header.js";
import { normalise } from "./records.js";
import { observeCharts, perf, startRedraw } from "./redraw.js";
import { stepsIn } from "./slices.js";
import "./stage.js";                 // scoreboard, presentation mode, keys, example recording
import "./sweep.js";                 // the Sweep tab's charts
import { keepStill, still } from "./still.js";
import { buildTail } from "./tail.js";
import { $, note, setText } from "./util.js";
import { bindViewControls } from "./view.js";

// A picture is on screen: the counters under the toolbar, and data-* attributes for tests.
// The counts are those the picture was planned with (live data keeps arriving while it is drawn).
function pictureDone(snap) {
  const inView = snap.gantt ? snap.gantt.steps.length : stepsIn(snap.d.steps, snap.lo, snap.hi).length;
  state.renders++;
  state.renderCost = perf.pictureCostMs;
  setText("bs-counter", `${inView} steps in view · ${snap.total} kept · ${snap.switches} switches`);
  const data = state.root.dataset;
  data.steps = String(snap.total);
  data.inview = String(inView);
  data.switches = String(snap.switches);
  data.nvml = String(snap.nvml);
  // tensor parallel: the other ranks' records kept, all ranks together
  data.ranksteps = String(Object.values(snap.d.rankSteps || {}).reduce((n, a) => n + a.length, 0));
  data.renders = String(state.renders);
  document.dispatchEvent(new CustomEvent("bs-picture", { detail: { lo: snap.lo, hi: snap.hi, steps: inView } }));
}

const onMessage = m => handle(m, header);

function init() {
  const el = $("bs-scope");
  if (!el || el === state.root) return;
  state.root = el;
  state.live = el.dataset.live !== "0";
  buildScope(el);
  bindViewControls(el);
  buildLegend();
  buildTail(el);
  observeCharts();
  if (window.ResizeObserver) new ResizeObserver(() => { state.dirty = true; }).observe(el);   // e.g. a panel hidden
  header.bindHeader();
  if (!state.live) {
    header.setConn("replay");
    api("/api/replay.json", "GET", undefined, 60000)
      .then(tl => showReplay(tl, el.dataset.replayName || tracedName(tl) || "recorded timeline"))
      .catch(e => note("replay: " + e.message, true));
  } else if (!socket.ws) {
    connect(onMessage, header.setConn, () => state.live);
    refreshRecordings();
  } else {
    header.setConn(socket.open ? "live" : "reconnecting");
    syncControls();
  }
  state.dirty = true;
}

// Gradio renders the page after our <head> script runs, and may re-render a block: watch for our elements.
function watch() {
  init();
  header.bindHeader();
  mountAnalysis();                         // (its boxes are a block of their own: they may come later)
  setTimeout(watch, state.root && document.body.contains(state.root) ? 1000 : 100);
}

function start() {
  keepStill();
  watch();
  startRedraw(pictureDone);
  setInterval(header.pollStatus, 3000);
  setInterval(refreshRecordings, 10000);
  document.addEventListener("visibilitychange", () => { state.dirty = true; });
  window.addEventListener("resize", () => { state.dirty = true; });     // the canvas follows Plotly's new size
}

// A module runs once per page, but an older copy of the page's script may already be running.
if (!window.batchscope) {
  window.batchscope = { store: state.store, view: state.view, handle: onMessage, showReplay, backToLive,
                        render: () => { state.dirty = true; }, normalise, perf, still,
                        get mode() { return state.mode; }, get renderMs() { return perf.pictureCostMs; } };
  // Gradio 6 injects head scripts after `load` has fired: start at once then, or when the document is parsed.
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
}

// A timeline imported from a profiler trace (`batchscope replay TRACE`) is named after its (first) trace file.
function tracedName(tl) {
  const files = (tl && tl.meta && tl.meta.source && tl.meta.source.files) || [];
  return files.length ? files[0].name + (files.length > 1 ? ` (+${files.length - 1} more)` : "") : "";
}
