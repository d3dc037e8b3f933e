"""The live numbers a room reads first, in a real browser (Playwright driving Debian's Chromium, headless): they
agree with each other and with the recording, a late tab sees the session's history, the series end at the last
completed step and break over idle stretches, switch labels never overprint, and the presenter runs the whole
demo from the keyboard (a continuous load, an A/B and its verdict, the switch view, a replay played back).

The agreement test runs the embedded SmolLM2, whose steps take hundreds of ms on a small CPU: millisecond steps
(tiny-random) hid the header's bug, a busy % that read 0 whenever the step in flight was not reported yet.
"""
from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import tiny_app_server

pytestmark = pytest.mark.browser

sync_api = pytest.importorskip("playwright.sync_api")

from batchscope.app.loadtest.specs import Limits  # noqa: E402
from batchscope.app.server import ServerThread, create_app  # noqa: E402
from batchscope.app.server.state import AppState  # noqa: E402

LIMITS = Limits(max_prompt_tokens=512, max_new_tokens=512, max_burst_requests=64, max_concurrent_bursts=2,
                max_waiting_requests=256)
T = 90_000            # ms: generous for a busy laptop or CI box; every wait ends as soon as its condition holds
ROOT = Path(__file__).resolve().parents[2]


def api(url: str, path: str, body: dict | None = None, method: str | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data, {"Content-Type": "application/json"}, method=method)
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def open_page(browser, url: str, viewport=None):
    ctx = browser.new_context(viewport=viewport or {"width": 1600, "height": 1000})
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_selector("#bs-gantt .main-svg", timeout=T)
    return ctx, page, errors


def stop_loads(url: str) -> None:
    running = api(url, "/api/status").get("running_load")
    if running:
        api(url, f"/api/load/{running}/stop", {})


@pytest.fixture(scope="module")
def smollm2():
    with tiny_app_server(LIMITS, model="smollm2-135m") as srv:
        yield srv


@pytest.fixture(scope="module")
def server():
    with tiny_app_server(LIMITS) as srv:
        yield srv


def header(page) -> dict:
    return page.evaluate("""() => ({busy: document.getElementById('bs-st-busy').textContent,
        running: document.getElementById('bs-st-running').textContent,
        board: document.getElementById('bs-board').dataset.asyncBusy,
        steps: +document.getElementById('bs-board').dataset.asyncSteps})""")


def test_the_header_agrees_with_the_scoreboard_and_never_reads_zero_under_load(smollm2, browser):
    """SmolLM2 under a continuous load (steps of hundreds of ms): the header's busy % and the scoreboard's agree
    within 2 points at every sample, and the header never reads 0 while requests run; the busy chart's live
    edge agrees too (it ends at the last completed compute, not in the step in flight)."""
    api(smollm2.url, "/api/mode", {"mode": "async"})
    api(smollm2.url, "/api/load", {"kind": "concurrency", "concurrency": 6, "prompt_tokens": [16, 48],
                                   "max_new_tokens": [48, 96], "duration_s": 240})
    ctx, page, errors = open_page(browser, smollm2.url + "/")
    try:
        page.wait_for_function("+document.getElementById('bs-board').dataset.asyncSteps >= 20", timeout=120_000)
        samples = []
        for _ in range(16):
            h = header(page)
            samples.append(h)
            time.sleep(0.7)
        for h in samples:
            assert h["busy"].endswith("%") and h["busy"] != "0%", samples
            if int(h["running"]) > 0:
                assert abs(float(h["busy"].rstrip("%")) - float(h["board"])) <= 2.0, samples
        # the busy chart's newest point says what the header says (both: completed steps only; the chart's point
        # averages over a few steps, the header over the last second, hence the wider margin; the bug this
        # guards against dived to 40-60% at the edge). A chart out of sight is drawn once it scrolls in.
        page.locator("#bs-c-busy").scroll_into_view_if_needed()
        newest = """() => { const t = (document.getElementById('bs-c-busy').data || [])[0];
            return t ? t.y.filter(v => v !== null).slice(-1)[0] : undefined; }"""
        # (its first picture may come before the window holds enough steps for a point: wait for one)
        page.wait_for_function(f"({newest})() !== undefined", timeout=T)
        edge = page.evaluate(newest)
        now = header(page)
        assert abs(edge - float(now["busy"].rstrip("%"))) <= 10.0, (edge, now, samples[-1])
        assert not errors, errors
    finally:
        stop_loads(smollm2.url)
        ctx.close()


def test_a_late_tab_sees_the_sessions_history_and_its_switches(server, browser):
    for mode in ("sync", "async", "sync", "async"):
        api(server.url, "/api/mode", {"mode": mode})
        b = api(server.url, "/api/burst", {"num_requests": 8, "prompt_tokens": [8, 16], "max_new_tokens": [24, 32]})
        while api(server.url, f"/api/bursts/{b['burst_id']}")["state"] == "running":
            time.sleep(0.2)
    history = api(server.url, "/api/history?seconds=180")
    time.sleep(11)                          # older than the hello message's own 10 s
    ctx, page, errors = open_page(browser, server.url + "/")
    try:
        page.click("#bs-window button[data-span='all']")
        page.wait_for_function(f"+document.getElementById('bs-scope').dataset.steps >= {len(history['steps'])}",
                               timeout=T)
        switches = int(page.get_attribute("#bs-scope", "data-switches"))
        assert switches >= len(history["mode_changes"]) >= 4
        assert not errors, errors
    finally:
        ctx.close()


def test_idle_stretches_break_the_per_step_lines(server, browser):
    api(server.url, "/api/mode", {"mode": "async"})
    b = api(server.url, "/api/burst", {"num_requests": 6, "prompt_tokens": [8, 16], "max_new_tokens": [32, 48]})
    while api(server.url, f"/api/bursts/{b['burst_id']}")["state"] == "running":
        time.sleep(0.2)
    time.sleep(2.5)                         # an idle stretch longer than the break (1 s)
    b = api(server.url, "/api/burst", {"num_requests": 6, "prompt_tokens": [8, 16], "max_new_tokens": [32, 48]})
    while api(server.url, f"/api/bursts/{b['burst_id']}")["state"] == "running":
        time.sleep(0.2)
    ctx, page, errors = open_page(browser, server.url + "/")
    try:
        page.click("#bs-window button[data-span='30']")
        page.eval_on_selector("#bs-c-queue", "e => e.scrollIntoView()")     # charts out of sight are not drawn
        page.wait_for_function("""() => { const el = document.getElementById('bs-c-queue');
            return el && el.data && el.data[1].x.length > 10; }""", timeout=T)
        page.wait_for_function("""() => ['bs-c-kv', 'bs-c-batch'].every(id => { const el = document.getElementById(id);
            return el && el.data && el.data[0].x.length > 10; })""", timeout=T)
        lines = page.evaluate("""() => ['bs-c-queue', 'bs-c-kv', 'bs-c-batch'].map(id =>
            document.getElementById(id).data[0].x.filter(v => v === null).length)""")
        assert all(n >= 1 for n in lines), lines       # a break where no step ran
        # idle now: the busy line is measured up to the present, and reads 0 there
        page.eval_on_selector("#bs-c-busy", "e => e.scrollIntoView()")
        page.wait_for_function("""() => { const t = document.getElementById('bs-c-busy').data[0];
            return t.y.length && t.y[t.y.length - 1] === 0; }""", timeout=T)
        assert not errors, errors
    finally:
        ctx.close()


def many_switches_timeline(tmp_path):
    """The H200 demo recording with its loop switched every 12 steps (about 40 switches): labels that would
    overprint at any width."""
    doc = json.loads((ROOT / "assets/examples/h200-demo.timeline.json").read_text())
    changes, mode = [], None
    for i, rec in enumerate(doc["steps"]):
        want = "sync" if (i // 12) % 2 == 0 else "async"
        if mode is not None and want != mode:
            changes.append({"t_us": rec["compute_us"][0], "step": rec["step"], "from": mode, "to": want})
        rec["mode"] = mode = want
    doc["mode_changes"] = changes
    doc["summary"].pop("board", None)
    path = tmp_path / "switches.timeline.json"
    path.write_text(json.dumps(doc))
    return path


def test_switch_labels_never_overprint(browser, tmp_path):
    state = AppState.from_replay_file(many_switches_timeline(tmp_path))
    srv = ServerThread(create_app(state)).start()
    try:
        ctx, page, errors = open_page(browser, srv.url + "/")
        page.wait_for_function("document.getElementById('bs-board').dataset.scope === 'replay'", timeout=T)
        for span in ("all", "2", "5"):
            page.click(f"#bs-window button[data-span='{span}']")
            time.sleep(1.0)
            boxes = page.eval_on_selector_all("#bs-gantt .annotation", """els => els
                .filter(e => /switch|→/.test(e.textContent)).map(e => { const r = e.getBoundingClientRect();
                return [r.left, r.right, r.top, r.bottom, e.textContent]; })""")
            assert boxes, span
            boxes.sort()
            for a, b in zip(boxes, boxes[1:]):
                assert a[1] <= b[0] + 1 or a[3] <= b[2] or b[3] <= a[2], (span, a, b)
        labels = page.eval_on_selector_all("#bs-gantt .annotation-text", "els => els.map(e => e.textContent)")
        assert any("switches (steps" in x for x in labels), labels      # merged where crowded, and says so
        assert not errors, errors
        ctx.close()
    finally:
        srv.stop()


def test_the_presenter_runs_the_demo_from_the_keyboard(server, browser):
    """In presentation mode: L starts a continuous load and stops it, B runs an A/B and shows its verdict with
    its n, W zooms on the latest switch with every gap labelled, and S/A say why while the A/B holds the toggle."""
    api(server.url, "/api/mode", {"mode": "async"})
    ctx, page, errors = open_page(browser, server.url + "/?present=1", {"width": 1280, "height": 720})
    posts: list[str] = []
    page.on("request", lambda r: r.method == "POST" and posts.append(r.url))
    try:
        keys = page.text_content("#bs-present-keys")
        for k in ("S", "A", "L", "B", "W", "P"):
            assert k in keys, keys
        page.click("#bs-header .bs-brand")
        page.keyboard.press("l")
        page.wait_for_function("document.getElementById('bs-st-running').textContent !== '0'", timeout=T)
        assert api(server.url, "/api/status")["running_load"]
        time.sleep(1.5)
        page.keyboard.press("l")
        deadline = time.time() + 30
        while api(server.url, "/api/status")["running_load"] and time.time() < deadline:
            time.sleep(0.3)
        assert not api(server.url, "/api/status")["running_load"]

        page.keyboard.press("b")
        page.wait_for_selector("#bs-ab-panel:not([hidden])", timeout=T)
        page.wait_for_function("document.querySelectorAll('.bs-locked').length > 0", timeout=T)
        before = len(posts)
        page.keyboard.press("s")                     # locked: no request, a reason instead
        time.sleep(0.5)
        assert not any("/api/mode" in u for u in posts[before:]), posts[before:]
        assert "locked" in page.text_content("#bs-msg").lower()
        page.wait_for_selector("#bs-ab-panel[data-state='done']", timeout=120_000)
        panel = page.text_content("#bs-ab-panel")
        verdict = page.get_attribute("#bs-ab-panel", "data-verdict")
        # a CPU engine computes on the host: nothing overlaps, so the A/B names no winner (and says why)
        assert verdict in ("no winner here", "not enough steps"), verdict
        assert "×" in panel and "busy (host)" in panel and "GPU busy" not in panel     # a CPU: the host spans
        if verdict != "not enough steps":
            assert "n = " in panel, panel
        # the switches the A/B made say so on the Gantt
        labels = " ".join(page.eval_on_selector_all("#bs-gantt .annotation-text", "els => els.map(e => e.textContent)"))
        assert "A/B" in labels, labels

        page.keyboard.press("w")
        page.wait_for_function("document.querySelectorAll('#bs-gantt .annotation-text').length > 0", timeout=T)
        time.sleep(1.0)
        inview = int(page.get_attribute("#bs-scope", "data-inview"))
        assert 2 <= inview <= 12, inview
        page.keyboard.press("w")                     # back
        page.wait_for_function("+document.getElementById('bs-scope').dataset.inview > 12", timeout=T)
        assert not errors, errors
    finally:
        stop_loads(server.url)
        ctx.close()


def test_a_replay_plays_like_a_live_run(browser, tmp_path):
    state = AppState.from_replay_file(many_switches_timeline(tmp_path))
    srv = ServerThread(create_app(state)).start()
    try:
        ctx, page, errors = open_page(browser, srv.url + "/")
        page.wait_for_function("document.getElementById('bs-board').dataset.scope === 'replay'", timeout=T)
        page.click("#bs-window button[data-span='all']")
        page.click("#bs-header .bs-brand")
        page.keyboard.press(" ")
        page.wait_for_function("window.batchscopeStage.play.on", timeout=T)
        first = page.evaluate("window.batchscopeStage.play.t")
        time.sleep(1.5)
        second = page.evaluate("window.batchscopeStage.play.t")
        assert 0.8e6 <= second - first <= 3e6, (first, second)     # about real time
        page.select_option("#bs-play-speed", "0.25")
        time.sleep(1.0)
        third = page.evaluate("window.batchscopeStage.play.t")
        assert (third - second) < 0.6 * (second - first), (first, second, third)
        page.keyboard.press(" ")
        page.wait_for_function("!window.batchscopeStage.play.on", timeout=T)
        assert page.text_content("#bs-play").startswith("▶")
        assert not errors, errors
        ctx.close()
    finally:
        srv.stop()


def test_the_page_names_its_own_fields_in_errors(server, browser):
    ctx, page, errors = open_page(browser, server.url + "/")
    try:
        page.fill("#bs-prompt textarea", "hello")
        page.fill("#bs-max-new input", "0")
        page.click("#bs-generate")
        page.wait_for_selector("#bs-gen-info .bs-err, .bs-err", timeout=T)
        text = page.text_content(".bs-err")
        assert "max new tokens" in text and "at least 1" in text, text
        assert not errors, errors
    finally:
        ctx.close()
