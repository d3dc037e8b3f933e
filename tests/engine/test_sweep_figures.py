"""The Sweep tab's HTML without a browser: the summary, the progress, what each chart is asked to draw, the panel's
fields as a SweepSpec; and the committed H200 sweep drawn by benchmarks/sweep_figure.py. (The figures the page
draws are checked in tests/unit/test_sweep_figures_js.py.)"""
from pathlib import Path

import pytest
from pydantic import ValidationError

from batchscope.app.loadtest.sweep.curves import curve_summary
from batchscope.app.ui.sweep_html import chart_html, import_html, sweep_progress_html, sweep_summary_html
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


def test_each_chart_says_what_to_draw_in_its_attributes():
    assert chart_html("curves", sweep="sweep-x", imports=["imp-1", "imp-2"], x="requests_per_s", points=4) == (
        '<div class="bs-sweep-fig" data-fig="curves" data-sweep="sweep-x" data-imports="imp-1,imp-2" '
        'data-x="requests_per_s" data-points="4"></div>')
    assert chart_html("dist", kind="cdf", imports=[]) == '<div class="bs-sweep-fig" data-fig="dist" data-kind="cdf"></div>'
    run = chart_html("dist", kind="hist", run="burst b-1", values=[["sync", {"ttft_ms": [1.5]}]])
    assert 'data-values="[[&quot;sync&quot;,{&quot;ttft_ms&quot;:[1.5]}]]"' in run and 'data-run="burst b-1"' in run


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
    # empty TTFT / ITL fields: the sweep takes them from its synchronous run; "none": not checked
    empty = sweep_spec(["sync"], 1, 1, 8, 8, "", " ", "", 0.99)
    assert "ttft_ms" not in empty.slo.model_fields_set and "itl_ms" not in empty.slo.model_fields_set
    typed = sweep_spec(["sync"], 1, 1, 8, 8, "300", "none", "", 0.99)
    assert typed.slo.ttft_ms == 300 and typed.slo.itl_ms is None and typed.slo.model_fields_set >= {"ttft_ms", "itl_ms"}


def test_the_summary_table_has_point_offered_and_achieved_columns_and_says_why_none_met():
    html = sweep_summary_html(status())
    assert "<th>point</th><th>offered</th><th>achieved</th>" * 2 in html
    # the highest rate meeting the SLOs: point 3, offered 3.00, achieved 3.00, each in its own cell
    assert "<td>3: constant rate</td><td>3.00 req/s</td><td>3.00 req/s</td>" in html
    assert "<td>4: constant rate</td><td>4.20 req/s</td><td>4.00 req/s</td>" in html      # where it leaves them
    assert "<td>1: throughput</td><td>all in flight</td><td>4.20 req/s · 42.0 tok/s</td>" in html
    st = status()
    for c in st["modes"].values():
        c["summary"] = {**c["summary"], "slo_max": None,
                        "slo_none_why": "no rate met ITL p99 ≤ 50 ms: the lowest load (0: synchronous) had ITL p99 "
                                        "180 ms"}
    st["slo_derived"] = {"mode": "sync", "index": 0, "kind": "synchronous",
                         "ttft_ms": {"from_p99_ms": 37.2, "factor": 3.0, "slo_ms": 120.0},
                         "itl_ms": {"from_p99_ms": 18.4, "factor": 2.0, "slo_ms": 38.0}}
    html = sweep_summary_html(st)
    assert '<td colspan="3" class="bs-sweep-why">no rate met ITL p99 ≤ 50 ms: the lowest load' in html
    assert "– / –" not in html
    assert "(TTFT and ITL from the synchronous run in sync: 3x and 2x its p99 of 37.2 and 18.4 ms)" in html


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
