/* The sticky header (#bs-header, rendered by app/ui.py): the mode badge and its sync/async toggle, the live
 * counters, and the status line. The server's messages and /api/status keep it current. */
import { api, socket } from "./api.js";
import { state } from "./feed.js";
import { $, fmt, note, pick, setText } from "./util.js";

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
    setMode((res && (res.mode || res.to)) || m);
    note("mode → " + m, false);
  } catch (e) {
    note("mode switch failed: " + e.message, true);
  } finally {
    if (badge) badge.classList.remove("pending");
  }
}

export function showStats(s) {
  const kvUsed = pick(s, "kv_blocks_used"), kvTotal = pick(s, "kv_blocks_total");
  let kv = pick(s, "kv_usage_pct", "kv_pct", "kv_usage", "kv_used_pct");
  if (kv === undefined && kvUsed !== undefined && kvTotal) kv = 100 * kvUsed / kvTotal;
  else if (kv !== undefined && kv <= 1 && pick(s, "kv_usage") !== undefined && pick(s, "kv_usage_pct", "kv_pct") === undefined) kv = 100 * kv;
  setText("bs-st-running", fmt(pick(s, "running", "num_running")));
  setText("bs-st-waiting", fmt(pick(s, "waiting", "queue_depth", "queued", "queue")));
  setText("bs-st-kv", fmt(kv) + "%");
  setText("bs-st-busy", fmt(pick(s, "busy_pct_1s", "busy_pct")) + "%");
  const util = pick(s, "nvml_util", "gpu_util");
  if (util !== undefined) setText("bs-st-nvml", fmt(util) + "%");
  setText("bs-st-tps", fmt(pick(s, "tokens_per_s", "output_tokens_per_s")));
  if (s.mode) setMode(s.mode);
}

// The status line: model, device, GPU, NVML. Python renders it first; this keeps it right after reconnects.
export function showStatus(s) {
  const model = pick(s, "model", "model_name");
  const device = pick(s, "device");
  const gpu = pick(s, "gpu_name", "gpu");
  if (model) setText("bs-model", typeof model === "string" ? model : (model.name || JSON.stringify(model)));
  if (device) setText("bs-device", String(device));
  if (gpu !== undefined) setText("bs-gpu", typeof gpu === "string" ? gpu : (gpu && gpu.name) || "none");
  const nv = pick(s, "nvml_available", "nvml");
  if (typeof nv === "boolean") setText("bs-nvml", nv ? "available" : "not available");
}

// The websocket carries the mode and the counters; this poll keeps them right while it is down.
export async function pollStatus() {
  if (!state.live || document.hidden) return;
  try {
    const s = await api("/api/status", "GET", undefined, 5000);
    if (s && s.mode) setMode(s.mode);
    if (!socket.open && s) showStats(s);
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
