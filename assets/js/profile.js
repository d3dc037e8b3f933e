/* The profiler control beside the recording controls: "⏱ profile N steps" asks the server for a torch.profiler
 * window over the engine's next N steps (POST /api/profile {"steps": N}), follows it (GET /api/profile), and once
 * the trace is written offers it for download (trace_url, a gzipped Kineto trace Perfetto opens) and, where the
 * server can import traces (open_url), opens it here as a replay beside the live recording.
 * One call mounts it: mountProfile(container, showReplay) appends its elements (ids bs-prof-*) to `container`. */
import { api, withToken } from "./api.js";
import { note } from "./util.js";

const POLL_MS = 500;
const DEFAULT_STEPS = 20;

export function mountProfile(container, showReplay) {
  if (!container) return;
  const box = document.createElement("span");
  box.id = "bs-prof-group";
  box.innerHTML = `
    <input id="bs-prof-steps" class="bs-input" type="number" min="1" max="1000" value="${DEFAULT_STEPS}" style="width:4.5em" title="Steps the profiler window covers">
    <button id="bs-prof" class="bs-btn" title="Run torch.profiler over the engine's next N steps (its Kineto trace, for Perfetto)">⏱ profile</button>
    <a id="bs-prof-dl" class="bs-btn" hidden title="The window's Kineto trace (gzipped Chrome trace JSON): open it in ui.perfetto.dev">⤓ profiler trace</a>
    <button id="bs-prof-open" class="bs-btn" hidden title="Import the trace and view it here as a replay">open trace</button>`;
  container.appendChild(box);
  const btn = box.querySelector("#bs-prof"), dl = box.querySelector("#bs-prof-dl");
  const open = box.querySelector("#bs-prof-open"), input = box.querySelector("#bs-prof-steps");
  btn.onclick = async () => {
    const steps = parseInt(input.value, 10);
    try {
      await api("/api/profile", "POST", { steps });
    } catch (e) { note("profile: " + e.message, true); return; }
    dl.hidden = true; open.hidden = true;
    follow(btn, dl, open);
  };
  open.onclick = async () => {
    try {
      await api("/api/profile/open", "POST", {}, 120000);
      showReplay(await api("/api/replay.json", "GET", undefined, 60000), "profiler trace");
    } catch (e) { note("open trace: " + e.message, true); }
  };
}

async function follow(btn, dl, open) {
  btn.disabled = true;
  try {
    for (;;) {
      const s = await api("/api/profile", "GET");
      if (s.state === "done" || s.state === "error") { show(s, dl, open); return; }
      btn.textContent = "⏱ " + s.state + "…";
      await new Promise(r => setTimeout(r, POLL_MS));
    }
  } catch (e) {
    note("profile: " + e.message, true);
  } finally {
    btn.disabled = false; btn.textContent = "⏱ profile";
  }
}

function show(s, dl, open) {
  if (s.state === "error") { note("profile: " + (s.error || "failed"), true); return; }
  dl.href = withToken(s.trace_url);
  dl.download = `batchscope-profile-steps-${s.first_step}-${s.last_step}.pt.trace.json.gz`;
  dl.hidden = false;
  open.hidden = !s.open_url;
  note(`profiled steps ${s.first_step}-${s.last_step} (the profiler held the engine ${s.start_ms} ms to start, ` +
       `${s.stop_ms} ms to stop)`, false);
}
