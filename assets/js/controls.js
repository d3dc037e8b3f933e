/* The toolbar above the charts: pause and window width, downloads, named recordings, loading a replay, and
 * the replay bar. It builds the chart containers too (#bs-gantt, and one per chart charts.js registers), inside
 * #bs-scope. */
import { api, withToken } from "./api.js";
import { CHARTS } from "./charts.js";
import { followLive, replayRange, state } from "./feed.js";
import { normalise } from "./records.js";
import { tensorParallel } from "./tensor_parallel.js";
import { notInTrace } from "./unknown.js";
import { setConn } from "./header.js";
import { $, note, setText } from "./util.js";
import { mountProfile } from "./profile.js";
import { VIEW_CHANGED } from "./plot.js";

// Controls that need an engine; a replay-only server disables them.
const LIVE_ONLY = ["bs-rec", "bs-rec-name", "bs-rec-list", "bs-pause"];
// What the download buttons save: the live recording, or the replay on screen (the server holds the same copy).
const DOWNLOADS = {
  live: { json: "/api/timeline.json?download=true", trace: "/api/trace.json?download=true", name: "batchscope-timeline" },
  replay: { json: "/api/replay.json?download=true", trace: "/api/replay/trace.json?download=true", name: "batchscope-replay" },
};

function scopeHtml() {
  return `
    <div class="bs-toolbar">
      <span class="bs-group">
        <span id="bs-conn" class="bs-conn" data-state="connecting">connecting…</span>
        <button id="bs-pause" class="bs-btn" title="Freeze the window (data keeps arriving)">Pause</button>
        <span class="bs-seg" id="bs-window" title="Window width">
          <button data-span="2">2 s</button><button data-span="5">5 s</button><button data-span="10" class="active">10 s</button><button data-span="30">30 s</button><button data-span="120">2 min</button><button data-span="all">all</button>
        </span>
        <span class="bs-counter" id="bs-counter"></span>
      </span>
      <span class="bs-group">
        <a id="bs-dl-json" class="bs-btn" href="${withToken("/api/timeline.json?download=true")}" download="batchscope-timeline.json" title="The recording so far: batchscope.timeline/1 JSON">⤓ timeline JSON</a>
        <a id="bs-dl-trace" class="bs-btn" href="${withToken("/api/trace.json?download=true")}" download="batchscope-trace.json" title="Chrome Trace Event format: open in ui.perfetto.dev">⤓ Perfetto trace</a>
      </span>
      <span class="bs-group" id="bs-rec-group">
        <input id="bs-rec-name" class="bs-input" placeholder="recording name" size="14">
        <button id="bs-rec" class="bs-btn" title="Start a named recording (kept in this server's memory until it stops: download it to keep it)">● record</button>
        <select id="bs-rec-list" class="bs-input" title="Download a named recording. Recordings live in this server's memory: they are gone when it stops."><option value="">recordings…</option></select>
      </span>
      <span class="bs-group">
        <button id="bs-load" class="bs-btn" title="Load a downloaded timeline JSON, or a profiler trace (torch.profiler, vLLM, SGLang; .json or .json.gz), and view it here">⤒ load replay</button>
        <input id="bs-file" type="file" accept=".json,.gz,application/json,application/gzip" hidden>
      </span>
      <span id="bs-msg" class="bs-msg" role="status"></span>
    </div>
    <div id="bs-replay-bar" class="bs-replay-bar" hidden>
      <span id="bs-replay-text"></span>
      <button id="bs-back-live" class="bs-btn">back to live</button>
    </div>
    <div class="bs-gantt-wrap"><canvas id="bs-gantt-canvas"></canvas><div id="bs-gantt" class="bs-plot bs-gantt"></div></div>
    <div id="bs-legend" class="bs-legend"></div>
    <div class="bs-grid">
      ${CHARTS.map(id => `<div id="${id}" class="bs-plot bs-chart"></div>`).join("\n      ")}
    </div>`;
}

// Something the user did changed what to draw: show it in the controls and draw it at the next turn.
function changed() {
  syncControls();
  state.dirty = true;
}

export function buildScope(el) {
  el.innerHTML = scopeHtml();            // Pause and the window buttons are bound by view.js
  $("bs-rec").onclick = toggleRecording;
  $("bs-rec-list").onchange = ev => {
    const name = ev.target.value;
    if (!name) return;
    const a = document.createElement("a");
    a.href = withToken("/api/timeline.json?download=true&recording=" + encodeURIComponent(name));
    a.download = "batchscope-" + name + ".json";
    document.body.appendChild(a); a.click(); a.remove();
    ev.target.value = "";
  };
  $("bs-load").onclick = () => $("bs-file").click();
  $("bs-file").onchange = ev => { const f = ev.target.files[0]; ev.target.value = ""; if (f) loadReplayFile(f); };
  $("bs-back-live").onclick = backToLive;
  mountProfile($("bs-rec-group"), showReplay);     // the profiler window's controls, beside the recording's
  if (!state.live) disableLiveOnly();
  syncControls();
}

function disableLiveOnly() {
  for (const id of LIVE_ONLY) {
    const x = $(id); if (x) { x.setAttribute("disabled", ""); x.classList.add("disabled"); }
  }
  $("bs-back-live").hidden = true;
  $("bs-rec-group").hidden = true;       // nothing to record without an engine
}

document.addEventListener(VIEW_CHANGED, () => syncControls());   // a zoom or a double-click on a chart

export function syncControls() {
  const view = state.view;
  const p = $("bs-pause");
  if (p) {
    p.textContent = view.follow ? "Pause" : "Resume live";
    p.classList.toggle("paused", !view.follow);
    p.hidden = view.source !== "live";
  }
  // a zoom (a drag on a chart, the switch view) shows no window width: no button stays lit
  const want = view.zoomed ? "" : view.span === Infinity ? "all" : String(view.span / 1e6);
  for (const b of document.querySelectorAll("#bs-window button")) b.classList.toggle("active", b.dataset.span === want);
  const dl = DOWNLOADS[view.source === "replay" ? "replay" : "live"];
  for (const [id, key, ext] of [["bs-dl-json", "json", ".json"], ["bs-dl-trace", "trace", ".trace.json"]]) {
    const a = $(id);
    if (!a) continue;
    const href = withToken(dl[key]);
    if (a.getAttribute("href") !== href) { a.setAttribute("href", href); a.setAttribute("download", dl.name + ext); }
    a.title = (view.source === "replay" ? "The replay on screen" : "The live recording so far") +
      (key === "json" ? ": batchscope.timeline/1 JSON" : ": Chrome Trace Event format, open in ui.perfetto.dev");
  }
  const bar = $("bs-replay-bar");
  if (bar) bar.hidden = view.source !== "replay";
  if (state.root) state.root.dataset.source = view.source;
}

// ---------------------------------------------------------------- recordings

function showRecording(name) {
  const input = $("bs-rec-name"), btn = $("bs-rec");
  input.value = name || ""; input.disabled = !!name;
  btn.textContent = name ? "■ stop" : "● record";
  btn.classList.toggle("recording", !!name);
}

async function toggleRecording() {
  try {
    if (!state.recording) {
      const input = $("bs-rec-name");
      const name = (input.value || "").trim() || ("run-" + new Date().toISOString().slice(11, 19).replace(/:/g, ""));
      await api("/api/recording/start", "POST", { name });
      state.recording = name;
      showRecording(name);
      note("recording “" + name + "”", false);
    } else {
      const res = await api("/api/recording/stop", "POST", {});
      note("saved “" + res.recording + "” (" + res.stored.steps + " steps)", false);
      state.recording = null;
      showRecording(null);
      refreshRecordings();
    }
  } catch (e) {
    note("recording: " + e.message, true);
  }
}

// GET /api/recordings: {recordings: [names], active: name or null, details: [{name, steps, ...}], limits}.
export async function refreshRecordings() {
  if (!state.live) return;
  try {
    const res = await api("/api/recordings", "GET", undefined, 5000);
    const sel = $("bs-rec-list");
    if (!sel) return;
    const options = res.details.map(rec => [rec.name, "⤓ " + rec.name + " · " + rec.steps + " steps"]);
    const key = JSON.stringify(options);
    if (sel.dataset.shown !== key) {        // polled every 10 s: rebuilt only when the list changed
      sel.innerHTML = `<option value="">recordings (${res.details.length}, until the server stops)…</option>`;
      for (const [name, text] of options) {
        const o = document.createElement("option");
        o.value = name;
        o.textContent = text;
        sel.appendChild(o);
      }
      sel.dataset.shown = key;
    }
    // a recording started elsewhere (API, another tab) shows as running here too
    if (res.active && !state.recording) {
      state.recording = res.active;
      showRecording(res.active);
    }
  } catch (e) { /* list is optional */ }
}

// ---------------------------------------------------------------- replay

// A profiler trace (Chrome-trace JSON, gzipped or not) and a gzipped timeline go to the server as they are: it
// tells a trace from a timeline by the content, as here (app/server/replay.py), and imports the trace. A plain
// timeline is checked here first, so that a wrong file fails with a reason before it is sent.
const SNIFF_BYTES = 1 << 20;
const IMPORT_TIMEOUT_MS = 600000;          // a large trace takes the server minutes to import

async function forTheServer(file) {
  const head = new Uint8Array(await file.slice(0, SNIFF_BYTES).arrayBuffer());
  if (head[0] === 0x1f && head[1] === 0x8b) return true;      // gzip: the server unpacks it
  const text = new TextDecoder().decode(head);
  if (/^\s*\[\s*\{/.test(text)) return true;                  // a bare array of trace events
  return !/"schema"\s*:\s*"batchscope\.timeline\//.test(text) && text.includes('"traceEvents"');
}

async function loadOnTheServer(file) {
  note("importing " + file.name + " on the server…", false);
  try {
    await api("/api/replay?name=" + encodeURIComponent(file.name), "POST", file, IMPORT_TIMEOUT_MS);
  } catch (e) {
    note("replay rejected: " + e.message, true);
    return;
  }
  let shown;
  try { shown = await api("/api/replay.json", "GET", undefined, 60000); } catch (e) {
    note("cannot fetch the imported replay: " + e.message, true);
    return;
  }
  showReplay(shown, file.name);               // the server's copy: the timeline it made, with its board
}

async function loadReplayFile(file) {
  try {
    if (await forTheServer(file)) return loadOnTheServer(file);
  } catch (e) {
    note("cannot replay " + file.name + ": " + e.message, true);
    return;
  }
  let text, obj;
  try {
    text = await file.text();
    obj = JSON.parse(text);
    normalise(obj);                        // fail early, with a readable reason
  } catch (e) {
    note("cannot replay " + file.name + ": " + e.message, true);
    return;
  }
  // The server validates the file too (schema, JSON Schema) and keeps it for /api/replay.json.
  try {
    await api("/api/replay", "POST", text, 60000);
  } catch (e) {
    note("replay rejected: " + e.message, true);
    return;
  }
  let shown = obj;
  try { shown = await api("/api/replay.json", "GET", undefined, 60000) || obj; } catch (e) { /* use the local copy */ }
  showReplay(shown, file.name);               // the server's copy carries the board it computed
}

// meta.model, meta.device and meta.gpu: batchscope.timeline/1 (docs/timeline.md)
function replayTitle(tl, name) {
  const m = tl.meta, tp = tensorParallel(tl);
  return `Replay: ${name} · ${m.model || "?"} on ${m.device || "?"}` + (m.gpu ? " (" + m.gpu + ")" : "") +
    (tp.size > 1 ? ` · tensor parallel ×${tp.size}` : "") +
    ` · ${tl.steps.length} steps · ` +
    (notInTrace(tl).has("request_ids") ? "requests not in the trace" : `${tl.requests.length} requests`) +
    ` · ${tl.mode_changes.length} mode switches`;
}

export function showReplay(obj, name, board) {
  let tl;
  try { tl = normalise(obj); } catch (e) { note("cannot replay: " + e.message, true); return; }
  const view = state.view;
  view.source = "replay";
  view.replay = tl;
  // the scoreboard of the whole recording: the server's (POST /api/replay answers it; its copy carries it)
  view.replayBoard = board || (tl.summary && tl.summary.board) || null;
  state.boardGen++;
  view.replayName = name || "timeline";
  view.follow = false;
  view.span = Infinity;
  view.range = replayRange();
  setText("bs-replay-text", replayTitle(tl, view.replayName));
  if (!state.live) setConn("replay");
  changed();
  document.dispatchEvent(new CustomEvent("bs-source"));   // what follows the timeline shown (tail.js)
  note("replaying " + view.replayName, false);
}

export function backToLive() {
  followLive();
  changed();
  document.dispatchEvent(new CustomEvent("bs-source"));
}

// ---------------------------------------------------------------- the mode lock
// While an A/B runs the server refuses mode switches (POST /api/mode answers 409 with the reason): the toggle is
// greyed out and says why. GET /api/mode tells {mode, locked, reason}; it is polled because the A/B may have been
// started by any client, and looked at again right after this page starts one (app/ui/load_tab.py calls soon()).
const MODE_BUTTONS = ["bs-mode-sync", "bs-mode-async"];
const LOCK_POLL_MS = 2000;
let lockShown = null;

export function showModeLock(reason) {
  reason = reason || null;
  const locked = document.querySelector(".bs-locked");
  if (reason === lockShown && !!locked === !!reason) return;     // nothing changed (the usual case)
  for (const id of MODE_BUTTONS) {
    const b = $(id);
    if (!b) continue;
    if (reason) {
      if (!b.classList.contains("bs-locked")) b.dataset.titleUnlocked = b.title;
      b.classList.add("bs-locked");
      b.disabled = true;
      b.setAttribute("aria-disabled", "true");
      b.title = "Locked: " + reason;
    } else if (b.classList.contains("bs-locked")) {
      b.classList.remove("bs-locked");
      b.disabled = !state.live;
      b.removeAttribute("aria-disabled");
      b.title = b.dataset.titleUnlocked || "";
    }
    // a disabled button may show no tooltip: its group carries the reason too
    const group = b.parentElement;
    if (group) group.title = reason ? "Locked: " + reason : "";
  }
  if (reason && lockShown !== reason) note("mode toggle locked: " + reason, false);
  lockShown = reason;
}

async function checkModeLock() {
  if (!state.live || document.hidden) return;
  try {
    const m = await api("/api/mode", "GET", undefined, 5000);
    showModeLock(m.locked ? m.reason : null);
  } catch (e) { /* the connection badge already tells */ }
}

if (!window.batchscopeModeLock) {
  window.batchscopeModeLock = {
    timer: setInterval(checkModeLock, LOCK_POLL_MS),
    // an A/B needs a moment to register: look twice
    soon() { setTimeout(checkModeLock, 300); setTimeout(checkModeLock, 1000); },
  };
}
