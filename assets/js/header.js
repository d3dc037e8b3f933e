/* The sticky header (#bs-header, rendered by app/ui/page_html.py): the mode badge and its sync/async toggle, the live
 * counters, and the status line. The server's messages and /api/status keep it current. While the charts show
 * a replay, the header describes the replay instead (showView): no "live" badge, no toggle, the recording's
 * device and NVML; back to live puts the engine's back. */
import { api, socket } from "./api.js";
import { state } from "./feed.js";
import { busyLabel } from "./palette.js";
import { $, fmt, note, setText } from "./util.js";

const CONN_TEXT = { live: "live", connecting: "connecting…", reconnecting: "reconnecting…", error: "offline",
                    replay: "replay" };
const seen = { conn: null, status: null, view: "" };   // the live side, kept while a replay is shown

// the same words as app/ui/page_html.py WHY_IMPORT
const WHY_IMPORT = "An imported profiler trace: busy % is what the device did, the union of its kernels, copies and " +
  "memsets over the steps' window. The steps' compute spans (between steps only) count the launch gaps inside a " +
  "step as busy, so that figure reads higher.";

const viewingReplay = () => state.view.source === "replay";

export function setConn(conn) {
  if (conn !== "replay") seen.conn = conn;
  const el = $("bs-conn");
  if (!el) return;
  const shown = viewingReplay() ? "replay" : conn;
  el.dataset.state = shown;
  el.textContent = CONN_TEXT[shown] || shown;
}

// Every "stats" message carries the mode: the page is changed only when the mode is not what it shows (each
// write, even of the same value, is a DOM mutation Gradio's observers wake for, and a new layout).
export function setMode(m) {
  if (m !== "sync" && m !== "async") return;
  state.mode = m;
  const badge = $("bs-mode");
  if (badge && !viewingReplay()) {
    if (badge.dataset.mode !== m) badge.dataset.mode = m;
    setText("bs-mode", m);
  }
  for (const k of ["sync", "async"]) {
    const b = $("bs-mode-" + k), on = k === m;
    if (!b) continue;
    if (b.classList.contains("active") !== on) b.classList.toggle("active", on);
    if (b.getAttribute("aria-pressed") !== String(on)) b.setAttribute("aria-pressed", String(on));
  }
}

export async function requestMode(m) {
  if (!state.live) return;
  if (viewingReplay()) { note("showing a replay: go back to live to switch the engine's mode", true); return; }
  if (m === state.mode) return;
  const badge = $("bs-mode");
  if (badge) badge.classList.add("pending");
  try {
    const res = await api("/api/mode", "POST", { mode: m });
    // the server answers with the engine's mode; the websocket "mode" message marks the switch on the charts
    setMode(res.mode);
    note("mode → " + m, false);
  } catch (e) {
    note("mode switch failed: " + (/fetch|network/i.test(e.message) ? "the server cannot be reached" : e.message), true);
  } finally {
    if (badge) badge.classList.remove("pending");
  }
}

// The engine's counters, named alike in /api/status and in the websocket's "stats" message (app/server/schemas.py
// EngineCounters): `queue` waiting for admission, `running`, and `kv_usage`, the share of KV blocks in use.
export function showCounters(c) {
  setText("bs-st-running", fmt(c.running));
  setText("bs-st-queue", fmt(c.queue));
  setText("bs-st-kv", (c.kv_usage === null || c.kv_usage === undefined ? "–" : fmt(100 * c.kv_usage)) + "%");
  if (c.mode) setMode(c.mode);
}

// A "stats" message: the counters plus the last second's event busy % and tokens/s.
export function showStats(s) {
  showCounters(s);
  setText("bs-st-busy", fmt(s.busy_pct_1s) + "%");
  setText("bs-st-tps", fmt(s.tokens_per_s));
}

// From the "requests" messages: the median time to first token of the latest requests (feed.js recentLatency).
export function showRequests(r) {
  setText("bs-st-ttft", r.ttftMs === null ? "–" : fmt(r.ttftMs) + " ms");
  const el = $("bs-st-ttft"), title = r.requests + " requests got their first token in the last " + r.windowS + " s";
  if (el && el.title !== title) el.title = title;
}

// The status line: model, device, GPU, NVML, from /api/status or the hello message (the same names in both).
// Python renders it first; this keeps it right after reconnects.
export function showStatus(s) {
  seen.status = Object.assign({}, seen.status, s);
  if (viewingReplay()) return;
  if (s.model) setText("bs-model", s.model);
  if (s.device) setText("bs-device", s.device);
  setText("bs-gpu", s.gpu_name || "none");
  setText("bs-nvml", s.nvml_available ? "available" : "not available");
  if (s.nvml_reason !== undefined) setText("bs-nvml-note", !s.nvml_available && s.nvml_reason ? "(" + s.nvml_reason + ")" : "");
}

// The header follows what the charts show: a replay's model, device and NVML, or the live engine's.
export function showView() {
  const replay = viewingReplay() ? state.view.replay : null;
  const key = replay ? "replay:" + state.view.replayName + ":" + replay.steps.length : "live";
  if (key === seen.view) return;
  seen.view = key;
  const hdr = $("bs-header");
  if (hdr) hdr.classList.toggle("bs-viewing-replay", !!replay);
  const badge = $("bs-mode");
  if (replay) {
    const m = replay.meta || {};
    if (badge) { badge.dataset.mode = "replay"; badge.textContent = "replay"; }
    setText("bs-model", m.model || "?");
    setText("bs-device", m.device || "?");
    setText("bs-gpu", m.gpu || "none");
    setText("bs-view-title", (state.view.replayName ? state.view.replayName + ": " : "") + (m.model || "?") + " on " + (m.gpu || m.device || "?"));
    const gpuSamples = replay.nvml.filter(x => x.gpu_util !== null && x.gpu_util !== undefined).length;
    setText("bs-nvml", gpuSamples ? "recorded" : "not recorded");
    const onGpu = gpuSamples > 0 || String(m.device || "").startsWith("cuda");
    showWhy((replay.summary || {}).busy_basis === "device_ops" ? WHY_IMPORT
      : onGpu ? ((m.status && m.status.busy_note) || "gpu") : "cpu");
    setText("bs-nvml-note", gpuSamples ? "(" + gpuSamples + " samples in the recording)"
      : replay.nvml.length ? "(host CPU % samples only)" : "(no samples in the recording)");
    if (!state.live) showReplayBusy(replay.summary || {});
    setConn("replay");
  } else if (state.live) {
    showWhy(null);
    if (state.mode) setMode(state.mode);
    if (seen.status) {
      showStatus(seen.status);
      const st = seen.status;
      if (st.model) setText("bs-view-title", st.model + " on " + (st.gpu_name || st.device || "?"));
    }
    setConn(seen.conn || (socket.open ? "live" : "connecting"));
  }
}

// A replay-only server's header shows the recording's headline busy (app/ui/page_html.py replay_busy): an
// imported trace's is the device's own, batchscope's own its CUDA events'. (A live server's header keeps the
// engine's counters while a replay is shown, labelled "live engine".)
function showReplayBusy(sm) {
  const basis = sm.busy_basis;
  setText("bs-st-busy-label", busyLabel(basis));
  setText("bs-st-busy", sm.busy_pct === null || sm.busy_pct === undefined ? "–" : fmt(sm.busy_pct, 1) + "%");
}

// The explainer under the header: why NVML and event busy % differ on a GPU, or what a CPU run lacks. `which`
// is "gpu", "cpu", a recording's own note, or null for the page's first text (the live engine's).
function showWhy(which) {
  const el = $("bs-why");
  if (!el) return;
  if (seen.why === undefined) seen.why = el.textContent;
  const text = which === null ? seen.why : which === "gpu" ? el.dataset.gpu : which === "cpu" ? el.dataset.cpu : which;
  if (text && el.textContent !== text) { el.textContent = text; el.title = text; }
}

// Without NVML the header shows this server's own CPU (the NVML sample's proc_cpu_pct, % of one core), not the
// host's: the host's also counts the browser drawing this page, which alone reads 50% and more on a small box.
export function showServerCpu(sample) {
  const el = $("bs-st-cpu");
  if (!el || !sample) return;
  setText("bs-st-cpu", fmt(sample.proc_cpu_pct) + "%");
  const host = sample.cpu_pct === null || sample.cpu_pct === undefined ? "" : "; the whole host: " + fmt(sample.cpu_pct) + "% of all cores";
  const title = "this batchscope server's process: " + fmt(sample.proc_cpu_pct) + "% of one core" + host;
  if (el.title !== title) el.title = title;
}

// The websocket carries the mode and the counters; this poll keeps them right while it is down.
export async function pollStatus() {
  if (!state.live || document.hidden) return;
  try {
    const s = await api("/api/status", "GET", undefined, 5000);
    if (s.mode) setMode(s.mode);
    if (!socket.open) showCounters(s);
    seen.status = Object.assign({}, seen.status, { model: s.model, device: s.device, gpu_name: s.gpu_name,
                                                   nvml_available: s.nvml_available, nvml_reason: s.nvml_reason });
  } catch (e) { /* the connection badge already tells */ }
}

// Gradio may render the header again: bind each toggle button once, whenever it (re)appears.
export function bindHeader() {
  for (const k of ["sync", "async"]) {
    const b = $("bs-mode-" + k);
    if (b && !b.dataset.bound) {
      b.dataset.bound = "1";
      b.addEventListener("click", () => requestMode(k));
      if (!state.live) b.disabled = true;
    }
  }
  const badge = $("bs-mode");
  if (badge && badge.dataset.mode && !state.mode) setMode(badge.dataset.mode);
}
