/* Compare and What-if on the page: the two views (compare_view.js, whatif_view.js) mounted in their collapsed
 * boxes under the charts (#bs-compare, #bs-whatif: app/ui/page.py), and the way from a compared bucket to the
 * Gantt.
 *
 * A bucket clicked shows the typical step of each side (its step of median time). The Gantt shows one timeline at
 * a time: a side whose recording is the one on screen ("live", "replay", or the named recording this page opened
 * as the replay) gets the Gantt on its step, marked (gantt.js draws state.marks) like a request picked in the
 * slowest list (tail.js): all charts on that window, frozen there like a zoom (a window button or a double-click
 * goes back). A side that is not on screen gets a button that puts it there first: back to live, the loaded
 * replay, or a named recording loaded as the replay (GET /api/timeline.json?recording=, POST /api/replay). */
import { api } from "./api.js";
import { mount as mountCompare } from "./compare_view.js";
import { backToLive, showReplay } from "./controls.js";
import { currentData, state } from "./feed.js";
import { findStep } from "./records.js";
import { revealGantt } from "./tail.js";
import { $, note } from "./util.js";
import { mount as mountWhatif } from "./whatif_view.js";

const STEPS_AROUND = 12;                   // the window shows about this many steps' time on each side of the step
const MIN_PAD_US = 3000;
const LOAD_TIMEOUT_MS = 60000;
export const MARK_COLOR = { base: "#64748b", new: "#2563eb" };

// The named recording this page loaded as the replay, and the timeline it became (so that it counts as on screen).
const opened = { name: null, tl: null };

function injectStyle() {
  if ($("bs-analysis-page-style")) return;
  const st = document.createElement("style");
  st.id = "bs-analysis-page-style";
  st.textContent = `
    #bs-analysis-block .bs-analysis-box { margin: 4px 0 6px; border: 1px solid rgba(100,116,139,.3);
      border-radius: 4px; padding: 4px 8px; }
    #bs-analysis-block .bs-analysis table { width: auto; margin: 2px 0; border: 0; font-size: 12px; font-variant-numeric: tabular-nums; }
    #bs-analysis-block .bs-analysis tr { border: 0; }
    #bs-analysis-block .bs-analysis th, #bs-analysis-block .bs-analysis td { padding: 2px 10px 2px 0; border: 0;
      border-bottom: 1px solid rgba(100,116,139,.2); background: transparent; line-height: 1.35; }
    #bs-analysis-block .bs-analysis tr.bs-chosen td { background: rgba(37,99,235,.12); }
    #bs-analysis-block .bs-analysis input, #bs-analysis-block .bs-analysis select { border: 1px solid #cbd5e1;
      border-radius: 3px; padding: 1px 4px; background: #fff; font-size: 12px; }
    #bs-analysis-block .bs-analysis ul { margin: 0; padding-left: 18px; }
    #bs-analysis-block .bs-analysis-box > summary { cursor: pointer; font-weight: 600; font-size: 13px; }
    #bs-analysis-block .bs-analysis-box > summary .bs-muted { font-weight: 400; opacity: .7; }
    #bs-analysis-block .bs-analysis-box[open] > summary { margin-bottom: 6px; }
    html.bs-present #bs-analysis-block { display: none !important; }`;
  document.head.append(st);
}

// Whether a compared recording is the timeline the Gantt shows now.
function onScreen(recording) {
  const v = state.view;
  if (recording === "live") return state.live && v.source === "live";
  if (v.source !== "replay") return false;
  if (recording === "replay") return true;      // the page shows no replay but the server's (controls.js posts it)
  return opened.name === recording && v.replay === opened.tl;
}

// The Gantt (and every chart: they share state.view) on step `step` of the timeline shown, the step marked.
export function jumpToStep(step, side) {
  const d = currentData();
  const s = findStep(d.steps, step);
  if (!s) {
    note(state.view.source === "live"
      ? `step #${step} is no longer in the live timeline: the ring keeps only the newest steps`
      : `step #${step} is not in the replay shown`, true);
    return false;
  }
  const i = d.steps.indexOf(s);
  const a = d.steps[Math.max(0, i - STEPS_AROUND)], z = d.steps[Math.min(d.steps.length - 1, i + STEPS_AROUND)];
  const lo = Math.min(s._s - MIN_PAD_US, a._s), hi = Math.max(s._e + MIN_PAD_US, z._e);
  state.marks = (state.marks || []).filter(m => m.side !== side && m.source === state.view.source)
    .concat([{ side, step, source: state.view.source, color: MARK_COLOR[side] || "#2563eb" }]);
  Object.assign(state.view, { follow: false, range: [lo, hi], zoomed: true });
  revealGantt();
  settle();
  state.dirty = true;
  return true;
}

// A source just switched (live, replay) changes what sits above the Gantt a moment later (the header and the
// toolbar follow it): while that settles, the Gantt's top lanes are brought back out from under the sticky header.
const SETTLE_MS = [150, 500, 1000, 1600];

function settle() {
  for (const ms of SETTLE_MS) setTimeout(() => {
    const g = $("bs-gantt"), head = $("bs-header");
    if (g && head && g.getBoundingClientRect().top < head.getBoundingClientRect().bottom) revealGantt();
  }, ms);
}

export function clearMarks() {
  if (!state.marks || !state.marks.length) return;
  state.marks = [];
  state.dirty = true;
}

// Puts a compared recording on screen: back to live, the loaded replay, or a named recording as the replay.
async function openRecording(recording) {
  if (recording === "live") { backToLive(); return; }
  if (recording === "replay") {
    const tl = await api("/api/replay.json", "GET", undefined, LOAD_TIMEOUT_MS);
    showReplay(tl, "replay");
    opened.name = opened.tl = null;
    return;
  }
  const tl = await api("/api/timeline.json?recording=" + encodeURIComponent(recording), "GET", undefined, LOAD_TIMEOUT_MS);
  const loaded = await api("/api/replay?name=" + encodeURIComponent(recording), "POST", tl, LOAD_TIMEOUT_MS);
  showReplay(tl, "recording " + recording, loaded && loaded.board);
  if (state.view.source === "replay") Object.assign(opened, { name: recording, tl: state.view.replay });
}

function button(id, text, title, onclick) {
  const b = document.createElement("button");
  Object.assign(b, { id, type: "button", textContent: text, title, className: "bs-btn" });
  b.addEventListener("click", onclick);
  return b;
}

// What each side's line of the typical steps offers: the step on the Gantt, or opening its recording first.
function sideAction(compare) {
  return (side, t) => {
    const here = onScreen(t.recording);
    const label = here ? "show on the Gantt"
      : t.recording === "live" ? "back to live" : t.recording === "replay" ? "show the replay" : "open this recording";
    const title = here ? `The Gantt on step #${t.step}, marked`
      : `Show ${t.recording === "live" ? "the live timeline" : t.recording} on the Gantt, then step #${t.step}`;
    return button(`bs-compare-open-${side}`, label, title, async ev => {
      const b = ev.currentTarget;
      b.disabled = true;
      try {
        if (!onScreen(t.recording)) await openRecording(t.recording);
        jumpToStep(t.step, side);
      } catch (e) {
        note(`cannot open ${t.recording}: ${e.message}`, true);
      } finally {
        b.disabled = false;
        compare.showTypical();                 // the buttons say what is on screen now
      }
    });
  };
}

// A bucket clicked: the on-screen sides on the Gantt (the new side's window when both are), the others a button.
function onBucket(b) {
  const t = b.typical || {};
  const here = ["new", "base"].filter(side => t[side] && onScreen(t[side].recording));
  clearMarks();
  for (const side of here.slice().reverse()) jumpToStep(t[side].step, side);   // the new side's window last: it stays
}

export function mountAnalysis() {
  const cmp = $("bs-compare"), wi = $("bs-whatif");
  if (!cmp && !wi) return;
  injectStyle();
  if (cmp && !cmp.dataset.mounted) {
    cmp.dataset.mounted = "1";
    const opts = { onBucket };
    const view = mountCompare(cmp, api, opts);
    opts.sideAction = sideAction(view);
    const box = cmp.closest("details");
    if (box) box.addEventListener("toggle", () => { if (box.open) view.refresh(); });
  }
  if (wi && !wi.dataset.mounted) {
    wi.dataset.mounted = "1";
    const view = mountWhatif(wi, api);
    const box = wi.closest("details");
    if (box) box.addEventListener("toggle", () => { if (box.open) view.refresh(); });
  }
}
