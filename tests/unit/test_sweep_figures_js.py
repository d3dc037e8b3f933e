"""The Sweep tab's figures as the page builds them (assets/js/sweep_figures.js), run in Node without a browser: curves
per mode in the order of the load offered, knees where the summary puts them, SLO lines and where each mode leaves
the SLOs; foreign reports overlaid; CDFs whose points carry their request's id; and the words and colours the
page and the Python side share (assets/js/palette.js)."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from batchscope.app.loadtest.sweep.curves import curve_summary
from batchscope.app.ui.page_html import BUSY_LABEL
from batchscope.app.ui.sweep_figures import FOREIGN_COLORS, MODE_COLORS

JS = Path(__file__).resolve().parents[2] / "assets" / "js"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")


def run_js(body: str, **inputs) -> dict:
    """`body` run as an ES module with sweep_figures.js as F and palette.js as P, `inputs` as constants; it
    returns its answer with `return`."""
    consts = "".join(f"const {k} = {json.dumps(v)};\n" for k, v in inputs.items())
    script = (f"const F = await import({json.dumps(str(JS / 'sweep_figures.js'))});\n"
              f"const P = await import({json.dumps(str(JS / 'palette.js'))});\n{consts}"
              f"const answer = await (async () => {{ {body} }})();\nconsole.log(JSON.stringify(answer));")
    proc = subprocess.run([NODE, "--experimental-detect-module", "--no-warnings", "--input-type=module", "-e", script],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def point(i, kind, rate, rps, ttft, attain):
    lat = {"p50": ttft, "p90": 1.5 * ttft, "p99": 2 * ttft, "mean": ttft, "n": 10}
    return {"index": i, "mode": "sync", "kind": kind, "offered_rate": rate, "concurrency": None, "complete": True,
            "requests_per_s": rps, "output_tokens_per_s": 10 * rps, "ttft_ms": lat, "itl_ms": lat, "tpot_ms": lat,
            "e2e_ms": lat, "slo_attainment": attain, "goodput_rps": rps * attain, "busy_pct": 50.0 + i,
            "ms_per_step": 5.0 + i, "busy_basis": "host"}


def status():
    pts = [point(0, "synchronous", None, 1.0, 10, 1.0), point(1, "throughput", None, 4.2, 600, 0.2),
           point(2, "constant", 2.0, 2.0, 11, 1.0), point(3, "constant", 3.0, 3.0, 12, 0.995),
           point(4, "constant", 4.2, 4.0, 15, 0.9)]
    modes = {m: {"points": pts, "summary": curve_summary(pts, 0.99)} for m in ("sync", "async")}
    return {"id": "sweep-x", "state": "done", "modes": modes,
            "slo": {"ttft_ms": 500, "itl_ms": 50, "e2e_ms": None, "target": 0.99}}


TRACES = "return fig.data.map(t => ({name: t.name, x: t.x, y: t.y, color: (t.line || t.marker || {}).color, " \
         "xaxis: t.xaxis, yaxis: t.yaxis, type: t.type, hover: t.hovertemplate, customdata: t.customdata ?? null}));"


def test_the_curves_overlay_both_modes_with_knees_slos_and_where_each_leaves_them():
    st = status()
    got = run_js("const fig = F.curvesFigure(F.seriesOf(ST, []), ST.slo);"
                 "const tok = F.curvesFigure(F.seriesOf(ST, []), ST.slo, 'output_tokens_per_s');"
                 "return {traces: fig.data.map(t => ({name: t.name, x: t.x, y: t.y, color: t.line && t.line.color,"
                 " yaxis: t.yaxis, hover: t.hovertemplate})), log: fig.layout.yaxis.type, shapes: fig.layout.shapes,"
                 " tokX: tok.data.find(t => t.name === 'sync p50').x[0], xtitle: fig.layout.xaxis3.title.text};",
                 ST=st)
    ts = got["traces"]
    names = [t["name"] for t in ts]
    for n in ("sync p50", "sync p99", "async p50", "async p99", "sync knee", "SLO"):
        assert n in names
    # one trace per latency row for each mode and percentile: TTFT (y), ITL (y2), E2E (y3)
    assert [t["yaxis"] for t in ts if t["name"] == "async p99"] == ["y", "y2", "y3"]
    p50 = next(t for t in ts if t["name"] == "sync p50")
    # in the order of the load offered: synchronous, rising rates, throughput last
    assert p50["x"] == [1.0, 2.0, 3.0, 4.0, 4.2] and p50["y"] == [10, 11, 12, 15, 600]
    assert p50["color"] == MODE_COLORS["sync"]
    assert "%{y:,.1f} ms" in p50["hover"] and "SLO attainment" in p50["hover"]
    # each knee a star at the point the summary names, on its own latency's row
    summary = st["modes"]["sync"]["summary"]["knees"]
    for row, metric in zip(("y", "y2", "y3"), ("ttft_ms", "itl_ms", "e2e_ms")):
        want = sorted(st["modes"]["sync"]["points"][k["index"]]["requests_per_s"]
                      for k in summary[metric].values() if k)
        assert sorted(t["x"][0] for t in ts if t["name"] == "sync knee" and t["yaxis"] == row) == want
    slo = [t for t in ts if t["name"] == "SLO"]
    assert sorted({t["y"][0] for t in slo}) == [50, 500]          # TTFT and ITL; no E2E SLO was set
    assert all(t["x"] == [1.0, 4.2] for t in slo)                   # across every point drawn
    assert any(n.startswith("sync leaves the SLOs at 4.00") for n in names)
    assert [s["x0"] for s in got["shapes"]] == [4.0, 4.0]          # a dashed line per mode where it leaves them
    assert got["log"] == "log" and got["xtitle"] == "throughput (requests/s)"
    assert got["tokX"] == 10.0


def test_a_foreign_report_is_one_more_series_and_empty_figures_say_so():
    st = status()
    rep = {"modes": {"GuideLLM 0.8.1 · smollm2": {"points": [point(0, "synchronous", None, 1.5, 20, 1.0)]}}}
    got = run_js("const s = F.seriesOf(ST, [REP]);"
                 "const eng = F.engineFigure(s, 0.99);"
                 "return {series: s.map(x => [x.name, x.color]),"
                 " curves: F.curvesFigure(s, ST.slo).data.map(t => t.name),"
                 " engine: eng.data.map(t => [t.name, t.yaxis]), busyTitle: eng.layout.annotations[0].text,"
                 " empty: [F.curvesFigure([], null), F.engineFigure([], null), F.distributionFigure([])]"
                 "   .map(f => [f.data.length, f.layout.meta.empty])};", ST=st, REP=rep)
    assert got["series"] == [["sync", MODE_COLORS["sync"]], ["async", MODE_COLORS["async"]],
                             ["GuideLLM 0.8.1 · smollm2", FOREIGN_COLORS[0]]]
    assert "GuideLLM 0.8.1 · smollm2 p50" in got["curves"]
    guide = [t for t in got["engine"] if t[0].startswith("GuideLLM")]
    assert guide == [["GuideLLM 0.8.1 · smollm2", "y3"]]            # attainment only: no engine telemetry there
    assert got["busyTitle"] == BUSY_LABEL["host"] + " %"           # the points say how busy was measured
    for n, text in got["empty"]:
        assert n == 0 and text.startswith("no ")


def test_cdfs_read_percentiles_and_histograms_share_of_values():
    vals = {"ttft_ms": [30.0, 10.0, 20.0, 40.0], "itl_ms": [1.0, 2.0], "tpot_ms": [], "e2e_ms": [5.0]}
    dists = [{"name": "sync · 1", "color": "#ea580c", "values": vals},
             {"name": "async · 1", "color": "#2563eb", "values": vals}]
    got = run_js("const fig = F.distributionFigure(D); const hist = F.distributionFigure(D, 'hist');"
                 "return {cdf: fig.data.map(t => ({x: t.x, y: t.y, hover: t.hovertemplate, yaxis: t.yaxis})),"
                 " hist: hist.data.map(t => [t.type, t.histnorm]), barmode: hist.layout.barmode};", D=dists)
    ttft = got["cdf"][0]
    assert ttft["x"] == [10.0, 20.0, 30.0, 40.0] and ttft["y"] == [25.0, 50.0, 75.0, 100.0]
    assert "p%{y:.1f} = %{x:,.2f} ms" in ttft["hover"]
    assert len(got["cdf"]) == 2 * 3                                 # no TPOT values: nothing drawn for it
    assert [t["yaxis"] for t in got["cdf"]] == ["y", "y", "y2", "y2", "y4", "y4"]
    assert {tuple(t) for t in got["hist"]} == {("histogram", "percent")} and got["barmode"] == "overlay"


def test_each_cdf_point_carries_its_requests_engine_id():
    # a sweep point's values: per-request lists share request_id, each gap has its own request's id
    pt = {"ttft_ms": [30.0, None, 10.0], "tpot_ms": [2.0, 1.0, 3.0], "e2e_ms": [50.0, 5.0, 40.0],
          "request_id": ["req-1", "req-2", "req-3"], "itl_ms": [4.0, 1.0, 2.0],
          "itl_request_id": ["req-3", "req-1", "req-1"]}
    # a continuous load's: one id list per latency (each sampled on its own)
    load = {"ttft_ms": [7.0, 6.0], "ttft_request_id": ["req-8", "req-9"], "itl_ms": [], "tpot_ms": [],
            "e2e_ms": [9.0], "e2e_request_id": ["req-9"]}
    got = run_js("const fig = F.distributionFigure([{name: 'sync · 1', color: '#ea580c', values: PT},"
                 "                                  {name: 'load', color: '#2563eb', values: LOAD}]);"
                 "const plain = F.distributionFigure([{name: 'g', color: '#059669', values: F.withoutIds(PT)}]);"
                 "return {hint: F.CLICK_HINT, kept: Object.keys(F.withoutIds(PT)).sort(),"
                 " plain: plain.data.map(t => [t.customdata ?? null, t.hovertemplate]),"
                 " traces: fig.data.map(t => ({name: t.name, x: t.x, ids: t.customdata, hover: t.hovertemplate,"
                 "   what: t.hovertemplate.split('<br>')[0].split(' ').pop()}))};", PT=pt, LOAD=load)
    by = {(t["name"], t["what"]): t for t in got["traces"]}
    ttft = by[("sync · 1", "TTFT")]
    assert ttft["x"] == [10.0, 30.0] and ttft["ids"] == ["req-3", "req-1"]     # sorted with its values
    assert by[("sync · 1", "E2E")]["ids"] == ["req-2", "req-3", "req-1"]
    itl = by[("sync · 1", "ITL")]
    assert itl["x"] == [1.0, 2.0, 4.0] and itl["ids"] == ["req-1", "req-1", "req-3"]
    assert by[("load", "TTFT")]["ids"] == ["req-9", "req-8"]
    assert by[("load", "E2E")]["ids"] == ["req-9"]
    assert got["hint"] == "click: show this request's steps"
    assert all(got["hint"] in t["hover"] and "%{customdata}" in t["hover"] for t in got["traces"])
    # values without ids (another server's report): no ids, and no promise of a click
    assert all(ids is None and got["hint"] not in hover for ids, hover in got["plain"])
    assert got["kept"] == ["e2e_ms", "itl_ms", "tpot_ms", "ttft_ms"]


def test_a_points_distributions_overlay_the_nearest_point_of_each_report_without_its_ids():
    doc = {"modes": {m: {"points": [point(0, "synchronous", None, 1.0, 10, 1.0), point(1, "constant", 2.0, 2.0, 11, 1)],
                         "distributions": [{"ttft_ms": [1.0], "request_id": ["a"]},
                                           {"ttft_ms": [2.0], "request_id": ["b"]}]} for m in ("sync", "async")}}
    rep = {"modes": {"vllm": {"points": [point(0, "constant", 1.0, 1.1, 9, 1), point(1, "constant", 2.0, 2.1, 9, 1)],
                              "distributions": [{"ttft_ms": [3.0]}, {"ttft_ms": [4.0], "request_id": ["z"]}]}}}
    got = run_js("return F.pointDistributions(DOC, 1, [REP]).map(d => [d.name, d.color, d.values]);", DOC=doc, REP=rep)
    assert [g[0] for g in got] == ["sync · 1: constant rate @ 2.00 req/s", "async · 1: constant rate @ 2.00 req/s",
                                   "vllm · 1: constant rate @ 2.00 req/s"]
    assert got[2][1] == FOREIGN_COLORS[0] and got[2][2] == {"ttft_ms": [4.0]}
    runs = run_js("return F.runDistributions('burst b-1', [['sync', {}], ['burst', {}]]).map(d => [d.name, d.color]);")
    assert runs == [["sync · burst b-1", MODE_COLORS["sync"]], ["burst · burst b-1", FOREIGN_COLORS[2]]]


def test_busy_has_one_name_for_each_way_it_was_measured():
    got = run_js("return [P.busyLabel('events'), P.busyLabel('host'), P.busyLabel('device_ops'), P.busyLabel(null)];")
    assert got == [BUSY_LABEL["events"], BUSY_LABEL["host"], BUSY_LABEL["device_ops"], BUSY_LABEL["events"]]
    assert run_js("return P.MODE_COLOR;") == MODE_COLORS
