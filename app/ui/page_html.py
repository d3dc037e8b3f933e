"""The HTML pieces of the batchscope page that Python renders: the sticky header, the chart container
(assets/js draws into it), progress bars, a burst's result table, the replay summary, the Generate tab's info
line and the error box every tab uses.

Pure functions of the app state or of a typed result (app/loadtest/statuses.py), so they are easy to check
without a browser; page.py and the tabs place them in Gradio blocks.
"""
from __future__ import annotations

import html
from typing import Any

from batchscope.telemetry.forecast import forecast_async
from batchscope.telemetry.summary import per_mode

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
# Where the shipped example recording is served (assets/examples/, package data under /batchscope-static/).
EXAMPLE_URL = "/batchscope-static/examples/h200-demo.timeline.json"
EXAMPLE_TEXT = "Llama-3-8B shapes on an NVIDIA H200, switched async → sync → async while it ran"
NO_GPU_HEAD = "No GPU here, so sync and async look alike."
NO_GPU = ("The async effect needs a device that computes while the host works: on a CPU the same cores build each "
          "step and compute it, so async has nothing to hide.")
KEYS = "keys: S sync · A async · P presentation"


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
    stats = ("".join(f'<span class="bs-stat"{title}>{label} <b id="{i}">–</b></span>' for label, i, title in (
        ("running", "bs-st-running", ""), ("queue", "bs-st-queue", ""), ("KV", "bs-st-kv", ""),
        ("busy (events)" if b["nvml"] else "busy (host)", "bs-st-busy", ""),
        (*cpu, f' title="{e(CPU_STAT_TITLE)}"' if not b["nvml"] else ""),
        ("tok/s", "bs-st-tps", ""), ("TTFT p50", "bs-st-ttft", "")))
        if live else '<span class="bs-stat">replay of a recorded timeline: no model loaded, live controls off</span>')
    replay = getattr(state, "replay", None)
    if not live and replay:
        nvml_value, nvml_note = recorded_nvml(replay)
    else:
        nvml_value = "available" if b["nvml"] else "not available"
        nvml_note = b["nvml_reason"] if b["nvml_reason"] and not b["nvml"] else ""
    on_gpu = b["nvml"] or b["device"].startswith("cuda")      # a replay of a GPU run has no live NVML either
    why = (b["busy_note"] or WHY_GPU) if on_gpu else WHY_CPU
    reason = f' <span id="bs-nvml-note" class="bs-reason">({e(nvml_note)})</span>' if nvml_note else \
        '<span id="bs-nvml-note" class="bs-reason"></span>'
    return f"""
<div class="bs-header">
  <div class="bs-brand">batchscope<span class="bs-sub">continuous batching, sync vs async</span></div>
  <div class="bs-modebox">{mode_box}</div>
  <div class="bs-stats">{stats}<span id="bs-dropped" class="bs-dropped"></span></div>
</div>
<div class="bs-statusline">
  <span>model <b id="bs-model">{e(b["model"])}</b></span>
  <span>device <b id="bs-device">{e(b["device"])}</b></span>
  <span>GPU <b id="bs-gpu">{e(b["gpu"])}</b></span>
  <span>NVML <b id="bs-nvml">{e(nvml_value)}</b>{reason}</span>
  {engine_notes(state)}
  <span id="bs-why" class="bs-why" title="{e(why)}" data-gpu="{e(b["busy_note"] or WHY_GPU)}" data-cpu="{e(WHY_CPU)}">{e(why)}</span>
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
        text = info["cuda_graphs_note"] if info.get("cuda_graphs") else f"decode runs eagerly: {info['cuda_graphs_note']}"
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
                 f'{html.escape(NO_GPU)}</p>'
                 f'<button id="bs-example" class="bs-example-btn" data-url="{EXAMPLE_URL}" '
                 f'title="{html.escape(EXAMPLE_TEXT)}. It opens in these charts as a replay; back to live returns here.">'
                 f'▶ Open the H200 example recording</button></div>')
    return (f'<div id="bs-stage" class="bs-stage">{nogpu}'
            f'<div id="bs-scope" class="bs-scope" data-live="{1 if live else 0}" '
            f'data-replay-name="{html.escape(str(recording.get("name") or ""))}">'
            f'<div class="bs-loading">loading charts…</div></div>'
            f'<aside id="bs-board" class="bs-board" aria-label="per-mode scoreboard"></aside>'
            f'<div id="bs-replay-loading" class="bs-replay-loading" role="status" hidden>'
            f'<span class="bs-spinner" aria-hidden="true"></span><span id="bs-replay-loading-text">'
            f'loading the recording…</span></div></div>')


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
    util_label, util = _util(res)
    extra = [("output tokens/s", res.output_tokens_per_s, 1), ("requests/s", res.requests_per_s, 2),
             (_busy_label(res), res.busy_pct, 1), (util_label, util, 1), ("requests completed", res.completed, 0),
             ("requests failed", res.failed or None, 0), ("wall time s", res.duration_s, 2)]
    tail = "".join(f'<tr><th>{label}</th><td colspan="3">{number_text(v, d)}</td></tr>' for label, v, d in extra if v is not None)
    return (f'<table id="{table_id}" class="bs-table"><thead><tr><th></th><th>p50</th><th>p90</th><th>p99</th></tr>'
            f'</thead><tbody>{"".join(rows)}{tail}</tbody></table>')


def _busy_label(res: BurstResults | None) -> str:
    basis = ((res.telemetry if res else None) or {}).get("busy_basis")
    return "compute busy % (host spans)" if basis == "host" else "GPU busy % (events)"


def _util(res: BurstResults | None) -> tuple[str, Any]:
    """NVML utilization over the burst's window, or host CPU % where there is no NVML."""
    tel = (res.telemetry if res else None) or {}
    if tel.get("gpu_util_mean") is not None:
        return "NVML util % (mean)", tel["gpu_util_mean"]
    return "host CPU % (mean)", tel.get("cpu_pct_mean")


REPLAY_FIELDS = (("model", "meta", "model"), ("device", "meta", "device"), ("GPU", "meta", "gpu"),
                 ("dtype", "meta", "dtype"), ("recorded", "meta", "created"), ("duration s", "summary", "duration_s"),
                 ("steps", "summary", "steps"), ("modes", "summary", "modes"),
                 ("requests finished", "summary", "requests_finished"), ("tokens/s", "summary", "tokens_per_s"),
                 ("busy %", "summary", "busy_pct"), ("busy basis", "summary", "busy_basis"),
                 ("GPU idle total µs", "summary", "idle_us_total"), ("decode ms/step p50", "summary", "decode_ms_p50"),
                 ("batch size mean", "summary", "batch_requests_mean"), ("queue depth max", "summary", "queue_depth_max"),
                 ("KV usage max %", "summary", "kv_usage_pct_max"), ("NVML util mean %", "summary", "gpu_util_mean"))


def replay_html(state) -> str:
    """What the side panel shows on a replay-only server: what was recorded, its summary, each mode's figures
    side by side and the async forecast from the sync steps. Recordings made before the per-mode summary existed
    get it computed here."""
    replay = getattr(state, "replay", None) or {}
    parts = {"meta": replay.get("meta") or {}, "summary": replay.get("summary") or {}}
    rows = []
    for label, part, key in REPLAY_FIELDS:
        v = parts[part].get(key)
        if v is None or v == "":
            continue
        if isinstance(v, dict):
            v = ", ".join(f"{k} {n}" for k, n in v.items())
        elif isinstance(v, float):
            v = f"{v:,.2f}"
        rows.append(f"<tr><th>{html.escape(label)}</th><td>{html.escape(str(v))[:80]}</td></tr>")
    summary = parts["summary"]
    steps = replay.get("steps") or []
    modes = summary.get("per_mode") or per_mode(steps, replay.get("nvml") or [])
    forecast = summary.get("async_forecast") or forecast_async(steps)
    return (f'<div class="bs-replay-info"><p>Replay of a recorded timeline. No model is loaded, so generation, '
            f'load tests and the mode toggle are off; the charts show the recording.</p>'
            f'{per_mode_html(modes, forecast)}'
            f'<table id="bs-replay-summary" class="bs-table">{"".join(rows)}</table></div>')


# (label, key in a mode's figures, digits, unit). Tokens/s over all steps is left out here: it moves with how
# many prompts arrived in each stretch (prefill steps), not with the loop; decode tok/s does not.
MODE_ROWS = (("ms/step (median)", "ms_per_step", 2, ""), ("decode tok/s", "decode_tokens_per_s", 0, ""),
             ("GPU busy % (events)", "busy_pct", 1, "%"), ("GPU idle per step", "idle_us_per_step", 0, " µs"),
             ("NVML util mean", "gpu_util_mean", 1, "%"), ("steps", "steps", 0, ""))


def mode_ratio(key: str, vs, va) -> str:
    """How async compares with sync on one figure, in words that say which way is better."""
    if vs is None or va is None or key not in ("ms_per_step", "decode_tokens_per_s", "busy_pct", "idle_us_per_step"):
        return ""
    if key == "busy_pct":
        return f"{va - vs:+.1f} pts"
    if not vs or not va:
        return "–"
    if key == "ms_per_step":
        return f"{vs / va:.2f}× {'faster' if va <= vs else 'slower'}"
    if key == "idle_us_per_step":
        return f"{100.0 * (va - vs) / vs:+.0f}%"
    return f"×{va / vs:.2f}"


def per_mode_html(modes: dict, forecast: dict | None) -> str:
    """Sync and async figures of a recording side by side (telemetry/summary.py per_mode), the ratio (how much
    better async did: x faster, x more tokens/s, busy points gained), and the forecast line."""
    if not modes:
        return ""
    s, a = modes.get("sync") or {}, modes.get("async") or {}
    body = []
    for label, key, digits, unit in MODE_ROWS:
        vs, va = s.get(key), a.get(key)
        if vs is None and va is None:
            continue
        cell = lambda v: "–" if v is None else f"{number_text(v, digits)}{unit}"  # noqa: E731
        body.append(f"<tr><th>{label}</th><td>{cell(vs)}</td><td>{cell(va)}</td>"
                    f"<td>{mode_ratio(key, vs, va)}</td></tr>")
    foot = ""
    if forecast and forecast.get("applicable"):
        f, m = forecast["forecast_ms_per_step"], forecast.get("measured_async_ms_per_step")
        measured = (f' · measured async <b>{number_text(m["p50"], 2)}</b> ms/step '
                    f'({forecast["forecast_error_pct"]:+.1f}%)' if m else " · no async steps recorded to check it")
        foot = (f'<p id="bs-replay-forecast" class="bs-forecast-line">Async forecast from the sync spans: '
                f'<b>{number_text(f["p50"], 2)}</b> ms/step (×{forecast["speedup"]:.2f}){measured}.</p>')
    elif forecast and forecast.get("reason"):
        foot = f'<p id="bs-replay-forecast" class="bs-forecast-line">Async forecast: {html.escape(forecast["reason"])}.</p>'
    return (f'<table id="bs-replay-modes" class="bs-table bs-ab"><thead><tr><th>per mode</th><th class="sync">sync</th>'
            f'<th class="async">async</th><th>async vs sync</th></tr></thead><tbody>{"".join(body)}</tbody></table>'
            f'{foot}')


def gen_info_html(first: float | None, elapsed: float, done: bool) -> str:
    ttft = f"first text after {first * 1000:.0f} ms · " if first is not None else ""
    return f'<div class="bs-gen-info">{ttft}{"done in" if done else "running"} {elapsed:.2f} s</div>'
