"""The page in a real browser: Playwright driving Debian's Chromium (headless) against the real server.

A user's story on a tiny random model on the CPU: open the page, stream a prompt, flip sync/async and see the mode
and a marker on the timeline, fire a burst and watch the Gantt and the charts grow, run an A/B, download the
timeline JSON and load it back as a replay. Then a replay-only server (no model) shows a GPU-shaped recording (telemetry's
synthetic engine) with the live controls off. Every request the page makes must stay on 127.0.0.1.
"""
from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest

from helpers import post_json as post, tiny_app_server

pytestmark = pytest.mark.browser

sync_api = pytest.importorskip("playwright.sync_api")

from batchscope.app.loadtest.specs import Limits  # noqa: E402
from batchscope.app.server import ServerThread, create_app  # noqa: E402
from batchscope.app.server.state import AppState  # noqa: E402
from batchscope.telemetry import SCHEMA_ID, validate_timeline  # noqa: E402

LIMITS = Limits(max_prompt_tokens=512, max_new_tokens=512, max_burst_requests=64, max_concurrent_bursts=2,
                max_waiting_requests=256)
T = 90_000            # ms: generous for a busy laptop or CI box; every wait ends as soon as its condition holds


@pytest.fixture(scope="module")
def server():
    with tiny_app_server(LIMITS) as srv:
        yield srv


class Watched:
    """A page with every request, websocket and failed response it makes on record."""

    def __init__(self, browser, tmp_path: Path):
        self.ctx = browser.new_context(viewport={"width": 1600, "height": 1000}, accept_downloads=True)
        self.page = self.ctx.new_page()
        self.urls: list[str] = []
        self.failed: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.urls.append(r.url))
        self.page.on("websocket", lambda ws: self.urls.append(ws.url))
        self.page.on("response", lambda r: r.status >= 400 and self.failed.append(f"{r.status} {r.url}"))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.tmp = tmp_path

    def open(self, url: str):
        self.page.goto(url)
        # the charts exist once the page's modules have found their container and plotly has drawn the Gantt
        self.page.wait_for_selector("#bs-gantt .main-svg", timeout=T)
        return self.page

    def assert_local(self, port: int):
        outside = [u for u in self.urls
                   if not u.startswith(("data:", "blob:")) and urlparse(u).netloc != f"127.0.0.1:{port}"]
        assert self.urls and not outside, f"requests left 127.0.0.1:{port}: {outside}"

    def close(self):
        self.ctx.close()


def scope(page, key: str) -> int:
    return int(page.eval_on_selector("#bs-scope", f"el => el.dataset.{key} || '0'"))


def engine_mode(url: str) -> str:
    with urllib.request.urlopen(url + "/api/status", timeout=10) as r:
        return json.load(r)["mode"]



def test_live_page_story(server, browser, tmp_path):
    w = Watched(browser, tmp_path)
    page = w.open(server.url + "/")
    # the page loaded only from this server, and nothing it asked for failed (our scripts, Gradio's own files)
    assert not w.failed, w.failed
    assert any(u.endswith("/batchscope-static/js/main.js") for u in w.urls)      # the charts' entry module
    page.wait_for_selector("#bs-conn[data-state='live']", timeout=T)
    assert page.text_content("#bs-model") == "tiny-random"
    assert page.text_content("#bs-device") == "cpu"
    assert page.text_content("#bs-nvml") == "not available"

    # -- a prompt, streamed: the output box takes several growing values before the final one
    page.fill("#bs-prompt textarea", "Tell me about batching")
    page.fill("#bs-max-new input", "200")
    page.evaluate("""() => {
        window.__seen = new Set();
        const box = document.querySelector('#bs-output textarea');
        window.__poll = setInterval(() => { if (box.value) window.__seen.add(box.value.length); }, 2);
    }""")
    page.click("#bs-generate")
    page.wait_for_function("document.querySelector('#bs-gen-info').textContent.includes('done in')", timeout=T)
    lengths = page.evaluate("clearInterval(window.__poll), Array.from(window.__seen).sort((a, b) => a - b)")
    assert len(lengths) >= 2, f"text did not stream, the box only showed lengths {lengths}"
    assert len(page.input_value("#bs-output textarea")) == lengths[-1] > 0

    # -- flip to sync: the engine switches, the page says so, the timeline gets a marker
    assert page.get_attribute("#bs-mode", "data-mode") == "async"
    switches = scope(page, "switches")
    page.click("#bs-mode-sync")
    page.wait_for_selector("#bs-mode[data-mode='sync']", timeout=T)
    assert page.text_content("#bs-mode") == "sync"
    assert engine_mode(server.url) == "sync"
    page.wait_for_function(f"+document.getElementById('bs-scope').dataset.switches > {switches}", timeout=T)
    page.wait_for_function("+document.getElementById('bs-gantt').dataset.markers >= 1", timeout=T)
    labels = page.eval_on_selector_all("#bs-gantt .annotation-text", "els => els.map(e => e.textContent)")
    assert any("→ sync" in t for t in labels), labels

    # -- a switch made through the API (not the page) shows up on the page too
    post(server.url, "/api/mode", {"mode": "async"})
    page.wait_for_selector("#bs-mode[data-mode='async']", timeout=T)
    page.wait_for_function(f"+document.getElementById('bs-scope').dataset.switches >= {switches + 2}", timeout=T)
    page.click("#bs-mode-sync")
    page.wait_for_selector("#bs-mode[data-mode='sync']", timeout=T)

    # -- a burst: progress, a results table, and the Gantt and charts grow with its steps
    page.get_by_role("tab", name="Load test").click()
    page.fill("#bs-n input", "12")
    page.fill("#bs-pmin input", "8")
    page.fill("#bs-pmax input", "48")
    page.fill("#bs-omin input", "24")
    page.fill("#bs-omax input", "64")
    before = scope(page, "steps")
    page.click("#bs-fire")
    page.wait_for_selector("#bs-burst-results", timeout=60_000)
    table = page.text_content("#bs-burst-results")
    for metric in ("TTFT", "TPOT", "ITL", "E2E", "output tokens/s", "requests/s"):
        assert metric in table, table
    assert "12/12" in page.text_content("#bs-burst-progress")
    # the header follows the engine's counters and, from the "requests" messages, the recent time to first token
    page.wait_for_function("document.getElementById('bs-st-ttft').textContent.endsWith(' ms')", timeout=T)
    assert page.text_content("#bs-st-kv").rstrip("%").replace(".", "").isdigit()
    assert page.text_content("#bs-st-queue").isdigit() and page.text_content("#bs-st-running").isdigit()
    page.wait_for_function(f"+document.getElementById('bs-scope').dataset.steps >= {before + 20}", timeout=T)
    assert int(page.get_attribute("#bs-gantt", "data-spans")) > 20
    # the Gantt has host lanes and the (host-measured) compute lane filled; the charts carry non-zero data
    names = json.loads(page.get_attribute("#bs-gantt", "data-lanes"))   # spans painted per row
    for lane in ("schedule", "fill", "launch", "update", "sync"):
        assert lane in names, names
    assert "compute (host)" in names or "compute" in names, names
    # (a chart out of sight is drawn when it scrolls into sight: bring each one there first)
    for chart in ("bs-c-tps", "bs-c-batch", "bs-c-kv", "bs-c-queue", "bs-c-busy"):
        page.locator(f"#{chart}").scroll_into_view_if_needed()
        peak = f"Math.max(0, ...(document.getElementById('{chart}').data || []).flatMap(t => t.y.filter(v => v !== null)))"
        page.wait_for_function(f"{peak} > 0", timeout=T)
        assert page.evaluate(peak) > 0, f"{chart} drew nothing"
        # no axis has Plotly measure its tick labels for overflow at every redraw (much of a picture's cost)
        measured = page.evaluate(f"""Object.entries(document.getElementById('{chart}').layout)
            .filter(([k, v]) => /^[xy]axis\\d*$/.test(k) && v.ticklabeloverflow !== 'allow').map(([k]) => k)""")
        assert measured == [], (chart, measured)
    # idle gaps before steps are drawn on their own lane, one trace per cause
    assert any(n.startswith("idle: ") for n in names), names
    # the lane labels checks outside the repository rely on
    labels = page.evaluate("document.getElementById('bs-gantt').layout.yaxis.ticktext")
    assert {"mode", "GPU · compute", "GPU idle"} <= set(labels), labels

    # -- the window: live it slides; paused it stays; a zoom on one chart applies to all and pauses
    x_end = "document.getElementById('bs-gantt').layout.xaxis.range[1]"
    first = page.evaluate(x_end)
    page.wait_for_function(f"{x_end} > {first}", timeout=T)
    page.click("#bs-pause")
    assert page.text_content("#bs-pause") == "Resume live"
    held = page.evaluate(x_end)
    time.sleep(1.0)
    assert page.evaluate(x_end) == held
    page.click("#bs-pause")
    page.wait_for_function(f"{x_end} > {held}", timeout=T)
    lo = page.evaluate("document.getElementById('bs-gantt').layout.xaxis.range[0]")
    page.locator("#bs-c-kv").scroll_into_view_if_needed()          # (drawn once in sight)
    page.wait_for_function("!!document.getElementById('bs-c-kv').layout", timeout=T)
    page.evaluate(f"Plotly.relayout('bs-c-kv', {{'xaxis.range': [{lo}, {lo} + 0.5]}})")
    page.wait_for_function(
        f"Math.abs(document.getElementById('bs-gantt').layout.xaxis.range[1] - ({lo} + 0.5)) < 1e-6", timeout=T)
    assert page.text_content("#bs-pause") == "Resume live"
    page.click("#bs-window button[data-span='10']")
    assert page.text_content("#bs-pause") == "Pause"

    # -- bad input is answered on the page, not with a hang
    page.fill("#bs-pmin input", "60")
    page.fill("#bs-pmax input", "10")
    page.click("#bs-fire")
    page.wait_for_selector("#bs-burst-progress .bs-err", timeout=T)
    assert "prompt" in page.text_content("#bs-burst-progress .bs-err").lower()
    page.fill("#bs-pmin input", "8")
    page.fill("#bs-pmax input", "16")

    # -- A/B of the same burst: sync then async, side by side with the speedup and busy % of each
    page.fill("#bs-n input", "4")
    page.fill("#bs-omin input", "16")
    page.fill("#bs-omax input", "24")
    page.click("#bs-ab")
    page.wait_for_selector("#bs-ab-speedup", timeout=120_000)
    ab = page.text_content("#bs-ab-results")
    assert "sync" in ab and "async" in ab and "busy" in ab, ab
    assert float(page.text_content("#bs-ab-speedup").rstrip("×")) > 0

    # -- a named recording
    page.fill("#bs-rec-name", "browser-run")
    page.click("#bs-rec")
    page.wait_for_selector("#bs-rec.recording", timeout=T)
    page.click("#bs-mode-async")
    page.wait_for_selector("#bs-mode[data-mode='async']", timeout=T)
    page.click("#bs-rec")
    page.wait_for_function("!document.querySelector('#bs-rec').classList.contains('recording')", timeout=T)
    page.wait_for_selector("#bs-rec-list option[value='browser-run']", state="attached", timeout=T)

    # -- download the timeline JSON and check it against the schema
    with page.expect_download(timeout=60_000) as dl:
        page.click("#bs-dl-json")
    path = tmp_path / "timeline.json"
    dl.value.save_as(path)
    doc = json.loads(path.read_text())
    assert doc["schema"] == SCHEMA_ID
    validate_timeline(doc)
    assert len(doc["steps"]) >= 20
    assert {"sync", "async"} <= {s["mode"] for s in doc["steps"]}
    assert any(c["to"] == "sync" for c in doc["mode_changes"])
    with page.expect_download(timeout=60_000) as dl:
        page.click("#bs-dl-trace")
    trace = json.loads(Path(dl.value.path()).read_text())
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])

    # -- load it back: the same charts show the file; back to live afterwards
    page.set_input_files("#bs-file", str(path))
    page.wait_for_selector("#bs-scope[data-source='replay']", timeout=T)
    page.wait_for_function(f"+document.getElementById('bs-scope').dataset.steps === {len(doc['steps'])}", timeout=T)
    assert "Replay: timeline.json" in page.text_content("#bs-replay-text")
    assert int(page.get_attribute("#bs-gantt", "data-spans")) > 20
    page.click("#bs-back-live")
    page.wait_for_selector("#bs-scope[data-source='live']", timeout=T)

    # -- a malformed timeline is refused with the server's reason
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "something/else", "steps": []}))
    page.set_input_files("#bs-file", str(bad))
    page.wait_for_selector("#bs-msg.bs-error", timeout=T)
    assert "replay rejected" in page.text_content("#bs-msg")
    assert page.get_attribute("#bs-scope", "data-source") == "live"

    page.screenshot(path=str(tmp_path / "live.png"), full_page=True)
    assert not w.errors, w.errors
    w.assert_local(server.port)
    w.close()


def synthetic_gpu_timeline() -> dict:
    """A GPU-shaped recording without a GPU: telemetry's synthetic engine (CUDA-like events on a virtual clock),
    sync, then async, then sync again, so the H2D/compute/D2H lanes and the idle gaps have something to show."""
    from batchscope.telemetry import Telemetry
    from synthetic import SyntheticEngine

    eng = SyntheticEngine(gpu=True, mode="sync", seed=1, host_scale=6)
    tel = Telemetry(eng, nvml_hz=5)
    try:
        eng.submit(n=16, prompt_tokens=64, max_new_tokens=60)
        eng.run(max_steps=25)
        eng.set_mode("async")
        eng.run(max_steps=25)
        eng.set_mode("sync")
        eng.run(max_steps=10)
        return tel.timeline()
    finally:
        tel.close()


def test_replay_only_server(browser, tmp_path):
    path = tmp_path / "gpu-timeline.json"
    doc = synthetic_gpu_timeline()
    path.write_text(json.dumps(doc))
    state = AppState.from_replay_file(path)
    assert state.engine is None
    srv = ServerThread(create_app(state)).start()
    w = Watched(browser, tmp_path)
    try:
        page = w.open(srv.url + "/")
        page.wait_for_selector("#bs-scope[data-source='replay']", timeout=T)
        page.wait_for_function(f"+document.getElementById('bs-scope').dataset.steps === {len(doc['steps'])}",
                               timeout=T)
        # live controls are off: no toggle, no recording, generation and load tests disabled
        assert page.get_attribute("#bs-mode", "data-mode") == "replay"
        assert page.query_selector("#bs-mode-sync") is None
        assert not page.is_visible("#bs-rec")
        assert "synthetic" in page.text_content("#bs-replay-summary")
        page.get_by_role("tab", name="Generate").click()
        assert page.is_disabled("#bs-generate")
        assert page.is_disabled("#bs-prompt textarea")
        # the GPU stream lanes, the idle gaps (highlighted and split by cause) and both switches are drawn
        names = json.loads(page.get_attribute("#bs-gantt", "data-lanes"))
        for lane in ("h2d", "compute", "d2h", "gap", "sync", "async"):
            assert lane in names, names
        assert any(n.startswith("idle: ") for n in names), names
        assert int(page.get_attribute("#bs-gantt", "data-markers")) == 2
        # and really painted: most of the compute lane's middle row is compute green
        green = page.evaluate("""() => {
            const c = document.getElementById('bs-gantt-canvas'), lanes = 10, compute = 7;
            const y = Math.round((compute + 0.5) * c.height / lanes);
            const d = c.getContext('2d').getImageData(0, y, c.width, 1).data;
            let n = 0;
            for (let i = 0; i < d.length; i += 4) if (d[i + 3] && d[i + 1] > d[i] + 60 && d[i + 1] > d[i + 2] + 60) n++;
            return n / c.width;
        }""")
        assert green > 0.5, green
        busy = page.evaluate("document.getElementById('bs-c-busy').data.find(t => t.name === 'busy (events) %').y")
        assert 0 < max(busy) <= 100
        page.screenshot(path=str(tmp_path / "replay.png"), full_page=True)
        assert not w.errors, w.errors
        w.assert_local(srv.port)
    finally:
        w.close()
        srv.stop()
