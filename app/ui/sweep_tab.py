"""The Sweep tab: its fields (modes, points, duration, request lengths, SLOs with their defaults), Start and Stop,
live progress, and where its charts go: latency against throughput with sync and async overlaid, the engine per
point, and the latency distributions of a chosen sweep point or of the Load test tab's newest burst, A/B or load.
Another tool's report can be uploaded to overlay. The page draws the charts (assets/js/sweep.js) from the API's
JSON; the handlers here only say what to draw (chart_html). The HTML is sweep_html.py's; the spec is the same
SweepSpec that POST /api/sweep checks.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import gradio as gr

from ..loadtest.sweep.spec import DEFAULT_RATE_POINTS, DEFAULT_TARGET, SLO, SLO_ITL_FACTOR, SLO_TTFT_FACTOR, SweepSpec
from .load_tab import CHECK_MODE_LOCK_SOON, refusal
from .page_html import error_html
from .sweep_html import chart_html, import_html, point_text, sweep_progress_html, sweep_summary_html

POLL_S = 0.5
START, STOP = "Start sweep", "Stop sweep"


@dataclass
class SweepTab:
    modes: gr.CheckboxGroup
    points: gr.Number
    duration: gr.Number
    prompt: gr.Number
    output: gr.Number
    slo_ttft: gr.Number
    slo_itl: gr.Number
    slo_e2e: gr.Textbox
    target: gr.Number
    start: gr.Button
    stop: gr.Button
    progress: gr.HTML
    summary: gr.HTML
    x_axis: gr.Radio
    curves: gr.HTML
    engine: gr.HTML
    choice: gr.Dropdown
    dist_kind: gr.Radio
    refresh: gr.Button
    dist: gr.HTML
    upload: gr.File
    imported: gr.HTML
    sweep_id: gr.State
    imports: gr.State

    def spec_inputs(self) -> list:
        return [self.modes, self.points, self.duration, self.prompt, self.output, self.slo_ttft, self.slo_itl,
                self.slo_e2e, self.target]

    def slo_inputs(self) -> list:
        return [self.slo_ttft, self.slo_itl, self.slo_e2e, self.target]


def sweep_tab(live: bool) -> dict:
    gr.Markdown("**Sweep**: in each mode a synchronous run (one request at a time), a throughput run (as many in "
                "flight as the server allows), then rates evenly spaced between the two, the same seeded requests "
                "at every point. The mode toggle is locked while it runs.", elem_id="bs-sweep-intro")
    modes = gr.CheckboxGroup(["sync", "async"], value=["sync", "async"], label="modes", elem_id="bs-sweep-modes",
                             interactive=live)
    with gr.Row():
        points = gr.Number(DEFAULT_RATE_POINTS, label="rates between", precision=0, elem_id="bs-sweep-points",
                           interactive=live)
        duration = gr.Number(10, label="seconds per point", elem_id="bs-sweep-duration", interactive=live)
    with gr.Row():
        prompt = gr.Number(64, label="prompt tokens", precision=0, elem_id="bs-sweep-prompt", interactive=live)
        output = gr.Number(64, label="output tokens", precision=0, elem_id="bs-sweep-output", interactive=live)
    with gr.Row():
        # empty: the model's own, from the sweep's first (synchronous) run; "none": not checked
        slo_ttft = gr.Textbox("", label=f"SLO TTFT ms (empty: {SLO_TTFT_FACTOR:g}x the synchronous run's p99)",
                              placeholder="from the synchronous run", elem_id="bs-sweep-slo-ttft",
                              interactive=live, max_lines=1)
        slo_itl = gr.Textbox("", label=f"SLO ITL ms per request (empty: {SLO_ITL_FACTOR:g}x the synchronous "
                             "run's p99)", placeholder="from the synchronous run", elem_id="bs-sweep-slo-itl",
                             interactive=live, max_lines=1)
    with gr.Row():
        # a text field: an empty Number reads as 0, and 0 is an SLO the model refuses; empty here means none
        slo_e2e = gr.Textbox("", label="SLO E2E ms (empty: none)", elem_id="bs-sweep-slo-e2e", interactive=live,
                             max_lines=1)
        target = gr.Number(DEFAULT_TARGET, label="target attainment (0-1)", elem_id="bs-sweep-target",
                           interactive=live)
    with gr.Row():
        start = gr.Button(START, variant="primary", elem_id="bs-sweep-start", interactive=live, size="sm")
        stop = gr.Button(STOP, variant="stop", elem_id="bs-sweep-stop", interactive=False, size="sm")
    progress = gr.HTML("", elem_id="bs-sweep-progress", js_on_load=None)
    upload = gr.File(label="overlay a GuideLLM or vllm bench serve JSON report", file_types=[".json", ".jsonl"],
                     type="binary", elem_id="bs-sweep-upload", interactive=live)
    imported = gr.HTML("", elem_id="bs-sweep-import-status", js_on_load=None)
    return {"modes": modes, "points": points, "duration": duration, "prompt": prompt, "output": output,
            "slo_ttft": slo_ttft, "slo_itl": slo_itl, "slo_e2e": slo_e2e, "target": target, "start": start,
            "stop": stop, "progress": progress, "upload": upload, "imported": imported,
            "sweep_id": gr.State(None), "imports": gr.State([])}


def sweep_charts() -> dict:
    """The Sweep tab's results, built where they are placed: the wide column beside the side panel (page.py
    shows them while the Sweep tab is open), not the 360-px panel that holds the fields."""
    summary = gr.HTML("", elem_id="bs-sweep-summary", js_on_load=None)
    x_axis = gr.Radio([("requests/s", "requests_per_s"), ("output tokens/s", "output_tokens_per_s")],
                      value="requests_per_s", label="throughput axis", elem_id="bs-sweep-x")
    curves = gr.HTML(chart_html("curves"), elem_id="bs-sweep-curves", js_on_load=None)
    engine = gr.HTML(chart_html("engine"), elem_id="bs-sweep-engine", js_on_load=None)
    gr.Markdown("**Distributions** of one sweep point (sync and async overlaid) or of the Load test tab's newest "
                "burst, A/B or continuous load", elem_id="bs-sweep-dist-intro")
    with gr.Row():
        choice = gr.Dropdown([], value=None, label="show", elem_id="bs-sweep-choice", scale=3)
        refresh = gr.Button("↻ load-test runs", elem_id="bs-sweep-refresh", size="sm", scale=1)
    dist_kind = gr.Radio([("CDF", "cdf"), ("histogram", "hist")], value="cdf", label="as",
                         elem_id="bs-sweep-dist-kind")
    dist = gr.HTML(chart_html("dist", kind="cdf"), elem_id="bs-sweep-dist", js_on_load=None)
    return {"summary": summary, "x_axis": x_axis, "curves": curves, "engine": engine, "choice": choice,
            "dist_kind": dist_kind, "refresh": refresh, "dist": dist}


# ----------------------------------------------------------------------------------------------- the handlers

def _given(v):
    if isinstance(v, str):
        v = v.strip()
    return None if v in (None, "") else v


def _ms(v):
    """A number typed in a text field as a number (the model refuses what is not one, with its reason)."""
    try:
        return float(v) if isinstance(v, str) else v
    except ValueError:
        return v


def panel_slo(ttft, itl, e2e, target) -> dict:
    """An empty TTFT or ITL field is left out (the sweep takes it from its synchronous run), "none" is not
    checked; an empty E2E field is not checked. A 0 is sent as it is, so that the model refuses it with its
    reason."""
    slo = {"e2e_ms": _ms(_given(e2e))}
    for key, v in (("ttft_ms", _given(ttft)), ("itl_ms", _given(itl))):
        if isinstance(v, str) and v.lower() in ("none", "-", "–"):
            slo[key] = None
        elif v is not None:
            slo[key] = _ms(v)
    if _given(target) is not None:
        slo["target"] = target
    return slo


def sweep_spec(modes, points, duration, prompt, output, *slo) -> SweepSpec:
    fields = {"modes": list(modes or []), "slo": panel_slo(*slo)}
    for key, value in (("points", points), ("duration_s", duration), ("prompt_tokens", prompt),
                       ("max_new_tokens", output)):
        if _given(value) is not None:
            fields[key] = value
    return SweepSpec(**fields)


def buttons(running: bool) -> tuple:
    if running:
        return gr.update(interactive=False, value="Sweep running…"), gr.update(interactive=True)
    return gr.update(interactive=True, value=START), gr.update(interactive=False)


def wire_sweep(state, tab: SweepTab, demo: gr.Blocks) -> None:
    views = SweepViews(state)
    outputs = [tab.progress, tab.summary, tab.curves, tab.engine, tab.choice, tab.start, tab.stop, tab.sweep_id]

    def start(x_key, imports, *values):
        # clears the last attempt's error and shows the start is under way
        starting = gr.update(interactive=False, value="Starting…"), gr.update(interactive=False)
        yield "", *(gr.update(),) * 4, *starting, None
        try:
            sweep_id = state.sweep_lab.start(sweep_spec(*values)).sweep_id
        except Exception as e:
            yield refusal("sweep", e), gr.update(), gr.update(), gr.update(), gr.update(), *buttons(False), None
            return
        yield from views.follow(sweep_id, x_key, imports)

    def stop(sweep_id):
        try:
            target = sweep_id or state.sweep_lab.running()
            if target:
                state.sweep_lab.stop(target)
        except Exception:               # already gone: the follower shows how it ended
            pass

    def follow_running(x_key, imports):
        sweep_id = state.sweep_lab.running() if state.engine is not None else None
        if sweep_id is None:
            yield (gr.update(),) * 4 + (views.choices(None),) + (gr.update(),) * 3
            return
        yield from views.follow(sweep_id, x_key, imports)

    # a sweep locks the mode toggle, as an A/B does: have the page look for the lock now
    tab.start.click(start, [tab.x_axis, tab.imports, *tab.spec_inputs()], outputs, concurrency_limit=4,
                    show_progress="hidden", js=CHECK_MODE_LOCK_SOON)
    tab.stop.click(stop, tab.sweep_id, None, show_progress="hidden")
    tab.x_axis.change(views.redraw, [tab.sweep_id, tab.x_axis, tab.imports], [tab.curves, tab.engine],
                      show_progress="hidden")
    dist_inputs = [tab.choice, tab.dist_kind, tab.sweep_id, tab.imports]
    tab.choice.change(views.distributions, dist_inputs, tab.dist, show_progress="hidden")
    # a new point's curves redraw the distributions too: the choice keeps its value when the other mode's run of
    # the same point arrives (sync's point 2, then async's), and an unchanged value fires no change of its own
    tab.curves.change(views.distributions, dist_inputs, tab.dist, show_progress="hidden")
    tab.dist_kind.change(views.distributions, dist_inputs, tab.dist, show_progress="hidden")
    tab.refresh.click(views.choices, tab.sweep_id, tab.choice, show_progress="hidden")
    tab.upload.upload(views.add_import, [tab.upload, tab.sweep_id, tab.x_axis, tab.imports, *tab.slo_inputs()],
                      [tab.imported, tab.curves, tab.engine, tab.imports], show_progress="hidden")
    if state.engine is not None:
        demo.load(follow_running, [tab.x_axis, tab.imports], outputs, show_progress="hidden", concurrency_limit=8)


class SweepViews:
    """What the tab's handlers show from the state: progress, choices, and what each chart is to draw."""

    def __init__(self, state):
        self.state = state

    def _status(self, sweep_id: str | None) -> dict | None:
        if not sweep_id:
            return None
        try:
            return self.state.sweep_lab.status(sweep_id).model_dump(mode="json")
        except Exception:
            return None

    def figures(self, st: dict | None, x_key: str, imports: list[str]) -> tuple:
        """The curves and the engine chart of a sweep, as what the page is to draw (the points drawn so far: a
        new point is a new picture)."""
        asked = {"sweep": (st or {}).get("id"), "imports": imports, "x": x_key or "requests_per_s",
                 "points": (st or {}).get("points_done")}
        return chart_html("curves", **asked), chart_html("engine", **asked)

    def redraw(self, sweep_id, x_key, imports):
        return self.figures(self._status(sweep_id), x_key, imports)

    def choices(self, sweep_id, st: dict | None = None):
        st = st or self._status(sweep_id)
        options, value = [], None
        for mode, curve in ((st or {}).get("modes") or {}).items():
            for p in curve.get("points") or []:
                label = f"sweep point {point_text(p)}"
                if (label, f"point:{p['index']}") not in options:
                    options.append((label, f"point:{p['index']}"))
                    value = f"point:{p['index']}"
        try:
            runs = list(self.state.load_lab.latest_values())
        except Exception:
            runs = []
        options += [(f"{key} (Load test tab)", f"run:{key}") for key in runs]
        return gr.update(choices=options, value=value or (options[0][1] if options else None))

    def follow(self, sweep_id: str, x_key, imports):
        drawn = None
        while True:
            st = self._status(sweep_id)
            if st is None:
                yield error_html(f"sweep {sweep_id} is gone"), *(gr.update(),) * 4, *buttons(False), None
                return
            running = st["state"] == "running"
            if st["points_done"] != drawn or not running:
                drawn = st["points_done"]
                curves, engine = self.figures(st, x_key, imports)
                yield (sweep_progress_html(st), sweep_summary_html(st), curves, engine, self.choices(sweep_id, st),
                       *buttons(running), sweep_id)
            else:
                yield (sweep_progress_html(st), gr.update(), gr.update(), gr.update(), gr.update(), *buttons(True),
                       sweep_id)
            if not running:
                return
            time.sleep(POLL_S)

    def distributions(self, choice, kind, sweep_id, imports):
        """What the distributions chart is to draw: a sweep point's values (the page reads them from the sweep's
        JSON) or a load-test run's (no route serves those: they go along)."""
        kind = kind or "cdf"
        if choice and choice.startswith("run:"):
            key = choice[4:]
            runs = [[series, values] for series, values in self.state.load_lab.latest_values().get(key, [])]
            return chart_html("dist", kind=kind, run=key, values=runs)
        if choice and choice.startswith("point:") and sweep_id:
            st = self._status(sweep_id)
            return chart_html("dist", kind=kind, sweep=sweep_id, point=int(choice[6:]), imports=imports,
                              points=(st or {}).get("points_done"))
        return chart_html("dist", kind=kind)

    def add_import(self, raw, sweep_id, x_key, imports, *slo):
        imports = list(imports or [])
        if raw is None:
            return gr.update(), gr.update(), gr.update(), imports
        try:
            report = self.state.sweep_lab.import_report(raw, SLO(**panel_slo(*slo)))
        except Exception as e:
            return refusal("report", e).replace("not started", "not read"), gr.update(), gr.update(), imports
        imports.append(report["id"])
        return (import_html(report), *self.figures(self._status(sweep_id), x_key, imports), imports)

