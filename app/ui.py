"""The batchscope page: Gradio Blocks for the controls, assets/timeline.js for the live charts.

The server mounts it with `gr.mount_gradio_app(app, build_ui(state), path="/", head=HEAD, css=CSS)`.
Split of work:
- Python handlers (here) call AppState for what has a beginning and an end: a streamed generation, a burst,
  an A/B run. Gradio's queue streams their progress back.
- timeline.js owns everything live: the websocket feed, the charts, the mode toggle (so the page always shows the
  engine's mode, also when someone switches it through the API), downloads, recordings and replay.
With `state.engine is None` (`batchscope replay FILE`) the live controls are disabled and the charts show the replay.
"""
from __future__ import annotations

import html
import os
import time
from importlib import resources

from typing import Any

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402  (the environment variable must be set before the import)

ASSETS = resources.files("batchscope.assets")

# Served by the app: assets/ at /batchscope-static/ (Gradio keeps /static and /assets for itself), plotly.js from the plotly package. Nothing comes from outside.
HEAD = ('<script src="/batchscope-static/plotly.min.js"></script>\n'
        '<script src="/batchscope-static/timeline.js"></script>')
CSS = (ASSETS / "style.css").read_text(encoding="utf-8")

# System fonts only: a page that loads no font files starts faster and never reaches outside.
# Small spacing and text: a dashboard, dense enough that the controls and results fit beside the charts.
THEME = gr.themes.Default(primary_hue="blue", neutral_hue="slate", spacing_size="sm", text_size="sm", radius_size="sm",
                          font=["Inter", "ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "sans-serif"],
                          font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "monospace"])

POLL_S = 0.3          # how often a running burst / A/B is polled for progress
TERMINAL = {"done", "finished", "complete", "completed", "error", "failed", "cancelled"}

WHY_GPU = ("Why the two busy numbers differ: NVML utilization is the share of each ~1/6–1 s sampling window in which "
           "any kernel ran, so sub-millisecond gaps between steps still read as busy. Event busy % adds up the "
           "measured compute spans (CUDA events), so it sees every gap.")
WHY_CPU = ("No NVML on this device: the utilization chart shows host CPU % (psutil), and with no CUDA events there is "
           "no event-based busy %. On a GPU, NVML counts any kernel in a ~1/6–1 s window while events see every gap.")


# ----------------------------------------------------------------------------------------------- small helpers

def _get(obj: Any, name: str, default: Any = None) -> Any:
    """Read a field from a dict or an object (AppState.limits may be either)."""
    if obj is None:
        return default
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _first(d: dict, *keys: str, default: Any = None) -> Any:
    for k in keys:
        if isinstance(d, dict) and d.get(k) is not None:
            return d[k]
    return default


def _num(v: Any, digits: int = 1) -> str:
    if v is None:
        return "–"
    try:
        return f"{float(v):,.{digits}f}"
    except (TypeError, ValueError):
        return html.escape(str(v))


def _safe_status(state) -> dict:
    try:
        return state.status() or {}
    except Exception as e:  # the page must render even when the status call fails
        return {"error": str(e)}


def _status_bits(st: dict) -> dict:
    model = _first(st, "model", "model_name", default="?")
    if isinstance(model, dict):
        model = model.get("name") or model.get("id") or "?"
    gpu = _first(st, "gpu_name", "gpu", default=None)
    if isinstance(gpu, dict):
        gpu = gpu.get("name")
    nvml = _first(st, "nvml_available", "nvml", default=None)
    if isinstance(nvml, dict):
        nvml = nvml.get("available")
    device = str(_first(st, "device", default="?"))
    return {"model": str(model), "device": device, "gpu": str(gpu) if gpu else "none",
            "nvml": bool(nvml), "nvml_reason": _first(st, "nvml_reason", default=""),
            "busy_note": _first(st, "busy_note", default=""), "mode": _first(st, "mode", default="?")}


# ----------------------------------------------------------------------------------------------- HTML blocks

def header_html(state) -> str:
    """The sticky header: mode (always visible) with its toggle, live counters, and the status line."""
    live = state.engine is not None
    b = _status_bits(_safe_status(state))
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
        ("running", "bs-st-running"), ("waiting", "bs-st-waiting"), ("KV", "bs-st-kv"),
        ("busy (events)" if b["nvml"] else "busy (host)", "bs-st-busy"), ("NVML" if b["nvml"] else "CPU", "bs-st-nvml"),
        ("tok/s", "bs-st-tps")))
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
    """The container timeline.js draws into; data-live tells it whether there is an engine to follow."""
    live = state.engine is not None
    name = ""
    replay = getattr(state, "replay", None)
    if isinstance(replay, dict):
        meta = replay.get("meta") or {}
        name = str(meta.get("name") or meta.get("source") or meta.get("file") or "")
    return (f'<div id="bs-scope" class="bs-scope" data-live="{1 if live else 0}" '
            f'data-replay-name="{html.escape(name)}"><div class="bs-loading">loading charts…</div></div>')


def _progress_html(done: int | None, total: int | None, label: str, error: str | None = None) -> str:
    if error:
        return f'<div class="bs-err" role="alert">{html.escape(error)}</div>'
    pct = 100.0 * (done or 0) / total if total else 0.0
    count = f"{done}/{total} requests" if total else ""
    return (f'<div class="bs-progress-wrap"><div class="bs-progress"><div style="width:{pct:.1f}%"></div></div>'
            f'<span class="bs-progress-label">{html.escape(label)} {count}</span></div>')


METRICS = (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("E2E", "e2e_ms"))


def results_html(res: dict | None, table_id: str = "bs-burst-results") -> str:
    """Latency percentiles and throughput of one burst."""
    if not res:
        return ""
    rows = []
    for label, key in METRICS:
        p = res.get(key) or {}
        rows.append(f"<tr><th>{label} <small>ms</small></th>"
                    + "".join(f"<td>{_num(p.get(q))}</td>" for q in ("p50", "p90", "p99")) + "</tr>")
    util_label, util = _util(res)
    extra = [("output tokens/s", res.get("output_tokens_per_s"), 1), ("requests/s", res.get("requests_per_s"), 2),
             (_busy_label(res), res.get("busy_pct"), 1), (util_label, util, 1),
             ("requests completed", _first(res, "completed", "num_requests"), 0),
             ("requests failed", res.get("failed") or None, 0),
             ("wall time s", _first(res, "duration_s", "wall_s"), 2)]
    tail = "".join(f'<tr><th>{label}</th><td colspan="3">{_num(v, d)}</td></tr>' for label, v, d in extra if v is not None)
    return (f'<table id="{table_id}" class="bs-table"><thead><tr><th></th><th>p50</th><th>p90</th><th>p99</th></tr>'
            f'</thead><tbody>{"".join(rows)}{tail}</tbody></table>')


def _busy_label(res: dict) -> str:
    basis = (res.get("telemetry") or {}).get("busy_basis")
    return "compute busy % (host spans)" if basis == "host" else "GPU busy % (events)"


def _util(res: dict) -> tuple[str, Any]:
    """NVML utilization over the burst's window, or host CPU % where there is no NVML."""
    tel = res.get("telemetry") or {}
    if tel.get("gpu_util_mean") is not None:
        return "NVML util % (mean)", tel["gpu_util_mean"]
    return "host CPU % (mean)", tel.get("cpu_pct_mean")


def _ratio(a: Any, b: Any) -> str:
    try:
        return f"×{float(b) / float(a):.2f}" if float(a) else "–"
    except (TypeError, ValueError):
        return "–"


def ab_html(ab: dict) -> str:
    """Sync and async results of the same burst side by side."""
    s, a = ab.get("sync") or {}, ab.get("async") or {}
    rows = []
    for label, key in METRICS:
        for q in ("p50", "p99"):
            vs, va = (s.get(key) or {}).get(q), (a.get(key) or {}).get(q)
            rows.append((f"{label} {q} <small>ms</small>", vs, va, 1))
    rows += [("output tokens/s", s.get("output_tokens_per_s"), a.get("output_tokens_per_s"), 1),
             ("requests/s", s.get("requests_per_s"), a.get("requests_per_s"), 2),
             (_busy_label(s or a), s.get("busy_pct"), a.get("busy_pct"), 1)]
    (util_label, nv_s), (_, nv_a) = _util(s), _util(a)
    if nv_s is not None or nv_a is not None:
        rows.append((util_label, nv_s, nv_a, 1))
    dur_s, dur_a = _first(s, "duration_s", "wall_s"), _first(a, "duration_s", "wall_s")
    if dur_s is not None or dur_a is not None:
        rows.append(("wall time s", dur_s, dur_a, 2))
    body = "".join(f"<tr><th>{label}</th><td>{_num(vs, d)}</td><td>{_num(va, d)}</td><td>{_ratio(vs, va)}</td></tr>"
                   for label, vs, va, d in rows)
    speedup = ab.get("speedup")
    if isinstance(speedup, dict):
        speedup = _first(speedup, "output_tokens_per_s", "throughput", "e2e", default=None)
    head = (f'<div class="bs-speedup">async speedup <b id="bs-ab-speedup">{_num(speedup, 2)}×</b>'
            f'<span>{_busy_label(s or a)}: sync {_num(s.get("busy_pct"))}% → async {_num(a.get("busy_pct"))}%</span>'
            f'<span>(output tokens/s, same burst and seed)</span></div>'
            if speedup is not None else "")
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


# ----------------------------------------------------------------------------------------------- the page

def build_ui(state) -> gr.Blocks:
    live = state.engine is not None
    limits = getattr(state, "limits", None)
    max_prompt = int(_get(limits, "max_prompt_tokens", 4096) or 4096)
    max_new = int(_get(limits, "max_new_tokens", 4096) or 4096)
    max_burst = int(_get(limits, "max_burst_requests", 1024) or 1024)

    with gr.Blocks(title="batchscope", analytics_enabled=False, fill_width=True) as demo:
        gr.HTML(header_html(state), elem_id="bs-header", js_on_load=None)
        with gr.Row(equal_height=False, elem_id="bs-main"):
            with gr.Column(scale=1, min_width=360, elem_id="bs-side"):
                with gr.Tabs():
                    if not live:
                        with gr.Tab("Replay"):
                            gr.HTML(replay_html(state), js_on_load=None)
                    with gr.Tab("Generate"):
                        prompt = gr.Textbox(label="Prompt", lines=3, placeholder="Ask the model something…",
                                            elem_id="bs-prompt", interactive=live)
                        with gr.Row():
                            gen_btn = gr.Button("Generate", variant="primary", elem_id="bs-generate",
                                                interactive=live, size="sm")
                            stop_btn = gr.Button("Stop", elem_id="bs-stop", interactive=live, size="sm")
                        output = gr.Textbox(label="Output (streamed)", lines=8, max_lines=16, elem_id="bs-output",
                                            interactive=False, autoscroll=True)
                        gen_info = gr.HTML("", elem_id="bs-gen-info", js_on_load=None)
                        with gr.Accordion("Sampling", open=True):
                            with gr.Row():
                                max_tokens = gr.Number(64, label="max new tokens", precision=0, minimum=1,
                                                       maximum=max_new, elem_id="bs-max-new", interactive=live)
                                seed = gr.Number(-1, label="seed (-1 = random)", precision=0, minimum=-1,
                                                 elem_id="bs-seed", interactive=live)
                            temperature = gr.Slider(0.0, 2.0, 0.0, step=0.05, label="temperature (0 = greedy)",
                                                    interactive=live)
                            with gr.Row():
                                top_p = gr.Slider(0.05, 1.0, 1.0, step=0.05, label="top-p", interactive=live)
                                top_k = gr.Number(0, label="top-k (0 = off)", precision=0, minimum=0,
                                                  interactive=live)
                            with gr.Row():
                                ignore_eos = gr.Checkbox(False, label="ignore EOS", interactive=live)
                                chat = gr.Checkbox(True, label="chat template", interactive=live)

                    with gr.Tab("Load test"):
                        with gr.Row():
                            n_req = gr.Number(16, label="requests", precision=0, minimum=1, maximum=max_burst,
                                              elem_id="bs-n", interactive=live)
                            burst_seed = gr.Number(0, label="seed", precision=0, elem_id="bs-burst-seed",
                                                   interactive=live)
                        with gr.Row():
                            p_min = gr.Number(16, label="prompt tokens min", precision=0, minimum=1,
                                              maximum=max_prompt, elem_id="bs-pmin", interactive=live)
                            p_max = gr.Number(64, label="prompt tokens max", precision=0, minimum=1,
                                              maximum=max_prompt, elem_id="bs-pmax", interactive=live)
                        with gr.Row():
                            o_min = gr.Number(16, label="output tokens min", precision=0, minimum=1,
                                              maximum=max_new, elem_id="bs-omin", interactive=live)
                            o_max = gr.Number(64, label="output tokens max", precision=0, minimum=1,
                                              maximum=max_new, elem_id="bs-omax", interactive=live)
                        arrival = gr.Radio([("all at once", "burst"), ("Poisson", "poisson"), ("gamma", "gamma")],
                                           value="burst", label="arrival", elem_id="bs-arrival", interactive=live)
                        with gr.Row():
                            rate = gr.Number(8.0, label="rate (requests/s)", minimum=0.01, visible=False,
                                             elem_id="bs-rate", interactive=live)
                            burstiness = gr.Number(0.5, label="burstiness (gamma shape: 1 = Poisson, <1 burstier)",
                                                   minimum=0.01, visible=False, elem_id="bs-burstiness",
                                                   interactive=live)
                        ignore_eos_b = gr.Checkbox(True, label="ignore EOS (exact output lengths)",
                                                   elem_id="bs-ignore-eos", interactive=live)
                        with gr.Row():
                            burst_btn = gr.Button("Fire burst", variant="primary", elem_id="bs-fire",
                                                  interactive=live, size="sm")
                            ab_btn = gr.Button("A/B: sync then async", elem_id="bs-ab", interactive=live, size="sm")
                        burst_progress = gr.HTML("", elem_id="bs-burst-progress", js_on_load=None)
                        burst_results = gr.HTML("", elem_id="bs-burst-table", js_on_load=None)
                        ab_progress = gr.HTML("", elem_id="bs-ab-progress", js_on_load=None)
                        ab_results = gr.HTML("", elem_id="bs-ab-table", js_on_load=None)

            with gr.Column(scale=3, min_width=640, elem_id="bs-charts"):
                gr.HTML(scope_html(state), elem_id="bs-scope-block", js_on_load=None)

        # ------------------------------------------------------------------ handlers

        def generate(text, n_new, temp, p, k, sd, no_eos, use_chat):
            if state.engine is None:
                raise gr.Error("No model loaded (replay only).")
            if not (text or "").strip():
                raise gr.Error("Type a prompt first.")
            t0 = time.perf_counter()
            first = None
            out = ""
            try:
                for out in state.generate_stream(text, max_new_tokens=int(n_new or 64), temperature=float(temp),
                                                 top_p=float(p), top_k=int(k or 0),
                                                 seed=None if sd in (None, "") or int(sd) < 0 else int(sd),
                                                 ignore_eos=bool(no_eos), chat=bool(use_chat)):
                    if first is None and out:
                        first = time.perf_counter() - t0
                    yield out, _gen_info(first, time.perf_counter() - t0, False)
            except Exception as e:  # bad input or engine error: say it on the page, keep serving
                yield out, f'<div class="bs-err" role="alert">{html.escape(str(e))}</div>'
                return
            yield out, _gen_info(first, time.perf_counter() - t0, True)

        gen_inputs = [prompt, max_tokens, temperature, top_p, top_k, seed, ignore_eos, chat]
        ev1 = gen_btn.click(generate, gen_inputs, [output, gen_info], concurrency_limit=8, show_progress="minimal")
        ev2 = prompt.submit(generate, gen_inputs, [output, gen_info], concurrency_limit=8, show_progress="minimal")
        stop_btn.click(None, None, None, cancels=[ev1, ev2])

        def arrival_changed(kind):
            return gr.update(visible=kind != "burst"), gr.update(visible=kind == "gamma")

        arrival.change(arrival_changed, arrival, [rate, burstiness])

        spec_inputs = [n_req, p_min, p_max, o_min, o_max, arrival, rate, burstiness, ignore_eos_b, burst_seed]

        def follow(kind: str, start, status, label, table):
            """Start a burst or an A/B, then poll it: (progress, results) until it ends or fails."""
            def run(*values):
                try:
                    run_id = start(_spec(*values))
                except Exception as e:
                    yield _progress_html(0, 0, "", error=f"{kind} not started: {e}"), ""
                    return
                while True:
                    try:
                        st = status(run_id)
                    except Exception as e:
                        yield _progress_html(0, 0, "", error=f"{kind} {run_id}: {e}"), ""
                        return
                    phase = str(st.get("state", "running"))
                    err = st.get("error")
                    yield (_progress_html(st.get("done"), st.get("total"), label(run_id, phase, st),
                                          error=f"{kind} {run_id} failed: {err}" if err else None), table(st))
                    if phase in TERMINAL or err:
                        return
                    time.sleep(POLL_S)
            return run

        def ab_label(ab_id, phase, st):
            running = _first(st, "phase", "current", "mode", default="")
            return f"A/B {ab_id}: {phase}" + (f" ({running})" if running and phase not in TERMINAL else "")

        run_burst = follow("burst", state.start_burst, state.burst_status,
                           lambda burst_id, phase, st: f"burst {burst_id}: {phase}",
                           lambda st: results_html(st.get("results")))
        run_ab = follow("A/B", state.start_ab, state.ab_status, ab_label,
                        lambda st: ab_html(st) if (st.get("sync") or st.get("async")) else "")

        # our own progress bars say how far a run got; Gradio's overlay would only hide them
        burst_btn.click(run_burst, spec_inputs, [burst_progress, burst_results], concurrency_limit=4,
                        show_progress="hidden")
        ab_btn.click(run_ab, spec_inputs, [ab_progress, ab_results], concurrency_limit=2, show_progress="hidden")

    return demo


def _gen_info(first: float | None, elapsed: float, done: bool) -> str:
    ttft = f"first text after {first * 1000:.0f} ms · " if first is not None else ""
    return f'<div class="bs-gen-info">{ttft}{"done in" if done else "running"} {elapsed:.2f} s</div>'


def _spec(n, pmin, pmax, omin, omax, arrival, rate, burstiness, ignore_eos, seed) -> dict:
    """The POST /api/burst body, from the panel's fields (the server validates ranges and limits)."""
    def need(v, name):
        if v is None or v == "":
            raise ValueError(f"{name} is empty")
        return v
    return {
        "num_requests": int(need(n, "requests")),
        "prompt_tokens": [int(need(pmin, "prompt tokens min")), int(need(pmax, "prompt tokens max"))],
        "max_new_tokens": [int(need(omin, "output tokens min")), int(need(omax, "output tokens max"))],
        "arrival": arrival or "burst",
        "rate": float(rate) if rate not in (None, "") else 8.0,
        "burstiness": float(burstiness) if burstiness not in (None, "") else 1.0,
        "ignore_eos": bool(ignore_eos),
        "seed": int(seed) if seed not in (None, "") else 0,
    }
