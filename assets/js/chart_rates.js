/* Busy % and tokens/s for the charts (charts.js), re-binned to the window: a fixed number of points across it,
 * each the average over a window of at least four steps, so a zoom narrower than a step still shows the local
 * busy % and tokens/s instead of an empty chart. */
import { dataExtent, state } from "./feed.js";
import { stepRange } from "./slices.js";
import { tensorParallel } from "./tensor_parallel.js";
import { notInTrace } from "./unknown.js";

const POINTS = 120;                        // points across the window for the rates
const MIN_STEPS_PER_POINT = 4;             // fewer, and a busy % of whole and empty steps saws up and down

// The typical time between steps (median of successive compute starts, sampled) in steps[a..z), for the
// averaging window.
function typicalInterval(steps, a, z) {
  const stride = Math.max(1, Math.floor((z - a - 1) / 200)), diffs = [];
  for (let i = a + 1; i < z; i += stride) { const v = steps[i]._c - steps[i - 1]._c; if (v > 0) diffs.push(v); }
  diffs.sort((x, y) => x - y);
  return diffs.length ? diffs[diffs.length >> 1] : 0;
}

// Busy % and tokens/s at POINTS points across [lo, hi], each over a window `win` wide centred on it: the
// time the compute spans cover in the window, and the tokens of steps that ended in it, over its length.
// Windows are clipped to where there is data, so the edges of a recording do not dip.
export function rates(d, lo, hi) {
  const binW = (hi - lo) / POINTS;
  const interval = typicalInterval(d.steps, ...stepRange(d.steps, lo, hi, MIN_STEPS_PER_POINT));
  const win = Math.max(binW, MIN_STEPS_PER_POINT * interval, 200);
  const [a, z] = stepRange(d.steps, lo - win, hi + win, 2);
  let [x0, x1] = dataExtent(d);
  if (state.view.source === "live" && z > a) {
    // While requests run, the step in flight is not reported yet: the series end where the newest reported
    // compute ended (not at the step's last host span: in async the next step computes under its update).
    // Only an engine with nothing to run is measured up to the present (0% busy is what it is then).
    const edge = lastComputeEnd(d.steps, z);
    x1 = state.store.running === 0 ? Math.max(edge, state.store.lastT) : edge;
  }
  // an imported trace's steps carry the device's busy time (the union of its ops): that is what is drawn
  const device = cumulativeDevice(d.steps, a, z);
  const spans = cumulativeSpans(d.steps, a, z);
  const compute = device || spans, tokens = cumulativeTokens(d.steps, a, z);
  let hostBasis = false;
  for (let i = a; i < z && !hostBasis; i++) hostBasis = d.steps[i]._hostCompute;
  // tensor parallel: each other rank's busy %, from its own records, the same way
  const ranks = tensorParallel(d).ranks.map(rk => {
    const list = (d.rankSteps && d.rankSteps[rk.rank]) || [];
    const [ra, rz] = stepRange(list, lo - win, hi + win, 2);
    return { rank: rk.rank, host: rk.host, compute: (device && cumulativeDevice(list, ra, rz)) || cumulativeSpans(list, ra, rz), busy: [] };
  });
  const out = { x: [], busy: [], spanBusy: [], tok: [], pre: [], win, gpuSeen: compute.n > 0, hostBasis, deviceBasis: !!device, ranks,
                noTokens: notInTrace(d).has("tokens_out") };
  for (let i = 0; i < POINTS; i++) {
    const mid = lo + (i + 0.5) * binW;
    const l = Math.max(mid - win / 2, x0), r = Math.min(mid + win / 2, x1);
    if (!(r - l >= win / 4)) continue;      // too little data under this point to say anything
    out.x.push(mid / 1e6);
    out.busy.push(Math.min(100, 100 * (compute.at(r) - compute.at(l)) / (r - l)));
    if (device) out.spanBusy.push(Math.min(100, 100 * (spans.at(r) - spans.at(l)) / (r - l)));
    for (const rk of ranks) rk.busy.push(Math.min(100, 100 * (rk.compute.at(r) - rk.compute.at(l)) / (r - l)));
    const per = 1e6 / (r - l);
    out.tok.push((tokens.at(r, 0) - tokens.at(l, 0)) * per);
    out.pre.push((tokens.at(r, 1) - tokens.at(l, 1)) * per);
  }
  return out;
}

// The latest compute end among the last few steps before index z (compute spans end in step order, nearly).
function lastComputeEnd(steps, z) {
  let end = -Infinity;
  for (let i = Math.max(0, z - 8); i < z; i++) if (steps[i]._cs && steps[i]._cs[1] > end) end = steps[i]._cs[1];
  return isFinite(end) ? end : steps[z - 1]._e;
}

// Index of the first of n sorted values greater than t.
function after(sorted, n, t) {
  let lo = 0, hi = n;
  while (lo < hi) { const m = (lo + hi) >> 1; if (sorted[m] <= t) lo = m + 1; else hi = m; }
  return lo;
}

// at(t): total compute time before t, from the compute spans of steps[a..z) merged, with prefix sums.
// Steps come in order, so their spans do too; a sort is needed only when they do not.
function cumulativeSpans(steps, a, z) {
  let spans = [];
  for (let i = a; i < z; i++) if (steps[i]._cs) spans.push(steps[i]._cs);
  if (spans.some((v, i) => i && v[0] < spans[i - 1][0])) spans = spans.slice().sort((x, y) => x[0] - y[0]);
  const S = new Float64Array(spans.length), E = new Float64Array(spans.length), P = new Float64Array(spans.length + 1);
  let n = 0;
  for (const [s, e] of spans) {
    if (n && s <= E[n - 1]) { if (e > E[n - 1]) { P[n] += e - E[n - 1]; E[n - 1] = e; } continue; }
    S[n] = s; E[n] = e; P[n + 1] = P[n] + e - s; n++;
  }
  const at = t => {
    const k = after(S, n, t);
    return k ? P[k - 1] + Math.min(t, E[k - 1]) - S[k - 1] : 0;
  };
  return { at, n };
}

// at(t): the device's busy time before t, from an imported trace's per-step shares (device_ops_before_us over
// the gap before a step, device_ops_us over its own part of the span; the parts tile the steps' window), each
// spread evenly over its part. null when a step with compute has no share (batchscope's own recordings).
function cumulativeDevice(steps, a, z) {
  const S = [], E = [], U = [];
  let prevEnd = null;
  for (let i = a; i < z; i++) {
    const s = steps[i];
    if (!s._cs) continue;
    if (typeof s.device_ops_us !== "number") return null;
    const [c0, c1] = s._cs;
    if (prevEnd !== null && c0 > prevEnd && typeof s.device_ops_before_us === "number") {
      S.push(prevEnd); E.push(c0); U.push(s.device_ops_before_us);
    }
    const from = prevEnd === null ? c0 : Math.max(c0, prevEnd), to = Math.max(c1, from);
    if (to > from) { S.push(from); E.push(to); U.push(s.device_ops_us); }
    prevEnd = prevEnd === null ? c1 : Math.max(prevEnd, c1);
  }
  if (!S.length) return null;
  const n = S.length, P = new Float64Array(n + 1);
  for (let k = 0; k < n; k++) P[k + 1] = P[k] + U[k];
  const at = t => {
    const k = after(S, n, t);
    return k ? P[k - 1] + U[k - 1] * Math.min(1, (t - S[k - 1]) / (E[k - 1] - S[k - 1])) : 0;
  };
  return { at, n };
}

// at(t, k): generated (k = 0) or prefill (k = 1) tokens of the steps in steps[a..z) that ended before t.
function cumulativeTokens(steps, a, z) {
  let order = steps.slice(a, z);
  if (order.some((s, i) => i && s._e < order[i - 1]._e)) order.sort((x, y) => x._e - y._e);
  const n = order.length, T = new Float64Array(n), G = new Float64Array(n + 1), F = new Float64Array(n + 1);
  order.forEach((s, i) => { T[i] = s._e; G[i + 1] = G[i] + s._tok; F[i + 1] = F[i] + (s.prefill_tokens || 0); });
  return { at: (t, k) => (k ? F : G)[after(T, n, t)] };
}
