/* The presenter's layer over the charts: the per-mode scoreboard (scoreboard.js), presentation mode, keyboard
 * shortcuts, the no-GPU notice's example recording, feedback while a replay loads, and the header following
 * what the charts show (a replay or the live engine). main.js imports this module once; it runs on its own
 * slow timer and never draws a chart, so it costs the page next to nothing.
 *
 *   S / A   switch the engine to sync / async (POST /api/mode)      P   presentation mode on/off (Esc leaves it)
 *
 * Presentation mode is a class on <html> (style.css does the rest): the side panel, explainer and most of the
 * toolbar go, the text grows, and at 1280x720 the Gantt and the busy chart fit above the fold. ?present=1 in the
 * address opens the page in it. */
import { api, withToken } from "./api.js";
import { showReplay } from "./controls.js";
import { headSample, state } from "./feed.js";
import { requestMode, setConn, showServerCpu, showView } from "./header.js";
import { updateBoard } from "./scoreboard.js";
import { $, note, setText } from "./util.js";

const TICK_MS = 500;
const LOADING_GIVE_UP_MS = 180000;
const EXAMPLE_NAME = "H200 example (Llama-3-8B shapes)";

// ---------------------------------------------------------------- presentation mode

export function setPresent(on) {
  const root = document.documentElement;
  if (root.classList.contains("bs-present") === on) return;
  root.classList.toggle("bs-present", on);
  const b = $("bs-present");
  if (b) { b.setAttribute("aria-pressed", on ? "true" : "false"); b.textContent = on ? "exit presentation" : "present"; }
  // the charts take their new width and the larger text at the next picture
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
  if ((k === "s" || k === "a") && state.live) { ev.preventDefault(); requestMode(k === "s" ? "sync" : "async"); }
  else if (k === "p") { ev.preventDefault(); setPresent(!presenting()); }
  else if (k === "escape" && presenting()) setPresent(false);
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

// ---------------------------------------------------------------- the example recording

async function openExample(btn) {
  showLoading("loading the H200 example recording…");
  btn.disabled = true;
  try {
    const res = await fetch(withToken(btn.dataset.url));
    if (!res.ok) throw new Error(res.status + " " + res.statusText);
    const text = await res.text();
    await api("/api/replay", "POST", text, 60000);       // the same route a loaded file goes through
    showReplay(JSON.parse(text), EXAMPLE_NAME);
  } catch (e) {
    note("cannot open the example: " + e.message, true);
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
      checkLoading();
    }
  } catch (e) { console.error("batchscope stage", e); }
  setTimeout(tick, TICK_MS);
}

function start() {
  document.addEventListener("keydown", onKey);
  document.addEventListener("change", onFileChosen, true);      // capture: before controls.js clears it
  if (new URLSearchParams(location.search).get("present") === "1") setPresent(true);
  tick();
}

if (!window.batchscopeStage) {
  window.batchscopeStage = { setPresent, get presenting() { return presenting(); } };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
}
