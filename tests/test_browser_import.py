"""Profiler traces on the page, in a real browser: `batchscope replay TRACE` shows an imported vLLM trace with its
idle inside steps in the legend and the hover, and "load replay" takes a gzipped trace file as it takes a
timeline, or says in one line why not (the page keeps what it showed)."""
from __future__ import annotations

import os

import pytest

from batchscope.telemetry.importers import import_trace
from test_import_cli import SYNC_TRACE, vllm_trace

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is not installed", allow_module_level=True)
pytest.importorskip("playwright.sync_api")

from batchscope.app.server import ServerThread, create_app  # noqa: E402
from batchscope.app.server.state import AppState  # noqa: E402

T = 90_000            # ms: generous for a busy box; every wait ends as soon as its condition holds


def hover_compute(page, t_us: float) -> str:
    """Moves the mouse onto the compute lane at time t_us and returns the hover box's text."""
    pos = page.evaluate("""t => {
        const el = document.getElementById('bs-gantt'), c = document.getElementById('bs-gantt-canvas');
        const names = el.layout.yaxis.ticktext, i = names.indexOf('GPU · compute'), r = c.getBoundingClientRect();
        const [lo, hi] = el.layout.xaxis.range;
        return { x: r.left + (t / 1e6 - lo) / (hi - lo) * r.width, y: r.top + (i + 0.5) * r.height / names.length };
    }""", t_us)
    page.mouse.move(pos["x"], pos["y"] - 3)
    page.mouse.move(pos["x"], pos["y"])
    page.wait_for_selector("#bs-gantt-hover", state="visible", timeout=T)
    return page.text_content("#bs-gantt-hover")


def test_a_trace_on_the_page(browser, tmp_path):
    trace = vllm_trace().write(tmp_path / "vllm-rank0.pt.trace.json.gz")
    expected = import_trace(trace)
    srv = ServerThread(create_app(AppState.from_replay_file(trace))).start()
    ctx = browser.new_context(viewport={"width": 1600, "height": 1000})
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(srv.url + "/")
        page.wait_for_selector("#bs-scope[data-source='replay']", timeout=T)
        page.wait_for_function("+document.getElementById('bs-scope').dataset.steps === 4", timeout=T)
        assert "Replay: vllm-rank0.pt.trace.json.gz · ? on cuda (NVIDIA H200) · 4 steps" in \
            page.text_content("#bs-replay-text")
        # idle inside steps: not on the idle lane, so the legend says how much, by cause, and the hover per step
        page.wait_for_selector("#bs-legend-inside", state="visible", timeout=T)
        legend = page.text_content("#bs-legend-inside")
        assert legend.startswith("GPU idle inside steps 200 µs in view: other host work 160 µs, host launching "
                                 "40 µs"), legend
        assert "GPU idle before a step, by cause" in page.text_content("#bs-legend")
        step = expected["steps"][1]
        box = hover_compute(page, step["compute_us"][0] + 5)
        assert f"step {step['step']}" in box and "GPU idle before: 0.180 ms (other host work)" in box, box
        assert "GPU idle inside the step: 0.050 ms (other host work 0.040, host launching 0.010)" in box, box

        # a gzipped trace through "load replay": imported on the server, then shown
        page.set_input_files("#bs-file", str(SYNC_TRACE))
        page.wait_for_function("+document.getElementById('bs-scope').dataset.steps === 10", timeout=T)
        assert f"Replay: {SYNC_TRACE.name}" in page.text_content("#bs-replay-text")
        assert page.is_hidden("#bs-legend-inside")      # a CPU trace: no device, no idle inside steps

        # a cut one: refused in one line naming the file; the replay on screen stays
        cut = tmp_path / "cut.pt.trace.json.gz"
        data = SYNC_TRACE.read_bytes()
        cut.write_bytes(data[: len(data) // 2])
        page.set_input_files("#bs-file", str(cut))
        page.wait_for_selector("#bs-msg.bs-error", timeout=T)
        msg = page.text_content("#bs-msg")
        assert msg.startswith("replay rejected: cut.pt.trace.json.gz: truncated"), msg
        assert page.get_attribute("#bs-scope", "data-steps") == "10"
        assert not errors, errors
    finally:
        ctx.close()
        srv.stop()
