"""The page's layout on the screens people have (Playwright driving Debian's Chromium, headless).

A newcomer's story: on a 1280x720 to 1920x1080 laptop the first screen shows the no-GPU notice readable beside or
under the scoreboard (its picker and button on screen), a line saying what to do first, and the Gantt's top above
the fold at 1366x768; nothing reaches past the window's right edge, before or after the engine has run. A
presenter's: with a load and then an A/B on it, presentation mode keeps everything inside the screen, the A/B's
result in place of the notice; the view holds on the A/B's span; and a resize (F11, a projector) leaves the Gantt's
lanes on their labels and above the legend.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers import get_json, post_json, tiny_app_server, until

pytestmark = pytest.mark.browser

pytest.importorskip("playwright.sync_api")

from batchscope.app.loadtest.specs import Limits  # noqa: E402
from batchscope.app.server import ServerThread, create_app  # noqa: E402
from batchscope.app.server.state import AppState  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "assets/examples/h200-demo.timeline.json"
LIMITS = Limits(max_prompt_tokens=512, max_new_tokens=512, max_burst_requests=64, max_concurrent_bursts=2,
                max_waiting_requests=256)
T = 90_000
SCREENS = [(1280, 720), (1366, 768), (1920, 1080)]
LAPTOP = (1366, 768)

# Every visible element of the header and the stage whose box, as far as its scrolling or clipping ancestors let
# it be seen, reaches past the window's right edge (or, with `bottom`, past its bottom edge).
PAST_EDGE_JS = """(bottom) => {
  const vw = innerWidth, vh = innerHeight, out = [];
  for (const el of document.querySelectorAll('#bs-header *, #bs-stage *')) {
    const r = el.getBoundingClientRect();
    if (!r.width || !r.height || getComputedStyle(el).visibility === 'hidden') continue;
    let right = r.right, bot = r.bottom, left = r.left, top = r.top;
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      const cs = getComputedStyle(p);
      if (cs.overflowX !== 'visible' || cs.overflowY !== 'visible') {
        const q = p.getBoundingClientRect();
        right = Math.min(right, q.right); bot = Math.min(bot, q.bottom);
        left = Math.max(left, q.left); top = Math.max(top, q.top);
      }
    }
    if (right <= left || bot <= top) continue;             // scrolled or clipped out of sight
    if (right > vw + 1 || (bottom && bot > vh + 1))
      out.push((el.id || el.className.baseVal || el.className || el.tagName) + ' ' + Math.round(right) + ',' + Math.round(bot));
  }
  return out.slice(0, 10);
}"""

BOX_JS = """(sel) => { const e = document.querySelector(sel); if (!e) return null; const r = e.getBoundingClientRect();
  return {left: r.left, top: r.top, right: r.right, bottom: r.bottom, width: r.width, height: r.height}; }"""


@pytest.fixture(scope="module")
def live():
    with tiny_app_server(LIMITS) as srv:
        yield srv


@pytest.fixture(scope="module")
def replay():
    srv = ServerThread(create_app(AppState.from_replay_file(EXAMPLE))).start()
    yield srv
    srv.stop()


def open_page(browser, url: str, size: tuple[int, int]):
    ctx = browser.new_context(viewport={"width": size[0], "height": size[1]})
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_selector("#bs-gantt .main-svg", timeout=T)
    page.wait_for_selector("#bs-board:not(:empty)", timeout=T)
    return ctx, page, errors


def box(page, sel: str) -> dict:
    return page.evaluate(BOX_JS, sel)


def check_first_screen(page, size: tuple[int, int]):
    """What the first screen must hold at this size, with or without data."""
    assert page.evaluate("document.documentElement.scrollWidth") <= size[0]
    assert page.evaluate(PAST_EDGE_JS, False) == []
    notice = box(page, "#bs-nogpu")
    assert notice["width"] >= 290, notice                   # readable: lines of words, not a word per line
    for sel in ("#bs-examples", "#bs-example"):
        b = box(page, sel)
        assert 0 <= b["left"] and b["right"] <= size[0], (sel, b)
    board = box(page, "#bs-board")
    assert board["height"] <= 200, board                    # only as tall as its rows
    if size == LAPTOP:
        assert box(page, "#bs-gantt")["top"] < size[1] - 60  # the Gantt's top lanes above the fold


@pytest.mark.parametrize("size", SCREENS + [(3840, 2160)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_first_screen_before_any_step(live, browser, size):
    ctx, page, errors = open_page(browser, live.url + "/", size)
    try:
        assert get_json(live.url, "/api/status")["steps"] == 0, "this test wants an engine that has not run yet"
        check_first_screen(page, size)
        first = page.text_content("#bs-first")
        assert page.is_visible("#bs-first") and "L" in first and "recording" in first
        assert not errors, errors
    finally:
        ctx.close()


@pytest.mark.parametrize("size", SCREENS, ids=lambda s: f"{s[0]}x{s[1]}")
def test_first_screen_with_data(live, browser, size):
    b = post_json(live.url, "/api/burst", {"num_requests": 8, "prompt_tokens": [8, 16], "max_new_tokens": [24, 32]})
    until(lambda: get_json(live.url, f"/api/bursts/{b['burst_id']}")["state"] != "running")
    ctx, page, errors = open_page(browser, live.url + "/", size)
    try:
        page.wait_for_selector("#bs-first", state="hidden", timeout=T)   # the engine has run: no "start here"
        check_first_screen(page, size)
        assert not errors, errors
    finally:
        ctx.close()


def test_sweep_results_take_the_wide_column(live, browser):
    ctx, page, errors = open_page(browser, live.url + "/", LAPTOP)
    try:
        assert not page.is_visible("#bs-sweep-curves")      # the live charts own the column until the tab opens
        page.get_by_role("tab", name="Sweep").click()
        page.wait_for_selector("#bs-sweep-curves", state="visible", timeout=T)
        side, curves = box(page, "#bs-side"), box(page, "#bs-sweep-curves")
        assert curves["left"] > side["right"] and curves["width"] > 600, (side, curves)
        assert page.is_visible("#bs-sweep-start")           # the fields stay in the side panel
        # the page draws the (empty) charts once their column shows, at its width, saying what to do
        page.wait_for_selector("#bs-sweep-curves .js-plotly-plot .main-svg", timeout=T)
        drawn = page.evaluate("""() => { const gd = document.querySelector('#bs-sweep-curves .js-plotly-plot');
            return {width: gd._fullLayout.width, empty: gd.layout.meta.empty}; }""")
        assert drawn["width"] > 600 and drawn["empty"].startswith("no sweep yet"), drawn
        page.get_by_role("tab", name="Generate").click()
        page.wait_for_selector("#bs-sweep-curves", state="hidden", timeout=T)
        assert not errors, errors
    finally:
        ctx.close()


# Pairs of the Gantt's labels (switches, the title line above the lanes) whose boxes overlap.
OVERPRINT_JS = """() => { const boxes = [...document.querySelectorAll('#bs-gantt .annotation-text')]
    .map(e => [e.textContent, e.getBoundingClientRect()]).filter(([, r]) => r.width);
  const out = [];
  for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
    const [a, r] = boxes[i], [b, q] = boxes[j];
    if (r.left < q.right - 1 && q.left < r.right - 1 && r.top < q.bottom - 1 && q.top < r.bottom - 1) out.push([a, b]);
  }
  return out; }"""


def stop_load(url: str):
    running = get_json(url, "/api/status").get("running_load")
    if running:
        post_json(url, f"/api/load/{running}/stop", {})
    until(lambda: not get_json(url, "/api/status").get("running_load"), timeout=60)


def test_presentation_fits_with_a_load_and_an_ab(live, browser):
    ctx, page, errors = open_page(browser, live.url + "/?present=1", (1280, 720))
    try:
        page.keyboard.press("l")
        until(lambda: get_json(live.url, "/api/status").get("running_load"), timeout=30)
        page.wait_for_timeout(4000)
        for size in ((1280, 720), (1920, 1080)):
            page.set_viewport_size({"width": size[0], "height": size[1]})
            page.wait_for_timeout(1500)
            assert page.evaluate(PAST_EDGE_JS, True) == [], size
        stop_load(live.url)
        page.set_viewport_size({"width": 1280, "height": 720})
        page.keyboard.press("b")
        page.wait_for_selector("#bs-ab-panel:not([hidden])", timeout=T)
        progress = page.text_content("#bs-ab-panel")
        page.wait_for_selector("#bs-ab-panel[data-state='done']", timeout=120_000)
        panel = page.text_content("#bs-ab-panel")
        each = int(panel.split("A/B · ")[1].split(" requests each half")[0])
        assert "requests" not in progress or f"/ {each} requests" in progress or "/ … requests" in progress, progress
        assert "GPU busy" not in panel and "busy (host)" in panel          # a CPU: no GPU to be busy
        assert not page.is_visible("#bs-nogpu")                            # the result in the notice's place
        # the switches the A/B made are labelled on the Gantt, no label over another
        page.wait_for_timeout(1500)
        assert page.evaluate(OVERPRINT_JS) == []
        # the view holds on the A/B: paused there, not sliding on to an empty live window
        page.wait_for_timeout(1500)
        assert page.text_content("#bs-pause").strip() == "Resume live"
        for size in ((1280, 720), (1920, 1080)):
            page.set_viewport_size({"width": size[0], "height": size[1]})
            page.wait_for_timeout(1500)
            assert page.evaluate(PAST_EDGE_JS, True) == [], size
        assert not errors, errors
    finally:
        stop_load(live.url)
        ctx.close()


GANTT_GEOMETRY_JS = """() => { const g = document.getElementById('bs-gantt');
  const r = e => { const b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; };
  return {svg: r(g.querySelector('.main-svg')), legend: r(document.querySelector('.bs-legend')),
          plot: r(g.querySelector('.nsewdrag')), canvas: r(document.getElementById('bs-gantt-canvas'))}; }"""


@pytest.mark.parametrize("present", [False, True], ids=["page", "presenting"])
def test_gantt_follows_a_resize(replay, browser, present):
    ctx, page, errors = open_page(browser, replay.url + ("/?present=1" if present else "/"), (1280, 720))
    try:
        page.keyboard.press("w")                            # the switch: a zoomed, frozen window
        page.wait_for_timeout(2000)
        for size in ((1920, 1080), (1280, 720), (1366, 768)):
            page.set_viewport_size({"width": size[0], "height": size[1]})
            page.wait_for_timeout(2500)
            geo = page.evaluate(GANTT_GEOMETRY_JS)
            assert geo["svg"][3] <= geo["legend"][1] + 1, (size, geo)       # no lane over the legend
            # the ink's canvas on Plotly's plot area, so every bar sits on its lane label
            assert geo["canvas"] == pytest.approx(geo["plot"], abs=1.5), (size, geo)
        assert not errors, errors
    finally:
        ctx.close()


# The x range of the Gantt and of every chart drawn, in seconds, and whether the chart has a point inside it.
RANGES_JS = """() => Object.fromEntries(['bs-gantt', 'bs-c-busy', 'bs-c-tps', 'bs-c-batch', 'bs-c-kv', 'bs-c-queue', 'bs-c-step']
  .map(id => document.getElementById(id)).filter(el => el && el.layout && el.layout.xaxis).map(el => {
    const [lo, hi] = el.layout.xaxis.range;
    const inside = (el.data || []).some(t => (t.x || []).some(x => typeof x === 'number' && x >= lo && x <= hi));
    return [el.id, {range: [lo, hi], inside}]; }))"""


def pick_request(page, rid: str):
    page.click(f"#bs-slowest tbody tr[data-id='{rid}']")
    page.wait_for_function("id => document.querySelector('#bs-gantt').dataset.focus === id", arg=rid, timeout=T)
    page.wait_for_timeout(2500)                             # the picture is drawn in slices


def test_a_jump_leaves_every_chart_on_one_window_and_the_gantt_in_sight(live, browser):
    for seed in (1, 2):                                     # requests at two different times
        b = post_json(live.url, "/api/burst", {"num_requests": 6, "prompt_tokens": [8, 16],
                                               "max_new_tokens": [24, 32], "seed": seed})
        until(lambda: get_json(live.url, f"/api/bursts/{b['burst_id']}")["state"] != "running")
        if seed == 1:
            import time
            time.sleep(1.5)
    ctx, page, errors = open_page(browser, live.url + "/", (1366, 768))
    try:
        page.wait_for_function("+document.querySelector('#bs-slowest')?.dataset.rows > 1", timeout=T)
        ids = page.eval_on_selector_all("#bs-slowest tbody tr[data-id]", "rows => rows.map(r => r.dataset.id)")
        starts = {}
        for rid in ids:
            waits = get_json(live.url, f"/api/requests/{rid}/waits")
            starts[rid] = waits["lifetime_us"][0]
        early, late = min(ids, key=starts.get), max(ids, key=starts.get)
        assert starts[late] > starts[early]
        page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
        pick_request(page, late)
        # the Gantt's top lanes below the sticky header, not under it
        assert box(page, "#bs-gantt")["top"] >= box(page, "#bs-header")["bottom"] - 1
        page.set_viewport_size({"width": 1366, "height": 2400})         # every chart in sight, so every one drawn
        for rid in (early, late, early):                    # a jump right, then left, from a frozen window
            pick_request(page, rid)
            ranges = page.evaluate(RANGES_JS)
            gantt = ranges.pop("bs-gantt")["range"]
            assert len(ranges) == 6, ranges
            for chart, r in ranges.items():
                assert r["range"] == pytest.approx(gantt, abs=1e-3), (rid, chart, r, gantt)
                assert r["inside"], (rid, chart, r)          # drawn for this window, not only its axis moved
        assert not errors, errors
    finally:
        ctx.close()
