"""Tensor parallelism on the page, in a real browser: the other ranks' GPU lanes on the Gantt, the all-reduce
estimate in the hover, one busy line per rank and one NVML line per GPU.

- A live server with `-tp 2` on the CPU (two processes over gloo) and the UI: after a few requests the Gantt
  has rank 1's compute lane, labelled with its rank, with ink on it; zoomed in, its compute bars end in the
  all-reduce stripe and the hover on them says the estimated all-reduce share. A TP=1 server has none of it.
- Replay: the shipped H200 recording given a second rank (its records, the engine's all-reduce figures, a
  second GPU's NVML samples), replayed by a replay-only server, draws rank 1's H2D / compute / D2H lanes,
  a busy line per rank and a util line per GPU; the same recording without them replays as before.
"""
from __future__ import annotations

import copy
import json
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

sync_api = pytest.importorskip("playwright.sync_api")

from helpers import post_json as post, serve_subprocess, tiny_app_server  # noqa: E402

from batchscope.app.loadtest.specs import Limits  # noqa: E402
from batchscope.app.server import ServerThread, create_app  # noqa: E402
from batchscope.app.server.state import AppState  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "benchmarks/results/2026-11-29-h200/demo.timeline.json"
T = 60_000                        # ms: every wait ends as soon as its condition holds
BASE_LANES = 10                   # mode, 5 host lanes, 3 GPU lanes, GPU idle (plot.js LANES)
LIMITS = Limits(max_prompt_tokens=256, max_new_tokens=256, max_burst_requests=32)
SHOT = Path("/tmp/tp_gantt.png")


# ---------------------------------------------------------------- servers and the page

def serve_with_ui(*args: str):
    """`batchscope serve --model tiny-random --device cpu --dtype float32 ARGS` with its UI, in its own process
    (a tensor-parallel engine starts processes of its own, one engine per process); yields its URL."""
    return serve_subprocess(*args, ui=True, start_s=240)




def generate_some(url: str, n: int = 6, tokens: int = 24):
    """n requests at once, so that steps batch several rows."""
    errors: list[BaseException] = []

    def one(i: int):
        try:
            post(url, "/api/generate", {"prompt": f"tensor parallel request {i}: tell me about batching",
                                        "max_new_tokens": tokens})
        except BaseException as exc:            # noqa: BLE001 (reported below)
            errors.append(exc)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


class Page:
    """A page with its errors watched: uncaught exceptions and console errors."""

    def __init__(self, browser, url: str, height: int = 1100):
        self.ctx = browser.new_context(viewport={"width": 1600, "height": height})
        self.page = self.ctx.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.goto(url)
        self.page.wait_for_selector("#bs-gantt .main-svg", timeout=T)

    def close(self):
        self.ctx.close()


def lanes(page) -> dict:
    return json.loads(page.get_attribute("#bs-gantt", "data-lanes") or "{}")


def ticks(page) -> list[str]:
    return page.evaluate("document.getElementById('bs-gantt').layout.yaxis.ticktext.slice()")


def tags(page) -> list[str]:
    return page.eval_on_selector_all("#bs-gantt .annotation-text", "els => els.map(e => e.textContent)")


def wait_quiet(page):
    page.wait_for_function("window.batchscope.perf.pictures > 0 && !window.batchscope.perf.drawing", timeout=T)


# How much of a lane's rows of the Gantt's canvas is ink (alpha summed over the lane, over its width).
LANE_INK_JS = """label => {
    const el = document.getElementById('bs-gantt'), c = document.getElementById('bs-gantt-canvas');
    const names = el.layout.yaxis.ticktext, i = names.indexOf(label);
    if (i < 0) return -1;
    const lane = c.height / names.length;
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let s = 0;
    for (let r = Math.floor(i * lane); r < Math.min(c.height, Math.ceil((i + 1) * lane)); r++)
        for (let x = 0; x < c.width; x++) s += d[(r * c.width + x) * 4 + 3];
    return s / 255 / c.width;
}"""


def lane_ink(page, label: str) -> float:
    return page.evaluate(LANE_INK_JS, label)


def zoom(page, a_s: float, b_s: float):
    """A zoom as a drag on a chart reports it (seconds); the Gantt follows."""
    page.evaluate(f"Plotly.relayout('bs-c-kv', {{'xaxis.range': [{a_s}, {b_s}]}})")
    page.wait_for_function(
        f"(r => Math.abs(r[0] - {a_s}) < 1e-9 && Math.abs(r[1] - {b_s}) < 1e-9)"
        "(document.getElementById('bs-gantt').layout.xaxis.range)", timeout=T)
    wait_quiet(page)


def hover_lane(page, label: str, t_us: float) -> str:
    """Moves the mouse onto lane `label` at time t_us and returns the hover box's text."""
    page.locator("#bs-gantt").scroll_into_view_if_needed()
    pos = page.evaluate("""([label, t]) => {
        const el = document.getElementById('bs-gantt'), c = document.getElementById('bs-gantt-canvas');
        const names = el.layout.yaxis.ticktext, i = names.indexOf(label), r = c.getBoundingClientRect();
        const [lo, hi] = el.layout.xaxis.range;
        return { x: r.left + (t / 1e6 - lo) / (hi - lo) * r.width, y: r.top + (i + 0.5) * r.height / names.length };
    }""", [label, t_us])
    page.mouse.move(pos["x"], pos["y"] - 3)
    page.mouse.move(pos["x"], pos["y"])
    page.wait_for_selector("#bs-gantt-hover", state="visible", timeout=T)
    return page.text_content("#bs-gantt-hover")


# ---------------------------------------------------------------- live

@pytest.fixture(scope="module")
def tp2():
    with serve_with_ui("-tp", "2") as url:
        yield url


def busy_lines(page, wanted: str) -> list[str]:
    """The busy chart's line names once it shows `wanted` (a chart out of sight is drawn when it scrolls in, so it
    is brought into sight first)."""
    page.locator("#bs-c-busy").scroll_into_view_if_needed()
    page.wait_for_function(f"(document.getElementById('bs-c-busy').data || []).some(t => t.name === {wanted!r})",
                           timeout=T)
    return page.evaluate("document.getElementById('bs-c-busy').data.map(t => t.name)")


def test_live_tp2_draws_rank_1_lanes(tp2, browser):
    w = Page(browser, tp2 + "/")
    page = w.page
    try:
        generate_some(tp2)
        page.wait_for_function("""(() => {
            const l = JSON.parse(document.getElementById('bs-gantt').dataset.lanes || '{}');
            return (l['r1:compute'] || 0) >= 5 && (l['compute (host)'] || 0) >= 5;
        })()""", timeout=T)
        wait_quiet(page)
        # rank 1's lane, labelled with its rank, below rank 0's ten; the ranks tagged with their devices
        labels = ticks(page)
        assert labels[:BASE_LANES] == ["mode", "host · schedule", "host · fill", "host · launch", "host · wait",
                                       "host · update", "GPU · H2D", "GPU · compute", "GPU · D2H", "GPU idle"], labels
        assert labels[BASE_LANES:] == ["rank 1 · compute"], labels      # on the CPU a rank has no copy streams
        assert page.get_attribute("#bs-gantt", "data-ranks") == "2"
        assert {"rank 0 · cpu", "rank 1 · cpu"} <= set(tags(page)), tags(page)
        # ... drawn: rank 1's records are in the page, and its lane holds ink
        assert int(page.get_attribute("#bs-scope", "data-ranksteps")) >= 5
        # (both ranks run the same forward: about as much ink as rank 0's host compute)
        ink0, ink1 = lane_ink(page, "GPU · compute"), lane_ink(page, "rank 1 · compute")
        assert ink0 > 0 and 0.3 * ink0 < ink1 < 3 * ink0, (ink0, ink1)
        # the Gantt grew by one lane instead of squeezing the ten
        assert page.evaluate("document.getElementById('bs-gantt').layout.height") > 318
        # the legend says what tensor parallel adds
        assert page.is_visible("#bs-legend-tp")
        assert "tensor parallel ×2" in page.text_content("#bs-legend-tp")

        # the busy chart: a busy line per rank, rank 1's from its own spans
        names = busy_lines(page, "rank 1 busy %")
        assert "rank 0 busy %" in names and "rank 1 busy %" in names, names
        peak = page.evaluate("Math.max(0, ...document.getElementById('bs-c-busy').data"
                             ".find(t => t.name === 'rank 1 busy %').y)")
        assert peak > 0, "rank 1's busy line is flat"

        # zoomed onto one of rank 1's steps: its compute bar ends in the all-reduce stripe, and the hover on it
        # is rank 1's part of the step with the estimated all-reduce share
        page.click("#bs-pause")
        rec = page.evaluate("""(() => {
            const a = window.batchscope.store.rankSteps[1];
            const r = a[Math.floor(a.length / 2)];
            return { step: r.step, cs: r._cs.slice() };
        })()""")
        a, b = rec["cs"]
        zoom(page, (a - 0.3 * (b - a)) / 1e6, (b + 0.3 * (b - a)) / 1e6)
        assert int(page.get_attribute("#bs-gantt", "data-stripes")) >= 1
        assert lanes(page).get("r1:allreduce", 0) >= 1, lanes(page)
        text = hover_lane(page, "rank 1 · compute", (a + b) / 2)
        assert f"rank 1 · cpu · step {rec['step']}" in text, text
        assert "all-reduce ≈" in text and "(measured at start-up)" in text, text
        # ... and on rank 0's compute lane, rank 0's step with the same estimate
        text0 = hover_lane(page, "GPU · compute", (a + b) / 2)
        assert "rank 1" not in text0 and "all-reduce ≈" in text0, text0

        # the picture: the requests' steps, all ranks
        first, end = page.evaluate("(s => [s[0]._s, s[s.length - 1]._e])(window.batchscope.store.steps)")
        zoom(page, (first - 0.05 * (end - first)) / 1e6, (end + 0.05 * (end - first)) / 1e6)
        page.mouse.move(5, 5)
        page.locator(".bs-gantt-wrap").screenshot(path=str(SHOT))
        page.locator("#bs-c-busy").screenshot(path="/tmp/tp_busy.png")
        assert not w.errors, w.errors
    finally:
        w.close()


def test_live_tp1_has_no_rank_lanes(browser):
    with tiny_app_server(LIMITS) as srv:
        w = Page(browser, srv.url + "/")
        page = w.page
        try:
            generate_some(srv.url, n=3, tokens=12)
            page.wait_for_function("(JSON.parse(document.getElementById('bs-gantt').dataset.lanes || '{}')"
                                   "['compute (host)'] || 0) >= 5", timeout=T)
            wait_quiet(page)
            assert len(ticks(page)) == BASE_LANES, ticks(page)
            assert not [k for k in lanes(page) if k.startswith("r") and ":" in k], lanes(page)
            assert page.get_attribute("#bs-gantt", "data-ranks") == "1"
            assert page.get_attribute("#bs-gantt", "data-stripes") == "0"
            assert page.evaluate("document.getElementById('bs-gantt').layout.height") == 318
            assert not [t for t in tags(page) if t.startswith("rank ")], tags(page)
            assert not page.is_visible("#bs-legend-tp")
            names = busy_lines(page, "busy (host) %")
            assert names == ["busy (host) %", "host CPU % (no NVML)"], names
            assert not w.errors, w.errors
        finally:
            w.close()


# ---------------------------------------------------------------- replay

def with_second_rank(doc: dict) -> dict:
    """The H200 recording as if run over two GPUs: rank 1's records (its spans a little after rank 0's), the
    engine's all-reduce figures, and each NVML tick sampled on both GPUs."""
    doc = copy.deepcopy(doc)
    info = doc["meta"].setdefault("info", {})
    info.update(tensor_parallel_size=2, allreduces_per_step=64,
                ranks=[{"rank": 0, "device": "cuda:0", "cuda_graphs": True},
                       {"rank": 1, "device": "cuda:1", "cuda_graphs": True}],
                allreduce_us={"1": 9.5, "8": 10.2, "32": 12.0, "64": 14.1, "128": 18.3, "256": 27.9})
    rank_steps = []
    for s in doc["steps"]:
        gpu = {k: [v[0] + 6.0, v[1] + 9.0] for k, v in (s.get("gpu") or {}).items() if v and v[0] is not None}
        if "compute" not in gpu:
            continue
        s["rank"] = 0
        rank_steps.append({"step": s["step"], "rank": 1, "mode": s["mode"], "gpu": gpu, "compute_us": gpu["compute"]})
    doc["rank_steps"] = rank_steps
    nvml = []
    for smp in doc["nvml"]:
        nvml.append(dict(smp, gpu=0, rank=0))
        other = {k: v for k, v in smp.items() if k not in ("cpu_pct", "proc_cpu_pct")}
        other.update(gpu=1, rank=1, gpu_util=max(0.0, (smp.get("gpu_util") or 0) - 3.0))
        nvml.append(other)
    doc["nvml"] = nvml
    return doc


@pytest.fixture(scope="module")
def tp_replay(tmp_path_factory):
    path = tmp_path_factory.mktemp("tp") / "tp2.timeline.json"
    doc = with_second_rank(json.loads(DEMO.read_text()))
    path.write_text(json.dumps(doc))
    srv = ServerThread(create_app(AppState.from_replay_file(path))).start()
    yield srv, doc
    srv.stop()


def test_replay_with_rank_steps_draws_rank_1_lanes(tp_replay, browser):
    srv, doc = tp_replay
    w = Page(browser, srv.url + "/")
    page = w.page
    try:
        page.wait_for_selector("#bs-scope[data-source='replay']", timeout=T)
        page.wait_for_function(f"+document.getElementById('bs-scope').dataset.ranksteps === {len(doc['rank_steps'])}",
                               timeout=T)
        wait_quiet(page)
        labels = ticks(page)
        assert labels[BASE_LANES:] == ["GPU1 · H2D", "GPU1 · compute", "GPU1 · D2H"], labels
        assert {"rank 0 · cuda:0", "rank 1 · cuda:1"} <= set(tags(page)), tags(page)
        got = lanes(page)
        for lane in ("r1:h2d", "r1:compute", "r1:d2h"):
            assert got.get(lane, 0) >= len(doc["rank_steps"]) - 5, got
        # rank 1's compute is as busy as rank 0's here (the same spans, moved by a few µs): as much ink
        ink0, ink1 = lane_ink(page, "GPU · compute"), lane_ink(page, "GPU1 · compute")
        assert ink1 > 0.5 and abs(ink1 - ink0) < 0.05 * ink0, (ink0, ink1)
        assert lane_ink(page, "GPU1 · H2D") > 0
        assert "tensor parallel ×2" in page.text_content("#bs-replay-text")
        # the busy chart: a line per rank, a line per GPU
        names = busy_lines(page, "rank 1 busy %")
        assert {"rank 0 busy %", "rank 1 busy %", "GPU0 util", "GPU1 util"} <= set(names), names
        assert "NVML util" not in names, names      # the per-GPU samples are not one zig-zag line
        assert "GPU0 SM clock MHz" in names and "GPU1 SM clock MHz" not in names, names   # one clock line
        # zoomed in to a few steps: stripes, and the hover on rank 1 says the all-reduce share
        s = doc["steps"][len(doc["steps"]) // 2]
        a, b = s["gpu"]["compute"]
        zoom(page, (a - 2 * (b - a)) / 1e6, (b + 2 * (b - a)) / 1e6)
        assert int(page.get_attribute("#bs-gantt", "data-stripes")) >= 2
        text = hover_lane(page, "GPU1 · compute", (a + b) / 2 + 6)
        assert f"rank 1 · cuda:1 · step {s['step']}" in text and "all-reduce ≈" in text, text
        rows = (s["prefill_tokens"] + s["decode_tokens"]) or s["num_requests"]
        measured = sorted(int(k) for k in doc["meta"]["info"]["allreduce_us"])
        k = next((m for m in measured if m >= rows), None)
        one = doc["meta"]["info"]["allreduce_us"][str(k)] if k else 27.9 * rows / 256
        assert f"all-reduce ≈ {64 * one / 1000:.3f} ms (measured at start-up)" in text, text
        page.mouse.move(5, 5)
        page.locator(".bs-gantt-wrap").screenshot(path="/tmp/tp_gantt_replay.png")
        assert not w.errors, w.errors
    finally:
        w.close()


def test_old_timeline_replays_as_before(tp_replay, browser):
    """The page of a TP recording, given the same recording without the tensor-parallel parts: ten lanes."""
    srv, _ = tp_replay
    w = Page(browser, srv.url + "/")
    page = w.page
    try:
        page.wait_for_function("+document.getElementById('bs-gantt').dataset.ranks === 2", timeout=T)
        n = page.evaluate("window.batchscope.perf.pictures")
        page.evaluate("doc => window.batchscope.showReplay(doc, 'plain')", json.loads(DEMO.read_text()))
        page.wait_for_function(f"window.batchscope.perf.pictures > {n} && !window.batchscope.perf.drawing", timeout=T)
        assert page.get_attribute("#bs-gantt", "data-ranks") == "1"
        assert len(ticks(page)) == BASE_LANES
        assert page.evaluate("document.getElementById('bs-gantt').layout.height") == 318
        assert not [k for k in lanes(page) if k.startswith("r1:")]
        names = page.evaluate("document.getElementById('bs-c-busy').data.map(t => t.name)")
        assert names == ["busy (events) %", "NVML util", "SM clock MHz"], names
        assert not w.errors, w.errors
    finally:
        w.close()
