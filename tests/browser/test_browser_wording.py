"""What a newcomer meets. Words, not field names: a replayed imported trace's page (side panel, header, scoreboard,
legends) shows how busy % was measured as "device ops in the trace", and none of the records' internal names
(`device_ops`, `busy_pct`, `busy_basis`, `steps_from`) appears as text anywhere on it. And the first screen's
sentences grow on a 4K screen seen at 100%, and stay as they were at 1280x720."""
from __future__ import annotations

import pytest

from test_import_cli import vllm_trace

pytestmark = pytest.mark.browser

pytest.importorskip("playwright.sync_api")

from batchscope.app.loadtest.specs import Limits  # noqa: E402
from batchscope.app.server import ServerThread, create_app  # noqa: E402
from batchscope.app.server.state import AppState  # noqa: E402
from helpers import tiny_app_server  # noqa: E402

T = 90_000            # ms: generous for a busy box; every wait ends as soon as its condition holds
INTERNAL_NAMES = ("device_ops", "busy_pct", "busy_basis", "steps_from")


def test_an_imported_trace_replayed_says_it_in_words(browser, tmp_path):
    trace = vllm_trace().write(tmp_path / "vllm-rank0.pt.trace.json.gz")
    srv = ServerThread(create_app(AppState.from_replay_file(trace))).start()
    ctx = browser.new_context(viewport={"width": 1600, "height": 1000})
    page = ctx.new_page()
    try:
        page.goto(srv.url + "/")
        page.wait_for_selector("#bs-scope[data-source='replay']", timeout=T)
        page.wait_for_function("+document.getElementById('bs-scope').dataset.steps === 4", timeout=T)
        page.wait_for_selector("#bs-replay-summary", timeout=T)
        summary = page.text_content("#bs-replay-summary")
        assert "device ops in the trace" in summary, summary
        body = page.evaluate("document.body.innerText")
        shown = [name for name in INTERNAL_NAMES if name in body]
        assert not shown, f"internal names on the page: {shown}"
    finally:
        ctx.close()
        srv.stop()


def test_the_first_screen_grows_on_a_4k_screen(browser):
    sizes = {}
    with tiny_app_server(Limits()) as srv:
        for width, height in ((1280, 720), (3840, 2160)):
            ctx = browser.new_context(viewport={"width": width, "height": height})
            page = ctx.new_page()
            try:
                page.goto(srv.url + "/")
                page.wait_for_selector("#bs-first", state="visible", timeout=T)
                sizes[width] = page.evaluate("""() => ['bs-first', 'bs-nogpu'].map(id =>
                    parseFloat(getComputedStyle(document.getElementById(id)).fontSize))""")
            finally:
                ctx.close()
    assert sizes[1280] == [14, 14], sizes
    assert sizes[3840] == [24, 24], sizes
