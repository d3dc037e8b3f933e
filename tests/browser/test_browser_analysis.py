"""The Compare view and the What-if panel (assets/js/compare_view.js, whatif_view.js), each mounted in a real
browser (Playwright driving Debian's Chromium, headless) on a page the app serves, against the tiny model: two
recordings compared, a bucket clicked opens its typical steps, a what-if predicted and verified on the engine."""
from __future__ import annotations

import httpx
import pytest

from batchscope.app.loadtest.specs import Limits
from helpers import tiny_served, until, whatif_predict

pytestmark = pytest.mark.browser

sync_api = pytest.importorskip("playwright.sync_api")

T = 120_000
BURST = {"num_requests": 4, "prompt_tokens": [8, 8], "max_new_tokens": [24, 24], "seed": 1, "ignore_eos": True}
MOUNT = """async () => {
  document.body.innerHTML = '<div id="c"></div><div id="w"></div>';
  const compare = await import('/batchscope-static/js/compare_view.js');
  const whatif = await import('/batchscope-static/js/whatif_view.js');
  window.picked = null;
  compare.mount(document.getElementById('c'), undefined, { onBucket: b => { window.picked = b; } });
  whatif.mount(document.getElementById('w'));
}"""


def record(c: httpx.Client, name: str) -> None:
    c.post("/api/recording/start", json={"name": name}).raise_for_status()
    burst_id = c.post("/api/burst", json=BURST).json()["burst_id"]
    until(lambda: c.get(f"/api/bursts/{burst_id}").json()["state"] != "running")
    c.post("/api/recording/stop").raise_for_status()


@pytest.fixture(scope="module")
def server():
    limits = Limits(max_prompt_tokens=64, max_new_tokens=32, max_burst_requests=8)
    with tiny_served(limits, ui=False, num_blocks=128, max_batch_tokens=64) as (srv, _):
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            record(c, "base")
            record(c, "new")
        yield srv


@pytest.fixture
def page(browser, server):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url + "/api/health")
    page.evaluate(MOUNT)
    yield page
    assert not errors, errors
    ctx.close()


def test_compare_view_compares_two_recordings_and_a_bucket_opens_its_typical_steps(page):
    page.wait_for_function("document.querySelectorAll('#bs-compare-base option').length === 3", timeout=T)
    assert page.eval_on_selector_all("#bs-compare-base option", "os => os.map(o => o.value)") == [
        "live", "base", "new"]
    page.select_option("#bs-compare-base", "base")
    page.select_option("#bs-compare-new", "new")
    page.click("#bs-compare-run")
    page.wait_for_selector("#bs-compare-verdict[data-verdict]", timeout=T)
    assert "device step time NEW/BASE" in page.text_content("#bs-compare-verdict")
    assert page.locator("#bs-compare-bucket-table tbody tr").count() >= 1
    assert "Not matched" in page.text_content("#bs-compare-unmatched")
    page.click("#bs-compare-bucket-0")
    picked = page.evaluate("window.picked")
    assert picked["typical"]["base"]["recording"] == "base" and picked["typical"]["new"]["recording"] == "new"
    assert isinstance(picked["typical"]["new"]["step"], int)


def test_compare_view_shows_the_servers_refusal(page):
    page.wait_for_function("document.querySelectorAll('#bs-compare-base option').length === 3", timeout=T)
    page.evaluate("""() => { const s = document.getElementById('bs-compare-new');
                             s.append(new Option('gone', 'gone')); s.value = 'gone'; }""")
    page.click("#bs-compare-run")
    page.wait_for_function("document.getElementById('bs-compare-error').textContent.length > 0", timeout=T)
    assert "no recording named 'gone'" in page.text_content("#bs-compare-error")


def test_whatif_panel_predicts_then_verifies_on_the_engine(page):
    whatif_predict(page, "base", "mode", "sync", T)
    page.wait_for_selector("#bs-whatif-table-sync", timeout=T)
    row = page.locator("#bs-whatif-table-sync tr[data-figure='output_tokens_per_s'] td")
    assert float(row.nth(2).text_content().split(" ")[0]) > 0 and row.nth(3).text_content() == ""
    page.click("#bs-whatif-verify")
    page.wait_for_function("document.getElementById('w').dataset.verifyState", timeout=300_000)
    assert page.evaluate("document.getElementById('w').dataset.verifyState") == "done", \
        page.text_content("#bs-whatif-error")
    assert float(row.nth(3).text_content()) > 0 and row.nth(4).text_content().endswith("%")


def test_whatif_panel_shows_the_cli_command_for_a_setting_that_needs_a_restart(page):
    page.wait_for_selector("#bs-whatif-key-max_running", timeout=T)
    page.select_option("#bs-whatif-source", "base")
    page.fill("#bs-whatif-runs", "1")
    page.fill("#bs-whatif-key-max_running", "4")
    page.click("#bs-whatif-predict")
    page.wait_for_selector("#bs-whatif-table-async", timeout=T)
    page.click("#bs-whatif-verify")
    page.wait_for_function("document.getElementById('bs-whatif-error').textContent.length > 0", timeout=T)
    assert "batchscope whatif RECORDING.json --set max_running=4 --verify" in page.text_content("#bs-whatif-error")
    page.fill("#bs-whatif-key-max_running", "0")
    page.click("#bs-whatif-predict")
    page.wait_for_function("document.getElementById('bs-whatif-error').textContent.includes('max_running=0')",
                           timeout=T)
