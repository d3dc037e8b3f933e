"""Other tools' reports read into a sweep's point shape: GuideLLM's four JSON layouts (0.3, 0.4, 0.5-0.6, 0.7-0.8)
and `vllm bench serve` results (one, JSON lines, a sweep's summary list), on small hand-made files in
tests/fixtures/ that follow the real formats; and reports that are not what they claim, refused with the reason."""
import copy
import json
import statistics
from pathlib import Path

import pytest

from batchscope.app.loadtest.foreign.reports import ReportError, read_report
from batchscope.app.loadtest.sweep.spec import SCHEMA, SLO

FIXTURES = Path(__file__).parents[1] / "fixtures"


def raw(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def load(name: str):
    return json.loads(raw(name))


def only_series(report: dict) -> list[dict]:
    (curve,) = report["modes"].values()
    return curve["points"]


# ---------------------------------------------------------------------------------------------- GuideLLM

@pytest.mark.parametrize("name, fmt, kinds", [
    ("guidellm-0.3-sweep.json", "GuideLLM 0.2-0.3 report", ["synchronous", "throughput", "constant"]),
    ("guidellm-0.4-concurrent.json", "GuideLLM 0.4 report", ["concurrent", "concurrent"]),
    ("guidellm-0.6-poisson.json", "GuideLLM 0.6.1 report (metadata.version 1)", ["poisson", "poisson"]),
    ("guidellm-0.8-sweep.json", "GuideLLM 0.8.1 report (metadata.version 2)", ["synchronous", "throughput",
                                                                               "constant"]),
])
def test_each_guidellm_layout_is_read(name, fmt, kinds):
    rep = read_report(raw(name), SLO())
    assert rep["tool"] == "guidellm" and rep["format"] == fmt
    pts = only_series(rep)
    assert [p["kind"] for p in pts] == kinds and [p["index"] for p in pts] == list(range(len(kinds)))
    for p in pts:
        assert p["requests_per_s"] > 0 and p["output_tokens_per_s"] > 0
        for k in ("ttft_ms", "itl_ms", "e2e_ms"):
            assert 0 < p[k]["p50"] <= p[k]["p90"] <= p[k]["p99"]


def test_guidellm_figures_map_to_ours():
    doc = load("guidellm-0.8-sweep.json")
    rep = read_report(doc, SLO(ttft_ms=100, itl_ms=20))
    assert rep["label"] == "GuideLLM 0.8.1 · smollm2" and any("inter_token_latency_ms" in n for n in rep["notes"])
    sync, top, const = only_series(rep)
    b = doc["benchmarks"][0]["metrics"]
    assert sync["ttft_ms"]["p50"] == b["time_to_first_token_ms"]["successful"]["percentiles"]["p50"]
    assert sync["itl_ms"]["p99"] == b["inter_token_latency_ms"]["successful"]["percentiles"]["p99"]
    assert sync["e2e_ms"]["p90"] == pytest.approx(1e3 * b["request_latency"]["successful"]["percentiles"]["p90"])
    assert sync["requests_per_s"] == b["requests_per_second"]["successful"]["mean"] == 3.0
    assert sync["output_tokens_per_s"] == b["output_tokens_per_second"]["total"]["mean"]
    assert (sync["completed"], sync["cancelled"], sync["sent"]) == (6, 1, 7)
    assert sync["offered_rate"] is None and sync["concurrency"] == 1 and top["concurrency"] == 512
    assert const["offered_rate"] == 29.25
    # TPOT is each request's mean gap (GuideLLM's ITL per request), not GuideLLM's TPOT, which counts the TTFT
    per = [r["inter_token_latency_ms"] for r in doc["benchmarks"][0]["requests"]["successful"]]
    assert sync["tpot_ms"]["n"] == 6 and min(per) <= sync["tpot_ms"]["p50"] <= max(per)
    # attainment judged with our SLO on its requests: the throughput run's TTFT is over a second
    assert sync["slo_attainment"] == 1.0 and top["slo_attainment"] == 0.0
    assert sync["goodput_rps"] == pytest.approx(6 / 4.0)
    dist = rep["modes"][rep["label"]]["distributions"][0]
    assert len(dist["ttft_ms"]) == 6 and dist["itl_ms"] == []        # no per-gap values in a GuideLLM report


def test_older_guidellm_layouts_keep_their_own_places():
    old = read_report(raw("guidellm-0.3-sweep.json"))
    assert [p["completed"] for p in only_series(old)] == [5, 5, 5]       # request_totals beside the metrics
    assert only_series(old)[2]["offered_rate"] == 15.7
    conc = only_series(read_report(raw("guidellm-0.4-concurrent.json")))
    assert [p["concurrency"] for p in conc] == [1, 4] and all(p["offered_rate"] is None for p in conc)
    pois = only_series(read_report(raw("guidellm-0.6-poisson.json"), SLO()))
    assert [p["offered_rate"] for p in pois] == [2.0, 6.0]
    # no request list kept: nothing to judge, so no attainment rather than a guess
    assert all(p["slo_attainment"] is None and p["tpot_ms"]["p50"] is None for p in pois)


# ----------------------------------------------------------------------------------------------- vLLM

def test_a_vllm_result_with_default_percentiles():
    doc = load("vllm-serve-4qps.json")
    rep = read_report(doc, SLO())
    assert rep["tool"] == "vllm bench serve" and rep["format"] == "vllm bench serve result"
    (p,) = only_series(rep)
    assert p["kind"] == "poisson" and p["offered_rate"] == 4.0
    assert p["requests_per_s"] == doc["request_throughput"] and p["output_tokens_per_s"] == doc["output_throughput"]
    assert p["ttft_ms"]["p50"] == doc["median_ttft_ms"] and p["ttft_ms"]["p99"] == doc["p99_ttft_ms"]
    assert p["ttft_ms"]["p90"] is None                              # not among its --metric-percentiles
    assert p["tpot_ms"]["p99"] == doc["p99_tpot_ms"] and p["itl_ms"]["mean"] == doc["mean_itl_ms"]
    # no e2el percentiles without --percentile-metrics e2el: taken from `latencies`, which is always kept
    assert "p99_e2el_ms" not in doc
    assert p["e2e_ms"]["p50"] == pytest.approx(1e3 * statistics.median(doc["latencies"]), abs=1e-3)
    assert p["slo_attainment"] is None and any("--save-detailed" in n for n in rep["notes"])


def test_a_detailed_vllm_result_is_judged_with_our_slo():
    doc = load("vllm-serve-detailed.json")
    (p,) = only_series(read_report(doc, SLO(ttft_ms=1000, itl_ms=100)))
    assert p["concurrency"] == 16 and p["ttft_ms"]["p90"] == doc["p90_ttft_ms"]
    assert p["e2e_ms"]["p99"] == doc["p99_e2el_ms"]
    assert p["slo_attainment"] == 1.0 and p["goodput_rps"] == pytest.approx(10 / doc["duration"])
    (strict,) = only_series(read_report(doc, SLO(ttft_ms=1, itl_ms=100)))
    assert strict["slo_attainment"] == 0.0
    rep = read_report(doc)
    dist = rep["modes"][rep["label"]]["distributions"][0]
    assert len(dist["itl_ms"]) == sum(len(x) for x in doc["itls"]) and len(dist["tpot_ms"]) == 10


def test_vllm_goodput_comes_from_the_report_when_it_has_no_per_request_values():
    doc = load("vllm-serve-4qps.json")
    doc["request_goodput"] = 2.0
    rep = read_report(doc, SLO())
    (p,) = only_series(rep)
    assert p["goodput_rps"] == 2.0 and p["slo_attainment"] == pytest.approx(2.0 / doc["request_throughput"])
    assert any("its own --goodput" in n for n in rep["notes"])


def test_vllm_appended_results_and_sweep_summaries_are_curves():
    rep = read_report(raw("vllm-serve-appended.jsonl"))
    assert rep["format"] == "vllm bench serve JSON lines (--append-result)"
    pts = only_series(rep)
    assert [(p["kind"], p["offered_rate"]) for p in pts] == [("poisson", 1.0), ("poisson", 4.0), ("throughput", None)]
    summary = read_report(raw("vllm-sweep-summary.json"))
    assert summary["format"].startswith("vllm bench sweep summary") and len(only_series(summary)) == 2
    inf = load("vllm-serve-4qps.json") | {"request_rate": "inf", "max_concurrency": 1}
    assert only_series(read_report(inf))[0]["kind"] == "synchronous"


def test_a_batchscope_sweep_file_reads_as_its_modes():
    point = {"index": 0, "kind": "synchronous", "offered_rate": None, "requests_per_s": 2.0,
             "output_tokens_per_s": 20.0, **{k: {"p50": 1.0, "p90": 2.0, "p99": 3.0} for k in
                                             ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")},
             "slo_attainment": 1.0, "goodput_rps": 2.0}
    doc = {"schema": SCHEMA, "meta": {"model": "llama3-8b-random", "gpu": "NVIDIA H200"}, "slo": {},
           "modes": {"sync": {"points": [point]}, "async": {"points": [point]}}}
    rep = read_report(json.dumps(doc))
    assert rep["label"] == "llama3-8b-random NVIDIA H200" and list(rep["modes"]) == ["sync", "async"]
    with pytest.raises(ReportError, match="this reader knows batchscope.sweep/1"):
        read_report({**doc, "schema": "batchscope.sweep/2"})


# ---------------------------------------------------------------------------------- not what they claim

def _guidellm(edit):
    doc = load("guidellm-0.8-sweep.json")
    edit(doc)
    return doc


def _vllm(**fields):
    doc = load("vllm-serve-4qps.json")
    for k, v in fields.items():
        if v is None:
            doc.pop(k)
        else:
            doc[k] = v
    return doc


@pytest.mark.parametrize("report, reason", [
    (b"", "empty"),
    (b"{not json", "not JSON"),
    (b'{"a": 1}\n{oops\n', "line 2 is not JSON"),
    (b'"just a string"', "JSON object"),
    ({"foo": 1, "bar": 2}, r"not a GuideLLM report \(no 'benchmarks'\).*top-level keys: bar, foo"),
    (_guidellm(lambda d: d.pop("config")), "metadata.version 2 .* no 'config'"),
    (_guidellm(lambda d: d["metadata"].update(version=3)), "metadata.version 3 is not one this reader knows"),
    (_guidellm(lambda d: d.update(benchmarks=[])), "non-empty list"),
    (_guidellm(lambda d: d["benchmarks"][1]["config"].pop("strategy")), r"benchmarks\[1\]: no config.strategy"),
    (_guidellm(lambda d: d["benchmarks"][0]["config"]["strategy"].update(type_="warp")), "strategy type 'warp'"),
    (_guidellm(lambda d: d["benchmarks"][2].pop("metrics")), r"benchmarks\[2\]: no metrics.requests_per_second"),
    (_vllm(duration=None), "missing duration"),
    (_vllm(request_rate="fast"), "request_rate 'fast' is neither a number"),
    (_vllm(request_throughput="lots"), "requests_per_s"),
    ([1, 2], "result 1: a result is a JSON object, not int"),
    ([], "no results"),
])
def test_a_report_that_is_not_what_it_claims_says_why(report, reason):
    with pytest.raises(ReportError, match=reason):
        read_report(copy.deepcopy(report) if not isinstance(report, bytes) else report)
