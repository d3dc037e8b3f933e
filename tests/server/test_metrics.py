"""GET /metrics: Prometheus' text format with vLLM's names and batchscope's own, read from telemetry's running totals.

On telemetry's synthetic engine (no model, no torch work): the exposition parses, carries vLLM's names, types,
labels and buckets, agrees with the timeline's own figures, stays monotone when the ring forgets, stays the same
size however long the run, leaves out what was not measured, and costs the engine thread little per step.
"""
from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from batchscope.app.loadtest.specs import Limits
from batchscope.app.server import create_app
from batchscope.app.server.state import AppState
from batchscope.engine.trace import RankSpans
from batchscope.telemetry import IDLE_CAUSES, Telemetry
from batchscope.telemetry.prometheus import CONTENT_TYPE, generate_latest, prometheus_registry
from batchscope.telemetry.totals import ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS, Totals
from synthetic import SyntheticEngine

TOKEN = "metrics-token-for-tests"


def scrape(tel: Telemetry) -> dict:
    """{family name: family} of one scrape, through prometheus-client's own parser."""
    text = generate_latest(prometheus_registry(tel)).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families: dict, family: str, sample: str | None = None, **labels) -> float:
    matches = [s.value for s in families[family].samples if (sample is None or s.name == sample)
               and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matches) == 1, (family, sample, labels, families[family].samples[:5])
    return matches[0]


@pytest.fixture
def switched(sync_then_async):
    eng, tel = sync_then_async(True, seed=3, requests=6, prompt_tokens=24, max_new_tokens=12)
    return eng, tel


def test_vllm_names_types_labels_and_buckets(switched):
    _, tel = switched
    fams = scrape(tel)
    for name, kind in [("vllm:num_requests_running", "gauge"), ("vllm:num_requests_waiting", "gauge"),
                       ("vllm:kv_cache_usage_perc", "gauge"), ("vllm:prompt_tokens", "counter"),
                       ("vllm:generation_tokens", "counter"), ("vllm:num_preemptions", "counter"),
                       ("vllm:request_success", "counter"), ("vllm:time_to_first_token_seconds", "histogram"),
                       ("vllm:inter_token_latency_seconds", "histogram"),
                       ("vllm:request_time_per_output_token_seconds", "histogram"),
                       ("vllm:e2e_request_latency_seconds", "histogram"),
                       ("vllm:request_queue_time_seconds", "histogram"),
                       ("vllm:request_prefill_time_seconds", "histogram"),
                       ("vllm:request_decode_time_seconds", "histogram"),
                       ("vllm:request_inference_time_seconds", "histogram"),
                       ("vllm:request_prompt_tokens", "histogram"), ("vllm:request_generation_tokens", "histogram"),
                       ("vllm:request_max_num_generation_tokens", "histogram"),
                       ("vllm:iteration_tokens_total", "histogram")]:
        assert fams[name].type == kind, name
        assert all(s.labels["model_name"] == "synthetic" and s.labels["engine"] == "0"
                   for s in fams[name].samples), name
    # the exposed sample names the dashboards query
    names = {s.name for f in fams.values() for s in f.samples}
    assert {"vllm:prompt_tokens_total", "vllm:request_success_total", "vllm:e2e_request_latency_seconds_bucket",
            "vllm:iteration_tokens_total_bucket", "vllm:time_to_first_token_seconds_count"} <= names
    assert not any(n.endswith("_created") for n in names)

    def les(family):
        return [s.labels["le"] for s in fams[family].samples if s.name.endswith("_bucket")]
    assert les("vllm:time_to_first_token_seconds") == [str(float(b)) for b in TTFT_BUCKETS] + ["+Inf"]
    assert les("vllm:inter_token_latency_seconds") == [str(float(b)) for b in ITL_BUCKETS] + ["+Inf"]
    assert les("vllm:e2e_request_latency_seconds")[:3] == ["0.3", "0.5", "0.8"]
    assert les("vllm:e2e_request_latency_seconds")[:-1] == [str(float(b)) for b in REQUEST_LATENCY_BUCKETS]
    assert les("vllm:iteration_tokens_total")[:3] == ["1.0", "8.0", "16.0"]
    assert les("vllm:request_prompt_tokens")[-2:] == ["2000.0", "+Inf"]        # 1-2-5 up to max_model_len 4096
    reasons = {s.labels["finished_reason"]: s.value for s in fams["vllm:request_success"].samples}
    assert reasons == {"stop": 0, "length": 6, "abort": 0, "error": 0, "repetition": 0}


def test_counters_agree_with_the_timeline(switched):
    eng, tel = switched
    fams = scrape(tel)
    timeline = tel.timeline()
    summary, steps, requests = timeline["summary"], timeline["steps"], timeline["requests"]
    busy = sum(s["compute_us"][1] - s["compute_us"][0] for s in steps) / 1e6
    assert value(fams, "batchscope_gpu_busy_seconds", rank="0") == pytest.approx(busy, rel=1e-9)
    for cause in IDLE_CAUSES:
        want = summary["idle_us_by_cause"].get(cause, 0.0) / 1e6
        assert value(fams, "batchscope_gpu_idle_seconds", cause=cause, rank="0") == pytest.approx(want, abs=1e-6)
    assert value(fams, "vllm:generation_tokens") == summary["tokens_out"] == sum(eng.outputs.values())
    assert value(fams, "vllm:prompt_tokens") == 6 * 24 == value(fams, "batchscope_prefill_tokens")
    assert value(fams, "batchscope_steps", mode="sync") == summary["modes"]["sync"]
    assert value(fams, "batchscope_steps", mode="async") == summary["modes"]["async"]
    assert value(fams, "batchscope_mode_switches") == 1
    assert value(fams, "batchscope_mode", mode="async") == 1 and value(fams, "batchscope_mode", mode="sync") == 0
    # request histograms: one observation per request, sums as the request records say
    ttft = [(r["first_token_us"] - r["arrival_us"]) / 1e6 for r in requests]
    assert value(fams, "vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count") == 6
    assert value(fams, "vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_sum") == \
        pytest.approx(sum(ttft), abs=1e-9)
    gaps = [b - a for r in requests for a, b in zip(r["token_us"], r["token_us"][1:])]
    assert value(fams, "vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count") == len(gaps)
    assert value(fams, "vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_sum") == \
        pytest.approx(sum(gaps) / 1e6, abs=1e-9)
    e2e = sum(r["finish_us"] - r["arrival_us"] for r in requests) / 1e6
    assert value(fams, "vllm:e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds_sum") == \
        pytest.approx(e2e, abs=1e-9)
    # queue + prefill + decode = e2e less the last token's wait for its finish, per request
    assert all(r["arrival_us"] <= r["scheduled_us"] <= r["first_token_us"] for r in requests)
    phases = sum(value(fams, f"vllm:request_{p}_time_seconds", f"vllm:request_{p}_time_seconds_sum")
                 for p in ("queue", "prefill", "decode"))
    assert phases == pytest.approx(sum(r["token_us"][-1] - r["arrival_us"] for r in requests) / 1e6, abs=1e-9)
    # host phases: every step's five spans
    for mode in ("sync", "async"):
        n = value(fams, "batchscope_host_phase_seconds", "batchscope_host_phase_seconds_count", mode=mode,
                  phase="launch")
        assert n == summary["modes"][mode]
    # decode steps: the same periods the per-mode figures are made of
    for mode in ("sync", "async"):
        count = value(fams, "batchscope_decode_step_seconds", "batchscope_decode_step_seconds_count", mode=mode)
        assert count >= 1


def test_queue_time_is_the_wait_for_a_place_in_the_batch():
    eng = SyntheticEngine(gpu=False, mode="async", max_running=2)
    tel = Telemetry(eng, nvml_hz=0)
    try:
        eng.submit(6, prompt_tokens=8, max_new_tokens=5)
        eng.run()
        requests = tel.timeline()["requests"]
        waits = sorted(r["scheduled_us"] - r["arrival_us"] for r in requests)
        assert waits[0] < 100 and waits[-1] > 1000       # the last two waited for two requests to finish
        fams = scrape(tel)
        assert value(fams, "vllm:request_queue_time_seconds", "vllm:request_queue_time_seconds_sum") == \
            pytest.approx(sum(waits) / 1e6, abs=1e-9)
    finally:
        tel.close()


def test_counters_stay_monotone_when_the_ring_forgets():
    eng = SyntheticEngine(gpu=True, mode="async")
    tel = Telemetry(eng, nvml_hz=0, ring_steps=16, ring_requests=4)
    try:
        seen = []
        for _ in range(6):
            eng.submit(4, prompt_tokens=16, max_new_tokens=10)
            eng.run()
            fams = scrape(tel)
            seen.append((value(fams, "vllm:generation_tokens"), value(fams, "batchscope_gpu_busy_seconds", rank="0"),
                         value(fams, "vllm:request_success", finished_reason="length"),
                         sum(value(fams, "batchscope_gpu_idle_seconds", cause=c, rank="0") for c in IDLE_CAUSES)))
        assert len(tel.recorder.steps) == 16 and len(tel.recorder.requests) == 4
        for a, b in zip(seen, seen[1:]):
            assert all(y > x for x, y in zip(a, b)), seen
        assert seen[-1][0] == sum(eng.outputs.values()) == 6 * 4 * 10
        assert seen[-1][2] == 24
    finally:
        tel.close()


def test_the_exposition_does_not_grow_with_the_run():
    eng = SyntheticEngine(gpu=True, mode="sync")
    tel = Telemetry(eng, nvml_hz=0)
    try:
        sizes = []
        for n in (3, 60):
            eng.submit(n, prompt_tokens=16, max_new_tokens=4)
            eng.run()
            eng.set_mode("async")
            text = generate_latest(prometheus_registry(tel)).decode()
            sizes.append(sum(1 for line in text.splitlines() if not line.startswith("#")))
        assert sizes[0] == sizes[1], sizes
        assert "r59" not in text and "r0" not in text       # nothing is labelled per request
    finally:
        tel.close()


def test_what_is_not_measured_is_absent(switched):
    _, tel = switched
    fams = scrape(tel)                # a synthetic GPU without NVML, no bandwidth measured
    assert not any(n.startswith("batchscope_nvml_") for n in fams)
    assert "batchscope_decode_floor_ratio" not in fams and "batchscope_decode_floor_seconds" not in fams
    assert "vllm:prefix_cache_queries" not in fams and "vllm:gpu_cache_usage_perc" not in fams


def test_nvml_and_the_floor_where_they_are_known():
    eng = SyntheticEngine(gpu=True, mode="async", realtime=True, compute_us=300)
    tel = Telemetry(eng, nvml_hz=0, bandwidth_gbps=50.0)
    try:
        eng.submit(4, prompt_tokens=16, max_new_tokens=30)
        eng.run()
        sample = {"t_us": tel.now_us(), "gpu_util": 97.0, "mem_util": 40.0, "mem_used_mb": 1024.0, "power_w": 300.5,
                  "sm_clock_mhz": 1980.0, "source": "nvml", "cpu_pct": 50.0, "proc_cpu_pct": 120.0}
        tel.recorder.on_sample(sample)
        before = tel.busy_ratio(1.0)
        fams = scrape(tel)
        assert value(fams, "batchscope_nvml_gpu_utilization_ratio", rank="0") == pytest.approx(0.97)
        assert value(fams, "batchscope_nvml_sm_clock_hertz", rank="0") == 1.98e9
        assert value(fams, "batchscope_nvml_memory_used_bytes", rank="0") == 1 << 30
        assert value(fams, "batchscope_host_cpu_ratio") == 0.5 and value(fams, "batchscope_process_cpu_cores") == 1.2
        # the floor: weights + KV over 50 GB/s; the synthetic decode step takes far longer than that
        ratio = value(fams, "batchscope_decode_floor_ratio", mode="async", window="10s")
        period = value(fams, "batchscope_decode_step_seconds", "batchscope_decode_step_seconds_sum", mode="async")
        floor = value(fams, "batchscope_decode_floor_seconds", mode="async")
        assert ratio == pytest.approx(period / floor, rel=1e-6) and ratio > 1
        # and the busy ratio of the wall-clock second before the scrape: the run is over, so the window slides
        # off its last steps and the gauge lies between what it read just before the scrape and just after
        after = tel.busy_ratio(1.0)
        busy = value(fams, "batchscope_gpu_busy_ratio", rank="0", window="1s")
        assert before >= busy >= after and 0 < busy <= 1
    finally:
        tel.close()


def test_every_rank_has_its_busy_figures():
    eng = SyntheticEngine(gpu=False, mode="async")
    eng.info["ranks"] = [{"rank": 0, "device": "cpu"}, {"rank": 1, "device": "cpu"}]
    tel = Telemetry(eng, nvml_hz=0)
    try:
        eng.submit(2, prompt_tokens=8, max_new_tokens=3)
        eng.run()
        anchor = time.perf_counter_ns()
        tel._observer(RankSpans(spans=[(1, 0, anchor, {"compute": (0.0, 2.0)}),
                                       (1, 1, anchor, {"compute": (3.0, 4.5)})]))
        fams = scrape(tel)
        assert value(fams, "batchscope_gpu_busy_seconds", rank="1") == pytest.approx(0.0035)
        assert {s.labels["rank"] for s in fams["batchscope_gpu_busy_ratio"].samples} == {"0", "1"}
        assert value(fams, "batchscope_info", tensor_parallel_size="2") == 1
    finally:
        tel.close()


def test_the_running_totals_cost_the_engine_thread_little(switched, capsys):
    """What `Totals.on_step` adds to each step's observer callback, replayed over recorded steps, against what
    the whole callback costs: measured on the same machine at the same moment, so a loaded CI box reads the same."""
    eng, tel = switched
    eng.submit(32, prompt_tokens=64, max_new_tokens=40)
    eng.run()
    steps = list(tel.recorder.steps)
    totals = Totals(tel.info, 100.0)
    t0 = time.perf_counter_ns()
    for _ in range(10):
        for rec in steps:
            totals.on_step(rec)
    per_step_us = (time.perf_counter_ns() - t0) / (10 * len(steps)) / 1e3
    t0 = time.perf_counter_ns()
    for _ in range(10_000):
        totals.itl.observe(0.004)               # one per delivered token
    per_token_us = (time.perf_counter_ns() - t0) / 10_000 / 1e3
    callback_us = tel.recorder.observer_ns / tel.recorder.steps_seen / 1e3
    tokens_per_step = sum(r["tokens_out"] for r in steps) / len(steps)
    with capsys.disabled():
        print(f"\n  totals: {per_step_us:.2f} us a step + {per_token_us:.2f} us a token "
              f"({tokens_per_step:.1f} tokens a step here); the whole observer callback: {callback_us:.1f} us a step")
    assert per_step_us + tokens_per_step * per_token_us < 0.5 * callback_us


# ---------------------------------------------------------------------------------------------- the route

@pytest.fixture
def synthetic_server():
    eng = SyntheticEngine(gpu=True, mode="sync")
    tel = Telemetry(eng, nvml_hz=0)
    eng.submit(3, prompt_tokens=8, max_new_tokens=4)
    eng.run()
    state = AppState(eng, tel, Limits())
    yield state
    tel.close()


def test_the_route_serves_text_0_0_4_whatever_the_scraper_asks(synthetic_server):
    accept = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
              "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")          # what Prometheus 2.42 sends
    with TestClient(create_app(synthetic_server, ui=False)) as client:
        r = client.get("/metrics", headers={"accept": accept})
        assert r.status_code == 200 and r.headers["content-type"] == CONTENT_TYPE
        assert "vllm:num_requests_running{" in r.text and "vllm_num_requests_running" not in r.text
        assert 'vllm:request_success_total{engine="0",finished_reason="length",model_name="synthetic"} 3.0' in r.text


def test_a_scrape_without_the_token_is_refused(synthetic_server):
    with TestClient(create_app(synthetic_server, token=TOKEN, ui=False)) as client:
        r = client.get("/metrics")
        assert r.status_code == 401 and "token" in r.json()["error"]
        assert client.get("/metrics", headers={"authorization": "Bearer wrong-token-xyz"}).status_code == 401
        r = client.get("/metrics", headers={"authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200 and "batchscope_gpu_idle_seconds_total" in r.text


def test_a_replay_only_server_has_nothing_to_scrape(switched_timeline):
    state = AppState(replay=switched_timeline(gpu=True))
    with TestClient(create_app(state, ui=False)) as client:
        r = client.get("/metrics")
        assert r.status_code == 200 and r.text == ""
