/* The sticky header (#bs-header, rendered by app/ui.py): the mode badge and its sync/async toggle, the live
 * counters, and the status line. The server's messages and /api/status keep it current. */
import { api, socket } from "./api.js";
import { state } from "./feed.js";
import { $, fmt, note, setText } from "./util.js";

const CONN_TEXT = { live: "live", connecting: "connecting…", reconnecting: "reconnecting…", error: "offline",
                    replay: "replay" };

export function setConn(conn) {
  const el = $("bs-conn");
  if (!el) return;
  el.dataset.state = conn;
  el.textContent = CONN_TEXT[conn] || conn;
}

export function setMode(m) {
  if (m !== "sync" && m !== "async") return;
  state.mode = m;
  const badge = $("bs-mode");
  if (badge) { badge.dataset.mode = m; badge.textContent = m; }
  for (const k of ["sync", "async"]) {
    const b = $("bs-mode-" + k);
    if (b) { b.classList.toggle("active", k === m); b.setAttribute("aria-pressed", k === m ? "true" : "false"); }
  }
}

async function requestMode(m) {
  if (!state.live || m === state.mode) return;
  const badge = $("bs-mode");
  if (badge) badge.classList.add("pending");
  try {
    const res = await api("/api/mode", "POST", { mode: m });
    // the server answers with the engine's mode; the websocket "mode" message marks the switch on the charts
    setMode(res.mode);
    note("mode → " + m, false);
  } catch (e) {
    note("mode switch failed: " + e.message, true);
  } finally {
    if (badge) badge.classList.remove("pending");
  }
}

// The engine's counters, named alike in /api/status and in the websocket's "stats" message (app/schemas.py
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
  const el = $("bs-st-ttft");
  if (el) el.title = r.requests + " requests got their first token in the last " + r.windowS + " s";
}

// The status line: model, device, GPU, NVML, from /api/status or the hello message (the same names in both).
// Python renders it first; this keeps it right after reconnects.
export function showStatus(s) {
  if (s.model) setText("bs-model", s.model);
  if (s.device) setText("bs-device", s.device);
  setText("bs-gpu", s.gpu_name || "none");
  setText("bs-nvml", s.nvml_available ? "available" : "not available");
}

// The websocket carries the mode and the counters; this poll keeps them right while it is down.
export async function pollStatus() {
  if (!state.live || document.hidden) return;
  try {
    const s = await api("/api/status", "GET", undefined, 5000);
    if (s.mode) setMode(s.mode);
    if (!socket.open) showCounters(s);
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
