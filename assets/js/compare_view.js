/* The Compare view: two of the server's recordings (the live history, the replay, a named recording) compared step
 * by step at matched batch shapes (POST /api/compare, the `batchscope compare --json` document, docs/compare.md).
 *
 *   import { mount } from "./compare_view.js";
 *   const view = mount(document.getElementById("bs-compare"), api, { onBucket: b => ... });
 *
 * `api(path, method, body, timeoutMs)` is api.js's (a plain fetch stands in without it). It draws, inside the
 * container: the two pickers and the Compare button, the overall verdict, the matched buckets (clicking one calls
 * onBucket(bucket) with `bucket.typical` = each side's step of median time, {recording, recording_index, step,
 * step_ms}, and fires "bs-compare-bucket" on the container), the typical step of each side of the bucket clicked
 * (#bs-compare-typical: its recording, step number, step time and the bucket's shape; `opts.sideAction(side,
 * typical, bucket)` may return an element to put on each side's line, e.g. a button that shows the step), the
 * idle time by cause per step, and what could not be matched. Every element's id starts with bs-compare-. Plain
 * DOM, no Plotly.
 */

const COMPARE_TIMEOUT_MS = 180000;
const VERDICT_WORDS = {
  slower: "NEW is slower", faster: "NEW is faster", same: "no change beyond the noise",
  inconclusive: "inconclusive",
};

export async function plainApi(path, method, body) {
  const res = await fetch(path, {
    method: method || "GET", headers: body === undefined ? {} : { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let json = null;
  try { json = await res.json(); } catch (e) { /* not JSON */ }
  if (!res.ok) throw new Error(json && json.error ? String(json.error) : res.status + " " + res.statusText);
  return json;
}

export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

export function fmt(x, digits) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  const d = digits === undefined ? (Math.abs(x) >= 100 ? 1 : Math.abs(x) >= 1 ? 2 : 3) : digits;
  return Number(x).toFixed(d);
}

function ratioText(r) {
  if (!r || r.value === null || r.value === undefined) return "–";
  const band = r.low !== null && r.low !== undefined ? ` [${fmt(r.low, 3)}–${fmt(r.high, 3)}]` : "";
  return `${fmt(r.value, 3)}x${band}`;
}

export function fillSources(select, sources, wanted) {
  const keep = wanted !== undefined ? wanted : select.value;
  select.replaceChildren(...sources.map(s => el("option", { value: s.source, text: s.label + (s.active ? " (recording)" : "") })));
  if (sources.some(s => s.source === keep)) select.value = keep;
}

export function injectStyle() {
  if (document.getElementById("bs-analysis-style")) return;
  document.head.append(el("style", { id: "bs-analysis-style", text: `
    .bs-analysis { font-size: 13px; display: flex; flex-direction: column; gap: 8px; }
    .bs-analysis .bs-row { display: flex; flex-wrap: wrap; gap: 8px; align-items: center; }
    .bs-analysis table { border-collapse: collapse; }
    .bs-analysis th, .bs-analysis td { padding: 2px 8px; text-align: right; border-bottom: 1px solid rgba(128,128,128,.25); }
    .bs-analysis th:first-child, .bs-analysis td:first-child { text-align: left; }
    .bs-analysis tr.bs-clickable { cursor: pointer; }
    .bs-analysis tr.bs-clickable:hover { background: rgba(128,128,128,.15); }
    .bs-analysis tr.bs-chosen { background: rgba(41,128,185,.15); }
    .bs-analysis .bs-typical { display: flex; flex-direction: column; gap: 3px; padding: 4px 8px;
      border-left: 3px solid #2980b9; background: rgba(41,128,185,.06); }
    .bs-analysis .bs-typical:empty { display: none; }
    .bs-analysis .bs-typical button { margin-left: 8px; }
    .bs-analysis .bs-error { color: #c0392b; white-space: pre-wrap; }
    .bs-analysis .bs-slower { color: #c0392b; } .bs-analysis .bs-faster { color: #1e8449; }
    .bs-analysis .bs-bar { display: inline-block; height: 8px; vertical-align: middle; }
    .bs-analysis .bs-muted { opacity: .7; }` }));
}

export function mount(container, api, options) {
  const call = api || plainApi;
  const opts = options || {};
  injectStyle();
  const base = el("select", { id: "bs-compare-base", "aria-label": "base recording" });
  const next = el("select", { id: "bs-compare-new", "aria-label": "new recording" });
  const refresh = el("button", { id: "bs-compare-refresh", type: "button", title: "reload the list", text: "↻" });
  const run = el("button", { id: "bs-compare-run", type: "button", text: "Compare" });
  const status = el("span", { id: "bs-compare-status", class: "bs-muted" });
  const error = el("div", { id: "bs-compare-error", class: "bs-error" });
  const verdict = el("div", { id: "bs-compare-verdict" });
  const warnings = el("ul", { id: "bs-compare-warnings", class: "bs-muted" });
  const buckets = el("div", { id: "bs-compare-buckets" });
  const typical = el("div", { id: "bs-compare-typical", class: "bs-typical", "aria-live": "polite" });
  const idle = el("div", { id: "bs-compare-idle" });
  const unmatched = el("div", { id: "bs-compare-unmatched" });
  container.replaceChildren(el("div", { class: "bs-analysis", id: "bs-compare-view" },
    el("div", { class: "bs-row" }, el("label", { text: "base " }, base), el("label", { text: "new " }, next),
       refresh, run, status),
    error, verdict, warnings, buckets, typical, idle, unmatched));

  const view = { onBucket: opts.onBucket || null, result: null };

  async function loadSources() {
    try {
      const { sources } = await call("/api/recordings/sources");
      const first = !base.options.length;
      fillSources(base, sources);
      fillSources(next, sources);
      if (first && sources.length) {       // a first pick that compares something: a recording against the newest
        base.value = (sources.find(s => s.kind === "recording") || sources[0]).source;
        next.value = sources[sources.length - 1].source;
      }
      run.disabled = !sources.length;
      status.textContent = sources.length ? "" : "nothing to compare yet: record something (or load a replay)";
    } catch (e) {
      error.textContent = "sources: " + e.message;
    }
  }

  async function compare() {
    error.textContent = "";
    run.disabled = true;
    status.textContent = "comparing…";
    try {
      const result = await call("/api/compare", "POST", { base: base.value, new: next.value }, COMPARE_TIMEOUT_MS);
      view.result = result;
      view.bucket = null;
      typical.replaceChildren();
      draw(result);
      status.textContent = "";
    } catch (e) {
      error.textContent = e.message;
      status.textContent = "";
    } finally {
      run.disabled = false;
    }
  }

  function draw(r) {
    const step = r.figures.step;
    const pct = r.step_time_ratio && r.step_time_ratio.value ? (100 * (r.step_time_ratio.value - 1)) : null;
    verdict.replaceChildren(
      el("b", { class: "bs-" + r.verdict, text: VERDICT_WORDS[r.verdict] || r.verdict }),
      ` — device step time NEW/BASE ${ratioText(r.step_time_ratio)}` +
      (pct !== null ? ` (${pct >= 0 ? "+" : ""}${fmt(pct, 1)}%)` : "") +
      `: ${fmt(step.base_ms)} → ${fmt(step.new_ms)} ms per step; minimum effect ${fmt(100 * r.noise.min_effect, 1)}%` +
      (r.verdict_reason && r.verdict_reason !== "measured" ? ` (${r.verdict_reason})` : ""));
    verdict.dataset.verdict = r.verdict;
    warnings.replaceChildren(...(r.warnings || []).map(w => el("li", { text: w })));
    drawBuckets(r.buckets || []);
    drawIdle(r.figures);
    drawUnmatched(r.unmatched || {});
  }

  function drawBuckets(list) {
    const head = el("tr", {}, ...["shape", "steps base", "steps new", "share", "base ms", "new ms", "NEW/BASE",
      "verdict"].map(t => el("th", { text: t })));
    const rows = list.map((b, i) => {
      const tr = el("tr", { class: "bs-clickable", id: `bs-compare-bucket-${i}`, "data-label": b.label,
        title: b.typical ? `typical steps: base #${b.typical.base.step}, new #${b.typical.new.step}` : undefined },
        el("td", { text: b.label }), el("td", { text: String(b.base_steps) }), el("td", { text: String(b.new_steps) }),
        el("td", { text: fmt(100 * (b.time_share || 0), 1) + "%" }), el("td", { text: fmt(b.base_step_ms) }),
        el("td", { text: fmt(b.new_step_ms) }), el("td", { text: ratioText(b.ratio) }),
        el("td", { class: "bs-" + b.verdict, text: b.verdict }));
      tr.addEventListener("click", () => {
        for (const row of buckets.querySelectorAll("tr.bs-chosen")) row.classList.remove("bs-chosen");
        tr.classList.add("bs-chosen");
        view.bucket = b;
        showTypical(b);
        container.dispatchEvent(new CustomEvent("bs-compare-bucket", { detail: b, bubbles: true }));
        if (view.onBucket) view.onBucket(b);
      });
      return tr;
    });
    buckets.replaceChildren(el("div", { text: `Matched shapes (${list.length}): click one to open its typical step` }),
      el("table", { id: "bs-compare-bucket-table" }, el("thead", {}, head), el("tbody", {}, ...rows)));
  }

  // Each side's typical step of the bucket picked: where it is, and what it took against the bucket's median.
  function showTypical(b) {
    if (!b || !b.typical) { typical.replaceChildren(); return; }
    const lines = ["base", "new"].filter(side => b.typical[side]).map(side => {
      const t = b.typical[side];
      const median = side === "base" ? b.base_step_ms : b.new_step_ms;
      const action = opts.sideAction ? opts.sideAction(side, t, b) : null;
      return el("div", { id: `bs-compare-typical-${side}`, "data-recording": t.recording, "data-step": String(t.step) },
        el("b", { text: side.toUpperCase() }),
        ` ${t.recording} · step #${t.step} · ${fmt(t.step_ms)} ms (the bucket's median ${fmt(median)} ms)`, action);
    });
    typical.replaceChildren(el("div", { text: `Typical step of ${b.label}` }), ...lines);
  }
  view.showTypical = () => showTypical(view.bucket);

  function drawIdle(figures) {
    const causes = Object.entries(figures).filter(([name]) => name.startsWith("cause."));
    if (!causes.length) { idle.replaceChildren(); return; }
    const most = Math.max(...causes.map(([, f]) => Math.max(f.base_ms || 0, f.new_ms || 0)), 1e-9);
    const bar = (ms, colour) => el("span", { class: "bs-bar", style: `width:${Math.round(80 * (ms || 0) / most)}px;background:${colour}` });
    const rows = causes.map(([name, f]) => el("tr", { "data-cause": name.slice(6) },
      el("td", { text: name.slice(6) }), el("td", { text: fmt(f.base_ms, 3) }), el("td", {}, bar(f.base_ms, "#7f8c8d")),
      el("td", { text: fmt(f.new_ms, 3) }), el("td", {}, bar(f.new_ms, "#2980b9")),
      el("td", { text: (f.delta_ms.value > 0 ? "+" : "") + fmt(f.delta_ms.value, 3) }),
      el("td", { class: "bs-" + f.verdict, text: f.verdict })));
    const head = el("tr", {}, ...["idle cause", "base ms/step", "", "new ms/step", "", "difference", "verdict"]
      .map(t => el("th", { text: t })));
    idle.replaceChildren(el("div", { text: "Idle time by cause, per step over the common mix" }),
      el("table", { id: "bs-compare-idle-table" }, el("thead", {}, head), el("tbody", {}, ...rows)));
  }

  function drawUnmatched(u) {
    const parts = [["only BASE ran", u.base_only], ["only NEW ran", u.new_only], ["too few steps", u.too_few_steps]];
    const items = parts.filter(([, list]) => list && list.length).map(([what, list]) => el("li", {
      text: `${what}: ` + list.map(e => `${e.bucket} (${e.base_steps}/${e.new_steps} steps)`).join(", ") }));
    const share = s => s === null || s === undefined ? "–" : fmt(100 * s, 1) + "%";
    unmatched.replaceChildren(
      el("div", { text: `Not matched: ${share(u.base_time_share)} of BASE's step time, ${share(u.new_time_share)} of NEW's` }),
      el("ul", {}, ...items));
  }

  run.addEventListener("click", compare);
  refresh.addEventListener("click", loadSources);
  loadSources();
  view.refresh = loadSources;
  view.compare = compare;
  return view;
}
