"""The batchscope page: Gradio Blocks for the controls, assets/js/ (ES modules, entry main.js) for the live charts.

The server mounts it with `gr.mount_gradio_app(app, build_ui(state), path="/", head=HEAD, css=CSS, theme=THEME)`.
Split of work:
- Python handlers (generate_tab.py for the Generate tab, load_tab.py for the Load test tab, sweep_tab.py for the
  Sweep tab, whose charts the page draws: the handler only says what to draw) call AppState for
  what has a beginning and an end: a streamed generation, a burst, an A/B run, a continuous load. Gradio's queue
  streams their progress back. page_html.py and load_html.py render the HTML they show. Each handler's first
  update clears what the last attempt left (an old error) and marks its button busy; its last one gives the
  button back.
- assets/js owns everything drawn: the websocket feed, every chart (the live scope's and the Sweep tab's, from the
  API's JSON, with one table of colours: palette.js), the mode toggle (so the page always shows the
  engine's mode, also when someone switches it through the API), downloads, recordings and replay.
With `state.engine is None` (`batchscope replay FILE`) the live controls are disabled and the charts show the replay.
"""
from __future__ import annotations

from importlib import resources

import gradio as gr

from .generate_tab import generate_tab, wire_generate
from .load_tab import load_test_tab, wire_load_test
from .page_html import header_html, replay_html, scope_html
from .sweep_tab import SweepTab, sweep_charts, sweep_tab, wire_sweep

ASSETS = resources.files("batchscope.assets")

# Served by the app: assets/ at /batchscope-static/ (Gradio keeps /static and /assets for itself), plotly.js from
# the plotly package. Nothing comes from outside. Plotly is a classic script (window.Plotly); the charts are
# ES modules that import each other relative to main.js, so there is no build step.
HEAD = ('<script src="/batchscope-static/plotly.min.js"></script>\n'
        '<script type="module" src="/batchscope-static/js/main.js"></script>')
CSS = (ASSETS / "style.css").read_text(encoding="utf-8")

# Compare (two recordings step by step, docs/compare.md) and What-if (docs/whatif.md): assets/js/analysis.js mounts
# compare_view.js and whatif_view.js in these boxes, both closed until opened.
ANALYSIS_HTML = ('<details id="bs-analysis" class="bs-analysis-box"><summary>Compare recordings '
                 '<span class="bs-muted">(two recordings step by step at matched batch shapes; a shape clicked: its '
                 'typical steps on the Gantt)</span></summary><div id="bs-compare"></div></details>'
                 '<details id="bs-whatif-box" class="bs-analysis-box"><summary>What-if '
                 '<span class="bs-muted">(what another setting would do to a recorded load)</span></summary>'
                 '<div id="bs-whatif"></div></details>')

# System fonts only: a page that loads no font files starts faster and never reaches outside.
# Small spacing and text: a dashboard, dense enough that the controls and results fit beside the charts.
THEME = gr.themes.Default(primary_hue="blue", neutral_hue="slate", spacing_size="sm", text_size="sm", radius_size="sm",
                          font=["Inter", "ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "sans-serif"],
                          font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "monospace"])


def build_ui(state) -> gr.Blocks:
    """The whole page for an AppState: the header, the side tabs (Replay on a replay-only server, Generate, Load
    test) and the charts' container."""
    live = state.engine is not None
    limits = state.limits
    with gr.Blocks(title="batchscope", analytics_enabled=False, fill_width=True) as demo:
        gr.HTML(header_html(state), elem_id="bs-header", js_on_load=None)
        with gr.Row(equal_height=False, elem_id="bs-main"):
            with gr.Column(scale=1, min_width=360, elem_id="bs-side"):
                with gr.Tabs():
                    others = []
                    if not live:
                        with gr.Tab("Replay") as replay_tab:
                            gr.HTML(replay_html(state), js_on_load=None)
                        others.append(replay_tab)
                    with gr.Tab("Generate") as gen_tab:
                        gen = generate_tab(live, limits)
                    with gr.Tab("Load test") as load_tab:
                        load = load_test_tab(live, limits)
                    with gr.Tab("Sweep") as sweep_panel:
                        sweep_fields = sweep_tab(live)
                    others += [gen_tab, load_tab]
            with gr.Column(scale=3, min_width=640, elem_id="bs-charts"):
                # the Sweep tab's results take the wide column while that tab is open, above the live charts
                with gr.Column(visible=False, elem_id="bs-sweep-wide") as sweep_wide:
                    sweep = SweepTab(**sweep_fields, **sweep_charts())
                gr.HTML(scope_html(state), elem_id="bs-scope-block", js_on_load=None)
                # under the charts, closed: the first screen stays the charts' (analysis.js mounts the views)
                gr.HTML(ANALYSIS_HTML, elem_id="bs-analysis-block", js_on_load=None)
        sweep_panel.select(lambda: gr.update(visible=True), None, sweep_wide, queue=False)
        for tab in others:
            tab.select(lambda: gr.update(visible=False), None, sweep_wide, queue=False)
        wire_generate(state, gen)
        wire_load_test(state, load, demo)
        wire_sweep(state, sweep, demo)
    return demo
