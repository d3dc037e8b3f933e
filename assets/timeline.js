/* batchscope live timelines.
 *
 * Loaded from the page <head> (app/ui.py). It draws into #bs-scope (a gr.HTML block) and keeps the sticky
 * header (#bs-header) current. Data comes from the websocket /ws/telemetry (live) or from a timeline JSON
 * (replay); both land in the same shape, so the same render code draws them:
 *   {steps: [...], nvml: [...], requests: [...], mode_changes: [...], meta: {...}}
 * Times are microseconds since the recording start; the x axes show seconds.
 *
 * Plain script, no build step. Plotly is served by the app at /batchscope-static/plotly.min.js.
 */
(function () {
  "use strict";
  if (window.batchscope) return;            // the head can be injected twice by some Gradio reloads

  // ---------------------------------------------------------------- constants

  const HOST = ["schedule", "fill", "launch", "wait", "update"];
  const GPU = ["h2d", "compute", "d2h"];
  const COLOR = {
    schedule: "#6366f1", fill: "#ec4899", launch: "#06b6d4", wait: "#cbd5e1", update: "#14b8a6",
    h2d: "#f59e0b", compute: "#16a34a", d2h: "#a855f7",
    sync: "#ea580c", async: "#2563eb",
  };
  // Idle gaps are coloured by what the host was doing meanwhile: a host phase keeps that phase's colour.
  // "empty_queue" (no request at all) is not the host's fault: grey. "host_other" is loop overhead between spans.
  const CAUSE_COLOR = {
    empty_queue: "#94a3b8", none: "#94a3b8", host_other: "#ef4444", h2d: "#f59e0b", d2h: "#a855f7",
  };
  const NO_WORK = new Set(["empty_queue", "none"]);
  const SPARE = ["#b91c1c", "#0f766e", "#7c2d12", "#4d7c0f", "#be185d", "#1e40af"];
  const LANES = [{ key: "mode", label: "mode" }]
    .concat(HOST.map(k => ({ key: k, group: "cpu", label: "host · " + k })))
    .concat(GPU.map(k => ({ key: k, group: "gpu", label: "GPU · " + (k === "compute" ? "compute" : k.toUpperCase()) })))
    .concat([{ key: "idle", label: "GPU idle" }]);
  const LANE_Y = Object.fromEntries(LANES.map((l, i) => [l.key, i]));
  const FONT = { family: "Inter, system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", size: 11, color: "#334155" };
  const GRID = "#eef1f5";
  const GANTT_HEIGHT = 318, GANTT_MARGIN = { l: 108, r: 12, t: 24, b: 26 };
  const KEEP_US = 180e6;                    // live history kept in the browser (the server keeps the recording)
  const KEEP_STEPS = 60000;
  const PLOT_CONFIG = {
    displaylogo: false, responsive: true, displayModeBar: "hover",
    modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d", "toImage"],
  };

  // ---------------------------------------------------------------- state

  const params = new URLSearchParams(location.search);
  const TOKEN = params.get("token");
  const store = emptyStore();               // live data, fed by the websocket
  const view = {
    source: "live",                         // "live" | "replay"
    replay: null,                           // a normalised timeline when source is "replay"
    replayName: "",
    follow: true,                           // live: the window slides with the newest data
    span: 10e6,                             // window width, µs (Infinity = everything)
    range: null,                            // [lo, hi] µs when not following
  };
  let root = null;                          // #bs-scope
  let live = true;                          // false on a replay-only server (no engine)
  let ws = null, wsBackoff = 500, wsOpen = false;
  let dirty = true, renderCost = 20, renders = 0, dropped = 0;
  let mode = null;

  function emptyStore() {
    return { steps: [], nvml: [], mode_changes: [], meta: {}, lastStep: -1,
             lastT: 0, lastTAt: 0 };
  }

  // ---------------------------------------------------------------- helpers

  function withToken(path) {
    if (!TOKEN) return path;
    return path + (path.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(TOKEN);
  }

  function errorText(body, res) {
    if (body && body.error) return String(body.error);
    if (body && body.detail) {
      // FastAPI validation errors come as a list of {loc, msg}
      if (Array.isArray(body.detail)) return body.detail.map(d => (d.loc || []).slice(1).join(".") + ": " + d.msg).join("; ");
      return String(body.detail);
    }
    return res.status + " " + (res.statusText || "error");
  }

  // Every call has a timeout so that a stuck server shows an error instead of a spinner forever.
  async function api(path, method, body, timeoutMs) {
    const headers = {};
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (TOKEN) headers["Authorization"] = "Bearer " + TOKEN;
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), timeoutMs || 15000);
    try {
      const res = await fetch(withToken(path), {
        method: method || "GET", headers, signal: ctl.signal,
        body: body === undefined ? undefined : (typeof body === "string" ? body : JSON.stringify(body)),
      });
      let json = null;
      try { json = await res.json(); } catch (e) { /* not JSON */ }
      if (!res.ok) throw new Error(errorText(json, res));
      return json;
    } catch (e) {
      if (e.name === "AbortError") throw new Error(path + ": no answer within " + Math.round((timeoutMs || 15000) / 1000) + " s");
      throw e;
    } finally {
      clearTimeout(timer);
    }
  }

  function $(id) { return document.getElementById(id); }
  function setText(id, text) { const el = $(id); if (el && el.textContent !== text) el.textContent = text; }
  function pick(obj, ...keys) {
    if (!obj) return undefined;
    for (const k of keys) if (obj[k] !== undefined && obj[k] !== null) return obj[k];
    return undefined;
  }
  function fmt(v, digits) {
    if (v === undefined || v === null || Number.isNaN(v)) return "–";
    return Number(v).toFixed(digits === undefined ? 0 : digits);
  }
  function esc(s) {
    return String(s).replace(/[&<>"']/g, c => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  }
  function causeColor(cause) {
    if (!cause) return CAUSE_COLOR.none;
    if (HOST.includes(cause)) return COLOR[cause];
    if (CAUSE_COLOR[cause]) return CAUSE_COLOR[cause];
    let h = 0;
    for (const ch of String(cause)) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
    return SPARE[h % SPARE.length];
  }
  function note(text, isError) {
    const el = $("bs-msg");
    if (!el) return;
    el.textContent = text;
    el.className = "bs-msg " + (isError ? "bs-error" : "bs-ok");
    clearTimeout(note.timer);
    note.timer = setTimeout(() => { el.textContent = ""; el.className = "bs-msg"; }, isError ? 12000 : 5000);
  }

  // ---------------------------------------------------------------- records

  function span(rec, group, key) {
    const g = rec[group];
    const s = g && g[key];
    return s && s.length === 2 && s[0] !== null && s[1] !== null ? s : null;
  }

  // Cache each step's extent and the instant its GPU work began (where an idle gap ends).
  function prep(r) {
    let s = Infinity, e = -Infinity;
    for (const group of ["cpu", "gpu"]) {
      const g = r[group];
      if (!g) continue;
      for (const k in g) {
        const v = g[k];
        if (!v || v[0] === null || v[0] === undefined) continue;
        if (v[0] < s) s = v[0];
        if (v[1] > e) e = v[1];
      }
    }
    r._s = isFinite(s) ? s : (r.t_us || 0);
    r._e = isFinite(e) ? e : r._s;
    // The compute span: CUDA events on a GPU; on CPU telemetry gives the host launch span instead
    // (compute_basis "host"), since the forward runs inside launch there.
    const ev = span(r, "gpu", "compute");
    const cu = Array.isArray(r.compute_us) && r.compute_us[0] !== null && r.compute_basis !== "none" ? r.compute_us : null;
    r._cs = ev || cu;
    r._hostCompute = !ev && !!cu && r.compute_basis === "host";
    r._c = r._cs ? r._cs[0] : r._s;
    r._tok = pick(r, "tokens_out", "sampled") ?? (r.decode_tokens || 0);
    return r;
  }

  function normalise(obj) {
    if (!obj || typeof obj !== "object") throw new Error("not a JSON object");
    if (!Array.isArray(obj.steps)) throw new Error("no \"steps\" array: is this a batchscope timeline?");
    const steps = obj.steps.filter(s => s && typeof s === "object").map(prep);
    steps.sort((a, b) => a.step - b.step);
    return {
      steps,
      nvml: Array.isArray(obj.nvml) ? obj.nvml.slice().sort((a, b) => a.t_us - b.t_us) : [],
      requests: Array.isArray(obj.requests) ? obj.requests : [],
      mode_changes: Array.isArray(obj.mode_changes) ? obj.mode_changes : [],
      meta: obj.meta || {},
      summary: obj.summary || {},
    };
  }

  function seen(t) {
    if (t > store.lastT) { store.lastT = t; store.lastTAt = performance.now(); }
  }

  function addSteps(list) {
    for (const r of list || []) {
      if (!r || typeof r.step !== "number") continue;
      if (r.step <= store.lastStep) continue;   // already have it (hello's recent overlaps the stream)
      store.lastStep = r.step;
      store.steps.push(prep(r));
      seen(r._e);
    }
    trim();
  }

  function addNvml(list) {
    let last = null;
    for (const s of list || []) {
      if (!s || typeof s.t_us !== "number") continue;
      store.nvml.push(s);
      seen(s.t_us);
      last = s;
    }
    if (last) {
      const v = last.gpu_util !== null && last.gpu_util !== undefined ? last.gpu_util : pick(last, "cpu_pct");
      setText("bs-st-nvml", fmt(v) + "%");
    }
    trim();
  }

  function addModeChange(m) {
    if (!m || typeof m.t_us !== "number") return;
    const dup = store.mode_changes.some(x => x.t_us === m.t_us && x.to === m.to);
    if (!dup) store.mode_changes.push({ t_us: m.t_us, step: m.step, from: m.from, to: m.to });
  }

  // Bounded history: cut in chunks so that a long session does not shift arrays on every message.
  function trim() {
    const cut = store.lastT - KEEP_US;
    if (store.steps.length > KEEP_STEPS * 1.2 || (store.steps.length && store.steps[0]._e < cut - 30e6)) {
      let i = 0;
      while (i < store.steps.length && (store.steps[i]._e < cut || store.steps.length - i > KEEP_STEPS)) i++;
      store.steps.splice(0, i);
    }
    if (store.nvml.length > 20000) store.nvml.splice(0, store.nvml.length - 15000);
  }

  // ---------------------------------------------------------------- websocket

  function connect() {
    if (!live) return;
    const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + withToken("/ws/telemetry");
    setConn("connecting");
    try { ws = new WebSocket(url); } catch (e) { setConn("error"); setTimeout(connect, wsBackoff); return; }
    ws.onopen = () => { wsOpen = true; wsBackoff = 500; setConn("live"); };
    ws.onmessage = ev => {
      let m;
      try { m = JSON.parse(ev.data); } catch (e) { return; }
      handle(m);
    };
    ws.onclose = () => {
      wsOpen = false;
      setConn("reconnecting");
      setTimeout(connect, wsBackoff);
      wsBackoff = Math.min(wsBackoff * 2, 8000);
    };
  }

  function handle(m) {
    switch (m.type) {
      case "hello": {
        // A (re)connect starts a fresh picture: the server sends what it has kept recently.
        const keepMeta = store.meta;
        Object.assign(store, emptyStore());
        store.meta = Object.assign({}, keepMeta, m);
        delete store.meta.recent;             // the records live in the store, not twice
        const recent = m.recent || {};
        addSteps(recent.steps);
        addNvml(recent.nvml || recent.samples);
        for (const c of recent.mode_changes || []) addModeChange(c);
        if (typeof m.t_us === "number") seen(m.t_us);
        showStatus(Object.assign({}, m.status || {}, m));
        if (m.mode) setMode(m.mode);
        break;
      }
      case "steps": addSteps(m.steps); break;
      case "nvml": addNvml(m.samples || m.nvml); break;
      case "requests": break;             // per-request latencies: the burst tables and the downloads have them
      case "mode":
        addModeChange(m);
        if (typeof m.t_us === "number") seen(m.t_us);
        if (m.to) setMode(m.to);
        break;
      case "stats":
        if (typeof m.t_us === "number") seen(m.t_us);
        showStats(m);
        break;
      default:
        if (/drop/.test(String(m.type))) {
          dropped += Number(pick(m, "dropped", "count", "frames") || 1);
          setText("bs-dropped", dropped + " frames dropped (slow link)");
        }
    }
    dirty = true;
  }

  function setConn(state) {
    const el = $("bs-conn");
    if (!el) return;
    el.dataset.state = state;
    el.textContent = { live: "live", connecting: "connecting…", reconnecting: "reconnecting…", error: "offline",
                       replay: "replay" }[state] || state;
  }

  // ---------------------------------------------------------------- header: mode, stats, status line

  function setMode(m) {
    if (m !== "sync" && m !== "async") return;
    mode = m;
    const badge = $("bs-mode");
    if (badge) { badge.dataset.mode = m; badge.textContent = m; }
    for (const k of ["sync", "async"]) {
      const b = $("bs-mode-" + k);
      if (b) { b.classList.toggle("active", k === m); b.setAttribute("aria-pressed", k === m ? "true" : "false"); }
    }
  }

  async function requestMode(m) {
    if (!live || m === mode) return;
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

  function showStats(s) {
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
  function showStatus(s) {
    const model = pick(s, "model", "model_name");
    const device = pick(s, "device");
    const gpu = pick(s, "gpu_name", "gpu");
    if (model) setText("bs-model", typeof model === "string" ? model : (model.name || JSON.stringify(model)));
    if (device) setText("bs-device", String(device));
    if (gpu !== undefined) setText("bs-gpu", typeof gpu === "string" ? gpu : (gpu && gpu.name) || "none");
    const nv = pick(s, "nvml_available", "nvml");
    if (typeof nv === "boolean") setText("bs-nvml", nv ? "available" : "not available");
  }

  async function pollStatus() {
    if (!live || document.hidden) return;
    try {
      const s = await api("/api/status", "GET", undefined, 5000);
      if (s && s.mode) setMode(s.mode);
      if (!wsOpen && s) showStats(s);
    } catch (e) { /* the connection badge already tells */ }
  }

  // ---------------------------------------------------------------- DOM

  function buildScope(el) {
    el.innerHTML = `
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
          <button id="bs-rec" class="bs-btn" title="Start a named recording">● record</button>
          <select id="bs-rec-list" class="bs-input" title="Download a named recording"><option value="">recordings…</option></select>
        </span>
        <span class="bs-group">
          <button id="bs-load" class="bs-btn" title="Load a downloaded timeline JSON and view it here">⤒ load replay</button>
          <input id="bs-file" type="file" accept=".json,application/json" hidden>
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
        <div id="bs-c-busy" class="bs-plot bs-chart"></div>
        <div id="bs-c-tps" class="bs-plot bs-chart"></div>
        <div id="bs-c-batch" class="bs-plot bs-chart"></div>
        <div id="bs-c-kv" class="bs-plot bs-chart"></div>
        <div id="bs-c-queue" class="bs-plot bs-chart"></div>
        <div id="bs-c-step" class="bs-plot bs-chart"></div>
      </div>`;

    $("bs-pause").onclick = () => {
      if (view.follow && view.source === "live") {
        view.range = shownRange || currentRange(currentData());   // freeze what is on screen, no jump
        view.follow = false;
      } else if (view.source === "live") {
        view.follow = true; view.range = null;
      }
      syncControls(); dirty = true;
    };
    for (const b of el.querySelectorAll("#bs-window button")) {
      b.onclick = () => {
        view.span = b.dataset.span === "all" ? Infinity : Number(b.dataset.span) * 1e6;
        if (view.source === "live") { view.follow = true; view.range = null; }
        else view.range = replayRange();
        syncControls(); dirty = true;
      };
    }
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
    if (!live) {
      for (const id of ["bs-rec", "bs-rec-name", "bs-rec-list", "bs-dl-json", "bs-dl-trace", "bs-pause"]) {
        const x = $(id); if (x) { x.setAttribute("disabled", ""); x.classList.add("disabled"); }
      }
      $("bs-dl-json").href = withToken("/api/replay.json");
      $("bs-dl-json").classList.remove("disabled"); $("bs-dl-json").removeAttribute("disabled");
      $("bs-back-live").hidden = true;
      $("bs-rec-group").hidden = true;       // nothing to record without an engine
    }
    buildLegend();
    syncControls();
  }

  function buildLegend() {
    const item = (c, label, cls) => `<span class="bs-li ${cls || ""}"><i style="background:${c}"></i>${esc(label)}</span>`;
    const parts = [item(COLOR.sync, "sync", "mode"), item(COLOR.async, "async", "mode"), "<b>host</b>"]
      .concat(HOST.map(k => item(COLOR[k], k)))
      .concat(["<b>GPU</b>"]).concat(GPU.map(k => item(COLOR[k], k === "compute" ? "compute" : k.toUpperCase())))
      .concat(["<b>idle gap, by host cause</b>", `<span id="bs-causes"></span>`,
               `<span class="bs-li"><i class="bs-gap"></i>gap on GPU lanes</span>`,
               `<span class="bs-li"><i class="bs-marker"></i>mode switch</span>`]);
    $("bs-legend").innerHTML = parts.join("");
  }

  function bindHeader() {
    for (const k of ["sync", "async"]) {
      const b = $("bs-mode-" + k);
      if (b && !b.dataset.bound) {
        b.dataset.bound = "1";
        b.addEventListener("click", () => requestMode(k));
        if (!live) b.disabled = true;
      }
    }
    const badge = $("bs-mode");
    if (badge && badge.dataset.mode && !mode) setMode(badge.dataset.mode);
  }

  function syncControls() {
    const p = $("bs-pause");
    if (p) {
      p.textContent = view.follow ? "Pause" : "Resume live";
      p.classList.toggle("paused", !view.follow);
      p.hidden = view.source !== "live";
    }
    const want = view.span === Infinity ? "all" : String(view.span / 1e6);
    for (const b of document.querySelectorAll("#bs-window button")) b.classList.toggle("active", b.dataset.span === want);
    const bar = $("bs-replay-bar");
    if (bar) bar.hidden = view.source !== "replay";
    if (root) root.dataset.source = view.source;
  }

  // ---------------------------------------------------------------- recording and replay

  let recording = null;
  async function toggleRecording() {
    const btn = $("bs-rec");
    try {
      if (!recording) {
        const input = $("bs-rec-name");
        const name = (input.value || "").trim() || ("run-" + new Date().toISOString().slice(11, 19).replace(/:/g, ""));
        await api("/api/recording/start", "POST", { name });
        recording = name;
        input.value = name; input.disabled = true;
        btn.textContent = "■ stop"; btn.classList.add("recording");
        note("recording “" + name + "”", false);
      } else {
        const res = await api("/api/recording/stop", "POST", {});
        const n = res && (pick(res, "steps", "num_steps") ?? pick(res.summary || {}, "steps"));
        note("saved “" + recording + "”" + (n !== undefined ? " (" + n + " steps)" : ""), false);
        recording = null;
        $("bs-rec-name").disabled = false; $("bs-rec-name").value = "";
        btn.textContent = "● record"; btn.classList.remove("recording");
        refreshRecordings();
      }
    } catch (e) {
      note("recording: " + e.message, true);
    }
  }

  async function refreshRecordings() {
    if (!live) return;
    try {
      const res = await api("/api/recordings", "GET", undefined, 5000);
      const list = Array.isArray(res) ? res : (res && (res.recordings || res.names)) || [];
      const sel = $("bs-rec-list");
      if (!sel) return;
      const active = res && !Array.isArray(res) ? pick(res, "active", "current") : undefined;
      const names = [];
      sel.innerHTML = `<option value="">recordings (${list.length})…</option>`;
      for (const it of list) {
        const name = typeof it === "string" ? it : it.name;
        if (!name) continue;
        names.push(name);
        const o = document.createElement("option");
        o.value = name;
        const steps = typeof it === "object" ? pick(it, "steps", "num_steps") : undefined;
        o.textContent = "⤓ " + name + (steps !== undefined ? " · " + steps + " steps" : "");
        sel.appendChild(o);
      }
      // a recording started elsewhere (API, another tab) shows as running here too
      const activeName = typeof active === "string" ? active : active && active.name;
      if (activeName && !recording) {
        recording = activeName;
        $("bs-rec-name").value = activeName; $("bs-rec-name").disabled = true;
        $("bs-rec").textContent = "■ stop"; $("bs-rec").classList.add("recording");
      }
    } catch (e) { /* list is optional */ }
  }

  async function loadReplayFile(file) {
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
    showReplay(shown, file.name);
  }

  function showReplay(obj, name) {
    let tl;
    try { tl = normalise(obj); } catch (e) { note("cannot replay: " + e.message, true); return; }
    view.source = "replay";
    view.replay = tl;
    view.replayName = name || (tl.meta && tl.meta.name) || "timeline";
    view.follow = false;
    view.span = Infinity;
    view.range = replayRange();
    const m = tl.meta || {};
    const model = typeof m.model === "string" ? m.model : (m.model && m.model.name) || pick(m.engine || m.config || {}, "model") || "?";
    setText("bs-replay-text", `Replay: ${view.replayName} · ${model} on ${pick(m, "device") || "?"}` +
      (m.gpu ? " (" + (typeof m.gpu === "string" ? m.gpu : m.gpu.name || "") + ")" : "") +
      ` · ${tl.steps.length} steps · ${tl.requests.length} requests · ${tl.mode_changes.length} mode switches`);
    if (!live) setConn("replay");
    syncControls();
    dirty = true;
    note("replaying " + view.replayName, false);
  }

  function backToLive() {
    view.source = "live"; view.replay = null; view.follow = true; view.range = null; view.span = 10e6;
    syncControls(); dirty = true;
  }

  // The steps' extent (NVML keeps sampling while the engine idles; that tail would squeeze the steps).
  function replayExtent() {
    const d = view.replay;
    let lo = Infinity, hi = -Infinity;
    for (const s of d.steps) { if (s._s < lo) lo = s._s; if (s._e > hi) hi = s._e; }
    if (!isFinite(lo)) for (const s of d.nvml) { if (s.t_us < lo) lo = s.t_us; if (s.t_us > hi) hi = s.t_us; }
    if (!isFinite(lo)) return [0, 1e6];
    const pad = Math.max((hi - lo) * 0.01, 1000);
    return [lo - pad, hi + pad];
  }
  function replayRange() {
    const [lo, hi] = replayExtent();
    return view.span === Infinity ? [lo, hi] : [Math.max(lo, hi - view.span), hi];
  }

  // ---------------------------------------------------------------- what to draw

  function currentData() {
    if (view.source === "replay" && view.replay) return view.replay;
    return { steps: store.steps, nvml: store.nvml, mode_changes: store.mode_changes, requests: [], meta: store.meta };
  }

  function liveNow() {
    if (!store.lastTAt) return store.lastT;
    // extrapolate the server clock between messages (bounded, so a dead link freezes the picture)
    const ahead = Math.min((performance.now() - store.lastTAt) * 1000, 3e6);
    return store.lastT + (wsOpen ? ahead : 0);
  }

  function currentRange(d) {
    if (!view.follow && view.range) return view.range;
    const hi = Math.max(liveNow(), 1e6);
    if (view.span === Infinity) {
      const lo = d.steps.length ? Math.min(d.steps[0]._s, d.nvml.length ? d.nvml[0].t_us : Infinity) : 0;
      return [lo, hi];
    }
    return [hi - view.span, hi];
  }

  // Steps are ordered by index, and so (nearly) by time: binary-search the start, then filter.
  function stepsIn(steps, lo, hi) {
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

  function modeRuns(steps) {
    const runs = [];
    for (const s of steps) {
      const last = runs[runs.length - 1];
      if (last && last.mode === s.mode) last.hi = Math.max(last.hi, s._e);
      else runs.push({ mode: s.mode, lo: s._s, hi: s._e });
    }
    return runs;
  }

  // Merge spans closer than one pixel: the picture is the same, the SVG stays small.
  function merged(spans, minGap) {
    spans.sort((a, b) => a[0] - b[0]);
    const out = [];
    for (const s of spans) {
      const last = out[out.length - 1];
      if (last && s[0] - last[1] < minGap) { if (s[1] > last[1]) last[1] = s[1]; }
      else out.push([s[0], Math.max(s[1], s[0] + minGap)]);   // at least a pixel wide, or short spans vanish
    }
    return out;
  }

  // One row of bars from y0 to y1 (lane units); painted on the canvas by paintBars.
  function rects(spans, y0, y1, color, name) {
    return { spans, y0, y1, color, name };
  }

  // The Gantt's bars are painted on a canvas under Plotly's (transparent) SVG: Plotly keeps the axes, lane
  // labels, switch markers, hover and zoom, while the canvas fills thousands of spans in a few milliseconds,
  // where the same spans as SVG paths took a hundred or more (and starved the engine on a small machine).
  function paintBars(bars, lo, hi) {
    const cv = $("bs-gantt-canvas"), el = $("bs-gantt");
    const m = GANTT_MARGIN;
    const w = Math.max(10, el.clientWidth - m.l - m.r), h = GANTT_HEIGHT - m.t - m.b;
    const dpr = window.devicePixelRatio || 1;
    if (cv.width !== Math.round(w * dpr) || cv.height !== Math.round(h * dpr)) {
      cv.width = Math.round(w * dpr); cv.height = Math.round(h * dpr);
      Object.assign(cv.style, { left: m.l + "px", top: m.t + "px", width: w + "px", height: h + "px" });
    }
    const ctx = cv.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    const lane = h / LANES.length, sx = w / (hi - lo);
    for (const b of bars) {
      ctx.fillStyle = b.color;
      const top = (b.y0 + 0.5) * lane, height = (b.y1 - b.y0) * lane;   // y axis runs top-down from -0.5
      for (const [a, e] of b.spans) {
        const x0 = (a - lo) * sx, x1 = (e - lo) * sx;
        if (x1 < 0 || x0 > w) continue;
        ctx.fillRect(x0, top, Math.max(1, x1 - x0), height);
      }
    }
  }

  function modeShapes(d, lo, hi, withLabels, usPerPx) {
    const shapes = [], annotations = [];
    let lastLabel = -Infinity;
    for (const c of d.mode_changes) {
      if (c.t_us < lo || c.t_us > hi) continue;
      const x = c.t_us / 1e6;
      const col = COLOR[c.to] || "#0f172a";
      shapes.push({ type: "line", xref: "x", yref: "paper", x0: x, x1: x, y0: 0, y1: 1,
                    line: { color: col, width: 2, dash: "dot" } });
      // labels closer than ~80 px would overprint each other: the line alone marks that switch
      const crowded = usPerPx && c.t_us - lastLabel < 80 * usPerPx;
      if (withLabels && !crowded) lastLabel = c.t_us;
      if (withLabels && !crowded) annotations.push({ x, y: 1, xref: "x", yref: "paper", yanchor: "bottom", showarrow: false,
        text: "→ " + c.to + (c.step !== undefined ? " @" + c.step : ""), font: { size: 10, color: col },
        bgcolor: "rgba(255,255,255,0.85)" });
    }
    return { shapes, annotations };
  }

  function bandShapes(runs) {
    // a faint tint behind sync stretches makes the before/after of a switch readable on every chart
    return runs.filter(r => r.mode === "sync").map(r => ({
      type: "rect", xref: "x", yref: "paper", x0: r.lo / 1e6, x1: r.hi / 1e6, y0: 0, y1: 1, layer: "below",
      line: { width: 0 }, fillcolor: "rgba(234,88,12,0.06)" }));
  }

  function baseLayout(lo, hi, extra) {
    return Object.assign({
      font: FONT, paper_bgcolor: "#ffffff", plot_bgcolor: "#ffffff",
      margin: { l: 44, r: 10, t: 44, b: 24 },
      xaxis: { range: [lo / 1e6, hi / 1e6], gridcolor: GRID, zeroline: false, ticksuffix: " s", tickfont: { size: 10 } },
      yaxis: { gridcolor: GRID, zeroline: false, rangemode: "tozero", tickfont: { size: 10 }, automargin: true },
      showlegend: true,
      legend: { orientation: "h", x: 0, xanchor: "left", y: 1.0, yanchor: "bottom", font: { size: 10 },
                bgcolor: "rgba(0,0,0,0)" },
      hovermode: "x unified", uirevision: "keep",
    }, extra || {});
  }

  function titled(text) {
    // title on the first line of the top margin, legend on the second: they never collide on narrow charts
    return { text, x: 0.012, xanchor: "left", xref: "container", y: 1, yanchor: "top", yref: "container", pad: { t: 4 },
             font: { size: 12, color: "#0f172a" } };
  }

  // ---------------------------------------------------------------- Gantt

  function renderGantt(d, steps, lo, hi) {
    const el = $("bs-gantt");
    const width = Math.max(200, (el.clientWidth || 900) - 120);
    const px = (hi - lo) / width;                    // µs per pixel
    const traces = [];                               // Plotly: hover targets only
    // the bars, back to front; a light band groups the GPU lanes
    const bars = [rects([[lo, hi]], LANE_Y.h2d - 0.5, LANE_Y.idle + 0.5, "#f8fafc", "band")];
    const lanes = {};
    for (const k of HOST.concat(GPU)) lanes[k] = [];
    const hostCompute = [];                          // CPU runs: the host span that did the forward
    const gaps = {};                                 // cause -> spans
    let gpuSeen = false;
    for (const s of steps) {
      for (const k of HOST) { const v = span(s, "cpu", k); if (v) lanes[k].push([v[0], v[1]]); }
      for (const k of GPU) { const v = span(s, "gpu", k); if (v) { lanes[k].push([v[0], v[1]]); gpuSeen = true; } }
      if (s._hostCompute) hostCompute.push([s._cs[0], s._cs[1]]);
      const gap = s.gpu_idle_before_us;
      if (gap > 0) {
        const cause = s.idle_cause || "none";
        (gaps[cause] = gaps[cause] || []).push([s._c - gap, s._c]);
      }
    }
    const h = 0.36;
    // GPU-lane highlight of every idle gap (faint red), then the lanes, then the coloured cause lane
    const allGaps = [];
    // (gaps while the engine simply had no work are not the host's fault: they stay grey and unhighlighted)
    for (const c in gaps) if (!NO_WORK.has(c)) for (const g of gaps[c]) if (g[1] - g[0] > 2 * px) allGaps.push(g.slice());
    if (allGaps.length) bars.push(rects(merged(allGaps, px), LANE_Y.h2d - 0.5, LANE_Y.d2h + 0.5, "rgba(239,68,68,0.13)", "gap"));
    for (const k of HOST.concat(GPU)) {
      const y = LANE_Y[k];
      if (lanes[k].length) bars.push(rects(merged(lanes[k], px), y - h, y + h, COLOR[k], k));
    }
    if (hostCompute.length) {
      bars.push(rects(merged(hostCompute, px), LANE_Y.compute - h, LANE_Y.compute + h, "rgba(22,163,74,0.45)", "compute (host)"));
    }
    for (const r of modeRuns(steps)) {
      bars.push(rects([[Math.max(r.lo, lo), Math.min(r.hi, hi)]], LANE_Y.mode - h, LANE_Y.mode + h,
                        COLOR[r.mode] || "#64748b", r.mode));
    }
    const causes = Object.keys(gaps).sort();
    for (const c of causes) bars.push(rects(merged(gaps[c], px), LANE_Y.idle - h, LANE_Y.idle + h, causeColor(c), "idle: " + c));
    setCauseLegend(causes);

    // Hover: one invisible marker per step (an SVG node each, so one per step, not per span) whose label
    // lists the step's spans; hovermode "x" picks the step nearest the cursor, whichever lane it points at.
    if (steps.length <= 3000) {
      const ms_ = v => v ? ((v[1] - v[0]) / 1000).toFixed(3) : null;
      const hx = [], ht = [];
      for (const s of steps) {
        const host = HOST.map(k => { const v = ms_(span(s, "cpu", k)); return v === null ? "" : `${k} ${v}`; }).filter(Boolean);
        const dev = s.gpu ? GPU.map(k => { const v = ms_(span(s, "gpu", k)); return v === null ? "" : `${k} ${v}`; }).filter(Boolean)
          : (s._hostCompute ? [`compute (host) ${ms_(s._cs)}`] : []);
        const idle = s.gpu_idle_before_us > 0 ? `<br>GPU idle before: ${(s.gpu_idle_before_us / 1000).toFixed(3)} ms (${s.idle_cause || "?"})` : "";
        hx.push(s._c / 1e6);
        ht.push(`<b>step ${s.step}</b> · ${s.mode} · slot ${s.slot} · ${s.num_requests} req · ` +
                `${s.prefill_tokens} prefill + ${s.decode_tokens} decode tok<br>host ms: ${host.join(", ")}` +
                (dev.length ? `<br>device ms: ${dev.join(", ")}` : "") + idle);
      }
      traces.push({ type: "scatter", mode: "markers", x: hx, y: hx.map(() => LANE_Y.compute), text: ht,
                    hovertemplate: "%{text}<extra></extra>", marker: { size: 6, opacity: 0 }, showlegend: false,
                    name: "hover" });
    }

    const ms = modeShapes(d, lo, hi, true, px);
    const shapes = [
      { type: "line", xref: "paper", yref: "y", x0: 0, x1: 1, y0: LANE_Y.schedule - 0.5, y1: LANE_Y.schedule - 0.5,
        line: { color: "#e2e8f0", width: 1 } },
      { type: "line", xref: "paper", yref: "y", x0: 0, x1: 1, y0: LANE_Y.h2d - 0.5, y1: LANE_Y.h2d - 0.5,
        line: { color: "#cbd5e1", width: 1 } },
    ].concat(ms.shapes);
    const annotations = ms.annotations.slice();
    if (!steps.length) {
      annotations.push({ xref: "paper", yref: "paper", x: 0.5, y: 0.5, showarrow: false, font: { size: 13, color: "#94a3b8" },
        text: view.source === "replay" ? "no steps in this window" : "waiting for steps: type a prompt or fire a burst" });
    } else if (!gpuSeen) {
      annotations.push({ xref: "paper", yref: "y", x: 0.99, xanchor: "right", y: LANE_Y.h2d, showarrow: false,
        font: { size: 10.5, color: "#64748b" }, bgcolor: "rgba(248,250,252,0.9)",
        text: hostCompute.length ? "CPU run: no CUDA events; the compute lane shows the host forward (launch span)"
                                 : "no GPU stream events on this device" });
    }
    const layout = baseLayout(lo, hi, {
      height: GANTT_HEIGHT, margin: GANTT_MARGIN, showlegend: false, hovermode: "x",
      hoverlabel: { align: "left", font: { size: 11 } },
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",   // the canvas shows through
      xaxis: { range: [lo / 1e6, hi / 1e6], showgrid: false, zeroline: false, ticksuffix: " s", tickfont: { size: 10 } },
      yaxis: { range: [LANES.length - 0.5, -0.5], tickvals: LANES.map((_, i) => i), ticktext: LANES.map(l => l.label),
               fixedrange: true, showgrid: false, zeroline: false, tickfont: { size: 10.5 } },
      shapes, annotations, dragmode: "zoom",
    });
    draw(el, traces, layout);
    paintBars(bars, lo, hi);
    // what was painted, for tests and curious readers: spans per row
    const painted = {};
    for (const b of bars) if (b.name !== "band") painted[b.name] = (painted[b.name] || 0) + b.spans.length;
    el.dataset.lanes = JSON.stringify(painted);
    el.dataset.spans = String(Object.values(painted).reduce((a, n) => a + n, 0));
    el.dataset.markers = String(ms.shapes.length);
  }

  function setCauseLegend(causes) {
    const el = $("bs-causes");
    if (!el) return;
    const html = causes.map(c => `<span class="bs-li"><i style="background:${causeColor(c)}"></i>${esc(c)}</span>`).join("") ||
      `<span class="bs-li muted">none in view</span>`;
    if (el.innerHTML !== html) el.innerHTML = html;
  }

  // ---------------------------------------------------------------- small charts

  // Fixed-width bins across [lo, hi]; the trailing partial bin of a live window is dropped (it would dip).
  // A bin spans at least four step intervals, or a busy % made of whole and empty bins would saw up and down.
  function makeBins(lo, hi, dataEnd, n, steps) {
    const k = steps.length;
    const interval = k > 1 ? (steps[k - 1]._c - steps[0]._c) / (k - 1) : 0;
    const w = Math.max((hi - lo) / n, 4 * interval, 500);
    const count = Math.max(1, Math.floor((Math.min(hi, dataEnd) - lo) / w));
    return { lo, w, count, mid: i => (lo + (i + 0.5) * w) / 1e6 };
  }

  function addOverlap(arr, bins, a, b) {
    let i = Math.max(0, Math.floor((a - bins.lo) / bins.w));
    for (; i < bins.count; i++) {
      const bl = bins.lo + i * bins.w, br = bl + bins.w;
      if (bl >= b) break;
      const o = Math.min(b, br) - Math.max(a, bl);
      if (o > 0) arr[i] += o;
    }
  }

  // Too many per-step points for SVG: keep one point per bucket (mean, or max for spiky series).
  function perStep(steps, lo, hi, fn, agg) {
    const x = [], y = [];
    if (steps.length <= 1500) {
      for (const s of steps) { const v = fn(s); if (v !== null && v !== undefined) { x.push(s._s / 1e6); y.push(v); } }
      return { x, y };
    }
    const n = 600, w = (hi - lo) / n, sum = new Float64Array(n), cnt = new Uint32Array(n), mx = new Float64Array(n).fill(-Infinity);
    for (const s of steps) {
      const v = fn(s);
      if (v === null || v === undefined) continue;
      const i = Math.min(n - 1, Math.max(0, Math.floor((s._s - lo) / w)));
      sum[i] += v; cnt[i]++; if (v > mx[i]) mx[i] = v;
    }
    for (let i = 0; i < n; i++) if (cnt[i]) { x.push((lo + (i + 0.5) * w) / 1e6); y.push(agg === "max" ? mx[i] : sum[i] / cnt[i]); }
    return { x, y };
  }

  function line(name, xy, color, extra) {
    return Object.assign({ type: "scatter", mode: "lines", name, x: xy.x, y: xy.y, line: { color, width: 1.6 },
                           hovertemplate: "%{y:.1f}" }, extra || {});
  }

  function renderCharts(d, steps, lo, hi) {
    const dataEnd = view.source === "live" ? Math.min(hi, store.lastT) : hi;
    const bins = makeBins(lo, hi, dataEnd, 100, steps);
    const runs = modeRuns(steps);
    const bands = bandShapes(runs);
    const marks = modeShapes(d, lo, hi, false).shapes;
    const shapes = bands.concat(marks);

    // GPU busy %: union of compute spans per bin, measured with events; NVML beside it.
    const busy = new Float64Array(bins.count), tok = new Float64Array(bins.count), pre = new Float64Array(bins.count);
    let gpuSeen = false, hostBasis = false;
    for (const s of steps) {
      const c = s._cs;
      if (c) { gpuSeen = true; hostBasis = hostBasis || s._hostCompute; addOverlap(busy, bins, c[0], c[1]); }
      const i = Math.floor((s._e - bins.lo) / bins.w);
      if (i >= 0 && i < bins.count) { tok[i] += s._tok; pre[i] += s.prefill_tokens || 0; }
    }
    const bx = [], by = [], tx = [], ty = [], py = [];
    for (let i = 0; i < bins.count; i++) {
      bx.push(bins.mid(i)); by.push(Math.min(100, 100 * busy[i] / bins.w));
      tx.push(bins.mid(i)); ty.push(tok[i] / (bins.w / 1e6)); py.push(pre[i] / (bins.w / 1e6));
    }
    const nv = { x: [], y: [] };
    let nvKey = null;
    for (const s of d.nvml) {
      if (s.t_us < lo || s.t_us > hi) continue;
      const v = s.gpu_util !== undefined && s.gpu_util !== null ? (nvKey = nvKey || "gpu_util", s.gpu_util)
        : pick(s, "cpu_pct", "cpu_util", "cpu_percent");
      if (v === undefined || v === null) continue;
      if (!nvKey) nvKey = "cpu";
      nv.x.push(s.t_us / 1e6); nv.y.push(v);
    }
    const nvName = nvKey === "gpu_util" ? "NVML util" : "host CPU % (no NVML)";
    const busyName = hostBasis ? "compute busy % (host spans)" : "event busy %";
    const busyTraces = [];
    if (gpuSeen) busyTraces.push(line(busyName, { x: bx, y: by }, COLOR.compute, { fill: "tozeroy", fillcolor: "rgba(22,163,74,0.12)" }));
    busyTraces.push(line(nvName, nv, "#475569", { mode: "lines", line: { color: "#475569", width: 1.2, dash: "dash" } }));
    draw($("bs-c-busy"), busyTraces, baseLayout(lo, hi, {
      height: 210, title: titled("Busy %: " + (hostBasis ? "compute spans (host)" : "CUDA events") +
                                 (nvKey === "gpu_util" ? " vs NVML" : nvKey ? " vs host CPU" : "")),
      yaxis: { range: [0, 105], gridcolor: GRID, ticksuffix: "%", tickfont: { size: 10 }, zeroline: false }, shapes,
    }));

    draw($("bs-c-tps"), [
      line("generated tok/s", { x: tx, y: ty }, COLOR.async, { fill: "tozeroy", fillcolor: "rgba(37,99,235,0.10)", hovertemplate: "%{y:.0f}" }),
      line("prefill tok/s", { x: tx, y: py }, COLOR.fill, { hovertemplate: "%{y:.0f}" }),
    ], baseLayout(lo, hi, { height: 210, title: titled("Throughput (tokens/s)"), shapes }));

    // Batch: tokens per step split prefill / decode (stacked), and the batch size.
    const dec = perStep(steps, lo, hi, s => s.decode_tokens || 0);
    const pf = perStep(steps, lo, hi, s => (s.decode_tokens || 0) + (s.prefill_tokens || 0));
    const bs = perStep(steps, lo, hi, s => s.num_requests);
    draw($("bs-c-batch"), [
      line("decode tok/step", dec, COLOR.update, { fill: "tozeroy", fillcolor: "rgba(20,184,166,0.25)", line: { color: COLOR.update, width: 1, shape: "hv" } }),
      line("+ prefill tok/step", pf, COLOR.fill, { fill: "tonexty", fillcolor: "rgba(236,72,153,0.18)", line: { color: COLOR.fill, width: 1, shape: "hv" } }),
      line("batch size", bs, "#0f172a", { line: { color: "#0f172a", width: 1.4, dash: "dot", shape: "hv" } }),
    ], baseLayout(lo, hi, { height: 210, title: titled("Batch: tokens per step, prefill vs decode"), shapes }));

    draw($("bs-c-kv"), [
      line("KV used %", perStep(steps, lo, hi, s => s.kv_blocks_total ? 100 * s.kv_blocks_used / s.kv_blocks_total : null),
           "#7c3aed", { fill: "tozeroy", fillcolor: "rgba(124,58,237,0.12)", line: { color: "#7c3aed", width: 1.6, shape: "hv" } }),
    ], baseLayout(lo, hi, { height: 210, title: titled("KV cache usage"), shapes,
      yaxis: { range: [0, 100], ticksuffix: "%", gridcolor: GRID, zeroline: false, tickfont: { size: 10 } } }));

    draw($("bs-c-queue"), [
      line("waiting", perStep(steps, lo, hi, s => s.queue_depth), "#dc2626", { line: { color: "#dc2626", width: 1.6, shape: "hv" } }),
      line("running", perStep(steps, lo, hi, s => pick(s, "running", "num_requests")), "#0f172a", { line: { color: "#0f172a", width: 1.2, shape: "hv" } }),
    ], baseLayout(lo, hi, { height: 210, title: titled("Queue depth"), shapes }));

    // Step interval (compute start to compute start) against the GPU idle gap before each step.
    // A step after an empty queue is left out: its "interval" is the engine idling, not the loop's cost.
    let prev = null;
    const busyStep = s => !NO_WORK.has(s.idle_cause);
    const interval = perStep(steps, lo, hi, s => {
      const v = prev === null || !busyStep(s) ? null : (s._c - prev) / 1000; prev = s._c; return v; }, "max");
    const gap = perStep(steps, lo, hi, s => busyStep(s) ? (s.gpu_idle_before_us || 0) / 1000 : null, "max");
    draw($("bs-c-step"), [
      line("step interval ms", interval, "#334155", { line: { color: "#334155", width: 1.3 } }),
      line("GPU idle before step ms", gap, "#ef4444", { fill: "tozeroy", fillcolor: "rgba(239,68,68,0.12)", line: { color: "#ef4444", width: 1.2 } }),
    ], baseLayout(lo, hi, { height: 210, title: titled("Step interval vs GPU idle gap (ms)"), shapes }));
  }

  // ---------------------------------------------------------------- drawing

  const bound = new WeakSet();
  let suppressRelayout = false;

  function draw(el, traces, layout) {
    if (!el || !window.Plotly) return;
    suppressRelayout = true;
    try { Plotly.react(el, traces, layout, PLOT_CONFIG); } finally { suppressRelayout = false; }
    if (!bound.has(el)) {
      bound.add(el);
      // Zooming any chart freezes the window on that range and applies it to every chart.
      el.on("plotly_relayout", ev => {
        if (suppressRelayout || !ev) return;
        if (ev["xaxis.autorange"]) {
          if (view.source === "live") { view.follow = true; view.range = null; }
          else { view.span = Infinity; view.range = replayRange(); }
          syncControls(); dirty = true;
          return;
        }
        const a = ev["xaxis.range[0]"] !== undefined ? ev["xaxis.range[0]"] : ev["xaxis.range"] && ev["xaxis.range"][0];
        const b = ev["xaxis.range[1]"] !== undefined ? ev["xaxis.range[1]"] : ev["xaxis.range"] && ev["xaxis.range"][1];
        if (a === undefined || b === undefined) return;
        view.follow = false;
        view.range = [a * 1e6, b * 1e6];
        syncControls(); dirty = true;
      });
    }
  }

  let shownRange = null;                    // the [lo, hi] of the last picture drawn
  function render() {
    const d = currentData();
    const [lo, hi] = currentRange(d);
    shownRange = [lo, hi];
    const steps = stepsIn(d.steps, lo, hi);
    renderGantt(d, steps, lo, hi);
    renderCharts(d, steps, lo, hi);
    renders++;
    const total = d.steps.length;
    setText("bs-counter", `${steps.length} steps in view · ${total} kept · ${d.mode_changes.length} switches`);
    root.dataset.steps = String(total);
    root.dataset.inview = String(steps.length);
    root.dataset.switches = String(d.mode_changes.length);
    root.dataset.nvml = String(d.nvml.length);
    root.dataset.renders = String(renders);
  }

  function loop() {
    const following = view.source === "live" && view.follow;
    if (root && document.body.contains(root) && !document.hidden && window.Plotly && (dirty || following)) {
      const t = performance.now();
      dirty = false;
      try { render(); } catch (e) { console.error("batchscope render", e); }
      renderCost = 0.7 * renderCost + 0.3 * (performance.now() - t);
    }
    // Back off when drawing is expensive, so the page stays responsive under heavy load.
    setTimeout(loop, Math.max(250, 3 * renderCost));
  }

  // ---------------------------------------------------------------- boot

  function init() {
    const el = $("bs-scope");
    if (!el || el === root) return;
    root = el;
    live = el.dataset.live !== "0";
    buildScope(el);
    bindHeader();
    if (!live) {
      setConn("replay");
      api("/api/replay.json", "GET", undefined, 60000)
        .then(tl => showReplay(tl, el.dataset.replayName || "recorded timeline"))
        .catch(e => note("replay: " + e.message, true));
    } else if (!ws) {
      connect();
      refreshRecordings();
    } else {
      setConn(wsOpen ? "live" : "reconnecting");
      syncControls();
    }
    dirty = true;
  }

  // Gradio renders the page after our <head> script runs, and may re-render a block: watch for our elements.
  function watch() {
    init();
    bindHeader();
    setTimeout(watch, root && document.body.contains(root) ? 1000 : 100);
  }

  window.batchscope = { store, view, handle, showReplay, backToLive, render: () => { dirty = true; },
                        normalise, get mode() { return mode; }, get renderMs() { return renderCost; } };

  function start() {
    watch();
    loop();
    setInterval(pollStatus, 3000);
    setInterval(refreshRecordings, 10000);
    document.addEventListener("visibilitychange", () => { dirty = true; });
    window.addEventListener("resize", () => { dirty = true; });     // the canvas follows Plotly's new size
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
