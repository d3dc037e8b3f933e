/* Hover on the Gantt: the step under the cursor, its spans and the idle gap before it, in a small box.
 * Found by binary search in the steps drawn last, so it costs nothing at redraw time, whatever the number of
 * steps (one Plotly marker per step made every redraw of a busy window slow). */
import { span } from "./feed.js";
import { causeLabel } from "./names.js";
import { GPU, HOST } from "./plot.js";
import { esc } from "./util.js";

const view = { steps: [], lo: 0, hi: 1, margin: null, bound: null, box: null };
const NEAR_PX = 24;                        // farther from any step's compute than this: no box

export function bindHover(el, picture) {
  Object.assign(view, picture);
  if (view.bound === el) return;
  view.bound = el;
  el.addEventListener("mousemove", ev => show(el, ev));
  el.addEventListener("mouseleave", hide);
  el.addEventListener("mousedown", hide);  // a zoom drag: the box would sit on the selection
}

function box(el) {
  if (view.box && view.box.isConnected) return view.box;
  const b = document.createElement("div");
  b.id = "bs-gantt-hover";
  Object.assign(b.style, {
    position: "absolute", zIndex: 5, pointerEvents: "none", display: "none", maxWidth: "420px",
    background: "rgba(15,23,42,0.94)", color: "#f8fafc", font: "12px/1.45 Inter, system-ui, sans-serif",
    padding: "6px 9px", borderRadius: "6px", boxShadow: "0 2px 8px rgba(15,23,42,0.25)", whiteSpace: "nowrap",
  });
  el.parentElement.appendChild(b);
  view.box = b;
  return b;
}

function hide() { if (view.box) view.box.style.display = "none"; }

function show(el, ev) {
  const m = view.margin, steps = view.steps;
  if (ev.buttons || !m || !steps.length) return hide();
  const rect = el.getBoundingClientRect();
  const w = rect.width - m.l - m.r, x = ev.clientX - rect.left - m.l, y = ev.clientY - rect.top;
  if (x < 0 || x > w || y < m.t || y > rect.height - m.b) return hide();
  const usPerPx = (view.hi - view.lo) / w;
  const s = nearest(steps, view.lo + x * usPerPx);
  if (!s || Math.abs(s._c - (view.lo + x * usPerPx)) > Math.max(NEAR_PX * usPerPx, s._e - s._s)) return hide();
  const b = box(el);
  b.innerHTML = describe(s);
  b.style.display = "block";
  // beside the cursor, flipped to the left near the right edge
  const bw = b.offsetWidth, left = ev.clientX - rect.left + 14;
  b.style.left = (left + bw > rect.width ? Math.max(0, ev.clientX - rect.left - bw - 14) : left) + "px";
  b.style.top = Math.max(0, y - 10) + "px";
}

// The step whose compute start (where an idle gap ends) is nearest to t; steps are ordered by index, so by _c.
function nearest(steps, t) {
  let a = 0, b = steps.length;
  while (a < b) { const mid = (a + b) >> 1; if (steps[mid]._c < t) a = mid + 1; else b = mid; }
  const l = steps[a - 1], r = steps[a];
  if (!l) return r;
  if (!r) return l;
  return t - l._c <= r._c - t ? l : r;
}

function describe(s) {
  const ms = v => v ? ((v[1] - v[0]) / 1000).toFixed(3) : null;
  const list = (group, keys) => keys.map(k => { const v = ms(span(s, group, k)); return v === null ? "" : `${k} ${v}`; })
    .filter(Boolean).join(", ");
  const dev = s.gpu ? list("gpu", GPU) : (s._hostCompute ? `compute (host) ${ms(s._cs)}` : "");
  const idle = s.gpu_idle_before_us > 0
    ? `<br>GPU idle before: ${(s.gpu_idle_before_us / 1000).toFixed(3)} ms (${esc(causeLabel(s.idle_cause || "none"))})` : "";
  // (the page styles <b> dark for its light panels: this box is dark)
  return `<b style="color:#fff">step ${s.step}</b> · ${esc(s.mode)} · slot ${s.slot} · ${s.num_requests} req · ` +
    `${s.prefill_tokens} prefill + ${s.decode_tokens} decode tok<br>host ms: ${list("cpu", HOST)}` +
    (dev ? `<br>device ms: ${dev}` : "") + idle;
}
