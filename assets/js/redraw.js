/* When to draw a picture, and drawing it in slices so that the page never stalls.
 *
 * A picture is the Gantt and the charts (those charts.js registers) for one snapshot: the data and the window [lo, hi]. Plotly needs
 * about 10 ms a chart on a small machine, so a picture is drawn as a queue of tasks (the Gantt's ink, the other
 * tensor-parallel ranks' ink if any, the Gantt, the charts' shared numbers, then one task per chart), each in its
 * own turn of the event loop: input, Pause and painting get in between. All tasks of a picture draw the same
 * snapshot, so the charts always agree on the window.
 *
 * Pictures come when asked (state.dirty: a click, a zoom, a replay) and, when following live, at a pace set by
 * their cost: with new steps every max(MIN_PERIOD_MS, cost / CPU_SHARE), and with none (an idle engine) every
 * max(IDLE_PERIOD_MS, cost / IDLE_CPU_SHARE), only to slide the window, until no step is left in it: an
 * empty window waits for the next step. A frozen window is drawn again only when asked. Charts out of sight
 * are skipped and drawn when they come back; a chart of per-step values whose steps have not changed only has
 * its axis moved. */
import { CHARTS, chartContext, drawChart, isPerStep } from "./charts.js";
import { currentData, currentRange, onDirty, state } from "./feed.js";
import { stepsIn } from "./slices.js";
import { tensorParallel } from "./tensor_parallel.js";
import { prepareGantt, prepareRanks, showGantt } from "./gantt.js";
import { moveRange, presentHeight, textScale } from "./plot.js";
import { $ } from "./util.js";

const MIN_PERIOD_MS = 250;
const CPU_SHARE = 0.12;                    // under load, pictures take at most an eighth of a core of the page's
                                           // own work (the renderer spends about as much again around it)
const IDLE_PERIOD_MS = 4000;
const IDLE_CPU_SHARE = 0.01;               // an idle engine's window slides for at most 1% of a core

// What drawing costs, for tests and the curious: window.batchscope.perf.
export const perf = {
  pictures: 0,                             // pictures finished
  tasks: [],                               // the last 200 tasks' durations, ms
  maxTaskMs: 0,                            // the longest task since the last reset()
  pictureMs: 0,                            // the last picture's work, all tasks together, ms
  pictureCostMs: 30,                       // the same, smoothed: it sets the live pace
  maxById: {},                             // the longest task of each kind since the last reset(), ms
  reset() { this.tasks = []; this.maxTaskMs = 0; this.pictures = 0; this.maxById = {}; },
  get drawing() { return job !== null; },  // a picture is being drawn now
  get inSight() { return [...visible]; },  // the charts drawn (the others wait until they scroll into sight)
};

const timing = { timer: null, at: Infinity, lastStart: -Infinity, lastStepGen: -1, lastEmpty: false };
let job = null;                            // the picture being drawn: { snap, queue, work, full }
const shown = new Map();                   // element id -> what it shows: { key, lo, hi, steps, width }
const visible = new Set(CHARTS);           // charts on screen (IntersectionObserver)
const stale = new Set();                   // charts skipped while out of sight
const replayIds = new WeakMap();
let onPicture = () => {};

export function startRedraw(pictureDone) {
  onPicture = pictureDone || onPicture;
  onDirty(() => schedule(0));
  tick();
}

// Watch the charts' visibility (again after Gradio re-renders the block: the charts are new elements then).
let observer = null;
export function observeCharts() {
  if (!window.IntersectionObserver) return;
  if (observer) observer.disconnect();
  observer = new IntersectionObserver(entries => {
    for (const e of entries) {
      if (e.target !== $(e.target.id)) continue;         // a chart of a block Gradio has since replaced
      if (e.isIntersecting) visible.add(e.target.id); else visible.delete(e.target.id);
      if (e.isIntersecting && stale.has(e.target.id)) schedule(0);
    }
  }, { rootMargin: "120px" });
  for (const id of CHARTS) { const el = $(id); if (el) observer.observe(el); }
}

function schedule(ms) {
  const at = performance.now() + ms;
  if (timing.timer !== null && at >= timing.at) return;
  clearTimeout(timing.timer);
  timing.at = at;
  timing.timer = setTimeout(tick, ms);
}

// How long until the next picture is due (0: now, Infinity: when asked).
function due() {
  const root = state.root;
  if (!root || !document.body.contains(root) || !window.Plotly) return 100;
  if (document.hidden) return Infinity;    // visibilitychange asks for a picture on return
  if (state.dirty) return 0;
  const view = state.view, since = performance.now() - timing.lastStart, cost = perf.pictureCostMs;
  // charts skipped out of sight and back in it (the Sweep tab's results closed above them, a scroll) are drawn at
  // once, live too: until then they would show the window they last had, not the Gantt's
  if ([...stale].some(id => visible.has(id) && $(id))) return 0;
  if (view.source === "live" && view.follow) {
    if (state.stepGen !== timing.lastStepGen) return Math.max(0, Math.max(MIN_PERIOD_MS, cost / CPU_SHARE) - since);
    if (timing.lastEmpty && windowEmpty()) return Infinity;   // nothing shown, nothing new: a still picture
    return Math.max(0, Math.max(IDLE_PERIOD_MS, cost / IDLE_CPU_SHARE) - since);
  }
  return Infinity;
}

// The live window, slid to now, would hold no step.
function windowEmpty() {
  const d = currentData(), last = d.steps[d.steps.length - 1];
  return !last || last._e < currentRange(d)[0];
}

function tick() {
  timing.timer = null; timing.at = Infinity;
  if (state.dirty) job = null;             // asked for a new picture: the rest of the old one is moot
  if (!job) {
    const wait = due();
    if (wait > 0) { if (wait !== Infinity) schedule(wait); return; }
    job = plan();
  }
  runTask();
}

// Which data a picture shows: the live store (its steps by generation), or one replayed timeline.
function dataId(d) {
  if (state.view.source !== "replay") return "live";
  if (!replayIds.has(d)) replayIds.set(d, "replay" + replayIds.size + ":" + Math.random());
  return replayIds.get(d);
}

// A snapshot of what to draw, and the queue of tasks that draw it.
function plan() {
  const full = state.dirty || (state.view.source === "live" && state.view.follow) || !state.shownRange;
  state.dirty = false;
  const d = currentData();
  const [lo, hi] = full ? currentRange(d) : state.shownRange;
  if (full) {
    state.shownRange = [lo, hi];
    timing.lastStart = performance.now();
    timing.lastStepGen = state.stepGen;
  }
  const id = dataId(d);
  // (live data keeps arriving while a picture is drawn: `total` is the count the picture was planned with)
  // (the request picked in the slowest list, and a compared bucket's typical steps (analysis.js), are drawn on the
  // Gantt: picking or clearing one is a new picture)
  const focus = (state.focus ? state.focus.id : "") + (state.marks || []).map(m => `|${m.side}${m.step}`).join("");
  const snap = { d, lo, hi, data: id, key: `${id}|${state.gen}|${lo}|${hi}|${textScale()}|${presentHeight("gantt")}|${focus}`, stepGen: state.stepGen,
                 total: d.steps.length, switches: d.mode_changes.length, nvml: d.nvml.length, gantt: null, ctx: null };
  // (the other tensor-parallel ranks' ink is a task of its own: as much work again per rank)
  const ranks = full && tensorParallel(d).ranks.length > 0;
  const queue = full ? ["gantt-ink"].concat(ranks ? ["gantt-ranks"] : [], ["bs-gantt", "charts"]) : ["charts"];
  for (const c of full ? CHARTS : [...stale]) {
    if (visible.has(c)) queue.push(c);
    else stale.add(c);                     // drawn when it scrolls into sight
  }
  return { snap, queue, work: 0, full };
}

function runTask() {
  const t0 = performance.now(), task = job.queue.shift();
  if (task) {
    try { runOne(task, job.snap); } catch (e) { console.error("batchscope render " + task, e); }
  }
  const ms = performance.now() - t0;
  job.work += ms;
  perf.tasks.push(ms);
  if (perf.tasks.length > 200) perf.tasks.shift();
  perf.maxTaskMs = Math.max(perf.maxTaskMs, ms);
  if (task) perf.maxById[task] = Math.max(perf.maxById[task] || 0, ms);
  if (job.queue.length) { schedule(0); return; }
  if (job.full) {
    const last = job.snap.d.steps[job.snap.d.steps.length - 1];
    timing.lastEmpty = !last || last._e < job.snap.lo;
    perf.pictures++;
    perf.pictureMs = job.work;
    perf.pictureCostMs = 0.7 * perf.pictureCostMs + 0.3 * job.work;
    onPicture(job.snap);
  }
  job = null;
  const wait = due();
  if (wait !== Infinity) schedule(wait);
}

function runOne(task, snap) {
  if (task === "gantt-ink") {
    if (!unchanged("bs-gantt", snap)) snap.gantt = prepareGantt(snap.d, stepsIn(snap.d.steps, snap.lo, snap.hi), snap.lo, snap.hi);
    return;
  }
  if (task === "gantt-ranks") { prepareRanks(snap.gantt); return; }
  if (task === "charts") {
    if (job.queue.some(c => !unchanged(c, snap))) snap.ctx = chartContext(snap.d, snap.lo, snap.hi).prepare();
    return;
  }
  const el = $(task);
  if (!el) return;
  stale.delete(task);
  if (unchanged(task, snap)) return;
  if (task === "bs-gantt") { if (snap.gantt) { showGantt(snap.gantt); state.ganttRange = [snap.lo, snap.hi]; } }
  else if (movable(task, snap, el)) moveRange(el, snap.lo, snap.hi);
  else drawChart(task, snap.ctx || (snap.ctx = chartContext(snap.d, snap.lo, snap.hi)));
  shown.set(task, { key: snap.key, data: snap.data, lo: snap.lo, hi: snap.hi, stepGen: snap.stepGen, width: el.clientWidth,
                    scale: textScale() });
}

// Nothing this element shows has changed: same data, same window, same size.
function unchanged(id, snap) {
  const el = $(id), s = shown.get(id);
  return !!(el && el.layout && s && s.key === snap.key && s.width === el.clientWidth);
}

// A chart of per-step values whose steps have not changed, slid to the right: the points it holds already
// cover the new window (its window held the newest step, so there is no step past it), so only its axis needs
// to move. A jump right from an older window (a slowest request, a CDF point) is drawn afresh.
function movable(id, snap, el) {
  const s = shown.get(id), steps = snap.d.steps, last = steps[steps.length - 1];
  return isPerStep(id) && snap.data === "live" && !!el.layout && !!s && s.stepGen === snap.stepGen &&
    s.width === el.clientWidth && s.scale === textScale() && snap.lo >= s.lo && snap.hi >= s.hi &&
    (!last || last._s <= s.hi);
}
