/* Coverage painting for the Gantt's canvas: ink proportional to time at every zoom.
 *
 * Each span adds to every device-pixel column the share of that column's time it covers. A lane's bar in a
 * column is then as tall as that share, centred on the lane, with its edge rows partly opaque, so a column
 * that is 15% idle shows an idle bar 15% tall however many gaps make up that 15%. (Drawing each span at
 * least a pixel wide, as before, painted 1 ms gaps every 7 ms as a solid idle bar and 4 µs gaps as blocks.)
 * Several layers in one lane (idle causes, or sync and async at a switch) stack inside the bar in order.
 * A column only partly covered by the end of a span wider than a pixel is drawn full height and partly
 * opaque instead (plain anti-aliasing): the ink is the same, and zoomed-in bars keep square ends.
 */

// The share of each of n columns that a lane's spans cover: coverage(n), then addSpan for each span.
// Overlaps add (capped at 1 when painted: spans of one lane come from successive steps and do not overlap in
// practice). `narrow` holds the part that spans narrower than a column add: those columns are drawn by height.
export function coverage(n) {
  const cov = new Float32Array(n);
  cov.narrow = new Float32Array(n);
  cov.spans = 0;
  return cov;
}

// Adds the span [a, b] (µs) to cov, whose columns start at lo and are usPerCol wide, with weight w: 1 for a
// span, a share for time spread evenly over it (an imported step's small idle stretches), -1 to take a span
// back out (the idle inside an imported step's compute span is not compute).
export function addSpan(cov, a, b, lo, usPerCol, w = 1) {
  const n = cov.length, narrow = cov.narrow;
  let x0 = (a - lo) / usPerCol, x1 = (b - lo) / usPerCol;
  if (w > 0) cov.spans++;
  if (x1 <= 0 || x0 >= n || !(x1 > x0)) return;
  const thin = x1 - x0 < 1;
  if (x0 < 0) x0 = 0;
  if (x1 > n) x1 = n;
  const i0 = Math.floor(x0), i1 = Math.floor(x1);
  if (i0 === i1) { cov[i0] += w * (x1 - x0); if (thin) narrow[i0] += w * (x1 - x0); return; }
  if (thin) { narrow[i0] += w * (i0 + 1 - x0); if (i1 < n) narrow[i1] += w * (x1 - i1); }
  cov[i0] += w * (i0 + 1 - x0);
  for (let i = i0 + 1; i < i1; i++) cov[i] += w;
  if (i1 < n) cov[i1] += w * (x1 - i1);
}

// "#rrggbb" -> [r, g, b]
export function rgb(hex) {
  const v = parseInt(String(hex).slice(1, 7), 16);
  return [(v >> 16) & 255, (v >> 8) & 255, v & 255];
}

// Source-over of one pixel (non-premultiplied RGBA, as ImageData holds it).
function blend(d, i, c, a) {
  const da = d[i + 3] / 255;
  if (a >= 0.999 || da === 0) {
    d[i] = c[0]; d[i + 1] = c[1]; d[i + 2] = c[2]; d[i + 3] = a * 255;
    return;
  }
  const oa = a + da * (1 - a), k = da * (1 - a);
  d[i] = (c[0] * a + d[i] * k) / oa;
  d[i + 1] = (c[1] * a + d[i + 1] * k) / oa;
  d[i + 2] = (c[2] * a + d[i + 2] * k) / oa;
  d[i + 3] = oa * 255;
}

// A wash over rows [top, bottom) whose opacity in each column is `alpha` times that column's coverage.
function paintWash(img, wash) {
  const { data: d, width: W } = img;
  const r0 = Math.max(0, Math.round(wash.top)), r1 = Math.min(img.height, Math.round(wash.bottom));
  for (let x = 0; x < W; x++) {
    const a = Math.min(1, wash.cov[x]) * wash.alpha;
    if (a < 0.004) continue;
    for (let r = r0; r < r1; r++) blend(d, (r * W + x) * 4, wash.rgb, a);
  }
}

// One lane: bars centred on row `cy` (device px), `half` px tall each side when fully covered.
function paintLane(img, lane) {
  const { data: d, width: W, height: H } = img;
  const layers = lane.layers.filter(l => l.cov);
  if (!layers.length) return;
  const full = 2 * lane.half;
  for (let x = 0; x < W; x++) {
    let total = 0, narrow = 0;
    for (const l of layers) { total += Math.max(0, l.cov[x]); narrow += Math.max(0, l.cov.narrow[x]); }
    if (total <= 1e-6) continue;
    const scale = total > 1 ? 1 / total : 1;           // overlapping spans: the column is simply full
    // by height where sub-pixel spans make up the column; by opacity at the end of a wide span
    const byHeight = narrow > 0, opacity = byHeight ? 1 : Math.min(1, total);
    const t = byHeight ? Math.min(1, total) * full : full;
    const top = lane.cy - t / 2, bot = lane.cy + t / 2;
    const r0 = Math.max(0, Math.floor(top)), r1 = Math.min(H, Math.ceil(bot));
    for (let r = r0; r < r1; r++) {
      // which layer owns most of this row, and how much of the row is ink at all
      let segTop = top, best = null, bestO = 0, inked = 0;
      for (const l of layers) {
        const segBot = segTop + Math.max(0, l.cov[x]) * scale * (byHeight ? full : full / Math.min(1, total));
        const o = Math.min(r + 1, segBot) - Math.max(r, segTop);
        if (o > 0) { inked += o; if (o > bestO) { bestO = o; best = l; } }
        segTop = segBot;
      }
      if (best) blend(d, (r * W + x) * 4, best.rgb, Math.min(1, inked) * opacity * best.alpha);
    }
  }
}

// Paints the washes, then the lanes, into the canvas (already sized in device pixels).
export function paintInk(canvas, washes, lanes) {
  const ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height;
  let img = paintInk.img;
  if (!img || img.width !== W || img.height !== H) img = paintInk.img = ctx.createImageData(W, H);
  else img.data.fill(0);
  for (const w of washes) paintWash(img, w);
  for (const l of lanes) paintLane(img, l);
  ctx.putImageData(img, 0, 0);
}
