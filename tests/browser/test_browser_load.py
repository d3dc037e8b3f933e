"""The Load test tab and the Generate tab in a real browser (Playwright driving Debian's Chromium, headless),
against the real server on a tiny random model on the CPU.

A presenter's story: start a continuous load, switch sync/async under it, stop it; fire a burst and see the button
busy; run an A/B and find the toggle locked with the reason, the progress counted per half and each ratio marked
better or worse. And the form's old traps: a hidden field that blocks a burst, an error that outlives the next
attempt, a stopped generation that still says "running".
"""
from __future__ import annotations

import time

import pytest

from helpers import get_json as get, post_json as post, tiny_app_server

pytestmark = pytest.mark.browser

sync_api = pytest.importorskip("playwright.sync_api")

from batchscope.app.loadtest.specs import Limits  # noqa: E402

LIMITS = Limits(max_prompt_tokens=512, max_new_tokens=512, max_burst_requests=64, max_concurrent_bursts=2,
                max_waiting_requests=256, max_load_duration_s=120)
T = 90_000            # ms: generous for a busy laptop or CI box; every wait ends as soon as its condition holds


@pytest.fixture(scope="module")
def server():
    with tiny_app_server(LIMITS) as srv:
        yield srv


@pytest.fixture
def page(server, browser):
    ctx = browser.new_context(viewport={"width": 1600, "height": 1000})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(server.url + "/")
    pg.wait_for_selector("#bs-conn[data-state='live']", timeout=T)     # the page's modules run
    pg.wait_for_selector("#bs-generate", timeout=T)                    # and Gradio has drawn the controls
    yield pg
    assert not errors, errors
    ctx.close()
    # nothing a test started may hold the engine for the next one
    for _ in range(100):
        if get(server.url, "/api/status")["loads_running"] == 0 and get(server.url, "/api/status")["running"] == 0:
            break
        time.sleep(0.1)




def load_tab(page):
    page.get_by_role("tab", name="Load test").click()
    page.wait_for_selector("#bs-load-start", timeout=T)


def lengths(page, pmin, pmax, omin, omax):
    for sel, v in (("#bs-pmin", pmin), ("#bs-pmax", pmax), ("#bs-omin", omin), ("#bs-omax", omax)):
        page.fill(f"{sel} input", str(v))


def text(page, sel: str) -> str:
    return (page.text_content(sel) or "").strip()


# ---------------------------------------------------------------------------------------------- the form

def test_a_hidden_field_does_not_block_a_burst_and_old_errors_go(page):
    load_tab(page)
    lengths(page, 8, 16, 8, 16)
    page.fill("#bs-n input", "6")
    page.get_by_label("Poisson").check()
    page.fill("#bs-rate input", "-3")
    page.click("#bs-fire")
    page.wait_for_selector("#bs-burst-progress .bs-err", timeout=T)
    assert "rate" in text(page, "#bs-burst-progress .bs-err")
    # all at once: the rate field is hidden, still holds -3, and no longer counts
    page.get_by_label("all at once").check()
    page.wait_for_selector("#bs-rate", state="hidden", timeout=T)
    page.click("#bs-fire")
    # the old error goes at once, on the attempt, not when the new result arrives
    page.wait_for_selector("#bs-burst-progress .bs-err", state="detached", timeout=5000)
    page.wait_for_selector("#bs-burst-results", timeout=T)
    assert "6/6" in text(page, "#bs-burst-progress")
    assert page.query_selector("#bs-burst-progress .bs-err") is None

    # the same for the continuous load's hidden rate
    page.get_by_label("steady rate").check()
    page.fill("#bs-load-rate input", "-3")
    page.click("#bs-load-start")
    page.wait_for_selector("#bs-load-status .bs-err", timeout=T)
    assert "rate" in text(page, "#bs-load-status .bs-err")
    page.get_by_label("fixed concurrency").check()
    page.fill("#bs-load-conc input", "2")
    page.click("#bs-load-start")
    page.wait_for_selector("#bs-load-status .bs-err", state="detached", timeout=5000)
    page.wait_for_selector("#bs-load-info[data-state='running']", timeout=T)
    page.click("#bs-load-stop")
    page.wait_for_selector("#bs-load-info[data-state='done']", timeout=T)


def test_each_burst_attempt_replaces_the_last_error(page):
    load_tab(page)
    lengths(page, 60, 10, 8, 16)
    page.click("#bs-fire")
    page.wait_for_selector("#bs-burst-progress .bs-err", timeout=T)
    assert "prompt" in text(page, "#bs-burst-progress .bs-err").lower()
    lengths(page, 8, 16, 20, 10)
    page.click("#bs-fire")
    # (the refusal names the panel's field, as it is labelled there)
    page.wait_for_function("document.querySelector('#bs-burst-progress .bs-err')?.textContent.includes('output tokens')",
                           timeout=T)
    assert "prompt" not in text(page, "#bs-burst-progress .bs-err").lower()
    assert len(page.query_selector_all("#bs-burst-progress .bs-err")) == 1


def test_fire_burst_is_busy_while_its_burst_runs(page):
    load_tab(page)
    lengths(page, 16, 32, 200, 300)
    page.fill("#bs-n input", "24")
    assert not page.is_disabled("#bs-fire") and text(page, "#bs-fire") == "Fire burst"
    page.click("#bs-fire")
    page.wait_for_function("document.querySelector('#bs-fire').disabled", timeout=5000)
    assert "running" in text(page, "#bs-fire")
    assert "burst" in text(page, "#bs-burst-progress")
    page.wait_for_selector("#bs-burst-results", timeout=60_000)
    page.wait_for_function("!document.querySelector('#bs-fire').disabled", timeout=T)
    assert text(page, "#bs-fire") == "Fire burst"
    assert "24/24" in text(page, "#bs-burst-progress")


def test_generate_says_stopped_after_stop_and_clears_its_errors(page, server):
    page.get_by_role("tab", name="Generate").click()
    # an error first: it must not survive the next attempt
    page.fill("#bs-prompt textarea", "Tell me a long story")
    page.fill("#bs-max-new input", "99999")
    page.click("#bs-generate")
    page.wait_for_selector("#bs-gen-info .bs-err", timeout=T)
    assert "over the limit" in text(page, "#bs-gen-info")
    # a long answer, slowed by a load beside it, stopped half way
    lid = post(server.url, "/api/load", {"concurrency": 24, "prompt_tokens": [100, 200],
                                         "max_new_tokens": [300, 400]})["load_id"]
    try:
        page.fill("#bs-max-new input", "512")
        page.get_by_label("ignore EOS", exact=True).check()
        page.click("#bs-generate")
        page.wait_for_selector("#bs-gen-info .bs-err", state="detached", timeout=5000)
        page.wait_for_function("document.querySelector('#bs-gen-info').textContent.includes('running')", timeout=T)
        page.click("#bs-stop")
        page.wait_for_function("document.querySelector('#bs-gen-info').textContent.includes('stopped after')",
                               timeout=T)
        time.sleep(1.0)                 # nothing comes back to say "running" again
        info = text(page, "#bs-gen-info")
        assert "stopped after" in info and "running" not in info, info
    finally:
        post(server.url, f"/api/load/{lid}/stop", {})
    # and a later run reads normally
    page.fill("#bs-max-new input", "8")
    page.click("#bs-generate")
    page.wait_for_function("document.querySelector('#bs-gen-info').textContent.includes('done in')", timeout=T)


# -------------------------------------------------------------------------------------------- continuous load

def test_a_continuous_load_runs_across_switches_until_stopped(page, server):
    load_tab(page)
    # defaults long enough to switch at leisure: until stopped, bounded by the server's limit
    assert page.input_value("#bs-load-duration input") == str(int(LIMITS.max_load_duration_s))
    assert page.is_checked("#bs-load-kind input[value='concurrency']")
    assert page.is_disabled("#bs-load-stop")
    lengths(page, 8, 24, 16, 48)
    page.fill("#bs-load-conc input", "6")
    page.click("#bs-load-start")
    page.wait_for_selector("#bs-load-info[data-state='running']", timeout=T)
    assert page.is_disabled("#bs-load-start") and not page.is_disabled("#bs-load-stop")
    assert "6 requests kept in flight" in text(page, "#bs-load-info")
    start_mode = get(server.url, "/api/status")["mode"]
    for mode in ("sync", "async", "sync"):
        page.click(f"#bs-mode-{mode}")
        page.wait_for_selector(f"#bs-mode[data-mode='{mode}']", timeout=T)
        time.sleep(0.6)
    page.wait_for_function("document.querySelector('#bs-load-info').textContent.includes('→ sync at')", timeout=T)
    info = text(page, "#bs-load-info")
    assert "→ async at" in info and "running" in info
    page.click("#bs-load-stop")
    page.wait_for_selector("#bs-load-info[data-state='done']", timeout=T)
    assert "stopped on request" in text(page, "#bs-load-info")
    assert page.query_selector("#bs-load-results") is not None       # the whole run's latencies
    page.wait_for_function("!document.querySelector('#bs-load-start').disabled", timeout=T)
    assert page.is_disabled("#bs-load-stop")
    post(server.url, "/api/mode", {"mode": start_mode})


# ------------------------------------------------------------------------------------------------------- A/B

def test_an_ab_locks_the_toggle_counts_per_half_and_marks_better_and_worse(page, server):
    load_tab(page)
    lengths(page, 16, 16, 160, 160)
    page.fill("#bs-n input", "12")
    mode = get(server.url, "/api/status")["mode"]
    page.click("#bs-ab")
    # the toggle is locked, and says why
    page.wait_for_selector("#bs-mode-sync.bs-locked", timeout=T)
    for k in ("sync", "async"):
        assert page.is_disabled(f"#bs-mode-{k}")
        assert "A/B" in page.get_attribute(f"#bs-mode-{k}", "title")
    assert "A/B" in page.get_attribute(".bs-toggle", "title")
    assert page.is_disabled("#bs-ab") and "running" in text(page, "#bs-ab")
    # progress counts the requests of the half that runs, out of the burst's 12
    page.wait_for_function("document.querySelector('#bs-ab-progress').textContent.includes('half')", timeout=T)
    progress = text(page, "#bs-ab-progress")
    assert "/12 requests" in progress and "/24" not in progress, progress
    page.wait_for_selector("#bs-ab-speedup", timeout=120_000)
    page.wait_for_selector("#bs-mode-sync:not(.bs-locked)", timeout=T)
    assert not page.is_disabled("#bs-mode-async") and "A/B" not in (page.get_attribute("#bs-mode-async", "title") or "")
    assert get(server.url, "/api/status")["mode"] == mode
    assert "12/12" in text(page, "#bs-ab-progress")
    # which way is better is said per group of metrics, and each ratio is worded, coloured and given an arrow
    groups = page.eval_on_selector_all("#bs-ab-results tr.bs-ab-group", "els => els.map(e => e.textContent)")
    assert any("lower is better" in g for g in groups) and any("higher is better" in g for g in groups)
    verdicts = page.eval_on_selector_all(
        "#bs-ab-results td.bs-verdict", "els => els.map(e => [e.className, e.textContent])")
    assert len(verdicts) >= 10
    for cls, words in verdicts:
        if "bs-better" in cls:
            assert "better" in words and ("▲" in words or "▼" in words)
        elif "bs-worse" in cls:
            assert "worse" in words and ("▲" in words or "▼" in words)
    colours = {page.eval_on_selector(sel, "e => getComputedStyle(e).color")
               for sel in ("#bs-ab-table .bs-ab-legend .bs-better", "#bs-ab-table .bs-ab-legend .bs-worse")}
    assert len(colours) == 2                        # better and worse look different
    # a throughput row: higher async tokens/s reads better, lower reads worse
    row = page.eval_on_selector_all("#bs-ab-results tr", """rows => rows
        .map(r => [...r.children].map(c => c.textContent)).find(cells => cells[0].startsWith('output tokens/s'))""")
    sync_tps, async_tps = (float(x.replace(",", "")) for x in row[1:3])
    if async_tps > sync_tps * 1.02:
        assert "better" in row[3]
    elif async_tps < sync_tps * 0.98:
        assert "worse" in row[3]
    assert page.query_selector("#bs-ab-invalid") is None
    assert not page.is_disabled("#bs-ab")


# ----------------------------------------------------------------------------------- from a tail request to its steps

FOCUS = """id => { const g = document.querySelector('#bs-gantt');
  return g.dataset.focus === id && +g.dataset.focusspans >= 3 && +g.dataset.focussteps >= 1; }"""


def gantt_range(page) -> list:
    return page.evaluate("document.querySelector('#bs-gantt').layout.xaxis.range")


def jump_to_slowest(page, server, replay: bool) -> dict:
    """Click the slowest request's row; the Gantt must then show its lifetime with its spans and steps marked."""
    page.wait_for_function("+document.querySelector('#bs-slowest')?.dataset.rows > 0", timeout=T)
    rid = page.get_attribute("#bs-slowest tbody tr[data-id]", "data-id")
    page.click(f"#bs-slowest tbody tr[data-id='{rid}']")
    try:
        page.wait_for_function(FOCUS, arg=rid, timeout=T)
    except Exception:
        raise AssertionError(page.evaluate("({...document.querySelector('#bs-gantt').dataset, "
                                           "msg: document.querySelector('#bs-msg').textContent})"))
    waits = get(server.url, f"/api/requests/{rid}/waits" + ("?replay=true" if replay else ""))
    a, b = (t / 1e6 for t in waits["lifetime_us"])
    lo, hi = gantt_range(page)
    # the window is the request's lifetime with a little room either side, not the live 10 s
    assert lo <= a and hi >= b and hi - lo <= (b - a) * 1.3 + 2e-3, (lo, hi, a, b)
    assert [s["phase"] for s in waits["spans"]][:2] == ["queue", "prefill"]
    assert "waited: queue" in text(page, "#bs-focus")
    return waits


def test_a_slowest_row_jumps_the_gantt_to_its_lifetime_live_and_in_replay(page, server):
    load_tab(page)
    lengths(page, 8, 16, 8, 16)
    page.fill("#bs-n input", "8")
    page.get_by_label("all at once").check()
    page.click("#bs-fire")
    page.wait_for_selector("#bs-burst-results", timeout=T)
    page.click("#bs-slowest-refresh")
    waits = jump_to_slowest(page, server, replay=False)
    # the hover over one of its steps says what it did there and what it waited for
    step = waits["steps"][-1]
    box = page.query_selector("#bs-gantt").bounding_box()
    lo, hi = gantt_range(page)
    margin_l = page.evaluate("document.querySelector('#bs-gantt')._fullLayout.margin.l")
    width = box["width"] - margin_l - 12
    x = box["x"] + margin_l + width * ((step["compute_us"][0] / 1e6) - lo) / (hi - lo) + 1
    page.mouse.move(x, box["y"] + box["height"] / 2)
    page.wait_for_function("document.querySelector('#bs-gantt-hover')?.style.display === 'block'", timeout=T)
    assert waits["id"] in text(page, "#bs-gantt-hover")

    # in replay: the same burst, loaded as a replay, read from the replay
    page.evaluate("""async () => {
        const tl = await (await fetch('/api/timeline.json')).json();
        await fetch('/api/replay', { method: 'POST', body: JSON.stringify(tl) });
        window.batchscope.showReplay(tl, 'the burst'); }""")
    page.wait_for_selector("#bs-replay-bar:not([hidden])", timeout=T)
    page.wait_for_function("!document.querySelector('#bs-gantt').dataset.focus", timeout=T)   # the live pick went
    replayed = jump_to_slowest(page, server, replay=True)
    assert replayed["id"] and replayed["lifetime_us"][1] > replayed["lifetime_us"][0]
    page.click("#bs-focus-clear")
    page.wait_for_function("document.querySelector('#bs-gantt').dataset.focusspans === '0'", timeout=T)
    page.click("#bs-back-live")
