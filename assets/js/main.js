/* batchscope live timelines: the entry module.
 *
 * Loaded from the page <head> (app/ui.py) as <script type="module">. It draws into #bs-scope (a gr.HTML block)
 * and keeps the sticky header (#bs-header) current. Data comes from the websocket /ws/telemetry (live) or from a
 * timeline JSON (replay); feed.js holds both. Plain ES modules, no build step; Plotly is a classic script the
 * app serves at /batchscope-static/plotly.min.js, so it is window.Plotly here and may arrive after us.
 *
 *   api.js       HTTP and the websocket          feed.js    the state object, records, what to draw
 *   header.js    mode, counters, status line     controls.js toolbar, recordings, replay
 *   plot.js      colours, lanes, layout, zoom    gantt.js   the Gantt          charts.js  the small charts
 */
import { api, connect, socket } from "./api.js";
import { renderCharts } from "./charts.js";
import { buildScope, refreshRecordings, showReplay, backToLive, syncControls } from "./controls.js";
import { currentData, currentRange, handle, normalise, state, stepsIn } from "./feed.js";
import { buildLegend, renderGantt } from "./gantt.js";
import * as header from "./header.js";
import { $, note, setText } from "./util.js";

function render() {
  const d = currentData();
  const [lo, hi] = currentRange(d);
  state.shownRange = [lo, hi];
  const steps = stepsIn(d.steps, lo, hi);
  renderGantt(d, steps, lo, hi);
  renderCharts(d, steps, lo, hi);
  state.renders++;
  const total = d.steps.length;
  setText("bs-counter", `${steps.length} steps in view · ${total} kept · ${d.mode_changes.length} switches`);
  const data = state.root.dataset;
  data.steps = String(total);
  data.inview = String(steps.length);
  data.switches = String(d.mode_changes.length);
  data.nvml = String(d.nvml.length);
  data.renders = String(state.renders);
}

function loop() {
  const following = state.view.source === "live" && state.view.follow;
  const root = state.root;
  if (root && document.body.contains(root) && !document.hidden && window.Plotly && (state.dirty || following)) {
    const t = performance.now();
    state.dirty = false;
    try { render(); } catch (e) { console.error("batchscope render", e); }
    state.renderCost = 0.7 * state.renderCost + 0.3 * (performance.now() - t);
  }
  // Back off when drawing is expensive, so the page stays responsive under heavy load.
  setTimeout(loop, Math.max(250, 3 * state.renderCost));
}

const onMessage = m => handle(m, header);

function init() {
  const el = $("bs-scope");
  if (!el || el === state.root) return;
  state.root = el;
  state.live = el.dataset.live !== "0";
  buildScope(el);
  buildLegend();
  header.bindHeader();
  if (!state.live) {
    header.setConn("replay");
    api("/api/replay.json", "GET", undefined, 60000)
      .then(tl => showReplay(tl, el.dataset.replayName || "recorded timeline"))
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
  setTimeout(watch, state.root && document.body.contains(state.root) ? 1000 : 100);
}

function start() {
  watch();
  loop();
  setInterval(header.pollStatus, 3000);
  setInterval(refreshRecordings, 10000);
  document.addEventListener("visibilitychange", () => { state.dirty = true; });
  window.addEventListener("resize", () => { state.dirty = true; });     // the canvas follows Plotly's new size
}

// A module runs once per page, but an older copy of the page's script may already be running.
if (!window.batchscope) {
  window.batchscope = { store: state.store, view: state.view, handle: onMessage, showReplay, backToLive,
                        render: () => { state.dirty = true; }, normalise,
                        get mode() { return state.mode; }, get renderMs() { return state.renderCost; } };
  // Gradio 6 injects head scripts after `load` has fired: start at once then, or when the document is parsed.
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
}
