"""The batchscope page: Gradio Blocks for the controls, assets/js/ (ES modules, entry main.js) for the live charts.

The server mounts it with `gr.mount_gradio_app(app, build_ui(state), path="/", head=HEAD, css=CSS)`.
Split of work:
- Python handlers (here for Generate, app/ui_runs.py for the Load test tab) call AppState for what has a
  beginning and an end: a streamed generation, a burst, an A/B run, a continuous load. Gradio's queue streams
  their progress back. app/ui_html.py and app/ui_load.py render the HTML they show. Each handler's first update clears what the last attempt left (an old error) and
  marks its button busy; its last one gives the button back.
- assets/js owns everything live: the websocket feed, the charts, the mode toggle (so the page always shows the
  engine's mode, also when someone switches it through the API), downloads, recordings and replay.
With `state.engine is None` (`batchscope replay FILE`) the live controls are disabled and the charts show the replay.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from importlib import resources

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402  (the environment variable must be set before the import)

from batchscope.app.loadtest.specs import Limits  # noqa: E402
from .ui_html import gen_info_html, header_html, replay_html, scope_html  # noqa: E402
from .ui_load import error_html  # noqa: E402
from .ui_runs import AB, FIRE, START_LOAD, wire_load_test  # noqa: E402

ASSETS = resources.files("batchscope.assets")

# Served by the app: assets/ at /batchscope-static/ (Gradio keeps /static and /assets for itself), plotly.js from
# the plotly package. Nothing comes from outside. Plotly is a classic script (window.Plotly); the charts are
# ES modules that import each other relative to main.js, so there is no build step.
HEAD = ('<script src="/batchscope-static/plotly.min.js"></script>\n'
        '<script type="module" src="/batchscope-static/js/main.js"></script>')
CSS = (ASSETS / "style.css").read_text(encoding="utf-8")

# System fonts only: a page that loads no font files starts faster and never reaches outside.
# Small spacing and text: a dashboard, dense enough that the controls and results fit beside the charts.
THEME = gr.themes.Default(primary_hue="blue", neutral_hue="slate", spacing_size="sm", text_size="sm", radius_size="sm",
                          font=["Inter", "ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "sans-serif"],
                          font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "monospace"])

@dataclass
class _GenerateTab:
    prompt: gr.Textbox
    generate: gr.Button
    stop: gr.Button
    output: gr.Textbox
    info: gr.HTML
    max_tokens: gr.Number
    seed: gr.Number
    temperature: gr.Slider
    top_p: gr.Slider
    top_k: gr.Number
    ignore_eos: gr.Checkbox
    chat: gr.Checkbox

    def inputs(self) -> list:
        """In the order `_generate_handler`'s function takes them."""
        return [self.prompt, self.max_tokens, self.temperature, self.top_p, self.top_k, self.seed, self.ignore_eos,
                self.chat]


@dataclass
class _LoadTestTab:
    load_kind: gr.Radio
    load_concurrency: gr.Number
    load_rate: gr.Number
    load_duration: gr.Number
    load_start: gr.Button
    load_stop: gr.Button
    load_status: gr.HTML
    load_id: gr.State
    p_min: gr.Number
    p_max: gr.Number
    o_min: gr.Number
    o_max: gr.Number
    seed: gr.Number
    ignore_eos: gr.Checkbox
    n_req: gr.Number
    arrival: gr.Radio
    rate: gr.Number
    burstiness: gr.Number
    burst: gr.Button
    ab: gr.Button
    burst_progress: gr.HTML
    burst_results: gr.HTML
    ab_progress: gr.HTML
    ab_results: gr.HTML

    def shape_inputs(self) -> list:
        """What every request looks like, in the order `_shape` takes them."""
        return [self.p_min, self.p_max, self.o_min, self.o_max, self.ignore_eos, self.seed]

    def spec_inputs(self) -> list:
        """In the order `ui_runs.burst_spec` takes them."""
        return [self.n_req, self.arrival, self.rate, self.burstiness, *self.shape_inputs()]

    def load_inputs(self) -> list:
        """In the order `ui_runs.load_spec` takes them."""
        return [self.load_kind, self.load_concurrency, self.load_rate, self.load_duration, *self.shape_inputs()]


# ----------------------------------------------------------------------------------------------- the page

def build_ui(state) -> gr.Blocks:
    live = state.engine is not None
    limits = state.limits
    with gr.Blocks(title="batchscope", analytics_enabled=False, fill_width=True) as demo:
        gr.HTML(header_html(state), elem_id="bs-header", js_on_load=None)
        with gr.Row(equal_height=False, elem_id="bs-main"):
            with gr.Column(scale=1, min_width=360, elem_id="bs-side"):
                with gr.Tabs():
                    if not live:
                        with gr.Tab("Replay"):
                            gr.HTML(replay_html(state), js_on_load=None)
                    with gr.Tab("Generate"):
                        gen = _generate_tab(live, limits)
                    with gr.Tab("Load test"):
                        load = _load_test_tab(live, limits)
            with gr.Column(scale=3, min_width=640, elem_id="bs-charts"):
                gr.HTML(scope_html(state), elem_id="bs-scope-block", js_on_load=None)
        _wire_generate(state, gen)
        wire_load_test(state, load, demo)
    return demo


def _generate_tab(live: bool, limits: Limits) -> _GenerateTab:
    prompt = gr.Textbox(label="Prompt", lines=3, placeholder="Ask the model something…", elem_id="bs-prompt",
                        interactive=live)
    with gr.Row():
        generate = gr.Button("Generate", variant="primary", elem_id="bs-generate", interactive=live, size="sm")
        stop = gr.Button("Stop", elem_id="bs-stop", interactive=live, size="sm")
    output = gr.Textbox(label="Output (streamed)", lines=8, max_lines=16, elem_id="bs-output", interactive=False,
                        autoscroll=True)
    info = gr.HTML("", elem_id="bs-gen-info", js_on_load=None)
    with gr.Accordion("Sampling", open=True):
        with gr.Row():
            # no minimum/maximum here: Gradio would refuse out-of-range values with a toast before our
            # handler runs, leaving the last attempt's message in place; the server's checks say why instead
            max_tokens = gr.Number(64, label=f"max new tokens (≤ {limits.max_new_tokens})", precision=0,
                                   elem_id="bs-max-new", interactive=live)
            seed = gr.Number(-1, label="seed (-1 = random)", precision=0, elem_id="bs-seed", interactive=live)
        temperature = gr.Slider(0.0, 2.0, 0.0, step=0.05, label="temperature (0 = greedy)", interactive=live)
        with gr.Row():
            top_p = gr.Slider(0.05, 1.0, 1.0, step=0.05, label="top-p", interactive=live)
            top_k = gr.Number(0, label="top-k (0 = off)", precision=0, interactive=live)
        with gr.Row():
            ignore_eos = gr.Checkbox(False, label="ignore EOS", interactive=live)
            chat = gr.Checkbox(True, label="chat template", interactive=live)
    return _GenerateTab(prompt, generate, stop, output, info, max_tokens, seed, temperature, top_p, top_k,
                        ignore_eos, chat)


def _load_test_tab(live: bool, limits: Limits) -> _LoadTestTab:
    # Numbers carry no minimum/maximum: Gradio would refuse an out-of-range value with a toast before our handler
    # runs (also in a hidden field), leaving the last attempt's message on the page. LoadSpec/BurstSpec check them.
    gr.Markdown("**Continuous load**: requests keep coming until you stop them, so you can switch sync/async "
                f"while it runs. It ends by itself after {limits.max_load_duration_s:g} s at most.",
                elem_id="bs-load-intro")
    load_kind = gr.Radio([("fixed concurrency", "concurrency"), ("steady rate", "rate")], value="concurrency",
                         label="continuous load", elem_id="bs-load-kind", interactive=live)
    with gr.Row():
        load_concurrency = gr.Number(16, label="requests in flight", precision=0, elem_id="bs-load-conc",
                                     interactive=live)
        load_rate = gr.Number(4.0, label="rate (requests/s, Poisson)", visible=False, elem_id="bs-load-rate",
                              interactive=live)
        load_duration = gr.Number(limits.max_load_duration_s, label="stop after (s)", elem_id="bs-load-duration",
                                  interactive=live)
    with gr.Row():
        load_start = gr.Button(START_LOAD, variant="primary", elem_id="bs-load-start", interactive=live, size="sm")
        load_stop = gr.Button("Stop load", variant="stop", elem_id="bs-load-stop", interactive=False, size="sm")
    load_status = gr.HTML("", elem_id="bs-load-status", js_on_load=None)

    gr.Markdown("**Requests** (continuous load, burst and A/B)", elem_id="bs-shape-intro")
    with gr.Row():
        p_min = gr.Number(16, label="prompt tokens min", precision=0, elem_id="bs-pmin", interactive=live)
        p_max = gr.Number(64, label="prompt tokens max", precision=0, elem_id="bs-pmax", interactive=live)
    with gr.Row():
        o_min = gr.Number(16, label="output tokens min", precision=0, elem_id="bs-omin", interactive=live)
        o_max = gr.Number(64, label="output tokens max", precision=0, elem_id="bs-omax", interactive=live)
    with gr.Row():
        seed = gr.Number(0, label="seed", precision=0, elem_id="bs-burst-seed", interactive=live)
        ignore_eos = gr.Checkbox(True, label="ignore EOS (exact output lengths)", elem_id="bs-ignore-eos",
                                 interactive=live)

    gr.Markdown("**Burst and A/B**: a fixed number of requests; the A/B runs the same burst in sync, then in "
                "async (the mode toggle is locked meanwhile).", elem_id="bs-burst-intro")
    with gr.Row():
        n_req = gr.Number(16, label=f"requests (≤ {limits.max_burst_requests})", precision=0, elem_id="bs-n",
                          interactive=live)
        arrival = gr.Radio([("all at once", "burst"), ("Poisson", "poisson"), ("gamma", "gamma")], value="burst",
                           label="arrival", elem_id="bs-arrival", interactive=live)
    with gr.Row():
        rate = gr.Number(8.0, label="rate (requests/s)", visible=False, elem_id="bs-rate", interactive=live)
        burstiness = gr.Number(0.5, label="burstiness (gamma shape: 1 = Poisson, <1 burstier)", visible=False,
                               elem_id="bs-burstiness", interactive=live)
    with gr.Row():
        burst = gr.Button(FIRE, variant="primary", elem_id="bs-fire", interactive=live, size="sm")
        ab = gr.Button(AB, elem_id="bs-ab", interactive=live, size="sm")
    return _LoadTestTab(load_kind, load_concurrency, load_rate, load_duration, load_start, load_stop,
                        load_status, gr.State(None), p_min, p_max, o_min, o_max, seed, ignore_eos, n_req, arrival,
                        rate, burstiness, burst, ab,
                        burst_progress=gr.HTML("", elem_id="bs-burst-progress", js_on_load=None),
                        burst_results=gr.HTML("", elem_id="bs-burst-table", js_on_load=None),
                        ab_progress=gr.HTML("", elem_id="bs-ab-progress", js_on_load=None),
                        ab_results=gr.HTML("", elem_id="bs-ab-table", js_on_load=None))


# ----------------------------------------------------------------------------------------------- handlers

class _Streams:
    """The generations each page (Gradio session) has streaming, so that its Stop button can cancel them in the
    engine. The handler then sees its stream end as cancelled and says so itself: its word is the last one.
    (Cancelling the handler through Gradio instead would cut it off after "running", with late updates still
    arriving after any "stopped".)"""

    def __init__(self):
        self._by_session: dict[str, set] = {}
        self._lock = threading.Lock()

    def add(self, session: str, handle) -> None:
        with self._lock:
            self._by_session.setdefault(session, set()).add(handle)

    def discard(self, session: str, handle) -> None:
        with self._lock:
            handles = self._by_session.get(session, set())
            handles.discard(handle)
            if not handles:
                self._by_session.pop(session, None)

    def cancel(self, session: str) -> None:
        with self._lock:
            handles = list(self._by_session.get(session, ()))
        for h in handles:
            h.cancel()


def _wire_generate(state, tab: _GenerateTab) -> None:
    streams = _Streams()
    generate = _generate_handler(state, streams)
    outputs = [tab.output, tab.info]
    tab.generate.click(generate, tab.inputs(), outputs, concurrency_limit=8, show_progress="minimal")
    tab.prompt.submit(generate, tab.inputs(), outputs, concurrency_limit=8, show_progress="minimal")

    def stop(request: gr.Request):
        streams.cancel(_session(request))
    tab.stop.click(stop, None, None, show_progress="hidden")


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "-"


def _generate_handler(state, streams: _Streams):
    def generate(text, n_new, temp, p, k, sd, no_eos, use_chat, request: gr.Request):
        t0 = time.perf_counter()
        first = None
        # every attempt starts from a clean box: an old error must not sit beside a new answer
        yield "", '<div class="bs-gen-info">waiting for the first token…</div>'
        if state.engine is None:
            yield "", error_html("No model loaded (replay only).")
            return
        if not (text or "").strip():
            yield "", error_html("Type a prompt first.")
            return
        session, handle, out, finished = _session(request), None, "", False
        try:
            ids = state.encode(text, chat=bool(use_chat))
            params = state.sampling(len(ids), int(n_new or 64), float(temp), float(p), int(k or 0),
                                    None if sd in (None, "") or int(sd) < 0 else int(sd), bool(no_eos))
            handle = state.submit(ids, params)
            streams.add(session, handle)
            for d in handle:
                out += d.text
                if first is None and out:
                    first = time.perf_counter() - t0
                if d.finished:
                    finished = True
                    if d.finish_reason == "cancelled":
                        yield out, _stopped_html(first, time.perf_counter() - t0)
                        return
                    if d.error or d.finish_reason == "error":
                        raise RuntimeError(f"generation failed: {d.error or 'engine error'}")
                yield out, gen_info_html(first, time.perf_counter() - t0, finished)
        except Exception as e:  # bad input or engine error: say it on the page, keep serving
            yield out, error_html(str(e))
        finally:
            if handle is not None:
                streams.discard(session, handle)
                if not finished:        # the page went away mid-stream
                    handle.cancel()
    return generate


def _stopped_html(first: float | None, elapsed: float) -> str:
    ttft = f"first text after {first * 1000:.0f} ms · " if first is not None else ""
    return f'<div class="bs-gen-info" data-state="stopped">{ttft}stopped after {elapsed:.2f} s</div>'
