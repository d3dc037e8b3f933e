"""The Sweep tab in a real browser (Playwright driving Debian's Chromium, headless), against the real server on a
tiny random model on the CPU.

A user's story: run a tiny sweep from the tab and find sync and async overlaid on the latency curves, the engine
chart and a CDF of one point (then the same as histograms); overlay a GuideLLM report; see bad input refused with
its reason; stop a sweep half way; draw the CDF of a burst fired from the Load test tab, and click a point of it
to see that request's lifetime on the Gantt.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from helpers import get_json as get, post_json as post, tiny_app_server

pytestmark = pytest.mark.browser

sync_api = pytest.importorskip("playwright.sync_api")

from batchscope.app.loadtest.specs import Limits  # noqa: E402

LIMITS = Limits(max_prompt_tokens=256, max_new_tokens=256, max_load_concurrency=8, max_load_duration_s=60)
FIXTURES = Path(__file__).parents[1] / "fixtures"
T = 60_000            # ms: generous for a slow CI box; every wait ends as soon as its condition holds


@pytest.fixture(scope="module")
def server():
    with tiny_app_server(LIMITS) as srv:
        yield srv


@pytest.fixture
def page(server, browser):
    ctx = browser.new_context(viewport={"width": 1600, "height": 1000})
    pg = ctx.new_page()
    errors: list[str] = []
    outside: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("request", lambda r: None if r.url.startswith((server.url, "data:", "blob:")) else outside.append(r.url))
    pg.goto(server.url + "/")
    pg.wait_for_selector("#bs-conn[data-state='live']", timeout=T)
    pg.get_by_role("tab", name="Sweep").click()
    pg.wait_for_selector("#bs-sweep-start", timeout=T)
    yield pg
    assert not errors, errors
    assert not outside, outside                     # the charts need nothing from the network
    ctx.close()
    for _ in range(200):                            # nothing a test started may hold the engine for the next one
        st = get(server.url, "/api/status")
        if not st["bursts"]["sweep_running"] and st["running"] == 0:
            break
        time.sleep(0.1)




def fields(page, **values):
    for name, v in values.items():
        sel = f"#bs-sweep-{name.replace('_', '-')}"
        page.fill(f"{sel} input, {sel} textarea", str(v))


def traces(page, plot: str) -> list[dict]:
    """The Plotly traces the page drew in a chart of the tab: name, type and how many points."""
    return page.evaluate(f"""() => {{
        const el = document.querySelector('#{plot} .js-plotly-plot');
        return el ? (el.data || []).map(t => ({{name: t.name, type: t.type || 'scatter',
                                               n: (t.x || []).filter(v => v !== null).length}})) : [];
    }}""")


def wait_traces(page, plot: str, cond, timeout=T):
    deadline = time.monotonic() + timeout / 1000
    while True:
        got = traces(page, plot)
        if cond(got):
            return got
        assert time.monotonic() < deadline, f"{plot}: {got}"
        time.sleep(0.2)


def choose(page, label_part: str):
    page.click("#bs-sweep-choice input")
    page.get_by_role("option").filter(has_text=label_part).first.click()


TINY = {"points": 1, "duration": 0.3, "prompt": 8, "output": 8, "slo_ttft": 5000, "slo_itl": 1000}


def test_a_tiny_sweep_draws_both_modes_overlaid_and_a_cdf(page, server):
    fields(page, **TINY)
    page.click("#bs-sweep-start")
    page.wait_for_selector("#bs-sweep-info[data-state='done']", timeout=120_000)
    assert "6/6 points" in page.text_content("#bs-sweep-info")
    # latency against throughput: sync and async, p50 and p99, each through its three points
    curves = wait_traces(page, "bs-sweep-curves", lambda ts: any(t["name"] == "async p99" for t in ts))
    for name in ("sync p50", "sync p99", "async p50", "async p99"):
        assert [t["n"] for t in curves if t["name"] == name] == [3, 3, 3], (name, curves)
    assert any(t["name"] == "SLO" for t in curves)
    engine = traces(page, "bs-sweep-engine")
    assert {t["name"] for t in engine} >= {"sync", "async"}
    # drawn by the page's own Plotly, in the colours the stylesheet uses: Gradio's copy of Plotly is never loaded
    drawn = page.evaluate("""() => {
        const gd = document.querySelector('#bs-sweep-curves .js-plotly-plot'), css = getComputedStyle(document.body);
        return {sync: gd.data.find(t => t.name === 'sync p50').line.color, css: css.getPropertyValue('--bs-sync').trim(),
                async: gd.data.find(t => t.name === 'async p50').line.color,
                cssAsync: css.getPropertyValue('--bs-async').trim(), log: gd.layout.yaxis.type,
                scripts: performance.getEntriesByType('resource').map(r => r.name).filter(n => /plotly/i.test(n))}; }""")
    assert drawn["sync"] == drawn["css"] and drawn["async"] == drawn["cssAsync"], drawn
    assert drawn["log"] == "log"
    assert [n.rsplit("/", 1)[-1] for n in drawn["scripts"]] == ["plotly.min.js"], drawn["scripts"]
    # the summary, with the downloads
    table = page.text_content("#bs-sweep-table")
    assert "meets the SLOs" in table and "throughput run" in table
    sid = get(server.url, "/api/sweeps")["sweeps"][-1]["id"]
    assert page.get_attribute("#bs-sweep-json", "href") == f"/api/sweep/{sid}.json?download=1"
    assert page.get_attribute("#bs-sweep-csv", "href") == f"/api/sweep/{sid}.csv?download=1"
    # a CDF of the last point, sync and async overlaid, per latency
    cdf = wait_traces(page, "bs-sweep-dist", lambda ts: len(ts) >= 8)
    assert {t["name"].split(" · ")[0] for t in cdf} == {"sync", "async"}
    assert all(t["n"] > 0 and t["type"] == "scatter" for t in cdf)
    choose(page, "0: synchronous")
    wait_traces(page, "bs-sweep-dist", lambda ts: ts and all("synchronous" in t["name"] for t in ts))
    page.get_by_label("histogram").check()
    wait_traces(page, "bs-sweep-dist", lambda ts: ts and all(t["type"] == "histogram" for t in ts))
    # a GuideLLM report overlaid on the curves
    page.set_input_files("#bs-sweep-upload input[type=file]", str(FIXTURES / "guidellm-0.8-sweep.json"))
    page.wait_for_selector("#bs-sweep-imported", timeout=T)
    assert "GuideLLM 0.8.1" in page.text_content("#bs-sweep-imported")
    wait_traces(page, "bs-sweep-curves", lambda ts: any(t["name"].startswith("GuideLLM 0.8.1") for t in ts))


def test_bad_input_is_refused_and_a_sweep_stops_half_way(page, server):
    fields(page, **{**TINY, "points": 0})
    page.click("#bs-sweep-start")
    page.wait_for_selector("#bs-sweep-progress .bs-err", timeout=T)
    assert "points" in page.text_content("#bs-sweep-progress .bs-err")
    fields(page, points=1, slo_ttft=0)
    page.click("#bs-sweep-start")
    page.wait_for_function("document.querySelector('#bs-sweep-progress .bs-err')?.textContent.includes('ttft')",
                           timeout=T)
    assert not get(server.url, "/api/mode")["locked"]
    # a long one: Start is busy, Stop is ready, and the mode toggle is locked and says why
    fields(page, slo_ttft=500, duration=30, output=120)
    page.click("#bs-sweep-start")
    page.wait_for_selector("#bs-sweep-info[data-state='running']", timeout=T)
    page.wait_for_function("!document.querySelector('#bs-sweep-stop').disabled", timeout=T)
    assert page.is_disabled("#bs-sweep-start")
    page.wait_for_function("document.querySelector('#bs-mode-sync.bs-locked')?.title.includes('sweep')", timeout=T)
    # stopped half way: what it ran stays
    page.wait_for_function("document.querySelector('#bs-sweep-info').textContent.includes('in flight')", timeout=T)
    page.click("#bs-sweep-stop")
    page.wait_for_selector("#bs-sweep-info[data-stop='stopped']", timeout=T)
    assert "stopped on request" in page.text_content("#bs-sweep-info")
    page.wait_for_function("!document.querySelector('#bs-sweep-start').disabled", timeout=T)
    assert not get(server.url, "/api/mode")["locked"]
    page.wait_for_selector("#bs-mode-sync:not(.bs-locked)", timeout=T)


def burst_done(server, tries: int = 600) -> str:
    """A burst of 6 short requests, fired through the API and waited for: its id."""
    bid = post(server.url, "/api/burst", {"num_requests": 6, "prompt_tokens": 8, "max_new_tokens": 12})["burst_id"]
    for _ in range(tries):
        if get(server.url, f"/api/bursts/{bid}")["state"] != "running":
            break
        time.sleep(0.1)
    return bid


def test_the_cdf_of_a_burst_from_the_load_test_tab(page, server):
    bid = burst_done(server)
    page.click("#bs-sweep-refresh")
    choose(page, f"burst {bid}")
    cdf = wait_traces(page, "bs-sweep-dist", lambda ts: len(ts) == 4)
    assert all(bid in t["name"] and t["n"] > 0 for t in cdf)
    assert [t["n"] for t in cdf][0] == 6            # one TTFT per request


# ------------------------------------------------------------------------ from a point of a CDF to its request's steps

FOCUSED = """id => { const g = document.querySelector('#bs-gantt');
  return g.dataset.focus === id && +g.dataset.focusspans >= 3 && +g.dataset.focussteps >= 1; }"""


def cdf_point(page, yaxis: str, i: int) -> dict:
    """Point i of the CDF on `yaxis` (y4: E2E): its value, its request id and where it is on the screen."""
    page.evaluate("document.querySelector('#bs-sweep-dist .js-plotly-plot').scrollIntoView({block: 'end'})")
    return page.evaluate("""([yaxis, i]) => {
        const gd = document.querySelector('#bs-sweep-dist .js-plotly-plot');
        const t = gd._fullData.find(t => t.yaxis === yaxis);
        const xa = gd._fullLayout['xaxis' + t.xaxis.slice(1)], ya = gd._fullLayout['yaxis' + t.yaxis.slice(1)];
        const k = i < 0 ? t.x.length + i : i, box = gd.getBoundingClientRect();
        return {x: t.x[k], id: t.customdata[k], n: t.x.length,
                px: box.left + xa._offset + xa.l2p(t.x[k]), py: box.top + ya._offset + ya.l2p(t.y[k])};
    }""", [yaxis, i])


def focused_on(page, server, rid: str):
    try:
        page.wait_for_function(FOCUSED, arg=rid, timeout=T)
    except Exception:
        raise AssertionError(page.evaluate("({...document.querySelector('#bs-gantt').dataset, "
                                           "msg: document.querySelector('#bs-msg').textContent})"))
    a, b = (t / 1e6 for t in get(server.url, f"/api/requests/{rid}/waits")["lifetime_us"])
    lo, hi = page.evaluate("document.querySelector('#bs-gantt').layout.xaxis.range")
    # the window is the request's lifetime with a little room either side, not the live 10 s
    assert lo <= a and hi >= b and hi - lo <= (b - a) * 1.3 + 2e-3, (lo, hi, a, b)


def test_a_click_on_a_cdf_point_jumps_the_gantt_to_its_request(page, server):
    bid = burst_done(server)
    page.click("#bs-sweep-refresh")
    choose(page, f"burst {bid}")
    wait_traces(page, "bs-sweep-dist", lambda ts: len(ts) == 4 and all(bid in t["name"] for t in ts))
    page.wait_for_selector("#bs-sweep-dist .js-plotly-plot[data-bs-clickable='1']", state="attached", timeout=T)
    # the second slowest E2E, hovered: the hover names its request and offers the click; clicked: the Gantt
    # shows that request's lifetime with its spans and steps marked
    pt = cdf_point(page, "y4", -2)
    assert pt["n"] == 6 and pt["id"]
    page.mouse.move(pt["px"], pt["py"])
    page.wait_for_function("""id => [...document.querySelectorAll('#bs-sweep-dist .hoverlayer .hovertext')]
        .some(h => h.textContent.includes(id) && h.textContent.includes("click: show this request's steps"))""",
                           arg=pt["id"], timeout=T)
    page.mouse.click(pt["px"], pt["py"])
    focused_on(page, server, pt["id"])
    assert pt["id"] in page.text_content("#bs-focus")
    # a gap of the ITL CDF leads to its own request (through Plotly's own click event, as a click sends it)
    gap = cdf_point(page, "y2", 0)
    assert gap["id"] and gap["n"] > 0
    page.evaluate("""([yaxis, id]) => { const gd = document.querySelector('#bs-sweep-dist .js-plotly-plot');
        gd.emit('plotly_click', {points: [{customdata: id, data: gd._fullData.find(t => t.yaxis === yaxis)}]}); }""",
                  ["y2", gap["id"]])
    focused_on(page, server, gap["id"])
    # a request whose steps the live ring no longer holds: the page says so, and the Gantt stays where it was
    page.evaluate("""() => document.querySelector('#bs-sweep-dist .js-plotly-plot')
        .emit('plotly_click', {points: [{customdata: 'req-long-gone'}]})""")
    page.wait_for_function("document.querySelector('#bs-msg').textContent.includes('no longer in the live timeline')",
                           timeout=T)
    assert page.get_attribute("#bs-gantt", "data-focus") == gap["id"]
    page.click("#bs-focus-clear")


RANGES = """() => Object.fromEntries([...document.querySelectorAll('#bs-scope-block .js-plotly-plot')]
    .filter(el => el.id && el.layout && el.layout.xaxis && el.layout.xaxis.range)
    .map(el => [el.id, el.layout.xaxis.range.map(v => +(+v).toFixed(3))]))"""


def one_window(page) -> dict:
    """Each live chart's x range once they all agree (redraw.js: one window for the Gantt and every chart)."""
    deadline = time.monotonic() + 10
    while True:
        ranges = page.evaluate(RANGES)
        if "bs-gantt" in ranges and len({tuple(r) for r in ranges.values()}) == 1:
            return ranges
        assert time.monotonic() < deadline, f"the charts do not share the Gantt's window: {ranges}"
        time.sleep(0.1)


def test_after_a_sweep_every_chart_shows_the_gantts_window(page, server):
    """The sweep's results push the live charts out of sight while it runs; back in sight (the Sweep tab left, then
    scrolled down to the last chart) each shows the Gantt's window, not the one it had when the sweep began. The
    hard case: a live window that has since emptied (a 2-s window, the engine idle after the sweep), which the
    page only draws again when asked."""
    fields(page, **{**TINY, "duration": 1})
    page.click("#bs-sweep-start")
    page.wait_for_selector("#bs-sweep-info[data-state='done']", timeout=120_000)
    # (clicked from script: a click by the mouse would scroll the charts back into sight)
    page.evaluate("document.querySelector('#bs-window button[data-span=\"2\"]').click()")
    time.sleep(3.5)
    page.get_by_role("tab", name="Generate").click()
    page.wait_for_selector("#bs-sweep-wide", state="hidden", timeout=T)
    ranges = one_window(page)
    assert {"bs-gantt", "bs-c-busy"} <= set(ranges), ranges
    last = page.evaluate("(() => { const c = [...document.querySelectorAll('#bs-scope-block .bs-chart')]; "
                         "return c.length ? c[c.length - 1].id : null; })()")
    if last:
        page.locator(f"#{last}").scroll_into_view_if_needed()
    one_window(page)
