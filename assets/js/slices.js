/* The steps and samples in a time window, by binary search over records ordered by step (and so, nearly, by
 * time) or by t_us. */

// Steps are ordered by index, and so (nearly) by time: binary-search the start, then filter.
export function stepsIn(steps, lo, hi) {
  let a = 0, b = steps.length;
  while (a < b) { const mid = (a + b) >> 1; if (steps[mid]._s < lo - 5e6) a = mid + 1; else b = mid; }
  const out = [];
  for (let i = a; i < steps.length; i++) {
    const s = steps[i];
    if (s._s > hi) break;
    if (s._e >= lo) out.push(s);
  }
  return out;
}

// The steps in [lo, hi] and `extra` more on each side, so that lines cross the window at any zoom (a window
// narrower than one step holds no step start at all). One contiguous slice of `steps`.
export function stepsAround(steps, lo, hi, extra) {
  return steps.slice(...stepRange(steps, lo, hi, extra));
}

// The same as indices [a, z) into steps, without copying.
export function stepRange(steps, lo, hi, extra) {
  const find = (t, key) => {
    let a = 0, b = steps.length;
    while (a < b) { const mid = (a + b) >> 1; if (steps[mid][key] < t) a = mid + 1; else b = mid; }
    return a;
  };
  let a = find(lo, "_e"), z = find(hi, "_s");
  while (z < steps.length && steps[z]._s <= hi) z++;
  return [Math.max(0, a - extra), Math.min(steps.length, Math.max(z, a) + extra)];
}

// Samples (sorted by t_us) in [lo, hi] plus one on each side, for the same reason.
export function samplesAround(samples, lo, hi) {
  let a = 0, b = samples.length;
  while (a < b) { const mid = (a + b) >> 1; if (samples[mid].t_us < lo) a = mid + 1; else b = mid; }
  let z = a;
  while (z < samples.length && samples[z].t_us <= hi) z++;
  return samples.slice(Math.max(0, a - 1), Math.min(samples.length, z + 1));
}
