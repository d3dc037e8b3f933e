"""The batchscope page: Gradio Blocks for the controls, assets/js/ (ES modules, entry main.js) for the live charts.

The server mounts it with `gr.mount_gradio_app(app, build_ui(state), path="/", head=HEAD, css=CSS)`.
Split of work:
- Python handlers (here) call AppState for what has a beginning and an end: a streamed generation, a burst,
  an A/B run. Gradio's queue streams their progress back. app/ui_html.py renders the HTML they show.
- assets/js owns everything live: the websocket feed, the charts, the mode toggle (so the page always shows the
  engine's mode, also when someone switches it through the API), downloads, recordings and replay.
With `state.engine is None` (`batchscope replay FILE`) the live controls are disabled and the charts show the replay.
"""
from __future__ import annotations

import html
import os
import time
from dataclasses import dataclass
from importlib import resources

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402  (the environment variable must be set before the import)

from pydantic import ValidationError  # noqa: E402

from .errors import validation_reason  # noqa: E402
from .schemas import BurstSpec, Limits  # noqa: E402
from .ui_html import (ab_html, gen_info_html, header_html, progress_html, replay_html,  # noqa: E402
                      results_html, scope_html)

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

POLL_S = 0.3          # how often a running burst / A/B is polled for progress


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
    n_req: gr.Number
    seed: gr.Number
    p_min: gr.Number
    p_max: gr.Number
    o_min: gr.Number
    o_max: gr.Number
    arrival: gr.Radio
    rate: gr.Number
    burstiness: gr.Number
    ignore_eos: gr.Checkbox
    burst: gr.Button
    ab: gr.Button
    burst_progress: gr.HTML
    burst_results: gr.HTML
    ab_progress: gr.HTML
    ab_results: gr.HTML

    def spec_inputs(self) -> list:
        """In the order `_burst_spec` takes them."""
        return [self.n_req, self.p_min, self.p_max, self.o_min, self.o_max, self.arrival, self.rate,
                self.burstiness, self.ignore_eos, self.seed]


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
        _wire_load_test(state, load)
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
            max_tokens = gr.Number(64, label="max new tokens", precision=0, minimum=1, maximum=limits.max_new_tokens,
                                   elem_id="bs-max-new", interactive=live)
            seed = gr.Number(-1, label="seed (-1 = random)", precision=0, minimum=-1, elem_id="bs-seed",
                             interactive=live)
        temperature = gr.Slider(0.0, 2.0, 0.0, step=0.05, label="temperature (0 = greedy)", interactive=live)
        with gr.Row():
            top_p = gr.Slider(0.05, 1.0, 1.0, step=0.05, label="top-p", interactive=live)
            top_k = gr.Number(0, label="top-k (0 = off)", precision=0, minimum=0, interactive=live)
        with gr.Row():
            ignore_eos = gr.Checkbox(False, label="ignore EOS", interactive=live)
            chat = gr.Checkbox(True, label="chat template", interactive=live)
    return _GenerateTab(prompt, generate, stop, output, info, max_tokens, seed, temperature, top_p, top_k,
                        ignore_eos, chat)


def _load_test_tab(live: bool, limits: Limits) -> _LoadTestTab:
    with gr.Row():
        n_req = gr.Number(16, label="requests", precision=0, minimum=1, maximum=limits.max_burst_requests,
                          elem_id="bs-n", interactive=live)
        seed = gr.Number(0, label="seed", precision=0, elem_id="bs-burst-seed", interactive=live)
    with gr.Row():
        p_min = gr.Number(16, label="prompt tokens min", precision=0, minimum=1, maximum=limits.max_prompt_tokens,
                          elem_id="bs-pmin", interactive=live)
        p_max = gr.Number(64, label="prompt tokens max", precision=0, minimum=1, maximum=limits.max_prompt_tokens,
                          elem_id="bs-pmax", interactive=live)
    with gr.Row():
        o_min = gr.Number(16, label="output tokens min", precision=0, minimum=1, maximum=limits.max_new_tokens,
                          elem_id="bs-omin", interactive=live)
        o_max = gr.Number(64, label="output tokens max", precision=0, minimum=1, maximum=limits.max_new_tokens,
                          elem_id="bs-omax", interactive=live)
    arrival = gr.Radio([("all at once", "burst"), ("Poisson", "poisson"), ("gamma", "gamma")], value="burst",
                       label="arrival", elem_id="bs-arrival", interactive=live)
    with gr.Row():
        rate = gr.Number(8.0, label="rate (requests/s)", minimum=0.01, visible=False, elem_id="bs-rate",
                         interactive=live)
        burstiness = gr.Number(0.5, label="burstiness (gamma shape: 1 = Poisson, <1 burstier)", minimum=0.01,
                               visible=False, elem_id="bs-burstiness", interactive=live)
    ignore_eos = gr.Checkbox(True, label="ignore EOS (exact output lengths)", elem_id="bs-ignore-eos",
                             interactive=live)
    with gr.Row():
        burst = gr.Button("Fire burst", variant="primary", elem_id="bs-fire", interactive=live, size="sm")
        ab = gr.Button("A/B: sync then async", elem_id="bs-ab", interactive=live, size="sm")
    return _LoadTestTab(n_req, seed, p_min, p_max, o_min, o_max, arrival, rate, burstiness, ignore_eos, burst, ab,
                        burst_progress=gr.HTML("", elem_id="bs-burst-progress", js_on_load=None),
                        burst_results=gr.HTML("", elem_id="bs-burst-table", js_on_load=None),
                        ab_progress=gr.HTML("", elem_id="bs-ab-progress", js_on_load=None),
                        ab_results=gr.HTML("", elem_id="bs-ab-table", js_on_load=None))


# ----------------------------------------------------------------------------------------------- handlers

def _wire_generate(state, tab: _GenerateTab) -> None:
    generate = _generate_handler(state)
    outputs = [tab.output, tab.info]
    ev1 = tab.generate.click(generate, tab.inputs(), outputs, concurrency_limit=8, show_progress="minimal")
    ev2 = tab.prompt.submit(generate, tab.inputs(), outputs, concurrency_limit=8, show_progress="minimal")
    tab.stop.click(None, None, None, cancels=[ev1, ev2])


def _generate_handler(state):
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
                yield out, gen_info_html(first, time.perf_counter() - t0, False)
        except Exception as e:  # bad input or engine error: say it on the page, keep serving
            yield out, f'<div class="bs-err" role="alert">{html.escape(str(e))}</div>'
            return
        yield out, gen_info_html(first, time.perf_counter() - t0, True)
    return generate


def _wire_load_test(state, tab: _LoadTestTab) -> None:
    def arrival_changed(kind):
        return gr.update(visible=kind != "burst"), gr.update(visible=kind == "gamma")

    tab.arrival.change(arrival_changed, tab.arrival, [tab.rate, tab.burstiness])

    def ab_label(st) -> str:
        return f"A/B {st.id}: {st.state}" + (f" ({st.phase})" if st.phase and st.state == "running" else "")

    run_burst = _follow("burst", state.start_burst, state.burst_status, lambda st: f"burst {st.id}: {st.state}",
                        lambda st: results_html(st.results))
    run_ab = _follow("A/B", state.start_ab, state.ab_status, ab_label,
                     lambda st: ab_html(st) if st.sync is not None or st.async_ is not None else "")
    # our own progress bars say how far a run got; Gradio's overlay would only hide them
    tab.burst.click(run_burst, tab.spec_inputs(), [tab.burst_progress, tab.burst_results], concurrency_limit=4,
                    show_progress="hidden")
    tab.ab.click(run_ab, tab.spec_inputs(), [tab.ab_progress, tab.ab_results], concurrency_limit=2,
                 show_progress="hidden")


def _follow(kind: str, start, status, label, table):
    """A handler that starts a burst or an A/B, then polls it: (progress, results) until it ends or fails."""
    def run(*values):
        try:
            run_id = start(_burst_spec(*values))
        except ValidationError as e:
            yield progress_html(0, 0, "", error=f"{kind} not started: {validation_reason(e)}"), ""
            return
        except Exception as e:
            yield progress_html(0, 0, "", error=f"{kind} not started: {e}"), ""
            return
        while True:
            try:
                st = status(run_id)
            except Exception as e:
                yield progress_html(0, 0, "", error=f"{kind} {run_id}: {e}"), ""
                return
            yield (progress_html(st.done, st.total, label(st),
                                 error=f"{kind} {run_id} failed: {st.error}" if st.error else None), table(st))
            if st.state != "running":
                return
            time.sleep(POLL_S)
    return run


def _burst_spec(n, pmin, pmax, omin, omax, arrival, rate, burstiness, ignore_eos, seed) -> BurstSpec:
    """The panel's fields as the body of POST /api/burst: the same model checks them. The optional knobs (rate,
    burstiness, seed) left empty take the API's defaults."""
    knobs = {k: v for k, v in (("rate", rate), ("burstiness", burstiness), ("seed", seed)) if v not in (None, "")}
    return BurstSpec(num_requests=n, prompt_tokens=(pmin, pmax), max_new_tokens=(omin, omax),
                     arrival=arrival or "burst", ignore_eos=bool(ignore_eos), **knobs)
