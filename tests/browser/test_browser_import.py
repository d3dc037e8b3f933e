"""Profiler traces on the page, in a real browser: `batchscope replay TRACE` shows an imported vLLM trace with its
idle inside steps in the legend and the hover, and "load replay" takes a gzipped trace file as it takes a
timeline, or says in one line why not (the page keeps what it showed)."""
from __future__ import annotations

import json

import pytest

from batchscope.telemetry.importers import import_trace
from test_import_cli import FIXTURES, SYNC_TRACE, vllm_trace

pytestmark = pytest.mark.browser

pytest.importorskip("playwright.sync_api")

from batchscope.app.server import ServerThread, create_app  # noqa: E402
from batchscope.app.server.state import AppState  # noqa: E402

T = 90_000            # ms: generous for a busy box; every wait ends as soon as its condition holds


def hover_compute(page, t_us: float, lane: str = "GPU · compute") -> str:
    """Moves the mouse onto a compute lane at time t_us and returns the hover box's text."""
    pos = page.evaluate("""([t, lane]) => {
        const el = document.getElementById('bs-gantt'), c = document.getElementById('bs-gantt-canvas');
        const names = el.layout.yaxis.ticktext, i = names.indexOf(lane), r = c.getBoundingClientRect();
        const [lo, hi] = el.layout.xaxis.range;
        return { x: r.left + (t / 1e6 - lo) / (hi - lo) * r.width, y: r.top + (i + 0.5) * r.height / names.length };
    }""", [t_us, lane])
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
        assert "Replay: vllm-rank0.pt.trace.json.gz · ? on cuda (NVIDIA H200) · 4 steps · requests not in the " \
            "trace · 0 mode switches" in page.text_content("#bs-replay-text")
        # idle inside steps: not on the idle lane, so the legend says how much, by cause, and the hover per step
        page.wait_for_selector("#bs-legend-inside", state="visible", timeout=T)
        legend = page.text_content("#bs-legend-inside")
        assert legend.startswith("GPU idle inside steps 200 µs in view: other host work 160 µs, host launching "
                                 "40 µs"), legend
        assert "GPU idle before a step, by cause" in page.text_content("#bs-legend")
        # the busy chart: the device's ops, and the steps' spans beside them
        page.wait_for_function("document.getElementById('bs-c-busy').textContent.includes('device ops')", timeout=T)
        assert "steps' spans % (between steps only)" in page.text_content("#bs-c-busy")
        # what the trace under-records is said above the figures
        assert page.get_attribute("#bs-trace-notes", "data-under") == "1"
        assert "The trace under-records:only 4 steps with device work" in page.text_content("#bs-trace-notes")
        # and drawn: on the idle lane by cause (all 200 µs of it), out of the compute bar
        assert page.get_attribute("#bs-gantt", "data-inside-drawn") == "200"
        lanes = json.loads(page.get_attribute("#bs-gantt", "data-lanes"))
        assert lanes["idle: host_other"] >= 4 and lanes["idle: launch"] >= 4, lanes
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


def test_an_imported_multi_rank_trace_leads_with_the_device_and_names_the_straggler(browser, tmp_path):
    """Two ranks of one run, rank 1's host late before each all-reduce while rank 0 waits inside it: the page's
    first numbers are the device's own (board and header), the rank table names rank 1 with the evidence, the
    charts the trace cannot fill say so, and nothing advises a mode switch the replay cannot make."""
    from test_import_headline import straggler_rank

    files = [straggler_rank(tmp_path, 0, late=False, steps=12), straggler_rank(tmp_path, 1, late=True, steps=12)]
    expected = import_trace(files)
    summary = expected["summary"]
    timeline = tmp_path / "two-ranks.timeline.json"
    timeline.write_text(json.dumps(expected))
    srv = ServerThread(create_app(AppState.from_replay_file(timeline))).start()
    ctx = browser.new_context(viewport={"width": 1600, "height": 1000})
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(srv.url + "/")
        page.wait_for_selector("#bs-ranks", timeout=T)
        assert summary["busy_basis"] == "device_ops" and summary["busy_pct"] < summary["busy_pct_steps"]
        board = page.locator("#bs-board")
        assert float(board.get_attribute("data-device-busy")) == pytest.approx(summary["busy_pct"], abs=1e-3)
        assert page.text_content("#bs-board-busy") == f"{summary['busy_pct']:.1f}%"
        assert page.text_content("#bs-st-busy") == f"{summary['busy_pct']:.1f}%"
        assert page.text_content("#bs-st-busy-label") == "busy (device ops)"
        # the rank table: each rank's device busy, the straggler named with its evidence
        rows = page.locator("#bs-ranks tbody tr")
        assert rows.count() == 2
        for i, rank in enumerate(summary["ranks"]):
            assert float(rows.nth(i).get_attribute("data-busy")) == rank["busy_pct"]
            assert f"{rank['busy_pct']:.1f}%" in rows.nth(i).text_content()
        assert summary["ranks"][1]["busy_pct"] < summary["ranks"][0]["busy_pct"]
        assert page.get_attribute("#bs-ranks", "data-straggler") == "1"
        assert "rank 1 held the others back: rank 1's host launched late" in page.text_content("#bs-ranks")
        # every rank's idle on the Gantt, by cause: rank 1 has a GPU idle lane of its own
        assert "GPU idle · rank 1" in page.evaluate("document.getElementById('bs-gantt').layout.yaxis.ticktext")
        lanes = json.loads(page.get_attribute("#bs-gantt", "data-lanes"))
        assert sum(n for k, n in lanes.items() if k.startswith("r1:idle: ")) >= 12, lanes
        # no advice the replay cannot act on, no figure the trace does not hold drawn as zero
        text = page.text_content("body")
        assert "switch to async" not in text and "(A)" not in page.text_content("#bs-board")
        assert "–, not in the trace" in page.text_content("#bs-board")
        assert "–, not in the trace" in page.text_content("#bs-replay-summary")
        charts = ("bs-c-tps", "bs-c-batch", "bs-c-kv", "bs-c-queue")      # each says so once it has drawn
        page.wait_for_function("ids => ids.every(id => document.getElementById(id).dataset.empty)", arg=list(charts),
                               timeout=T)
        for chart in charts:
            assert page.get_attribute(f"#{chart}", "data-empty").startswith("Not in the trace:"), chart
        assert "Busy %: device ops" in page.text_content("#bs-c-busy")
        box = hover_compute(page, expected["steps"][5]["compute_us"][0] + 5)
        assert "requests –, not in the trace" in box and "0 req" not in box, box
        step = expected["steps"][5]
        assert f"device ran ops {step['device_ops_us'] / 1000:.3f} ms of the step's span" in box, box
        # rank 1's part of a step: its collective time as the trace measured it, no estimate
        rank1 = next(r for r in expected["rank_steps"] if r["step"] == step["step"])
        box = hover_compute(page, rank1["compute_us"][0] + 5, "rank 1 · compute")
        assert f"collectives (in the trace): {rank1['collective_us'] / 1000:.3f} ms" in box, box
        assert "requests –, not in the trace" in box and "measured at start-up" not in box, box
        assert not errors, errors
    finally:
        ctx.close()
        srv.stop()


def test_a_replayed_sync_trace_forecasts_without_advising_a_switch(browser):
    """Our own engine's sync steps under a profiler (an H200 trace): the forecast stands on their spans, but a
    replay has no mode key, so the board says there is no async stretch to check it against instead of "switch to
    async (A)"; the device's busy leads and the CUDA-event spans' figure is beside it."""
    trace = FIXTURES / "batchscope-h200-sync.pt.trace.json.gz"
    expected = import_trace(trace)
    assert expected["summary"]["board"]["forecast"]["applicable"]
    srv = ServerThread(create_app(AppState.from_replay_file(trace))).start()
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    try:
        page.goto(srv.url + "/")
        page.wait_for_selector("#bs-forecast[data-applicable='1']", timeout=T)
        board = page.text_content("#bs-board")
        assert "switch to async" not in board and "no async stretch in the recording to check it against" in board
        s = expected["summary"]
        assert page.text_content("#bs-board-busy") == f"{s['busy_pct']:.1f}%"
        assert f"between steps only (the steps' compute spans): {s['busy_pct_steps']:.1f}%" in board
    finally:
        page.close()
        srv.stop()


def test_a_finished_recording_is_worded_as_finished(browser):
    """A replayed trace will get no more steps and holds no requests: the board and the slowest-requests table say
    so without a live engine's "yet" / "so far", and do not ask for a burst the replay cannot fire."""
    trace = FIXTURES / "transformers-h200-sync.pt.trace.json.gz"
    srv = ServerThread(create_app(AppState.from_replay_file(trace))).start()
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    try:
        page.goto(srv.url + "/")
        page.wait_for_selector("#bs-board .bs-verdict-line", timeout=T)
        page.wait_for_function("document.querySelector('#bs-slowest tbody, table tbody') !== null", timeout=T)
        page.wait_for_function("[...document.querySelectorAll('td.muted')].some(td => td.textContent.length > 10)",
                               timeout=T)
        board = page.text_content("#bs-board")
        assert "not enough steps" in board                      # six steps: too few to compare, and said
        assert " yet" not in board and "so far" not in board, board
        muted = page.evaluate("[...document.querySelectorAll('td.muted')].map(td => td.textContent).join(' | ')")
        assert "no finished request in this recording" in muted and "fire a burst" not in muted, muted
    finally:
        page.close()
        srv.stop()
