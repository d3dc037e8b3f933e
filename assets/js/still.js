/* Gradio's page kept still while nothing runs: no animation frames for a status tracker that is gone.
 *
 * Gradio 6's status tracker (the box that shows a component's progress) runs a requestAnimationFrame loop while
 * its status is "pending", to count the seconds, and stops it when it hears the status change. The app's own
 * loading tracker, shown while the page starts, is taken off the page in the same update that ends the loading,
 * so it never hears it: its loop runs on for the life of the tab, 60 animation frames a second that draw
 * nothing, each one work for the page's main thread and its compositor. On an idle tab that was most of the
 * renderer's CPU. Any tracker removed while pending (a tab switched away during a run) does the same.
 *
 * Nothing outside the tracker can reach that loop, but each turn of it calls performance.now() straight from
 * the animation frame. So every few seconds, while no tracker on the page shows progress, performance.now()
 * throws for exactly that caller, for one frame: a function of Gradio's statustracker module called by the
 * browser itself, nothing else on the stack. The throw ends that turn before it asks for the next frame, and its
 * error event is cancelled, so nothing reports it. Everyone else gets the time as usual. A tracker still in use
 * but hidden (show_progress="hidden") loses its loop too: it stops counting seconds nobody sees, and counts
 * again from its next run. */

const EVERY_MS = 2000;
const MAX_ARMED_MS = 100;                 // a hidden tab runs no frame: give up waiting for one
const STOP = new Error("batchscope: stopped the animation loop of a Gradio status tracker that is gone");
const FRAME = /:\d+:\d+\)?$/;                            // a stack line that names a place in a script
const TRACKER = /\/statustracker-[^/]*\.js:\d+:\d+\)?$/;   // ... in Gradio's statustracker module

export const still = { checks: 0, stopped: 0 };   // for tests and the curious (window.batchscope.still)

let armed = false;

// A turn of a tracker's loop: performance.now() called from the tracker's module by the browser directly.
function trackerTurn() {
  const frames = (new Error().stack || "").split("\n").filter(line => FRAME.test(line));
  return frames.length === 3 && TRACKER.test(frames[2]);   // this function, now(), and the turn: nothing else
}

function now() {
  if (trackerTurn()) { still.stopped++; throw STOP; }
  return Performance.prototype.now.call(performance);
}

function disarm() {
  if (!armed) return;
  armed = false;
  delete performance.now;                 // the prototype's own again
}

// Some progress is on screen: leave every loop alone (a live counter must keep counting).
const progressShown = () => !!document.querySelector('[data-testid="status-tracker"]:not(.hide)');

function check() {
  if (armed || document.hidden || progressShown()) return;
  still.checks++;
  armed = true;
  // for the next frame: a loop asked for it during the last one, before us, so its turn comes before disarm
  performance.now = now;
  requestAnimationFrame(disarm);
  setTimeout(disarm, MAX_ARMED_MS);
}

export function keepStill() {
  window.addEventListener("error", e => {
    if (e.error === STOP) { e.preventDefault(); e.stopImmediatePropagation(); }
  }, true);
  check();
  setInterval(check, EVERY_MS);
}
