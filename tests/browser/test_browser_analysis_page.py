"""Compare and What-if on the page itself (assets/js/analysis.js mounting compare_view.js and whatif_view.js in
their boxes under the charts), in a real browser (Playwright driving Debian's Chromium, headless) against the
tiny model: the live timeline compared with a named recording, a matched shape clicked puts the Gantt on the live
side's typical step and offers to open the recording's; a what-if predicted; both boxes closed on the first screen
and gone in presentation mode."""
from __future__ import annotations

import httpx
import pytest

from batchscope.app.loadtest.specs import Limits
from helpers import tiny_served, until, whatif_predict

pytestmark = pytest.mark.browser

sync_api = pytest.importorskip("playwright.sync_api")

T = 60_000
LAPTOP = {"width": 1366, "height": 768}
BURST = {"num_requests": 4, "prompt_tokens": [8, 8], "max_new_tokens": [24, 24], "seed": 1, "ignore_eos": True}
# the Gantt's x range (s) and the [start, end] (s) of a step of the live store, as the page holds them
RANGE_JS = "() => document.getElementById('bs-gantt').layout.xaxis.range"
STEP_JS = """(n) => { const s = window.batchscope.store.steps.find(r => r.step === n);
  return s ? [s._s / 1e6, s._e / 1e6] : null; }"""


def burst(c: httpx.Client) -> None:
    burst_id = c.post("/api/burst", json=BURST).json()["burst_id"]
    until(lambda: c.get(f"/api/bursts/{burst_id}").json()["state"] != "running")


@pytest.fixture(scope="module")
def server():
    limits = Limits(max_prompt_tokens=64, max_new_tokens=32, max_burst_requests=8)
    with tiny_served(limits, num_blocks=128, max_batch_tokens=64) as (srv, _):
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            c.post("/api/recording/start", json={"name": "first"}).raise_for_status()
            burst(c)
            c.post("/api/recording/stop").raise_for_status()
            burst(c)                     # the second runs live only
        yield srv


@pytest.fixture
def page(browser, server):
    ctx = browser.new_context(viewport=LAPTOP)
    page = ctx.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url + "/")
    page.wait_for_selector("#bs-gantt .main-svg", timeout=T)
    page.wait_for_selector("#bs-compare-view", state="attached", timeout=T)
    yield page
    assert not errors, errors
    ctx.close()


def test_first_screen_keeps_the_gantt_and_both_boxes_closed(page):
    assert page.evaluate("document.getElementById('bs-gantt').getBoundingClientRect().top") < LAPTOP["height"] - 60
    assert page.evaluate("[...document.querySelectorAll('#bs-analysis-block details')].map(d => d.open)") == [False, False]
    assert not page.is_visible("#bs-compare-run") and not page.is_visible("#bs-whatif-predict")
    page.click("#bs-analysis > summary")
    assert page.is_visible("#bs-compare-run")
    page.keyboard.press("p")                                   # presentation mode: the stage alone
    page.wait_for_function("document.documentElement.classList.contains('bs-present')", timeout=T)
    assert not page.is_visible("#bs-analysis") and not page.is_visible("#bs-whatif-box")


def test_a_compared_bucket_puts_the_gantt_on_the_live_typical_step(page):
    page.click("#bs-analysis > summary")
    page.wait_for_function("document.querySelectorAll('#bs-compare-base option').length >= 2", timeout=T)
    page.select_option("#bs-compare-base", "first")
    page.select_option("#bs-compare-new", "live")
    page.click("#bs-compare-run")
    page.wait_for_selector("#bs-compare-verdict[data-verdict]", timeout=T)
    assert "device step time NEW/BASE" in page.text_content("#bs-compare-verdict")
    page.click("#bs-compare-bucket-0")
    new = page.get_attribute("#bs-compare-typical-new", "data-step")
    assert page.get_attribute("#bs-compare-typical-new", "data-recording") == "live"
    step = int(new)
    page.wait_for_function(f"(document.getElementById('bs-gantt').dataset.marks || '').includes('new:{step}')",
                           timeout=T)
    lo, hi = page.evaluate(RANGE_JS)
    s0, s1 = page.evaluate(STEP_JS, step)
    assert lo <= s0 and s1 <= hi, (lo, hi, s0, s1)
    assert page.evaluate("window.batchscope.view.follow") is False   # frozen there like a zoom
    below_header(page)
    # the base side is a named recording, not on screen: its figures and a button that opens it
    base = page.text_content("#bs-compare-typical-base")
    assert "first" in base and "step #" in base and " ms" in base
    assert page.text_content("#bs-compare-open-base") == "open this recording"
    page.click("#bs-compare-open-base")
    base_step = int(page.get_attribute("#bs-compare-typical-base", "data-step"))
    page.wait_for_function(f"(document.getElementById('bs-gantt').dataset.marks || '').includes('base:{base_step}')",
                           timeout=T)
    assert page.evaluate("window.batchscope.view.source") == "replay"
    lo, hi = page.evaluate(RANGE_JS)
    s0, s1 = page.evaluate("""(n) => { const s = window.batchscope.view.replay.steps.find(r => r.step === n);
                                       return [s._s / 1e6, s._e / 1e6]; }""", base_step)
    assert lo <= s0 and s1 <= hi, (lo, hi, s0, s1)
    below_header(page)


def below_header(page):
    """The Gantt's top lanes are in sight below the sticky header, not under it (once the picture has settled)."""
    page.wait_for_timeout(1800)                                # (analysis.js keeps it there while the page settles)
    head = page.evaluate("document.getElementById('bs-header').getBoundingClientRect().bottom")
    top = page.evaluate("document.getElementById('bs-gantt').getBoundingClientRect().top")
    assert head - 1 <= top < page.viewport_size["height"] / 2, (head, top)


def test_whatif_predicts_a_smaller_token_budget(page):
    page.click("#bs-whatif-box > summary")
    whatif_predict(page, "first", "max_batch_tokens", "32", T)
    page.wait_for_selector("#bs-whatif-tables table tbody tr", timeout=T)
    assert page.text_content("#bs-whatif-error") == ""
    assert page.locator("#bs-whatif-tables table").count() >= 1
    assert page.locator("#bs-whatif-tables tr[data-figure='output_tokens_per_s']").count() >= 1
