/* Words for what the records call by code names: idle causes (docs/timeline.md, "Idle causes"; the ones only an
 * imported profiler trace tells apart, docs/import.md, "Causes") and mode-switch markers. The records keep their
 * codes (firm names); people read these. */

const CAUSE_LABEL = {
  schedule: "host scheduling",
  fill: "host filling the batch",
  launch: "host launching",
  wait: "host waiting on the last step",
  update: "host updating requests",
  h2d: "input copy (H2D)",
  d2h: "output copy (D2H)",
  telemetry: "telemetry recording the last step",
  empty_queue: "no requests",
  host_other: "other host work",
  gc: "Python garbage collection",
  preempted: "host thread not running",
  // imported traces only
  host_sync: "host blocked mid-step",
  host_op: "host in another op",
  stream_wait: "waiting on another stream",
  copy: "other copy (D2D, peer)",
  collective: "collective (waiting on peers)",
  other_work: "other device work",
  unattributed: "launched outside the trace",
  none: "no cause recorded",
};

const CAUSE_HINT = {
  schedule: "the engine thread was choosing the next batch",
  fill: "the engine thread was writing the next batch's inputs",
  launch: "the engine thread was launching the step (or the launch had not reached the GPU yet)",
  wait: "the engine thread was waiting for the previous step's tokens",
  update: "the engine thread was handing out the previous step's tokens",
  h2d: "the step's inputs were still being copied to the GPU",
  d2h: "the previous step's tokens were still being copied back",
  telemetry: "telemetry was recording the previous step",
  empty_queue: "there was no request to run: not the loop's fault",
  host_other: "engine-thread time no span covers (loop bookkeeping)",
  gc: "Python's garbage collector held the interpreter: the engine thread could not run",
  preempted: "the engine thread had work but little CPU: another thread held the GIL, or the cores were busy",
  host_sync: "the host blocked in a CUDA call in the middle of the step (an .item(), a .cpu())",
  host_op: "the launching thread was in a recorded op that maps to no engine phase",
  stream_wait: "the device waited on an event of another stream",
  copy: "a device-to-device or peer copy ran while no kernel did",
  collective: "a collective (NCCL/RCCL) kernel of no step ran: busy, but waiting for its peers",
  other_work: "kernels of no step ran (another thread's, or launched before the window)",
  unattributed: "the op that ended the gap has no launching call in the trace",
  none: "",
};

export function causeLabel(cause) {
  return CAUSE_LABEL[cause || "none"] || String(cause).replace(/_/g, " ");
}

export function causeHint(cause) {
  return CAUSE_HINT[cause || "none"] || "";
}

// "→ sync at step 174": the step is the first one the new loop ran; a switch made by an A/B says so.
export function switchLabel(change) {
  const at = change.step !== undefined && change.step !== null ? " at step " + change.step : "";
  return "→ " + change.to + at + (change.reason ? " (" + shortReason(change.reason) + ")" : "");
}

// "A/B ab-3f2: sync half" -> "A/B sync half": the run id says nothing to a room.
function shortReason(reason) {
  return String(reason).replace(/^A\/B [\w-]+: /, "A/B ");
}

// Several switches too close to label each: one label for all of them.
export function switchesLabel(changes) {
  const a = changes[0].step, b = changes[changes.length - 1].step;
  const steps = a !== undefined && b !== undefined ? ` (steps ${a}–${b})` : "";
  const ab = changes.some(c => c.reason && /^A\/B/.test(c.reason)) ? " · A/B" : "";
  return `${changes.length} switches${steps}${ab}`;
}
