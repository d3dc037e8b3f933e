"""The profiler control on the live page, in a real browser (Playwright driving Debian's Chromium, headless): asked
for from the toolbar beside the recording controls, it runs a torch.profiler window over the next steps and then
offers the Kineto trace for download."""
from __future__ import annotations

import gzip
import json
import urllib.request

import pytest

from helpers import tiny_app_server

pytestmark = pytest.mark.browser

sync_api = pytest.importorskip("playwright.sync_api")

from batchscope.app.loadtest.specs import Limits  # noqa: E402

T = 60_000


def test_the_page_takes_a_profiler_window_and_offers_its_trace(browser, tmp_path):
    with tiny_app_server(Limits(max_new_tokens=64)) as srv:
        ctx = browser.new_context(viewport={"width": 1600, "height": 1000}, accept_downloads=True)
        page = ctx.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(srv.url)
        page.wait_for_selector("#bs-rec-group #bs-prof", timeout=T)
        assert page.is_hidden("#bs-prof-dl")
        page.fill("#bs-prof-steps", "3")
        page.click("#bs-prof")
        page.wait_for_function("document.querySelector('#bs-prof').textContent.includes('…')", timeout=T)
        body = json.dumps({"prompt": [1500, 1501], "max_new_tokens": 8, "ignore_eos": True}).encode()
        urllib.request.urlopen(urllib.request.Request(srv.url + "/api/generate", body,
                                                      {"Content-Type": "application/json"}), timeout=60).read()
        page.wait_for_selector("#bs-prof-dl:not([hidden])", timeout=T)
        with page.expect_download(timeout=T) as download:
            page.click("#bs-prof-dl")
        path = tmp_path / "trace.json.gz"
        download.value.save_as(path)
        events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
        assert any(e.get("name", "").startswith("batchscope.launch step=") for e in events)
        assert "profiled steps" in page.text_content("#bs-msg")
        assert not errors, errors
        ctx.close()
