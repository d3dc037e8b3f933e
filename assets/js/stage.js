/* The presenter's layer over the charts: the per-mode scoreboard (scoreboard.js), presentation mode and its keys,
 * an A/B run and its result, a continuous load on and off, the switch view, replay played like a live run, the
 * no-GPU notice's recordings, feedback while a replay loads, and the header following what the charts show.
 * main.js imports this module once; it runs on its own slow timer and never draws a chart.
 *
 *   S / A   switch the engine to sync / async            L   start / stop a continuous load
 *   B       run an A/B of one burst and show its result  W   the switch: a few steps either side of the latest
 *   Space   play / pause a replay                        P   presentation mode on/off (Esc leaves it)
 *
 * Presentation mode is a class on <html> (style.css does the rest): the side panel and explainer go, the Gantt,
 * the busy and throughput charts and the scoreboard fill the screen, and the text grows with it (--bs-scale,
 * 1 at 1280x720 up to 3 at 3840x2160). ?present=1 in the address opens the page in it. */
import { api, withToken } from "./api.js";
import { showReplay, showModeLock, syncControls } from "./controls.js";
import { currentData, headSample, state } from "./feed.js";
import { requestMode, setConn, showServerCpu, showView } from "./header.js";
import { updateBoard, verdictHtml } from "./scoreboard.js";
import { busyLabel } from "./palette.js";
import { $, esc, fmt, note, setText } from "./util.js";

const TICK_MS = 500;
const LOADING_GIVE_UP_MS = 180000;
const SWITCH_STEPS = 4;                    // the switch view: this many steps either side of the switch

// ---------------------------------------------------------------- presentation mode

// The type scale: 1 at a 1280x720 projector, growing with the smaller side's ratio, up to 3 (3840x2160).
function setScale() {
  const k = Math.max(1, Math.min(3, Math.min(window.innerWidth / 1280, window.innerHeight / 720)));
  document.documentElement.style.setProperty("--bs-scale", k.toFixed(3));
  setStageTop();
}

// Where the stage starts on the page: presentation mode sizes the column beside the charts to the rest of the
// screen (style.css), and the header's height changes with the scale and its wrapping.
function setStageTop() {
  const stage = $("bs-stage");
  if (!stage || !presenting()) return;
  const top = Math.round(stage.getBoundingClientRect().top + window.scrollY);
  const root = document.documentElement;
  if (root.style.getPropertyValue("--bs-stage-top") !== top + "px") root.style.setProperty("--bs-stage-top", top + "px");
}

export function setPresent(on) {
  const root = document.documentElement;
  if (root.classList.contains("bs-present") === on) return;
  setScale();
  root.classList.toggle("bs-present", on);
  const b = $("bs-present");
  if (b) { b.setAttribute("aria-pressed", on ? "true" : "false"); b.textContent = on ? "exit presentation" : "present"; }
  // the charts take their new size and the larger text at the next picture
  window.dispatchEvent(new Event("resize"));
  state.dirty = true;
}

const presenting = () => document.documentElement.classList.contains("bs-present");

// ---------------------------------------------------------------- keys

function typing(t) {
  return t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName));
}

function onKey(ev) {
  if (ev.defaultPrevented || ev.ctrlKey || ev.metaKey || ev.altKey || ev.repeat || typing(ev.target)) return;
  const k = ev.key.toLowerCase();
  const live = state.live && state.view.source === "live";
  const act = {
    s: live && (() => switchMode("sync")), a: live && (() => switchMode("async")),
    l: live && toggleLoad, b: live && runAB, w: () => { releaseABHold(); toggleSwitchView(); },
    " ": state.view.source === "replay" && togglePlay,
    p: () => setPresent(!presenting()), escape: presenting() && (() => setPresent(false)),
  }[k];
  if (!act) return;
  ev.preventDefault();
  if ("salb".includes(k)) releaseABHold();           // the presenter moves on: back to the live window
  act();
}

// S and A do nothing while the toggle is locked (an A/B holds it): they say why instead of asking the server.
function switchMode(mode) {
  const locked = document.querySelector("#bs-mode-sync.bs-locked, #bs-mode-async.bs-locked");
  if (locked) { note(locked.title || "the mode is locked", true); return; }
  requestMode(mode);
}

// What a failed call says to a room: the server's reason, or that it cannot be reached.
function reason(e) {
  return /fetch|network/i.test(e.message) ? "the server cannot be reached" : e.message;
}

// ---------------------------------------------------------------- a continuous load (L)

async function toggleLoad() {
  try {
    const st = await api("/api/status", "GET", undefined, 5000);
    if (st.running_load) {
      await api("/api/load/" + encodeURIComponent(st.running_load) + "/stop", "POST", {});
      note("continuous load stopped", false);
    } else {
      const res = await api("/api/load", "POST", {});
      note("continuous load started (" + res.load_id + "): L stops it", false);
    }
  } catch (e) { note("load: " + reason(e), true); }
}

// ---------------------------------------------------------------- an A/B (B) and its result

const ab = { id: null, timer: null, held: false };   // held: the A/B's span while the view holds on it

async function runAB() {
  if (ab.id) { note("an A/B is running already", true); return; }
  try {
    const res = await api("/api/ab", "POST", {});
    ab.id = res.ab_id;
    if (window.batchscopeModeLock) window.batchscopeModeLock.soon();
    showAB({ state: "running", phase: null, done: 0, total: 0 });
    ab.timer = setInterval(pollAB, 1000);
  } catch (e) { note("A/B: " + reason(e), true); }
}

async function pollAB() {
  try {
    const st = await api("/api/ab/" + encodeURIComponent(ab.id), "GET", undefined, 5000);
    showAB(st);
    if (st.state !== "running") { clearInterval(ab.timer); ab.id = null; showModeLock(null); }
  } catch (e) { /* the next poll tries again */ }
}

// The A/B panel: progress while it runs, then its result in large type with the verdict its steps support.
function showAB(st) {
  const el = $("bs-ab-panel");
  if (!el) return;
  el.hidden = false;
  if (st.state === "running") {
    // the half's own count: the result reports requests per half, so the progress counts the same ones
    const half = st.phase ? st.phase + " half" : "warm-up";
    const each = st.requests_per_half || "…";
    el.innerHTML = `<div class="bs-ab-head">A/B running · ${esc(half)}</div>` +
      `<div class="bs-ab-progress">${st.phase ? st.half_done || 0 : 0} / ${each} requests of this half</div>`;
    return;
  }
  if (st.state !== "done") {
    el.innerHTML = `<div class="bs-ab-head">A/B failed</div><div class="bs-err">${esc(st.error || st.state)}</div>`;
    return;
  }
  const s = st.sync || {}, a = st.async || {};
  const tps = st.speedup ? `<b class="bs-ab-big">${st.speedup.toFixed(2)}×</b> output tokens/s in async` : "";
  const busy = (x) => (x.busy_pct === null || x.busy_pct === undefined ? "–" : fmt(x.busy_pct, 1) + "%");
  // measured with events only where a device computed: on a CPU the figure is the host spans'
  const onHost = [s, a].some(x => ((x.telemetry || {}).busy_basis) === "host") || !!$("bs-nogpu");
  el.innerHTML = `<div class="bs-ab-head">A/B · ${st.requests_per_half} requests each half</div>` +
    `<div class="bs-ab-result">${tps}</div>` +
    `<div class="bs-ab-busy">${busyLabel(onHost ? "host" : "events")} <span class="sync">sync ${busy(s)}</span> → <span class="async">async ${busy(a)}</span></div>` +
    verdictHtml(st.compare, "bs-ab-verdict");
  el.dataset.state = st.state;
  el.dataset.verdict = (st.compare && st.compare.verdict) || "";
  holdOnAB(s.window_us, a.window_us);
}

// After an A/B the charts stay on its span (the live window would slide to empty while the room reads the
// result) until the presenter moves on: Resume live, a window button, or S, A, L, B or W.
function holdOnAB(syncWindow, asyncWindow) {
  const view = state.view;
  if (!syncWindow || !asyncWindow || view.source !== "live") return;
  const lo = syncWindow[0], hi = asyncWindow[1], pad = 0.02 * (hi - lo);
  ab.held = [lo - pad, hi + pad];
  Object.assign(view, { follow: false, paused: true, zoomed: false, range: ab.held });
  syncControls();
  state.dirty = true;
  note("the A/B's span, held: Resume live (or S, A, L, B) goes back to live", false);
}

function releaseABHold() {
  if (!ab.held) return;
  const held = ab.held;
  ab.held = false;
  if (state.view.source === "live" && state.view.range === held) {     // not moved on already
    Object.assign(state.view, { follow: true, paused: false, range: null });
    syncControls();
    state.dirty = true;
  }
}

// ---------------------------------------------------------------- the switch view (W)

const switchView = { on: false, before: null };

// A few steps either side of the latest switch in the data on screen, frozen, so the gaps read off the Gantt
// (gantt.js labels each with its length and share); W again goes back to where the view was.
function toggleSwitchView() {
  const view = state.view;
  if (switchView.on) {
    Object.assign(view, switchView.before);
    switchView.on = false;
    state.dirty = true;
    return;
  }
  const d = currentData();
  const change = d.mode_changes[d.mode_changes.length - 1];
  if (!change) {
    note(view.source === "live" ? "no mode switch yet: S or A makes one" : "no mode switch in this recording", true);
    return;
  }
  let i = d.steps.findIndex(s => s.step >= change.step);
  if (i < 0) i = d.steps.length - 1;
  const a = d.steps[Math.max(0, i - SWITCH_STEPS)], b = d.steps[Math.min(d.steps.length - 1, i + SWITCH_STEPS - 1)];
  if (!a || !b) { note("the switch's steps are not in view", true); return; }
  switchView.before = { follow: view.follow, range: view.range, zoomed: view.zoomed, paused: view.paused };
  const pad = 0.02 * (b._e - a._s);
  Object.assign(view, { follow: false, range: [a._s - pad, b._e + pad], zoomed: true });
  switchView.on = true;
  state.dirty = true;
  note("the switch at step " + change.step + ": W goes back", false);
}

// ---------------------------------------------------------------- replay played like a live run (Space)

const play = { on: false, speed: 1, t: 0, last: 0, span: 10e6 };

export function togglePlay() {
  const view = state.view;
  if (view.source !== "replay") return;
  if (play.on) { play.on = false; syncPlay(); return; }
  const [first, end] = extent(view.replay);
  // the window that sweeps: the width chosen, or a fifth of the recording (at "all" nothing would move)
  play.span = isFinite(view.span) && view.span < end - first ? view.span : Math.max(1e5, Math.min(10e6, (end - first) / 5));
  // resume where it paused, else from the start
  play.t = play.t > first + play.span && play.t < end ? play.t : first + play.span;
  play.last = performance.now();
  play.on = true;
  syncPlay();
  stepPlay();
}

function extent(d) {
  return d.steps.length ? [d.steps[0]._s, d.steps[d.steps.length - 1]._e] : [0, 0];
}

function stepPlay() {
  const view = state.view;
  if (!play.on || view.source !== "replay") { play.on = false; syncPlay(); return; }
  const now = performance.now();
  play.t += (now - play.last) * 1000 * play.speed;
  play.last = now;
  const [, end] = extent(view.replay);
  if (play.t >= end) { play.t = end; play.on = false; }
  Object.assign(view, { follow: false, zoomed: true, range: [play.t - play.span, play.t] });
  state.dirty = true;
  syncPlay();
  if (play.on) setTimeout(stepPlay, 100);
}

function syncPlay() {
  const b = $("bs-play");
  if (b) { b.textContent = play.on ? "❚❚ pause" : "▶ play"; b.setAttribute("aria-pressed", String(play.on)); }
}

// The play control lives in the replay bar: built once it exists.
function bindPlay() {
  const bar = $("bs-replay-bar");
  if (!bar || $("bs-play")) return;
  const wrap = document.createElement("span");
  wrap.className = "bs-play";
  wrap.innerHTML = `<button id="bs-play" class="bs-btn" aria-pressed="false" title="Sweep the recording as if it ran now (Space)">▶ play</button>` +
    `<select id="bs-play-speed" class="bs-input" title="Playback speed"><option value="1">1×</option>` +
    `<option value="0.5">½×</option><option value="0.25">¼×</option><option value="0.1">⅒×</option></select>`;
  bar.insertBefore(wrap, $("bs-back-live"));
  $("bs-play").onclick = togglePlay;
  $("bs-play-speed").onchange = ev => { play.speed = Number(ev.target.value) || 1; };
}

// ---------------------------------------------------------------- replay loading feedback

const loading = { since: 0, before: null, text: "" };

function showLoading(text) {
  loading.since = performance.now();
  loading.before = state.view.replay;
  loading.text = text;
  const el = $("bs-replay-loading");
  if (el) { setText("bs-replay-loading-text", text); el.hidden = false; }
}

function hideLoading() {
  loading.since = 0;
  const el = $("bs-replay-loading");
  if (el) el.hidden = true;
}

function checkLoading() {
  const el = $("bs-replay-loading");
  if (!el) return;
  if (!state.live && !state.view.replay) {            // a replay-only page fetching its recording
    if (el.hidden) { el.hidden = false; setText("bs-replay-loading-text", "loading the recording…"); }
    return;
  }
  if (!loading.since) { if (!el.hidden) el.hidden = true; return; }
  const msg = $("bs-msg");
  const failed = msg && msg.classList.contains("bs-error") && msg.textContent;
  if ((state.view.replay && state.view.replay !== loading.before) || failed ||
      performance.now() - loading.since > LOADING_GIVE_UP_MS) hideLoading();
}

// The toolbar's file input (controls.js) clears its value in its own handler: look at the file first.
function onFileChosen(ev) {
  const input = ev.target;
  if (!input || input.id !== "bs-file" || !input.files || !input.files[0]) return;
  const f = input.files[0];
  showLoading(`loading ${f.name} (${(f.size / 1048576).toFixed(1)} MB): reading, checking on the server, drawing…`);
}

// ---------------------------------------------------------------- the shipped recordings

async function openExample(btn) {
  const pick = $("bs-examples");
  const opt = pick && pick.selectedOptions[0];
  if (!opt) return;
  const name = opt.textContent;
  showLoading("loading “" + name + "”…");
  btn.disabled = true;
  try {
    const res = await fetch(withToken(opt.value));
    if (!res.ok) throw new Error(res.status + " " + res.statusText);
    const text = await res.text();
    const loaded = await api("/api/replay", "POST", text, 60000);   // the same route a loaded file goes through
    showReplay(JSON.parse(text), name, loaded.board);
  } catch (e) {
    note("cannot open the recording: " + reason(e), true);
    hideLoading();
  } finally {
    btn.disabled = false;
  }
}

// ---------------------------------------------------------------- wiring

function bind() {
  const p = $("bs-present");
  if (p && !p.dataset.bound) { p.dataset.bound = "1"; p.addEventListener("click", () => setPresent(!presenting())); }
  const ex = $("bs-example");
  if (ex && !ex.dataset.bound) { ex.dataset.bound = "1"; ex.addEventListener("click", () => openExample(ex)); }
  const nogpu = $("bs-nogpu");
  if (nogpu) nogpu.hidden = state.view.source === "replay";
  // what to do first: until the engine has run a step, and not over a replay
  const first = $("bs-first");
  if (first) first.hidden = state.store.lastStep >= 0 || state.view.source === "replay";
  bindPlay();
}

function tick() {
  try {
    bind();
    if (state.root) {
      showView();
      if (!state.live) setConn("replay");
      const nv = state.store.nvml;
      if (state.live && nv.length) {
        // rank 0's sample (a multi-GPU tick brings one per GPU; only rank 0's carries the CPU fields)
        let i = nv.length - 1;
        while (i > 0 && i > nv.length - 64 && !headSample(nv[i])) i--;
        showServerCpu(nv[i]);
      }
      if (!document.hidden) updateBoard();
      setStageTop();
      checkLoading();
      if (state.view.source !== "replay" && play.on) { play.on = false; syncPlay(); }
    }
  } catch (e) { console.error("batchscope stage", e); }
  setTimeout(tick, TICK_MS);
}

function start() {
  document.addEventListener("keydown", onKey);
  document.addEventListener("change", onFileChosen, true);      // capture: before controls.js clears it
  window.addEventListener("resize", () => { if (presenting()) setScale(); });
  if (new URLSearchParams(location.search).get("present") === "1") setPresent(true);
  tick();
}

if (!window.batchscopeStage) {
  window.batchscopeStage = { setPresent, togglePlay, get presenting() { return presenting(); }, play };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
}
