"""The Load test tab: its layout (a continuous load, the requests' shape, a burst and an A/B), the panel's fields
as run specs (the same models the HTTP API checks them with), and the Gradio handlers that start a burst, an A/B
or a continuous load and follow it until it ends. The HTML they show is load_html.py's and page_html.py's.
"""
from __future__ import annotations

import re

import time
from dataclasses import dataclass

import gradio as gr
from pydantic import ValidationError

from ..loadtest.refusals import validation_reason
from ..loadtest.specs import BurstSpec, Limits, LoadSpec
from .load_html import ab_compare_html, ab_progress_html, load_html
from .page_html import error_html, progress_html, results_html

POLL_S = 0.3          # how often a running burst / A/B is polled for progress
LOAD_POLL_S = 0.5     # and a continuous load
FIRE, AB, START_LOAD = "Fire burst", "A/B: sync then async", "Start load"
# runs in the page before the A/B handler (assets/js/controls.js defines the hook); passes the inputs through
CHECK_MODE_LOCK_SOON = "(...args) => { window.batchscopeModeLock?.soon(); return args; }"


# ----------------------------------------------------------------------------------------------- the layout

@dataclass
class LoadTestTab:
    """The tab's components, for `wire_load_test`."""
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
        """What every request looks like, in the order `panel_shape` takes them."""
        return [self.p_min, self.p_max, self.o_min, self.o_max, self.ignore_eos, self.seed]

    def spec_inputs(self) -> list:
        """In the order `burst_spec` takes them."""
        return [self.n_req, self.arrival, self.rate, self.burstiness, *self.shape_inputs()]

    def load_inputs(self) -> list:
        """In the order `load_spec` takes them."""
        return [self.load_kind, self.load_concurrency, self.load_rate, self.load_duration, *self.shape_inputs()]


def load_test_tab(live: bool, limits: Limits) -> LoadTestTab:
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
    return LoadTestTab(load_kind, load_concurrency, load_rate, load_duration, load_start, load_stop,
                        load_status, gr.State(None), p_min, p_max, o_min, o_max, seed, ignore_eos, n_req, arrival,
                        rate, burstiness, burst, ab,
                        burst_progress=gr.HTML("", elem_id="bs-burst-progress", js_on_load=None),
                        burst_results=gr.HTML("", elem_id="bs-burst-table", js_on_load=None),
                        ab_progress=gr.HTML("", elem_id="bs-ab-progress", js_on_load=None),
                        ab_results=gr.HTML("", elem_id="bs-ab-table", js_on_load=None))


# ----------------------------------------------------------------------------------------------- the handlers

def wire_load_test(state, tab: LoadTestTab, demo: gr.Blocks) -> None:
    """The tab's handlers: arrival and load-kind fields shown as they apply, Fire burst, A/B, Start/Stop load."""
    def arrival_changed(kind):
        return gr.update(visible=kind != "burst"), gr.update(visible=kind == "gamma")

    def load_kind_changed(kind):
        return gr.update(visible=kind == "concurrency"), gr.update(visible=kind == "rate")

    tab.arrival.change(arrival_changed, tab.arrival, [tab.rate, tab.burstiness])
    tab.load_kind.change(load_kind_changed, tab.load_kind, [tab.load_concurrency, tab.load_rate])

    lab = state.load_lab
    run_burst = follow_run("burst", FIRE, lambda *v: lab.start_burst(burst_spec(*v)), lab.burst,
                        lambda st: progress_html(st.done, st.total, f"burst {st.id}: {st.state}",
                                                 error=f"burst {st.id} failed: {st.error}" if st.error else None),
                        lambda st: results_html(st.results))
    run_ab = follow_run("A/B", AB, lambda *v: lab.start_ab(burst_spec(*v)), lab.ab, ab_progress_html,
                     ab_compare_html)
    # our own progress bars say how far a run got; Gradio's overlay would only hide them
    tab.burst.click(run_burst, tab.spec_inputs(), [tab.burst_progress, tab.burst_results, tab.burst],
                    concurrency_limit=4, show_progress="hidden")
    # the A/B locks the mode toggle: have the page look for the lock now rather than at its next poll
    tab.ab.click(run_ab, tab.spec_inputs(), [tab.ab_progress, tab.ab_results, tab.ab], concurrency_limit=2,
                 show_progress="hidden", js=CHECK_MODE_LOCK_SOON)

    load_outputs = [tab.load_status, tab.load_start, tab.load_stop, tab.load_id]
    follow = follow_load(state)

    def start_load(*values):
        # clears the last attempt's error and shows the start is under way
        yield "", gr.update(interactive=False, value="Starting…"), gr.update(interactive=False), None
        try:
            load_id = state.load_lab.start_load(load_spec(*values))
        except Exception as e:
            yield refusal("load", e), *load_buttons(False), None
            return
        yield from follow(load_id)

    def stop_load(load_id):
        try:
            target = load_id or state.load_lab.running_load()
            if target:
                state.load_lab.stop_load(target)
        except Exception:               # already gone: the follower shows how it ended
            pass

    def follow_running():
        # a page opened (or reloaded) while a load runs follows it, so that its Stop button works
        load_id = state.load_lab.running_load() if state.engine is not None else None
        if load_id is None:
            yield gr.update(), gr.update(), gr.update(), None
            return
        yield from follow(load_id)

    tab.load_start.click(start_load, tab.load_inputs(), load_outputs, concurrency_limit=4, show_progress="hidden")
    tab.load_stop.click(stop_load, tab.load_id, None, show_progress="hidden")
    if state.engine is not None:
        # a follower per open page, each holding a worker thread while it sleeps between polls: several at once,
        # not Gradio's default of one, but few enough to leave threads for everything else
        demo.load(follow_running, None, load_outputs, show_progress="hidden", concurrency_limit=8)


# The spec's field names as the panel labels them, so that a refusal names what the user sees, not the API.
FIELD_LABELS = {"max_new_tokens.0": "output tokens min", "max_new_tokens.1": "output tokens max",
                "prompt_tokens.0": "prompt tokens min", "prompt_tokens.1": "prompt tokens max",
                "max_new_tokens": "output tokens", "prompt_tokens": "prompt tokens", "num_requests": "requests",
                "duration_s": "stop after (s)", "concurrency": "requests in flight", "max_requests": "requests",
                "burstiness": "burstiness", "rate": "rate", "seed": "seed", "arrival": "arrival",
                "kind": "continuous load"}
_FIELD = re.compile(r"\b(" + "|".join(re.escape(k) for k in sorted(FIELD_LABELS, key=len, reverse=True)) + r")\b")


def refusal(kind: str, e: Exception) -> str:
    reason = validation_reason(e) if isinstance(e, ValidationError) else str(e)
    return error_html(f"{kind} not started: " + _FIELD.sub(lambda m: f"“{FIELD_LABELS[m.group(1)]}”", reason))


def follow_run(kind: str, label: str, start, status, progress, table):
    """A handler that starts a burst or an A/B, then polls it: (progress, results, its button) until it ends or
    fails. The button is busy meanwhile."""
    # fresh updates each time: Gradio consumes an update's fields as it applies them
    def busy():
        return gr.update(interactive=False, value=f"{kind} running…")

    def idle():
        return gr.update(interactive=True, value=label)

    def run(*values):
        yield progress_html(0, 0, f"{kind}: starting…"), "", busy()    # clears the last attempt's error
        try:
            run_id = start(*values)
        except Exception as e:
            yield refusal(kind, e), "", idle()
            return
        while True:
            try:
                st = status(run_id)
            except Exception as e:
                yield error_html(f"{kind} {run_id}: {e}"), "", idle()
                return
            ended = st.state != "running"
            yield progress(st), table(st), idle() if ended else busy()
            if ended:
                return
            time.sleep(POLL_S)
    return run


def load_buttons(running: bool) -> tuple:
    """(start, stop) while a load runs, or not: fresh updates each time (Gradio consumes them as it applies them)."""
    if running:
        return gr.update(interactive=False, value="Load running…"), gr.update(interactive=True)
    return gr.update(interactive=True, value=START_LOAD), gr.update(interactive=False)


def follow_load(state):
    """Poll a continuous load until it ends: (status, start button, stop button, load id)."""
    def follow(load_id: str):
        while True:
            try:
                st = state.load_lab.load(load_id)
            except Exception as e:
                yield error_html(f"load {load_id}: {e}"), *load_buttons(False), None
                return
            running = st.state == "running"
            yield load_html(st), *load_buttons(running), load_id if running else None
            if not running:
                return
            time.sleep(LOAD_POLL_S)
    return follow


def panel_shape(pmin, pmax, omin, omax, ignore_eos, seed) -> dict:
    fields = {"prompt_tokens": (pmin, pmax), "max_new_tokens": (omin, omax), "ignore_eos": bool(ignore_eos)}
    if seed not in (None, ""):
        fields["seed"] = seed
    return fields


def burst_spec(n, arrival, rate, burstiness, *shape) -> BurstSpec:
    """The panel's fields as the body of POST /api/burst: the same model checks them. Only the fields the chosen
    arrival uses are sent: a hidden field must not block a burst (its value stays, but nobody can see it)."""
    arrival = arrival or "burst"
    knobs = {}
    if arrival != "burst" and rate not in (None, ""):
        knobs["rate"] = rate
    if arrival == "gamma" and burstiness not in (None, ""):
        knobs["burstiness"] = burstiness
    return BurstSpec(num_requests=n, arrival=arrival, **knobs, **panel_shape(*shape))


def load_spec(kind, concurrency, rate, duration, *shape) -> LoadSpec:
    """The panel's fields as the body of POST /api/load; as for bursts, only the visible knob is sent."""
    kind = kind or "concurrency"
    knobs = {"concurrency": concurrency} if kind == "concurrency" else {"rate": rate}
    if duration not in (None, ""):
        knobs["duration_s"] = duration
    return LoadSpec(kind=kind, **knobs, **panel_shape(*shape))
