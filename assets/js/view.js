/* What Pause and the window buttons do to the view.
 *
 * Pause freezes the window on what is on screen until Resume, and a window button changes the width of a
 * paused window around its right edge instead of going back to live. A zoom (drag on a chart) freezes the
 * window too without pausing: a window button then goes back to live, and a double-click always does
 * (plot.js). controls.js builds the buttons; these are their only handlers. */
import { syncControls } from "./controls.js";
import { currentData, currentRange, replayRange, state } from "./feed.js";
import { $ } from "./util.js";

export function bindViewControls(root) {
  const pause = $("bs-pause");
  if (pause) pause.onclick = togglePause;
  for (const b of root.querySelectorAll("#bs-window button")) b.onclick = () => setSpan(b.dataset.span);
}

function changed() {
  syncControls();
  state.dirty = true;                      // wakes the redraw at once (redraw.js)
}

export function togglePause() {
  const view = state.view;
  if (view.source !== "live") return;
  if (view.follow) {
    // freeze exactly what is on screen: no jump. A picture still being drawn in slices was planned for a newer
    // window than the Gantt shows; `changed` drops the rest of it
    view.range = (state.ganttRange || state.shownRange || currentRange(currentData())).slice();
    view.follow = false;
    view.paused = true;
  } else {
    Object.assign(view, { follow: true, range: null, paused: false });
  }
  changed();
}

export function setSpan(value) {
  const view = state.view;
  view.zoomed = false;
  view.span = value === "all" ? Infinity : Number(value) * 1e6;
  if (view.source === "replay") {
    view.range = replayRange();
  } else if (view.paused && view.range) {
    const end = view.range[1], d = currentData();
    const start = d.steps.length ? d.steps[0]._s : end - 10e6;
    view.range = [view.span === Infinity ? Math.min(start, end - 1e6) : end - view.span, end];
  } else {
    Object.assign(view, { follow: true, range: null });
  }
  changed();
}
