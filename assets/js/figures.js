/* Per-mode figures and the async forecast, computed in the page with the definitions of telemetry/summary.py
 * (stretches, run_periods, stretch_figures) and telemetry/forecast.py, so that the scoreboard and a timeline's
 * summary give the same numbers (tests/test_browser_scoreboard.py holds them to it). How the forecast is made:
 * docs/forecast.md. Pure functions of step records; times in µs, results in ms. */

const emptyUs = r => (r.idle_by_cause_us && r.idle_by_cause_us.empty_queue) || 0;
const tokens = r => (r.tokens_out !== undefined && r.tokens_out !== null ? r.tokens_out : (r.decode_tokens || 0));
const computeOf = r => (Array.isArray(r.compute_us) && r.compute_us[0] !== null ? r.compute_us : null);
const deviceCompute = r => (computeOf(r) && (r.compute_basis === "gpu" || r.compute_basis === "gpu_wait") ? r.compute_us : null);
const dur = s => (Array.isArray(s) && s[0] !== null && s[1] !== null ? s[1] - s[0] : null);

// Linear interpolation between ranks, as numpy and statistics.quantiles(method="inclusive") do.
export function quantile(values, q) {
  if (!values.length) return null;
  const v = values.slice().sort((a, b) => a - b);
  const pos = (v.length - 1) * q, i = Math.floor(pos), f = pos - i;
  return i + 1 < v.length ? v[i] + (v[i + 1] - v[i]) * f : v[i];
}

const mean = v => (v.length ? v.reduce((a, b) => a + b, 0) / v.length : null);

// Runs of consecutive steps (no hole in the step numbers) of one mode; only `mode`'s when given.
export function stretches(steps, mode) {
  const runs = [];
  for (const r of steps) {
    const last = runs[runs.length - 1];
    if (last && last[last.length - 1].mode === r.mode && r.step === last[last.length - 1].step + 1) last.push(r);
    else runs.push([r]);
  }
  return mode ? runs.filter(run => run[0].mode === mode) : runs;
}

// [step, ms] per step but the last: compute start to the next one's, less the next one's empty-queue gap.
export function runPeriods(run) {
  const out = [];
  for (let i = 0; i + 1 < run.length; i++) {
    const a = computeOf(run[i]), b = computeOf(run[i + 1]);
    if (a && b) out.push([run[i], (b[0] - a[0] - emptyUs(run[i + 1])) / 1000]);
  }
  return out;
}

function unionLength(spans, lo, hi) {
  let total = 0, cs = null, ce = null;
  const clipped = spans.map(s => [Math.max(s[0], lo), Math.min(s[1], hi)]).filter(s => s[1] > s[0]).sort((a, b) => a[0] - b[0]);
  for (const [s, e] of clipped) {
    if (ce === null || s > ce) { if (ce !== null) total += ce - cs; cs = s; ce = e; } else ce = Math.max(ce, e);
  }
  return ce === null ? total : total + ce - cs;
}

// One mode's figures over its stretches: busy % and tokens/s over the working time (first compute start to
// last compute end, less empty-queue gaps), decode tok/s, ms/step (median), GPU idle per step by cause.
export function figures(runs) {
  let work = 0, busy = 0, decodeMs = 0, decodeTok = 0, tok = 0, steps = 0;
  const periods = [], idle = [], byCause = {};
  let hostBasis = false;
  for (const run of runs) {
    steps += run.length;
    for (const r of run) tok += tokens(r);
    const spans = run.map(computeOf).filter(Boolean);
    if (!spans.length) continue;
    hostBasis = hostBasis || run.some(r => r.compute_basis === "host");
    const lo = spans[0][0], hi = Math.max(...spans.map(s => s[1]));
    let empty = 0;
    for (let i = 1; i < run.length; i++) empty += emptyUs(run[i]);
    work += Math.max(0, hi - lo - empty);
    busy += unionLength(spans, lo, hi);
    for (const [r, ms] of runPeriods(run)) {
      periods.push(ms);
      if (r.prefill_tokens === 0) { decodeMs += ms; decodeTok += tokens(r); }
    }
    for (let i = 1; i < run.length; i++) {
      const r = run[i];
      if (r.gpu_idle_before_us === null || r.gpu_idle_before_us === undefined) continue;
      idle.push(Math.max(0, r.gpu_idle_before_us - emptyUs(r)));
      for (const [c, us] of Object.entries(r.idle_by_cause_us || {})) if (c !== "empty_queue") byCause[c] = (byCause[c] || 0) + us;
    }
  }
  return {
    steps, stretches: runs.length, hostBasis,
    firstStep: runs.length ? runs[0][0].step : null,
    lastStep: runs.length ? runs[runs.length - 1][runs[runs.length - 1].length - 1].step : null,
    workS: work / 1e6,
    busyPct: work ? 100 * busy / work : null,
    tokensPerS: work ? tok / (work / 1e6) : null,
    decodeTokensPerS: decodeMs ? decodeTok / (decodeMs / 1e3) : null,
    msPerStep: quantile(periods, 0.5),
    idleUsPerStep: mean(idle),
    idleByCause: byCause,
  };
}

// ---------------------------------------------------------------- the forecast (telemetry/forecast.py)

// C (device compute), H (host work per step, its wait left out), X (the chain the GPU waited out after it).
export function stepCosts(run) {
  const out = [];
  for (let i = 0; i < run.length; i++) {
    const r = run[i], c = deviceCompute(r);
    if (!c) continue;
    let h = null, x = null;
    const next = run[i + 1];
    if (next && deviceCompute(next)) {
      const empty = emptyUs(next), s0 = r.cpu && r.cpu.schedule, s1 = next.cpu && next.cpu.schedule;
      const wait = dur(r.cpu && r.cpu.wait) || 0;
      if (s0 && s1) h = Math.max(0, s1[0] - s0[0] - wait - empty);
      if (next.gpu_idle_before_us !== null && next.gpu_idle_before_us !== undefined) x = Math.max(0, next.gpu_idle_before_us - empty);
    }
    out.push({ step: r.step, C: c[1] - c[0], H: h, X: x });
  }
  for (const k of ["H", "X"]) {
    const known = out.map(s => s[k]).filter(v => v !== null);
    // statistics.median: the middle value, or the mean of the two middle ones
    const fill = known.length ? quantile(known, 0.5) : 0;
    for (const s of out) if (s[k] === null) s[k] = fill;
  }
  return out;
}

// Step i starts when the device is free, the chain from i-2 is done and the host has had time for one step.
export function simulate(costs) {
  const sim = [];
  costs.forEach((s, i) => {
    let cs = 0, bound = "gpu";
    if (i > 0) {
      const cands = [[sim[i - 1].ce, "gpu"]];
      if (i >= 2) cands.push([sim[i - 2].ce + costs[i - 2].X, "chain"]);
      cands.push([sim[i - 1].cs + costs[i - 1].H, "host"]);
      [cs, bound] = cands.reduce((best, c) => (c[0] > best[0] ? c : best));   // ties keep the first: the device
    }
    sim.push({ step: s.step, cs, ce: cs + s.C, bound });
  });
  return sim;
}

// The forecast over some sync stretches, beside the measured async ms/step of some async stretches.
export function forecastOf(syncRuns, asyncRuns) {
  const measured = [], forecast = [], bounds = { gpu: 0, chain: 0, host: 0 };
  let steps = 0, device = false;
  for (const run of syncRuns) {
    if (run.some(deviceCompute)) device = true;
    const costs = stepCosts(run);
    if (costs.length < 3) continue;
    const sim = simulate(costs);
    steps += costs.length;
    for (const [r, ms] of runPeriods(run)) if (deviceCompute(r)) measured.push(ms);
    for (let i = 1; i < sim.length; i++) { forecast.push((sim[i].cs - sim[i - 1].cs) / 1000); bounds[sim[i].bound]++; }
  }
  if (!syncRuns.length) return { applicable: false, reason: "no sync steps to forecast from" };
  if (!device) return { applicable: false, reason: "compute runs on the host here, so async has nothing to hide" };
  if (!forecast.length) return { applicable: false, reason: "too few sync steps yet" };
  const async = [];
  for (const run of asyncRuns) for (const [, ms] of runPeriods(run)) async.push(ms);
  const f = quantile(forecast, 0.5), a = quantile(async, 0.5);
  return {
    applicable: true, steps, bounds,
    measuredMs: quantile(measured, 0.5), forecastMs: f,
    speedup: mean(measured) / mean(forecast),
    asyncMs: a,
    errorPct: a ? 100 * (f - a) / a : null,
  };
}

// As telemetry/forecast.py's forecast_async: every sync stretch, against the async stretches beside them.
export function forecastAsync(steps) {
  const runs = stretches(steps);
  const near = new Set();
  runs.forEach((run, k) => {
    if (run[0].mode !== "sync" || stepCosts(run).length < 3) return;
    for (const j of [k - 1, k + 1]) if (j >= 0 && j < runs.length && runs[j][0].mode === "async") near.add(j);
  });
  const asyncRuns = near.size ? [...near].sort((a, b) => a - b).map(j => runs[j]) : runs.filter(r => r[0].mode === "async");
  return forecastOf(runs.filter(r => r[0].mode === "sync"), asyncRuns);
}
