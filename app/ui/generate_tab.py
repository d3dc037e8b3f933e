"""The Generate tab: one prompt, its answer streamed into the page as it comes, and a Stop button that cancels it
in the engine.

`generate_tab` lays the tab out, `wire_generate` connects its buttons; `generate_handler` is the Gradio handler
(a generator of (output, info) updates), which submits through AppState like the HTTP routes do.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import gradio as gr

from ..loadtest.specs import Limits
from .page_html import error_html, gen_info_html


@dataclass
class GenerateTab:
    """The tab's components, for `wire_generate`."""
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
        """In the order `generate_handler`'s function takes them."""
        return [self.prompt, self.max_tokens, self.temperature, self.top_p, self.top_k, self.seed, self.ignore_eos,
                self.chat]


def generate_tab(live: bool, limits: Limits) -> GenerateTab:
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
    return GenerateTab(prompt, generate, stop, output, info, max_tokens, seed, temperature, top_p, top_k,
                        ignore_eos, chat)


class Streams:
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


def wire_generate(state, tab: GenerateTab) -> None:
    streams = Streams()
    generate = generate_handler(state, streams)
    outputs = [tab.output, tab.info]
    tab.generate.click(generate, tab.inputs(), outputs, concurrency_limit=8, show_progress="minimal")
    tab.prompt.submit(generate, tab.inputs(), outputs, concurrency_limit=8, show_progress="minimal")

    def stop(request: gr.Request):
        streams.cancel(_session(request))
    tab.stop.click(stop, None, None, show_progress="hidden")


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "-"


def generate_handler(state, streams: Streams):
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
        if n_new is None or int(n_new) < 1:
            yield "", error_html(f"max new tokens must be a whole number of at least 1, got {n_new!r}.")
            return
        session, handle, out, finished = _session(request), None, "", False
        try:
            ids = state.encode(text, chat=bool(use_chat))
            params = state.sampling(len(ids), int(n_new), float(temp), float(p), int(k or 0),
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
