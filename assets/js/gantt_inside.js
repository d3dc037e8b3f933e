/* Idle inside an imported step's compute span (the launch-bound stretches between kernels that CUDA events around
 * a step cannot see; telemetry/importers/steprecords.py inside_ink): its ink on the Gantt and its legend line. */
import { causeHint, causeLabel } from "./names.js";
import { causeColor, NO_WORK } from "./plot.js";
import { $, esc } from "./util.js";

const fmtUs = us => (us >= 1000 ? (us / 1000).toFixed(2) + " ms" : (+us).toFixed(us < 10 ? 1 : 0) + " µs");

// An imported step's idle inside its compute span: each kept stretch where it was, the rest spread evenly over
// the span (its share of the time is right at any zoom, only its place inside the step is not), taken out of
// the compute bar so that the bar's ink is what the device ran, and drawn by cause on the idle lane whose layers
// are named `idlePrefix` + cause (none: no idle lane to draw on).
export function insideInk(ink, s, computeKey, idlePrefix) {
  const span = s._cs;
  if (!span || !(span[1] > span[0])) return;
  const rank0 = idlePrefix === "idle: ";
  const idle = (c, a, b, w) => {
    ink.addW(computeKey, a, b, -w);
    if (!idlePrefix) return;
    ink.causes.add(c);
    ink.addW(idlePrefix + c, a, b, w);
    if (!rank0) return;
    ink.inside.drawn += w * (b - a);
    if (!NO_WORK.has(c)) ink.addW("gap", a, b, w);        // washed across the GPU lanes, as the gaps before steps
  };
  for (const [a, b, c] of s.idle_inside_stretches || []) idle(c, a, b, 1);
  const len = span[1] - span[0];
  for (const [c, us] of Object.entries(s.idle_inside_spread_us || {})) idle(c, span[0], span[1], us / len);
}

// The legend says how much idle inside steps there is in view and what it was; the hover gives it per step.
const INSIDE_CAUSES_SHOWN = 3;

export function setInsideLegend(inside) {
  const el = $("bs-legend-inside");
  if (!el) return;
  const on = inside.us > 0;
  if (el.hidden === on) el.hidden = !on;
  if (!on) return;
  const top = Object.entries(inside.byCause).sort((a, b) => b[1] - a[1]).slice(0, INSIDE_CAUSES_SHOWN);
  const html = `<b>GPU idle inside steps</b> ${esc(fmtUs(inside.us))} in view` + (top.length ? ": " : "") +
    top.map(([c, us]) => `<span class="bs-li" title="${esc(causeHint(c) || c)}"><i style="background:${causeColor(c)}"></i>` +
                         `${esc(causeLabel(c))} ${esc(fmtUs(us))}</span>`).join(", ") +
    ` <span style="color:#64748b">(drawn on the idle lane by cause, and left out of the compute bar)</span>`;
  if (el.innerHTML !== html) el.innerHTML = html;
}
