"""The HTML pieces of the batchscope page that Python renders: the sticky header, the chart container
(assets/js draws into it), progress bars, a burst's result table, the replay summary, the Generate tab's info
line and the error box every tab uses.

Pure functions of the app state or of a typed result (app/loadtest/statuses.py), so they are easy to check
without a browser; page.py and the tabs place them in Gradio blocks.
"""
from __future__ import annotations

import html
from typing import Any

from ..loadtest.statuses import BurstResults


WHY_GPU = ("Why the two busy numbers differ: NVML utilization is the share of each ~1/6–1 s sampling window in which "
           "any kernel ran, so sub-millisecond gaps between steps still read as busy. Event busy % adds up the "
           "measured compute spans (CUDA events), so it sees every gap.")
WHY_CPU = ("No NVML on this device: the utilization chart shows host CPU % (psutil), and with no CUDA events there is "
           "no event-based busy %. On a GPU, NVML counts any kernel in a ~1/6–1 s window while events see every gap.")
# The header's CPU figure on a machine without NVML: this server's own process, not the whole host, which also
# runs the browser drawing this page (a busy tab alone reads 50% and more of a small machine).
CPU_STAT_TITLE = ("CPU used by this batchscope server (engine, telemetry and web server), in % of one core. The host "
                  "as a whole also runs this browser; its figure is in the busy chart's dashed line.")
# Where the shipped example recordings are served (assets/examples/, package data under /batchscope-static/), and
# their index (benchmarks/ship_examples.py writes both).
EXAMPLES_URL = "/batchscope-static/examples/"
EXAMPLE_TEXT = "Llama-3-8B shapes on an NVIDIA H200, switched async → sync → async while it ran"
NO_GPU_HEAD = "No GPU here, so sync and async look alike."
NO_GPU = ("The async effect needs a device that computes while the host works: on a CPU the same cores build each "
          "step and compute it, so async has nothing to hide.")
KEYS = "keys: S sync · A async · P presentation"
# What to do first, on a live page until the engine has run a step (stage.js hides it then).
FIRST_STEP = ("<b>Start here:</b> press <kbd>L</kbd> to put a steady load on the engine (or Load test → Start "
              "load), then <kbd>S</kbd> and <kbd>A</kbd> to switch the loop and watch the Gantt.")
FIRST_STEP_CPU = (" Or open a recorded GPU run, where async shows what it hides: ▶ Open the recording.")
WHY_IMPORT = ("An imported profiler trace: busy % is what the device did, the union of its kernels, copies and "
              "memsets over the steps' window. The steps' compute spans (between steps only) count the launch gaps "
              "inside a step as busy, so that figure reads higher.")
DEVICE_BUSY_TITLE = ("What the device did: the share of the steps' window in which it ran any op (the union of "
                     "kernels, copies and memsets on all streams), read from the profiler trace.")
BUSY_STAT_TITLE = ("busy %: the newest 2 s of completed steps; out tok/s: every output token of the newest 5 s (the "
                   "scoreboard's tok/s counts decode steps only). While requests run the step in flight is not counted "
                   "until it is done. The same records the scoreboard and the downloaded timeline hold.")
# In presentation mode the whole demo runs from the keyboard: the hints stay on screen.
PRESENT_KEYS = (("S", "sync"), ("A", "async"), ("L", "load on/off"), ("B", "run an A/B"), ("W", "the switch"),
                ("P", "leave"))
REPLAY_KEYS = (("Space", "play / pause"), ("W", "the switch"), ("P", "leave"))


# ----------------------------------------------------------------------------------------------- small helpers

def number_text(v: Any, digits: int = 1) -> str:
    if v is None:
        return "–"
    try:
        return f"{float(v):,.{digits}f}"
    except (TypeError, ValueError):
        return html.escape(str(v))


def error_html(text: str) -> str:
    return f'<div class="bs-err" role="alert">{html.escape(text)}</div>'


def _status_bits(state) -> dict:
    try:
        st = state.status()
    except Exception:  # the page must render even when the status call fails
        return {"model": "?", "device": "?", "gpu": "none", "nvml": False, "nvml_reason": "", "busy_note": "",
                "mode": "?"}
    return {"model": st.model or "?", "device": st.device or "?", "gpu": st.gpu_name or "none",
            "nvml": st.nvml_available, "nvml_reason": st.nvml_reason or "", "busy_note": st.busy_note,
            "mode": st.mode or "?"}


# ----------------------------------------------------------------------------------------------- HTML blocks

def recorded_nvml(timeline: dict) -> tuple[str, str]:
    """What a recording says about NVML, as the status line's (value, note): samples with GPU utilization mean
    NVML was there when it was recorded, whatever this server has now."""
    samples = timeline.get("nvml") or []
    gpu = sum(1 for x in samples if x.get("gpu_util") is not None)
    if gpu:
        return "recorded", f"{gpu} samples in the recording"
    if samples:
        return "not recorded", "host CPU % samples only (psutil)"
    return "not recorded", "no samples in the recording"


def replay_busy(timeline: dict) -> tuple[str, str, str]:
    """A recording's headline busy % for the header, as (label, value, title): an imported trace's is the device's
    own (the union of its ops over the steps' window), with the steps' figure in the title; batchscope's own is
    its CUDA events' (or, on a CPU, the host spans')."""
    s = timeline.get("summary") or {}
    v = s.get("busy_pct")
    value = "–" if v is None else f"{v:.1f}%"
    if s.get("busy_basis") == "device_ops":
        steps = s.get("busy_pct_steps")
        return busy_label("device_ops"), value, DEVICE_BUSY_TITLE + (
            f" Between steps only (the steps' compute spans): {steps:.1f}%." if steps is not None else "")
    if s.get("busy_basis") == "host":
        return busy_label("host"), value, "the share of the recording the forward's host spans cover (no device events)"
    return busy_label("events"), value, "the share of the recording the steps' compute spans cover (CUDA events)"


def header_html(state) -> str:
    """The sticky header: mode (always visible) with its toggle, live counters, and the status line."""
    live = state.engine is not None
    b = _status_bits(state)
    e = html.escape
    mode = b["mode"] if b["mode"] in ("sync", "async") else ""
    present = ('<button id="bs-present" class="bs-present-btn" aria-pressed="false" '
               'title="Presentation mode (key P): charts and scoreboard only, larger text">present</button>')
    on = b["gpu"] if b["gpu"] != "none" else b["device"]        # shown in presentation mode, for the room
    present += f'<span id="bs-view-title" class="bs-view-title">{e(b["model"])} on {e(on)}</span>'
    if live:
        toggle = (f'<span class="bs-seg bs-toggle" role="group" aria-label="engine mode">'
                  f'<button id="bs-mode-sync" class="{"active" if mode == "sync" else ""}" '
                  f'title="Classic loop: the host waits for each step (key S)">sync</button>'
                  f'<button id="bs-mode-async" class="{"active" if mode == "async" else ""}" '
                  f'title="Overlapped loop: the host builds step N+1 while the GPU runs N (key A)">async</button>'
                  f'</span>')
        mode_box = (f'<span class="bs-label">mode</span><span id="bs-mode" class="bs-mode" data-mode="{e(mode)}">'
                    f'{e(mode or "?")}</span>{toggle}{present}'
                    f'<span id="bs-keys" class="bs-keys" title="Keyboard shortcuts (not while typing in a field)">'
                    f'{KEYS}</span>')
    else:
        mode_box = (f'<span id="bs-mode" class="bs-mode" data-mode="replay">replay</span>{present}'
                    f'<span id="bs-keys" class="bs-keys" title="Keyboard shortcut">keys: P presentation</span>')
    cpu = ("server CPU", "bs-st-cpu") if not b["nvml"] else ("NVML", "bs-st-nvml")
    # busy and tok/s come from the server (telemetry/figures.py recent): the newest 2 s of completed steps
    busy_title = f' title="{e(BUSY_STAT_TITLE)}"'
    replay_stats = ""
    if not live:
        label, value, title = replay_busy(getattr(state, "replay", None) or {})
        replay_stats = (f'<span class="bs-stat" title="{e(title)}"><span id="bs-st-busy-label">{e(label)}</span> '
                        f'<b id="bs-st-busy">{e(value)}</b></span>')
    stats = ("".join(f'<span class="bs-stat{cls}"{title}>{label} <b id="{i}">–</b></span>' for label, i, title, cls in (
        ("running", "bs-st-running", "", ""), ("queue", "bs-st-queue", "", " bs-minor"),
        ("KV", "bs-st-kv", "", " bs-minor"),
        (busy_label("events" if b["nvml"] else "host"), "bs-st-busy", busy_title, ""),
        (*cpu, f' title="{e(CPU_STAT_TITLE)}"' if not b["nvml"] else "", " bs-minor"),
        ("out tok/s", "bs-st-tps", busy_title, ""), ("TTFT p50", "bs-st-ttft", "", " bs-minor")))
        if live else replay_stats + '<span class="bs-stat">replay of a recorded timeline: no model loaded, live '
        'controls off</span>')
    replay = getattr(state, "replay", None)
    if not live and replay:
        nvml_value, nvml_note = recorded_nvml(replay)
    else:
        nvml_value = "available" if b["nvml"] else "not available"
        nvml_note = b["nvml_reason"] if b["nvml_reason"] and not b["nvml"] else ""
    on_gpu = b["nvml"] or b["device"].startswith("cuda")      # a replay of a GPU run has no live NVML either
    why = (b["busy_note"] or WHY_GPU) if on_gpu else WHY_CPU
    if not live and replay and (replay.get("summary") or {}).get("busy_basis") == "device_ops":
        why = WHY_IMPORT
    reason = f' <span id="bs-nvml-note" class="bs-reason">({e(nvml_note)})</span>' if nvml_note else \
        '<span id="bs-nvml-note" class="bs-reason"></span>'
    stats_class = "" if live else " bs-replay-stats"
    return f"""
<div class="bs-header">
  <div class="bs-brand">batchscope<span class="bs-sub">continuous batching, sync vs async</span></div>
  <div class="bs-modebox">{mode_box}</div>
  <div class="bs-stats{stats_class}">{stats}<span id="bs-dropped" class="bs-dropped"></span></div>
</div>
<div class="bs-statusline">
  <span>model <b id="bs-model">{e(b["model"])}</b></span>
  <span>device <b id="bs-device">{e(b["device"])}</b></span>
  <span>GPU <b id="bs-gpu">{e(b["gpu"])}</b></span>
  <span>NVML <b id="bs-nvml">{e(nvml_value)}</b>{reason}</span>
  {engine_notes(state)}
  <span id="bs-why" class="bs-why" title="{e(why)}" data-gpu="{e(b["busy_note"] or WHY_GPU)}"
        data-cpu="{e(WHY_CPU)}">{e(why)}</span>
</div>"""


def engine_notes(state) -> str:
    """What the engine runs differently from the usual, on the status line: decode without CUDA graphs (and
    why: a model whose step cannot be captured runs eagerly), a sampling path that runs eagerly, tensor
    parallelism over several GPUs. From the live engine's info, or the replayed recording's."""
    if state.engine is not None:
        info = getattr(state.engine, "info", None) or {}
    else:
        info = ((getattr(state, "replay", None) or {}).get("meta") or {}).get("info") or {}
    e = html.escape
    notes = []
    if info.get("cuda_graphs_note"):
        title = "decode steps replay CUDA graphs where the model allows it; where not, the reason is shown"
        note = info["cuda_graphs_note"]
        text = note if info.get("cuda_graphs") else f"decode runs eagerly: {note}"
        notes.append(f'<span id="bs-graphs-note" class="bs-engine-note" title="{e(title)}">{e(text)}</span>')
    tp = info.get("tensor_parallel_size") or 1
    if tp > 1:
        gpus = ", ".join(str(r.get("device")) for r in info.get("ranks") or [])
        notes.append(f'<span id="bs-tp-note" class="bs-engine-note">tensor parallel x{tp}'
                     f'{" (" + e(gpus) + ")" if gpus else ""}</span>')
    return "".join(notes)


def scope_html(state) -> str:
    """The container assets/js draws into (data-live tells it whether there is an engine to follow), with the
    per-mode scoreboard beside it (assets/js/scoreboard.js), the no-GPU notice on a CPU engine, and the replay
    loading notice (assets/js/stage.js)."""
    live = state.engine is not None
    recording = ((getattr(state, "replay", None) or {}).get("meta") or {}).get("recording") or {}
    device = _status_bits(state)["device"] if live else ""
    nogpu = ""
    if live and not device.startswith("cuda"):
        nogpu = (f'<div id="bs-nogpu" class="bs-nogpu" role="note"><p><b>{html.escape(NO_GPU_HEAD)}</b> '
                 f'{html.escape(NO_GPU)}</p>{examples_html()}</div>')
    first = ""
    if live:
        first = (f'<div id="bs-first" class="bs-first" role="note">{FIRST_STEP}'
                 f'{FIRST_STEP_CPU if nogpu else ""}</div>')
    def hints(pairs) -> str:
        return "".join(f"<span><kbd>{html.escape(k)}</kbd> {html.escape(v)}</span>" for k, v in pairs)
    # a live server can show a replay too ("load replay"): its keys S, A, L and B act on the engine, not on the
    # replay on screen, so while one is shown (bs-scope's data-source, style.css) only the replay's keys are offered
    keys = (f'<span class="bs-keys-live">{hints(PRESENT_KEYS)}</span>'
            f'<span class="bs-keys-replay">{hints(REPLAY_KEYS)}</span>') if live else hints(REPLAY_KEYS)
    # the band above the charts (a column beside them when presenting): an A/B's panel first in the markup so
    # that, once shown, it can replace the notice (style.css), then the notice and the scoreboard
    return (f'<div id="bs-stage" class="bs-stage">{first}'
            f'<div id="bs-band" class="bs-band">'
            f'<aside id="bs-ab-panel" class="bs-ab-panel" aria-live="polite" hidden></aside>{nogpu}'
            f'<aside id="bs-board" class="bs-board" aria-label="per-mode scoreboard"></aside></div>'
            f'<div id="bs-scope" class="bs-scope" data-live="{1 if live else 0}" '
            f'data-replay-name="{html.escape(str(recording.get("name") or ""))}">'
            f'<div class="bs-loading">loading charts…</div></div>'
            f'<div id="bs-present-keys" class="bs-present-keys" aria-label="keyboard shortcuts">{keys}</div>'
            f'<div id="bs-replay-loading" class="bs-replay-loading" role="status" hidden>'
            f'<span class="bs-spinner" aria-hidden="true"></span><span id="bs-replay-loading-text">'
            f'loading the recording…</span></div></div>')


def examples() -> list[dict]:
    """The shipped recordings (assets/examples/index.json): file, title, text."""
    import json
    from importlib import resources

    try:
        return json.loads((resources.files("batchscope.assets") / "examples" / "index.json").read_text("utf-8"))
    except (OSError, ValueError):
        return []


def examples_html() -> str:
    """A picker of the shipped H200 recordings and the button that opens the chosen one as a replay."""
    e = html.escape
    options = "".join(f'<option value="{e(EXAMPLES_URL + x["file"])}" title="{e(x.get("text", ""))}">'
                      f'{e(x["title"])}</option>' for x in examples())
    if not options:
        return ""
    return (f'<span class="bs-examples"><select id="bs-examples" class="bs-input" aria-label="a recorded GPU run">'
            f'{options}</select><button id="bs-example" class="bs-example-btn" title="{e(EXAMPLE_TEXT)}: and the '
            f'others in the list open in these charts as a replay; back to live returns here.">▶ Open the recording'
            f'</button></span>')


def progress_html(done: int | None, total: int | None, label: str, error: str | None = None) -> str:
    if error:
        return f'<div class="bs-err" role="alert">{html.escape(error)}</div>'
    pct = 100.0 * (done or 0) / total if total else 0.0
    count = f"{done}/{total} requests" if total else ""
    return (f'<div class="bs-progress-wrap"><div class="bs-progress"><div style="width:{pct:.1f}%"></div></div>'
            f'<span class="bs-progress-label">{html.escape(label)} {count}</span></div>')


METRICS = (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("E2E", "e2e_ms"))


def results_html(res: BurstResults | None, table_id: str = "bs-burst-results") -> str:
    """Latency percentiles and throughput of one burst."""
    if res is None:
        return ""
    rows = []
    for label, key in METRICS:
        p = getattr(res, key)
        rows.append(f"<tr><th>{label} <small>ms</small></th>"
                    + "".join(f"<td>{number_text(v)}</td>" for v in (p.p50, p.p90, p.p99)) + "</tr>")
    if res.telemetry is not None:
        rows.append(_delivery_row(res.telemetry.get("delivery_delay_ms")))
    util_label, util = _util(res)
    extra = [("output tokens/s", res.output_tokens_per_s, 1), ("requests/s", res.requests_per_s, 2),
             (result_busy_label(res), res.busy_pct, 1), (util_label, util, 1), ("requests completed", res.completed, 0),
             ("requests failed", res.failed or None, 0), ("wall time s", res.duration_s, 2)]
    tail = "".join(f'<tr><th>{label}</th><td colspan="3">{number_text(v, d)}</td></tr>'
                   for label, v, d in extra if v is not None)
    return (f'<table id="{table_id}" class="bs-table"><thead><tr><th></th><th>p50</th><th>p90</th><th>p99</th></tr>'
            f'</thead><tbody>{"".join(rows)}{tail}</tbody></table>')


DELIVERY_TITLE = ("From each sampled token to its chunk written to the client: the server's event loop, "
                  "detokenising and JSON, not the GPU. Unknown where nothing was streamed.")


def delivery_text(p: dict | None, q: str) -> str:
    """One percentile of the delivery delay, or "unknown" where no token was streamed (nothing measured it)."""
    return number_text(p.get(q), 2) if p and p.get("n") else "unknown"


def _delivery_row(p: dict | None) -> str:
    return (f'<tr class="bs-delivery" title="{html.escape(DELIVERY_TITLE)}"><th>delivery delay <small>ms</small></th>'
            + "".join(f"<td>{delivery_text(p, q)}</td>" for q in ("p50", "p90", "p99")) + "</tr>")


# What "busy" is called for each way it was measured: the same words as assets/js/palette.js's busyLabel (the
# page's one source; tests/unit/test_sweep_figures_js.py holds the two together).
BUSY_LABEL = {"events": "busy (events)", "host": "busy (host)", "device_ops": "busy (device ops)"}


def busy_label(basis: str | None) -> str:
    return BUSY_LABEL.get(basis or "events", BUSY_LABEL["events"])


def result_busy_label(res: BurstResults | None) -> str:
    """A result's busy % row, named for how its telemetry measured it."""
    return busy_label(((res.telemetry if res else None) or {}).get("busy_basis")) + " %"


def _util(res: BurstResults | None) -> tuple[str, Any]:
    """NVML utilization over the burst's window, or host CPU % where there is no NVML."""
    tel = (res.telemetry if res else None) or {}
    if tel.get("gpu_util_mean") is not None:
        return "NVML util % (mean)", tel["gpu_util_mean"]
    return "host CPU % (mean)", tel.get("cpu_pct_mean")


NOT_IN_TRACE = "–, not in the trace"
# summary.busy_basis in words: the side panel names how busy % was measured, not the field's value
BUSY_BASIS_WORDS = {"events": "CUDA events around each step", "host": "host timing (no device events)",
                    "device_ops": "device ops in the trace"}
# the side panel's figures made of a field an imported trace may not hold (meta.source.unknown)
UNKNOWN_FROM = {"requests_finished": "request_ids", "tokens_per_s": "tokens_out", "batch_requests_mean": "num_requests",
                "queue_depth_max": "queue_depth", "kv_usage_pct_max": "kv_blocks_used"}
REPLAY_FIELDS = (("model", "meta", "model"), ("device", "meta", "device"), ("GPU", "meta", "gpu"),
                 ("dtype", "meta", "dtype"), ("recorded", "meta", "created"), ("duration s", "summary", "duration_s"),
                 ("steps", "summary", "steps"), ("modes", "summary", "modes"),
                 ("requests finished", "summary", "requests_finished"), ("tokens/s", "summary", "tokens_per_s"),
                 ("busy %", "summary", "busy_pct"), ("busy measured from", "summary", "busy_basis"),
                 ("busy between steps only %", "summary", "busy_pct_steps"),
                 ("GPU idle total µs", "summary", "idle_us_total"), ("decode ms/step p50", "summary", "decode_ms_p50"),
                 ("delivery delay p50 / p99 ms", "summary", "delivery_delay_ms"),
                 ("batch size mean", "summary", "batch_requests_mean"),
                 ("queue depth max", "summary", "queue_depth_max"),
                 ("KV usage max %", "summary", "kv_usage_pct_max"), ("NVML util mean %", "summary", "gpu_util_mean"))


def replay_html(state) -> str:
    """What the side panel shows on a replay-only server: what was recorded and its summary. The modes are set
    against each other by the scoreboard beside the charts (the server's board of the recording), once."""
    replay = getattr(state, "replay", None) or {}
    parts = {"meta": replay.get("meta") or {}, "summary": replay.get("summary") or {}}
    source = parts["meta"].get("source") or {}
    unknown = set(source.get("unknown") or ())
    rows = []
    for label, part, key in REPLAY_FIELDS:
        v = parts[part].get(key)
        if key == "created" and source:           # an imported trace: when the trace began, not the import
            label, v = "recorded (trace start)", source.get("trace_start") or NOT_IN_TRACE
        if UNKNOWN_FROM.get(key) in unknown:
            v = NOT_IN_TRACE
        if v is None or v == "":
            continue
        if key == "busy_basis":
            v = BUSY_BASIS_WORDS.get(v, v)
        if key == "delivery_delay_ms":
            if not v.get("n"):
                continue
            v = f"{delivery_text(v, 'p50')} / {delivery_text(v, 'p99')}"
        if isinstance(v, dict):
            v = ", ".join(f"{k} {n}" for k, n in v.items())
        elif isinstance(v, float):
            v = f"{v:,.2f}"
        rows.append(f"<tr><th>{html.escape(label)}</th><td>{html.escape(str(v))[:80]}</td></tr>")
    return (f'<div class="bs-replay-info"><p>Replay of a recorded timeline. No model is loaded, so generation, '
            f'load tests and the mode toggle are off; the charts show the recording and the scoreboard beside '
            f'them sets its sync and async stretches against each other.</p>'
            f'<table id="bs-replay-summary" class="bs-table">{"".join(rows)}</table></div>')


def gen_info_html(first: float | None, elapsed: float, done: bool) -> str:
    ttft = f"first text after {first * 1000:.0f} ms · " if first is not None else ""
    return f'<div class="bs-gen-info">{ttft}{"done in" if done else "running"} {elapsed:.2f} s</div>'
