/* The What-if panel: what another setting would do to a recorded load (POST /api/whatif, the `batchscope whatif
 * --json` document, docs/whatif.md), and Verify, which runs it for real on this server's engine (POST
 * /api/whatif/verify, then GET /api/whatif/verify/{id} until it ends) or says which CLI command can (a 409).
 *
 *   import { mount } from "./whatif_view.js";
 *   mount(document.getElementById("bs-whatif"), api);
 *
 * `api(path, method, body, timeoutMs)` is api.js's (a plain fetch stands in without it). It draws, inside the
 * container: a source picker, one input per setting (GET /api/whatif/keys; empty: as recorded), Predict and Verify,
 * and per loop a table of the headline figures: recorded, predicted [interval], measured (after Verify), error %.
 * Values go to the server as typed: whatif parses them itself and its refusals are shown as they come. Every
 * element's id starts with bs-whatif-.
 */
import { el, fillSources, fmt, injectStyle, plainApi } from "./compare_view.js";

const PREDICT_TIMEOUT_MS = 180000;
const POLL_MS = 1000;
// telemetry/whatif/settings.KEYS, for a server that does not say (GET /api/whatif/keys is the source)
const KEYS = ["mode", "max_batch_tokens", "itl_target_ms", "max_running", "num_blocks", "mixed_graphs", "rate",
  "arrival", "burstiness", "requests", "prompt_tokens", "new_tokens", "seed"];
const HINTS = {
  mode: "sync / async", max_batch_tokens: "N or adaptive", itl_target_ms: "ms", max_running: "N",
  num_blocks: "N", mixed_graphs: "on / off", rate: "x recorded", arrival: "burst / poisson / gamma",
  burstiness: "gamma shape", requests: "N", prompt_tokens: "N or MIN:MAX", new_tokens: "N or MIN:MAX", seed: "N",
};
// the rows of each table: a figure, and its percentile where it has them
const ROWS = [["output_tokens_per_s", null, "output tok/s"], ["ttft_ms", "p50", "TTFT p50 ms"],
  ["ttft_ms", "p99", "TTFT p99 ms"], ["itl_ms", "p50", "ITL p50 ms"], ["itl_ms", "p99", "ITL p99 ms"],
  ["tpot_ms", "p50", "TPOT p50 ms"], ["e2e_ms", "p50", "E2E p50 ms"], ["e2e_ms", "p99", "E2E p99 ms"],
  ["busy_pct", null, "busy %"], ["step_ms", "p50", "step p50 ms"], ["step_ms", "p99", "step p99 ms"]];

function pick(figures, name, q) {
  if (!figures) return null;
  const v = figures[name];
  return q ? (v ? v[q] : null) : v;
}

export function mount(container, api) {
  const call = api || plainApi;
  injectStyle();
  const source = el("select", { id: "bs-whatif-source", "aria-label": "recording" });
  const refresh = el("button", { id: "bs-whatif-refresh", type: "button", title: "reload the list", text: "↻" });
  const runs = el("input", { id: "bs-whatif-runs", type: "number", min: "1", max: "5", value: "3", style: "width:3em",
    title: "simulations per prediction (the interval)" });
  const predict = el("button", { id: "bs-whatif-predict", type: "button", text: "Predict" });
  const verify = el("button", { id: "bs-whatif-verify", type: "button", text: "Verify", disabled: "",
    title: "run it for real on this server's engine" });
  const status = el("span", { id: "bs-whatif-status", class: "bs-muted" });
  const keys = el("div", { id: "bs-whatif-keys", class: "bs-row" });
  const error = el("div", { id: "bs-whatif-error", class: "bs-error" });
  const notes = el("ul", { id: "bs-whatif-notes", class: "bs-muted" });
  const tables = el("div", { id: "bs-whatif-tables" });
  container.replaceChildren(el("div", { class: "bs-analysis", id: "bs-whatif-view" },
    el("div", { class: "bs-row" }, el("label", { text: "recording " }, source), refresh,
       el("label", { text: "runs " }, runs), predict, verify, status),
    keys, error, notes, tables));

  const view = { result: null, verifyId: null };
  let polling = null;

  function drawKeys(names) {
    keys.replaceChildren(...names.map(k => el("label", { title: HINTS[k] || "" }, k + " ",
      el("input", { id: "bs-whatif-key-" + k, "data-key": k, placeholder: HINTS[k] || "", size: "9" }))));
  }

  function settings() {
    const out = {};
    for (const input of keys.querySelectorAll("input[data-key]")) {
      const v = input.value.trim();
      if (v) out[input.dataset.key] = v;
    }
    return out;
  }

  function body() {
    return { recording: source.value, set: settings(), runs: Math.min(5, Math.max(1, parseInt(runs.value, 10) || 3)) };
  }

  async function load() {
    try {
      const [{ sources }, known] = await Promise.all([call("/api/recordings/sources"),
        call("/api/whatif/keys").catch(() => ({ keys: KEYS }))]);
      fillSources(source, sources);
      if (!keys.children.length) drawKeys(known.keys || KEYS);
      predict.disabled = !sources.length;
      status.textContent = sources.length ? "" : "nothing recorded yet: record a load (or load a replay)";
    } catch (e) {
      error.textContent = "sources: " + e.message;
    }
  }

  async function runPredict() {
    error.textContent = "";
    predict.disabled = verify.disabled = true;
    status.textContent = "predicting…";
    try {
      view.result = await call("/api/whatif", "POST", body(), PREDICT_TIMEOUT_MS);
      view.asked = body();
      draw(view.result);
      status.textContent = "";
      verify.disabled = false;
    } catch (e) {
      error.textContent = e.message;
      status.textContent = "";
    } finally {
      predict.disabled = false;
    }
  }

  async function runVerify() {
    error.textContent = "";
    verify.disabled = predict.disabled = true;
    status.textContent = "starting the verify…";
    try {
      const started = await call("/api/whatif/verify", "POST", view.asked || body());
      view.verifyId = started.verify_id;
      container.dataset.verify = started.verify_id;
      poll();
    } catch (e) {            // a 409 says which command verifies it, or what holds the engine
      error.textContent = e.message;
      status.textContent = "";
      verify.disabled = predict.disabled = false;
    }
  }

  async function poll() {
    clearTimeout(polling);
    let s;
    try {
      s = await call("/api/whatif/verify/" + encodeURIComponent(view.verifyId));
    } catch (e) {
      error.textContent = e.message;
      verify.disabled = predict.disabled = false;
      return;
    }
    if (s.state === "running") {
      status.textContent = `verifying: ${s.phase || ""} — ${s.progress.done}/${s.progress.total} requests`;
      polling = setTimeout(poll, POLL_MS);
      return;
    }
    verify.disabled = predict.disabled = false;
    status.textContent = s.state === "done" ? "verified on this server's engine" : "";
    container.dataset.verifyState = s.state;
    if (s.state !== "done") error.textContent = `verify ${s.state}: ${s.error || ""}`;
    if (s.result) { view.result = s.result; draw(s.result); }
  }

  function draw(r) {
    notes.replaceChildren(...(r.notes || []).map(n => el("li", { text: n })));
    tables.replaceChildren(...Object.entries(r.modes).map(([mode, entry]) => table(mode, entry)));
  }

  function table(mode, entry) {
    const rec = entry.recorded, p = entry.predicted, m = entry.measured, err = entry.error_pct;
    const iv = p.interval || { low: {}, high: {} };
    const rows = ROWS.map(([name, q, label]) => {
      const lo = pick(iv.low, name, q), hi = pick(iv.high, name, q);
      const e = err ? pick(err, name, q) : null;
      const inside = entry.within_interval ? pick(entry.within_interval, name, q) : null;
      return el("tr", { "data-figure": name + (q ? "." + q : "") },
        el("td", { text: label }), el("td", { text: fmt(pick(rec, name, q)) }),
        el("td", { text: fmt(pick(p, name, q)) + (lo !== null && hi !== null ? ` [${fmt(lo)}–${fmt(hi)}]` : "") }),
        el("td", { class: "bs-measured", text: m ? fmt(pick(m, name, q)) : "" }),
        el("td", { class: inside === false ? "bs-slower" : "", text: e !== null && e !== undefined ? (e > 0 ? "+" : "") + fmt(e, 1) + "%" : "" }));
    });
    const head = el("tr", {}, ...[`${mode} loop`, "recorded", "predicted [interval]", "measured", "error %"]
      .map(t => el("th", { text: t })));
    const more = [`${fmt(rec.requests, 0)} requests recorded`, `${fmt(p.preemptions, 0)} preemptions predicted`];
    if (p.extrapolated && p.extrapolated.share_pct) more.push(`${fmt(p.extrapolated.share_pct, 1)}% of steps extrapolated`);
    return el("div", { id: "bs-whatif-mode-" + mode },
      el("table", { id: "bs-whatif-table-" + mode }, el("thead", {}, head), el("tbody", {}, ...rows)),
      el("div", { class: "bs-muted", text: more.join(" · ") }));
  }

  predict.addEventListener("click", runPredict);
  verify.addEventListener("click", runVerify);
  refresh.addEventListener("click", load);
  load();
  view.refresh = load;
  view.predict = runPredict;
  view.verify = runVerify;
  return view;
}
