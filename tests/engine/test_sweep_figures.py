"""The Sweep tab's figures and HTML without a browser: curves with knees, SLO lines and where each mode leaves
the SLOs; CDFs whose hover reads the percentile; the panel's fields as a SweepSpec."""
from pathlib import Path

import pytest
from pydantic import ValidationError

from batchscope.app.loadtest.sweep.curves import curve_summary
from batchscope.app.ui.sweep_figures import (CLICK_HINT, MODE_COLORS, curves_figure, distribution_figure,
                                             engine_figure, series_of, without_ids)
from batchscope.app.ui.sweep_html import import_html, sweep_progress_html, sweep_summary_html
from batchscope.app.ui.sweep_tab import sweep_spec


def point(i, kind, rate, rps, ttft, attain):
    lat = {"p50": ttft, "p90": 1.5 * ttft, "p99": 2 * ttft, "mean": ttft, "n": 10}
    return {"index": i, "mode": "sync", "kind": kind, "offered_rate": rate, "concurrency": None, "complete": True,
            "requests_per_s": rps, "output_tokens_per_s": 10 * rps, "ttft_ms": lat, "itl_ms": lat, "tpot_ms": lat,
            "e2e_ms": lat, "slo_attainment": attain, "goodput_rps": rps * attain, "busy_pct": 50.0 + i,
            "ms_per_step": 5.0 + i}


def status(state="done"):
    pts = [point(0, "synchronous", None, 1.0, 10, 1.0), point(1, "throughput", None, 4.2, 600, 0.2),
           point(2, "constant", 2.0, 2.0, 11, 1.0), point(3, "constant", 3.0, 3.0, 12, 0.995),
           point(4, "constant", 4.2, 4.0, 15, 0.9)]
    modes = {m: {"points": pts, "summary": curve_summary(pts, 0.99)} for m in ("sync", "async")}
    return {"id": "sweep-x", "state": state, "stop_reason": None, "error": None, "points_done": 10,
            "points_total": 10, "current": None, "elapsed_s": 12.0, "modes": modes,
            "slo": {"ttft_ms": 500, "itl_ms": 50, "e2e_ms": None, "target": 0.99}}


def names(fig):
    return [t.name for t in fig.data]


def test_the_curves_overlay_both_modes_with_knees_slos_and_where_each_leaves_them():
    st = status()
    fig = curves_figure(series_of(st), st["slo"])
    for n in ("sync p50", "sync p99", "async p50", "async p99", "sync knee", "SLO"):
        assert n in names(fig)
    p50 = next(t for t in fig.data if t.name == "sync p50")
    # in the order of the load offered: synchronous, rising rates, throughput last
    assert list(p50.x) == [1.0, 2.0, 3.0, 4.0, 4.2] and list(p50.y) == [10, 11, 12, 15, 600]
    assert p50.line.color == MODE_COLORS["sync"]
    assert "%{y:,.1f} ms" in p50.hovertemplate and "SLO attainment" in p50.hovertemplate
    slo = [t for t in fig.data if t.name == "SLO"]
    assert sorted({t.y[0] for t in slo}) == [50, 500]          # TTFT and ITL; no E2E SLO was set
    assert any(n.startswith("sync leaves the SLOs at 4.00") for n in names(fig))
    assert fig.layout.yaxis.type == "log"
    tokens = curves_figure(series_of(st), st["slo"], "output_tokens_per_s")
    assert list(next(t for t in tokens.data if t.name == "sync p50").x)[0] == 10.0


def test_a_foreign_report_is_one_more_series_and_empty_figures_say_so():
    st = status()
    rep = {"modes": {"GuideLLM 0.8.1 · smollm2": {"points": [point(0, "synchronous", None, 1.5, 20, 1.0)]}}}
    series = series_of(st, [rep])
    assert [s["name"] for s in series] == ["sync", "async", "GuideLLM 0.8.1 · smollm2"]
    fig = curves_figure(series, st["slo"])
    assert "GuideLLM 0.8.1 · smollm2 p50" in names(fig)
    eng = engine_figure(series, 0.99)
    guide = [t for t in eng.data if t.name.startswith("GuideLLM")]
    assert len(guide) == 1 and guide[0].yaxis == "y3"           # attainment only: no engine telemetry there
    for empty in (curves_figure([], None), engine_figure([], None), distribution_figure([])):
        assert empty.layout.annotations[-1].text.startswith("no ")


def test_cdfs_read_percentiles_and_histograms_share_of_values():
    vals = {"ttft_ms": [30.0, 10.0, 20.0, 40.0], "itl_ms": [1.0, 2.0], "tpot_ms": [], "e2e_ms": [5.0]}
    dists = [{"name": "sync · 1", "color": "#ea580c", "values": vals},
             {"name": "async · 1", "color": "#2563eb", "values": vals}]
    fig = distribution_figure(dists)
    ttft = fig.data[0]
    assert list(ttft.x) == [10.0, 20.0, 30.0, 40.0] and list(ttft.y) == [25.0, 50.0, 75.0, 100.0]
    assert "p%{y:.1f} = %{x:,.2f} ms" in ttft.hovertemplate
    assert len(fig.data) == 2 * 3                               # no TPOT values: nothing drawn for it
    hist = distribution_figure(dists, "hist")
    assert {t.type for t in hist.data} == {"histogram"} and hist.data[0].histnorm == "percent"


def test_each_cdf_point_carries_its_requests_engine_id():
    # a sweep point's values: per-request lists share request_id, each gap has its own request's id
    point = {"ttft_ms": [30.0, None, 10.0], "tpot_ms": [2.0, 1.0, 3.0], "e2e_ms": [50.0, 5.0, 40.0],
             "request_id": ["req-1", "req-2", "req-3"], "itl_ms": [4.0, 1.0, 2.0],
             "itl_request_id": ["req-3", "req-1", "req-1"]}
    # a continuous load's: one id list per latency (each sampled on its own)
    load = {"ttft_ms": [7.0, 6.0], "ttft_request_id": ["req-8", "req-9"], "itl_ms": [], "tpot_ms": [],
            "e2e_ms": [9.0], "e2e_request_id": ["req-9"]}
    fig = distribution_figure([{"name": "sync · 1", "color": "#ea580c", "values": point},
                               {"name": "load", "color": "#2563eb", "values": load}])
    by = {(t.name, t.hovertemplate.split("<br>")[0].split()[-1]): t for t in fig.data}
    ttft = by[("sync · 1", "TTFT")]
    assert list(ttft.x) == [10.0, 30.0] and list(ttft.customdata) == ["req-3", "req-1"]   # sorted with its values
    assert list(by[("sync · 1", "E2E")].customdata) == ["req-2", "req-3", "req-1"]
    itl = by[("sync · 1", "ITL")]
    assert list(itl.x) == [1.0, 2.0, 4.0] and list(itl.customdata) == ["req-1", "req-1", "req-3"]
    assert list(by[("load", "TTFT")].customdata) == ["req-9", "req-8"]
    assert list(by[("load", "E2E")].customdata) == ["req-9"]
    assert all(CLICK_HINT in t.hovertemplate and "%{customdata}" in t.hovertemplate for t in fig.data)
    assert CLICK_HINT == "click: show this request's steps"
    # values without ids (another server's report): no ids, and no promise of a click
    plain = distribution_figure([{"name": "g", "color": "#059669", "values": without_ids(point)}])
    assert all(t.customdata is None and CLICK_HINT not in t.hovertemplate for t in plain.data)
    assert set(without_ids(point)) == {"ttft_ms", "tpot_ms", "e2e_ms", "itl_ms"}


def test_the_summary_says_where_each_mode_meets_and_leaves_the_slos():
    html = sweep_summary_html(status())
    assert "meets the SLOs (≥ 99%) up to" in html and "3.00 req/s" in html and "leaves them at" in html
    assert 'href="/api/sweep/sweep-x.json?download=1"' in html and "sweep-x.csv" in html
    assert "TTFT ≤ 500 ms, ITL ≤ 50 ms" in html
    assert 'data-state="done"' in sweep_progress_html(status())
    running = {**status("running"), "points_done": 3, "current": {
        "mode": "async", "index": 2, "kind": "constant", "offered_rate": 2.5, "elapsed_s": 1.2, "sent": 4,
        "finished": 3, "in_flight": 1, "draining": False}}
    text = sweep_progress_html(running)
    assert "async" in text and "2.50 req/s" in text and "3/10 points" in text and "width:30.0%" in text
    assert "failed" in sweep_progress_html({**status("error"), "error": "boom"})
    assert "overlaid" in import_html({"format": "GuideLLM 0.8.1 report", "modes": {"g": {"points": [1, 2]}},
                                      "notes": ["n"]})


def test_the_panel_fields_are_the_api_spec():
    spec = sweep_spec(["sync", "async"], 2, 0.5, 8, 16, 500, 50, "", 0.99)
    assert spec.points == 2 and spec.duration_s == 0.5 and spec.prompt_tokens == (8, 8)
    assert spec.slo.e2e_ms is None and spec.slo.ttft_ms == 500
    assert sweep_spec(["async"], 2, 0.5, 8, 16, 500, 50, " 800 ", 0.99).slo.e2e_ms == 800
    for bad, field in (((["sync"], 0, 1, 8, 8, 500, 50, "", 0.99), "points"),
                       (([], 1, 1, 8, 8, 500, 50, "", 0.99), "modes"),
                       ((["sync"], 1, 1, 8, 8, 0, 50, "", 0.99), "ttft_ms"),
                       ((["sync"], 1, 1, 8, 8, 500, 50, "0", 0.99), "e2e_ms")):
        with pytest.raises(ValidationError, match=field):
            sweep_spec(*bad)


def test_the_committed_h200_sweep_draws_and_says_where_each_mode_leaves_the_slos():
    """benchmarks/sweep_figure.py (the README's picture) reads the committed file with the tab's own figures."""
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("sweep_figure", root / "benchmarks" / "sweep_figure.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    doc = mod.read_sweep(root / "benchmarks/results/2026-12-02-h200-sweep/sweep_rates.json.gz")
    text = mod.page(doc, "H200", "requests_per_s")
    assert "sync: meets the SLOs up to 22 req/s offered" in text and "leaves them at 28 req/s offered" in text
    assert "async: meets the SLOs up to 28 req/s offered" in text and "leaves them at 34 req/s offered" in text
    assert text.count("class=\"plotly-graph-div\"") == 2          # the curves and the engine chart
    with pytest.raises(SystemExit, match="not a batchscope.sweep/1"):
        mod.read_sweep(root / "tests/fixtures/vllm-serve-4qps.json")
