"""The HTML pieces of the batchscope page that Python renders: the sticky header, the chart container
(assets/js draws into it), progress bars, burst and A/B result tables, and the replay summary.

Pure functions of the app state or of a typed result (app/schemas.py), so they are easy to check without a
browser; app/ui.py places them in Gradio blocks.
"""
from __future__ import annotations

import html
from typing import Any

from .schemas import ABStatus, BurstResults

WHY_GPU = ("Why the two busy numbers differ: NVML utilization is the share of each ~1/6–1 s sampling window in which "
           "any kernel ran, so sub-millisecond gaps between steps still read as busy. Event busy % adds up the "
           "measured compute spans (CUDA events), so it sees every gap.")
WHY_CPU = ("No NVML on this device: the utilization chart shows host CPU % (psutil), and with no CUDA events there is "
           "no event-based busy %. On a GPU, NVML counts any kernel in a ~1/6–1 s window while events see every gap.")


# ----------------------------------------------------------------------------------------------- small helpers

def _num(v: Any, digits: int = 1) -> str:
    if v is None:
        return "–"
    try:
        return f"{float(v):,.{digits}f}"
    except (TypeError, ValueError):
        return html.escape(str(v))


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

def header_html(state) -> str:
    """The sticky header: mode (always visible) with its toggle, live counters, and the status line."""
    live = state.engine is not None
    b = _status_bits(state)
    e = html.escape
    mode = b["mode"] if b["mode"] in ("sync", "async") else ""
    if live:
        toggle = (f'<span class="bs-seg bs-toggle" role="group" aria-label="engine mode">'
                  f'<button id="bs-mode-sync" class="{"active" if mode == "sync" else ""}" '
                  f'title="Classic loop: the host waits for each step">sync</button>'
                  f'<button id="bs-mode-async" class="{"active" if mode == "async" else ""}" '
                  f'title="Overlapped loop: the host builds step N+1 while the GPU runs N">async</button></span>')
        mode_box = (f'<span class="bs-label">mode</span><span id="bs-mode" class="bs-mode" data-mode="{e(mode)}">'
                    f'{e(mode or "?")}</span>{toggle}')
    else:
        mode_box = '<span id="bs-mode" class="bs-mode" data-mode="replay">replay</span>'
    stats = ("".join(f'<span class="bs-stat">{label} <b id="{i}">–</b></span>' for label, i in (
        ("running", "bs-st-running"), ("queue", "bs-st-queue"), ("KV", "bs-st-kv"),
        ("busy (events)" if b["nvml"] else "busy (host)", "bs-st-busy"), ("NVML" if b["nvml"] else "CPU", "bs-st-nvml"),
        ("tok/s", "bs-st-tps"), ("TTFT p50", "bs-st-ttft")))
        if live else '<span class="bs-stat">replay of a recorded timeline: no model loaded, live controls off</span>')
    on_gpu = b["nvml"] or b["device"].startswith("cuda")      # a replay of a GPU run has no live NVML either
    why = (b["busy_note"] or WHY_GPU) if on_gpu else WHY_CPU
    reason = f' <span class="bs-reason">({e(b["nvml_reason"])})</span>' if b["nvml_reason"] and not b["nvml"] else ""
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
  <span>NVML <b id="bs-nvml">{"available" if b["nvml"] else "not available"}</b>{reason}</span>
  <span class="bs-why" title="{e(why)}">{e(why)}</span>
</div>"""


def scope_html(state) -> str:
    """The container assets/js draws into; data-live tells it whether there is an engine to follow."""
    live = state.engine is not None
    recording = ((getattr(state, "replay", None) or {}).get("meta") or {}).get("recording") or {}
    return (f'<div id="bs-scope" class="bs-scope" data-live="{1 if live else 0}" '
            f'data-replay-name="{html.escape(str(recording.get("name") or ""))}">'
            f'<div class="bs-loading">loading charts…</div></div>')


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
                    + "".join(f"<td>{_num(v)}</td>" for v in (p.p50, p.p90, p.p99)) + "</tr>")
    util_label, util = _util(res)
    extra = [("output tokens/s", res.output_tokens_per_s, 1), ("requests/s", res.requests_per_s, 2),
             (_busy_label(res), res.busy_pct, 1), (util_label, util, 1), ("requests completed", res.completed, 0),
             ("requests failed", res.failed or None, 0), ("wall time s", res.duration_s, 2)]
    tail = "".join(f'<tr><th>{label}</th><td colspan="3">{_num(v, d)}</td></tr>' for label, v, d in extra if v is not None)
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


def _ratio(a: Any, b: Any) -> str:
    try:
        return f"×{float(b) / float(a):.2f}" if float(a) else "–"
    except (TypeError, ValueError):
        return "–"


def ab_html(ab: ABStatus) -> str:
    """Sync and async results of the same burst side by side."""
    s, a = ab.sync, ab.async_

    def both(read) -> tuple:
        return (read(s) if s else None), (read(a) if a else None)

    rows = [(f"{label} {q} <small>ms</small>", *both(lambda r: getattr(getattr(r, key), q)), 1)
            for label, key in METRICS for q in ("p50", "p99")]
    rows += [("output tokens/s", *both(lambda r: r.output_tokens_per_s), 1),
             ("requests/s", *both(lambda r: r.requests_per_s), 2),
             (_busy_label(s or a), *both(lambda r: r.busy_pct), 1)]
    (util_label, nv_s), (_, nv_a) = _util(s), _util(a)
    if nv_s is not None or nv_a is not None:
        rows.append((util_label, nv_s, nv_a, 1))
    rows.append(("wall time s", *both(lambda r: r.duration_s), 2))
    body = "".join(f"<tr><th>{label}</th><td>{_num(vs, d)}</td><td>{_num(va, d)}</td><td>{_ratio(vs, va)}</td></tr>"
                   for label, vs, va, d in rows)
    busy_s, busy_a = both(lambda r: r.busy_pct)
    head = (f'<div class="bs-speedup">async speedup <b id="bs-ab-speedup">{_num(ab.speedup, 2)}×</b>'
            f'<span>{_busy_label(s or a)}: sync {_num(busy_s)}% → async {_num(busy_a)}%</span>'
            f'<span>(output tokens/s, same burst and seed)</span></div>'
            if ab.speedup is not None else "")
    return (f'{head}<table id="bs-ab-results" class="bs-table bs-ab"><thead><tr><th></th>'
            f'<th class="sync">sync</th><th class="async">async</th><th>ratio</th></tr></thead>'
            f"<tbody>{body}</tbody></table>")


REPLAY_FIELDS = (("model", "meta", "model"), ("device", "meta", "device"), ("GPU", "meta", "gpu"),
                 ("dtype", "meta", "dtype"), ("recorded", "meta", "created"), ("duration s", "summary", "duration_s"),
                 ("steps", "summary", "steps"), ("modes", "summary", "modes"),
                 ("requests finished", "summary", "requests_finished"), ("tokens/s", "summary", "tokens_per_s"),
                 ("busy %", "summary", "busy_pct"), ("busy basis", "summary", "busy_basis"),
                 ("GPU idle total µs", "summary", "idle_us_total"), ("decode ms/step p50", "summary", "decode_ms_p50"),
                 ("batch size mean", "summary", "batch_requests_mean"), ("queue depth max", "summary", "queue_depth_max"),
                 ("KV usage max %", "summary", "kv_usage_pct_max"), ("NVML util mean %", "summary", "gpu_util_mean"))


def replay_html(state) -> str:
    """What the side panel shows on a replay-only server: what was recorded, and its summary."""
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
    return (f'<div class="bs-replay-info"><p>Replay of a recorded timeline. No model is loaded, so generation, '
            f'load tests and the mode toggle are off; the charts show the recording.</p>'
            f'<table id="bs-replay-summary" class="bs-table">{"".join(rows)}</table></div>')


def gen_info_html(first: float | None, elapsed: float, done: bool) -> str:
    ttft = f"first text after {first * 1000:.0f} ms · " if first is not None else ""
    return f'<div class="bs-gen-info">{ttft}{"done in" if done else "running"} {elapsed:.2f} s</div>'
