/* The step records of a timeline, live or replayed: each step's extent and compute span cached on it (prep), the
 * other ranks' records kept per rank in step order, a step found by its number, and a timeline read into the
 * shape the page draws (normalise; feed.js describes it). */

export function span(rec, group, key) {
  const g = rec[group];
  const s = g && g[key];
  return s && s.length === 2 && s[0] !== null && s[1] !== null ? s : null;
}

// Cache each step's extent and the instant its GPU work began (where an idle gap ends).
export function prep(r) {
  let s = Infinity, e = -Infinity;
  for (const group of ["cpu", "gpu"]) {
    const g = r[group];
    if (!g) continue;
    for (const k in g) {
      const v = g[k];
      if (!v || v[0] === null || v[0] === undefined) continue;
      if (v[0] < s) s = v[0];
      if (v[1] > e) e = v[1];
    }
  }
  r._s = isFinite(s) ? s : (r.t_us || 0);
  r._e = isFinite(e) ? e : r._s;
  // The compute span: CUDA events on a GPU; on CPU telemetry gives the host launch span instead
  // (compute_basis "host"), since the forward runs inside launch there.
  const ev = span(r, "gpu", "compute");
  const cu = Array.isArray(r.compute_us) && r.compute_us[0] !== null && r.compute_basis !== "none" ? r.compute_us : null;
  r._cs = ev || cu;
  r._hostCompute = !ev && !!cu && r.compute_basis === "host";
  r._c = r._cs ? r._cs[0] : r._s;
  r._tok = r.tokens_out ?? (r.decode_tokens || 0);     // tokens_out is optional in batchscope.timeline/1
  return r;
}

// The same for another rank's part of a step: its GPU spans only (the host spans and counts are rank 0's).
function prepRank(r) {
  let s = Infinity, e = -Infinity;
  const g = r.gpu;
  if (g) for (const k in g) {
    const v = g[k];
    if (!v || v[0] === null || v[0] === undefined || v[1] === null || v[1] === undefined) continue;
    if (v[0] < s) s = v[0];
    if (v[1] > e) e = v[1];
  }
  const cu = Array.isArray(r.compute_us) && r.compute_us[0] !== null && r.compute_us[1] !== null ? r.compute_us : null;
  r._cs = span(r, "gpu", "compute") || cu;
  if (r._cs) { if (r._cs[0] < s) s = r._cs[0]; if (r._cs[1] > e) e = r._cs[1]; }
  r._s = isFinite(s) ? s : 0;
  r._e = isFinite(e) ? e : r._s;
  r._c = r._cs ? r._cs[0] : r._s;
  return r;
}

const isRankStep = r => r && typeof r === "object" && typeof r.step === "number" && typeof r.rank === "number" && r.rank >= 1;

// Index of the first record of `arr` (ordered by step) whose step is >= step.
function stepIndex(arr, step) {
  let a = 0, b = arr.length;
  while (a < b) { const mid = (a + b) >> 1; if (arr[mid].step < step) a = mid + 1; else b = mid; }
  return a;
}

// The record of step number `step` in `arr` (ordered by step), or null.
export function findStep(arr, step) {
  const i = stepIndex(arr, step);
  return arr && i < arr.length && arr[i].step === step ? arr[i] : null;
}

// Adds rank step records to byRank (rank -> records ordered by step), skipping those it has. Records of one
// rank come in order, so this is an append; a late or repeated one (hello's recent overlaps the stream) is
// found by binary search. Returns the number added.
export function addRankRecords(byRank, list) {
  let n = 0;
  for (const r of list || []) {
    if (!isRankStep(r)) continue;
    const arr = byRank[r.rank] || (byRank[r.rank] = []);
    const last = arr[arr.length - 1];
    if (!last || r.step > last.step) { arr.push(prepRank(r)); n++; continue; }
    const i = stepIndex(arr, r.step);
    if (i < arr.length && arr[i].step === r.step) continue;
    arr.splice(i, 0, prepRank(r)); n++;
  }
  return n;
}

function rankStepsOf(list) {
  const byRank = {};
  addRankRecords(byRank, list);
  return byRank;
}

export function normalise(obj) {
  if (!obj || typeof obj !== "object") throw new Error("not a JSON object");
  if (!Array.isArray(obj.steps)) throw new Error("no \"steps\" array: is this a batchscope timeline?");
  const steps = obj.steps.filter(s => s && typeof s === "object").map(prep);
  steps.sort((a, b) => a.step - b.step);
  return {
    steps,
    nvml: Array.isArray(obj.nvml) ? obj.nvml.slice().sort((a, b) => a.t_us - b.t_us) : [],
    requests: Array.isArray(obj.requests) ? obj.requests : [],
    mode_changes: Array.isArray(obj.mode_changes) ? obj.mode_changes : [],
    meta: obj.meta || {},
    summary: obj.summary || {},
    // tensor parallel recordings only; an older timeline has none and replays as before
    rankSteps: Array.isArray(obj.rank_steps) ? rankStepsOf(obj.rank_steps) : {},
  };
}
