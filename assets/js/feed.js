/* What the page knows, in one state object: the live telemetry from the websocket, the timeline being
 * replayed, what the view shows, and the page's own flags. Every other module reads and changes this object;
 * none keeps state of its own about the data.
 *
 * Live and replayed data have one shape, so the same render code draws them:
 *   {steps: [...], nvml: [...], requests: [...], mode_changes: [...], meta: {...}, rankSteps: {rank: [...]}}
 * Times are microseconds since the recording start. Under tensor parallelism rank 0's steps are `steps` (it
 * plans them and owns telemetry); the other ranks' GPU spans come as "rank step" records, kept per rank in
 * `rankSteps` (rank -> records ordered by step), each array bounded like `steps`.
 */
import { api, socket } from "./api.js";
import { addRankRecords, prep } from "./records.js";
import { fmt, setText } from "./util.js";

const KEEP_US = 180e6;                      // live history kept in the browser (the server keeps the recording)
const KEEP_STEPS = 60000;
const LIVE_SPAN_US = 10e6;                  // the window width a live view starts with
const KEEP_REQUESTS = 2000;                 // the newest request records, live
const LATENCY_WINDOW_US = 10e6;             // the header's TTFT covers first tokens this recent

function emptyStore() {
  // requests: id -> the request's latest record, oldest first (a Map keeps insertion order)
  // running: the engine's requests in flight at the last "stats" (null before one): while any run, the live edge
  // is the newest completed step, not the server's clock (the step in flight is not reported yet)
  return { steps: [], nvml: [], requests: new Map(), mode_changes: [], meta: {}, lastStep: -1, lastT: 0, lastTAt: 0,
           rankSteps: {}, gpus: 1, running: null, history: null };
}

const redrawFlags = { dirty: true, wake: () => {} };

// The redraw scheduler registers how to wake it: when a picture is asked for, and when data arrives (it then
// works out itself when the next picture is due).
export function onDirty(wake) { redrawFlags.wake = wake; }

export const state = {
  store: emptyStore(),                      // live data, fed by the websocket
  view: {
    source: "live",                         // "live" | "replay"
    replay: null,                           // a normalised timeline when source is "replay"
    replayName: "",
    replayBoard: null,                      // the replay's scoreboard, as the server computed it
    follow: true,                           // live: the window slides with the newest data
    span: LIVE_SPAN_US,                     // window width, µs (Infinity = everything)
    range: null,                            // [lo, hi] µs when not following
    paused: false,                          // live: frozen by the Pause button (a zoom freezes without pausing)
    zoomed: false,                          // a drag on a chart or the switch view set the range, not a window button
  },
  root: null,                               // #bs-scope
  live: true,                               // false on a replay-only server (no engine)
  mode: null,                               // the engine's mode, as last heard
  recording: null,                          // the name of the recording running, if any
  board: null,                              // the server's live scoreboard (telemetry/figures.py board)
  boardGen: 0,                              // bumped when a board arrives (live) or a replay's is shown
  // Setting `dirty` asks for a new picture at once (redraw.js wakes on it): user actions set it.
  get dirty() { return redrawFlags.dirty; },
  set dirty(v) { redrawFlags.dirty = !!v; if (v) redrawFlags.wake(); },
  gen: 0,                                   // bumped when drawn data (steps, NVML, switches) arrives
  stepGen: 0,                               // bumped when steps or switches arrive (NVML alone does not)
  dropped: 0,                               // frames the server dropped for this viewer
  shownRange: null,                         // the [lo, hi] of the last picture planned (it draws in slices)
  ganttRange: null,                         // the [lo, hi] the Gantt on screen shows
  focus: null,                              // the request picked in the slowest list: its waits (tail.js)
  renders: 0,
  renderCost: 20,                           // ms per picture, smoothed: the redraw period follows it
};

// ---------------------------------------------------------------- the live store

function seen(t) {
  const store = state.store;
  if (t > store.lastT) { store.lastT = t; store.lastTAt = performance.now(); }
}

function addSteps(list) {
  const store = state.store;
  for (const r of list || []) {
    if (!r || typeof r.step !== "number") continue;
    if (r.step <= store.lastStep) continue;   // already have it (hello's recent overlaps the stream)
    store.lastStep = r.step;
    store.steps.push(prep(r));
    seen(r._e);
  }
  trim();
}

function addRankSteps(list) {
  const store = state.store;
  if (!addRankRecords(store.rankSteps, list)) return false;
  trimRanks();
  return true;
}

// The sample the header reads: rank 0's (a multi-GPU tick brings one sample per GPU; only rank 0's carries the
// host CPU fields), or the only one.
export const headSample = s => !s.rank;

function addNvml(list) {
  let last = null;
  for (const s of list || []) {
    if (!s || typeof s.t_us !== "number") continue;
    state.store.nvml.push(s);
    seen(s.t_us);
    if (typeof s.gpu === "number" && s.gpu + 1 > state.store.gpus) state.store.gpus = s.gpu + 1;
    if (headSample(s)) last = s;
  }
  // the header's reading twice a second: samples come up to 20 times a second, each a relayout of the header
  if (last && performance.now() - (addNvml.shownAt || 0) > 500) {
    addNvml.shownAt = performance.now();
    const v = last.gpu_util !== null && last.gpu_util !== undefined ? last.gpu_util : last.cpu_pct;
    setText("bs-st-nvml", fmt(v) + "%");
  }
  trim();
}

// "requests" messages carry a request each time its state changes (pending, decoding, finished): keep the
// latest of each, the newest KEEP_REQUESTS of them.
function addRequests(list) {
  const byId = state.store.requests;
  for (const r of list || []) {
    if (!r || typeof r.id !== "string") continue;
    byId.delete(r.id);                      // re-inserted: the Map stays ordered by the latest update
    byId.set(r.id, r);
  }
  for (const id of byId.keys()) {
    if (byId.size <= KEEP_REQUESTS) break;
    byId.delete(id);
  }
}

// The median time to first token of the requests whose first token came in the last LATENCY_WINDOW_US.
export function recentLatency() {
  const since = state.store.lastT - LATENCY_WINDOW_US;
  const ttft = [];
  for (const r of state.store.requests.values()) {
    if (r.first_token_us !== null && r.first_token_us >= since) ttft.push(r.first_token_us - r.arrival_us);
  }
  ttft.sort((a, b) => a - b);
  const mid = ttft.length >> 1;
  const median = !ttft.length ? null : ttft.length % 2 ? ttft[mid] : (ttft[mid - 1] + ttft[mid]) / 2;
  return { ttftMs: median === null ? null : median / 1000, requests: ttft.length, windowS: LATENCY_WINDOW_US / 1e6 };
}

function addModeChange(m) {
  if (!m || typeof m.t_us !== "number") return;
  const changes = state.store.mode_changes;
  const dup = changes.some(x => x.t_us === m.t_us && x.to === m.to);
  if (!dup) changes.push({ t_us: m.t_us, step: m.step, from: m.from, to: m.to, reason: m.reason });
  if (dup === false && changes.length > 1 && m.t_us < changes[changes.length - 2].t_us) changes.sort((a, b) => a.t_us - b.t_us);
}

// What the server kept from before this viewer joined (GET /api/history): older records go in front of the
// store's, those it has already are skipped, so the windows hold what the server kept, not only what this tab saw.
function addHistory(h) {
  const store = state.store;
  const first = store.steps.length ? store.steps[0].step : Infinity;
  const older = (h.steps || []).filter(r => r && typeof r.step === "number" && r.step < first).map(prep);
  if (older.length) {
    older.sort((a, b) => a.step - b.step);
    store.steps = older.concat(store.steps);
    if (store.lastStep < older[older.length - 1].step) store.lastStep = older[older.length - 1].step;
  }
  const t0 = store.nvml.length ? store.nvml[0].t_us : Infinity;
  const nv = (h.nvml || []).filter(s => s && s.t_us < t0);
  if (nv.length) store.nvml = nv.concat(store.nvml);
  for (const c of h.mode_changes || []) addModeChange(c);
  const known = store.requests;
  const add = (h.requests || []).filter(r => r && typeof r.id === "string" && !known.has(r.id));
  if (add.length) store.requests = new Map([...add.map(r => [r.id, r]), ...known]);
  addRankRecords(store.rankSteps, h.rank_steps);
  store.history = { since_us: h.since_us, kept: h.kept };
  trim();
}

// After (re)connecting: ask once for what the server kept before, and merge it.
async function fetchHistory() {
  try {
    addHistory(await api("/api/history?seconds=" + KEEP_US / 1e6, "GET", undefined, 30000));
    state.stepGen++; state.gen++; state.dirty = true;
  } catch (e) { /* the live stream alone still draws */ }
}

// Bounded history: cut in chunks so that a long session does not shift arrays on every message.
function trim() {
  const store = state.store;
  const cut = store.lastT - KEEP_US;
  if (store.steps.length > KEEP_STEPS * 1.2 || (store.steps.length && store.steps[0]._e < cut - 30e6)) {
    let i = 0;
    while (i < store.steps.length && (store.steps[i]._e < cut || store.steps.length - i > KEEP_STEPS)) i++;
    store.steps.splice(0, i);
  }
  // one sample per GPU per tick on a tensor-parallel engine: the same history holds as many more
  const gpus = Math.max(1, store.gpus);
  if (store.nvml.length > 20000 * gpus) store.nvml.splice(0, store.nvml.length - 15000 * gpus);
}

// The other ranks' records: the same bounds as rank 0's steps, each rank on its own.
function trimRanks() {
  const store = state.store;
  const cut = store.lastT - KEEP_US;
  for (const k in store.rankSteps) {
    const arr = store.rankSteps[k];
    if (arr.length > KEEP_STEPS * 1.2 || (arr.length && arr[0]._e < cut - 30e6)) {
      let i = 0;
      while (i < arr.length && (arr[i]._e < cut || arr.length - i > KEEP_STEPS)) i++;
      arr.splice(0, i);
    }
  }
}

// One websocket message. `header` shows what the message says about the engine (status, stats, mode).
export function handle(m, header) {
  const store = state.store;
  switch (m.type) {
    case "hello": {
      // A (re)connect starts a fresh picture: the server sends what it has kept recently.
      const keepMeta = store.meta;
      Object.assign(store, emptyStore());
      store.meta = Object.assign({}, keepMeta, m);
      delete store.meta.recent;             // the records live in the store, not twice
      const recent = m.recent || {};
      addSteps(recent.steps);
      addRankSteps(recent.rank_steps);
      addNvml(recent.nvml);
      addRequests(recent.requests);
      for (const c of recent.mode_changes || []) addModeChange(c);
      if (typeof m.t_us === "number") seen(m.t_us);
      header.showStatus(m);
      header.showRequests(recentLatency());
      if (m.mode) header.setMode(m.mode);
      if (m.board) { state.board = m.board; state.boardGen++; }
      state.stepGen++; state.gen++;
      state.dirty = true;                   // a fresh store: draw it now
      fetchHistory();
      break;
    }
    case "board": state.board = m; state.boardGen++; break;
    case "steps": addSteps(m.steps); state.stepGen++; state.gen++; redrawFlags.wake(); break;
    // the other ranks' spans of steps already drawn: step data too (the last ones come after the last step)
    case "rank_steps": if (addRankSteps(m.rank_steps)) { state.stepGen++; state.gen++; redrawFlags.wake(); } break;
    case "nvml": addNvml(m.samples); state.gen++; break;       // NVML alone never hurries a picture
    case "requests": addRequests(m.requests); break;
    case "mode":
      addModeChange(m);
      if (typeof m.t_us === "number") seen(m.t_us);
      if (m.to) header.setMode(m.to);
      state.stepGen++; state.gen++; redrawFlags.wake();
      break;
    case "stats":
      if (typeof m.t_us === "number") seen(m.t_us);
      if (typeof m.running === "number") store.running = m.running;
      header.showStats(m);
      header.showRequests(recentLatency());      // a few times a second: the window slides on
      break;
    case "dropped":                     // this viewer fell behind: the server skipped it to the newest frames
      state.dropped += m.frames;
      setText("bs-dropped", state.dropped + " frames dropped (slow link)");
      break;
    case "catch_up": {                  // after "dropped": what the skipped frames held that the picture needs
      addSteps(m.steps);                // the newest steps; those of m.gap are not drawn
      addRankSteps(m.rank_steps);
      const last = store.nvml.length ? store.nvml[store.nvml.length - 1].t_us : -Infinity;
      addNvml((m.nvml || []).filter(s => s && s.t_us > last));
      addRequests(m.requests);          // finished since, and running: the latest state of each
      for (const c of m.mode_changes || []) addModeChange(c);
      if (typeof m.t_us === "number") seen(m.t_us);
      header.showRequests(recentLatency());
      state.stepGen++; state.gen++; redrawFlags.wake();
      break;
    }
  }
  // Live data does not ask for a picture by itself: the redraw scheduler paces pictures by their cost
  // (redraw.js), and the header and counters above are updated as the messages come.
}

// ---------------------------------------------------------------- what to draw

// The scoreboard of what is on screen: the live one, or the replay's (controls.js keeps it with the replay).
export function shownBoard() {
  return state.view.source === "replay" ? state.view.replayBoard : state.board;
}

export function currentData() {
  const { view, store } = state;
  if (view.source === "replay" && view.replay) return view.replay;
  return { steps: store.steps, nvml: store.nvml, mode_changes: store.mode_changes,
           requests: Array.from(store.requests.values()), meta: store.meta, rankSteps: store.rankSteps };
}

// The live "now" on the server's clock (µs), for the sliding window.
export function liveNow() {
  const store = state.store;
  if (!store.lastTAt) return store.lastT;
  // extrapolate the server clock between messages (bounded, so a dead link freezes the picture)
  const ahead = Math.min((performance.now() - store.lastTAt) * 1000, 3e6);
  return store.lastT + (socket.open ? ahead : 0);
}

export function currentRange(d) {
  const view = state.view;
  if (!view.follow && view.range) return view.range;
  const hi = Math.max(liveNow(), 1e6);
  if (view.span === Infinity) {
    const lo = d.steps.length ? Math.min(d.steps[0]._s, d.nvml.length ? d.nvml[0].t_us : Infinity) : 0;
    return [lo, hi];
  }
  return [hi - view.span, hi];
}


// Where there is data: the first step's start to the last step's end, or to the server's clock when live
// (an idle engine is data too: 0% busy, not a gap).
export function dataExtent(d) {
  if (!d.steps.length) return [Infinity, -Infinity];
  const end = state.view.source === "live" ? Math.max(state.store.lastT, d.steps[d.steps.length - 1]._e)
    : d.steps[d.steps.length - 1]._e;
  return [d.steps[0]._s, end];
}

// The steps' extent (NVML keeps sampling while the engine idles; that tail would squeeze the steps).
function replayExtent() {
  const d = state.view.replay;
  let lo = Infinity, hi = -Infinity;
  for (const s of d.steps) { if (s._s < lo) lo = s._s; if (s._e > hi) hi = s._e; }
  if (!isFinite(lo)) for (const s of d.nvml) { if (s.t_us < lo) lo = s.t_us; if (s.t_us > hi) hi = s.t_us; }
  if (!isFinite(lo)) return [0, 1e6];
  const pad = Math.max((hi - lo) * 0.01, 1000);
  return [lo - pad, hi + pad];
}

export function replayRange() {
  const [lo, hi] = replayExtent();
  const span = state.view.span;
  return span === Infinity ? [lo, hi] : [Math.max(lo, hi - span), hi];
}

// Back to the live window as a fresh page starts it.
export function followLive() {
  Object.assign(state.view, { source: "live", replay: null, replayBoard: null, follow: true, range: null, span: LIVE_SPAN_US,
                              paused: false, zoomed: false });
  state.boardGen++;
}
