"""Summaries: the formulas, busy % from a union of intervals, the floor, recordings and an A/B comparison."""
from __future__ import annotations

import gc

import pytest

from batchscope.telemetry import Telemetry, compare, percentiles, request_metrics, summarize
from batchscope.telemetry.stretches import stretches, union_length
from synthetic import SyntheticEngine


def step(n, compute, tokens=1, prefill=0, decode=1, idle=None, parts=None, mode="sync", kv=10):
    return {"step": n, "mode": mode, "num_requests": decode or 1, "prefill_tokens": prefill,
            "decode_tokens": decode, "kv_blocks_used": kv, "kv_blocks_total": 100, "queue_depth": 0,
            "tokens_out": tokens, "cpu": {"launch": list(compute)}, "compute_us": list(compute),
            "compute_basis": "host", "gpu_idle_before_us": idle, "idle_by_cause_us": parts or {}}


def test_percentiles_interpolate_between_ranks():
    p = percentiles([4, 1, 3, 2, None])
    assert p == {"n": 4, "mean": 2.5, "p50": 2.5, "p90": 3.7, "p99": 3.97}
    assert percentiles([])["p50"] is None
    # numpy's default (linear) interpolation, whatever the number of values
    assert percentiles(range(1, 101)) == {"n": 100, "mean": 50.5, "p50": 50.5, "p90": 90.1, "p99": 99.01}
    assert percentiles([3.0]) == {"n": 1, "mean": 3.0, "p50": 3.0, "p90": 3.0, "p99": 3.0}


def test_request_metrics_follow_the_stated_formulas():
    req = {"arrival_us": 0.0, "first_token_us": 100.0, "finish_us": 650.0, "output_tokens": 3,
           "token_us": [100.0, 300.0, 600.0]}
    m = request_metrics(req)
    assert m["ttft_ms"] == pytest.approx(0.1)
    assert m["tpot_ms"] == pytest.approx(0.25)          # (600 - 100) / (3 - 1): the first token excluded
    assert m["itl_ms"] == pytest.approx([0.2, 0.3])
    assert m["e2e_ms"] == pytest.approx(0.65)
    one = request_metrics({**req, "output_tokens": 1, "token_us": [100.0]})
    assert one["tpot_ms"] is None and one["itl_ms"] == []


def test_union_counts_overlaps_once_and_clips_to_the_window():
    assert union_length([(0, 10), (5, 15), (20, 30)], 0, 100) == 25
    assert union_length([(0, 10), (20, 30)], 5, 25) == 10
    assert union_length([], 0, 10) == 0


def test_busy_pct_idle_by_cause_and_rates_over_a_window():
    steps = [step(0, (0, 10)), step(1, (20, 30), idle=10, parts={"update": 4, "schedule": 6}),
             step(2, (30, 40), idle=0), step(3, (60, 70), idle=20, parts={"empty_queue": 20})]
    s = summarize(steps, t0_us=0, t1_us=80)
    assert s["busy_pct"] == 50.0
    assert s["idle_us_by_cause"] == {"empty_queue": 20, "schedule": 6, "update": 4}
    assert s["idle_us_total"] == 30
    assert s["tokens_per_s"] == pytest.approx(4 / 80e-6)
    assert s["step_ms"]["n"] == 3 and s["decode_ms_per_step"]["p50"] == pytest.approx(0.02)
    part = summarize(steps, t0_us=15, t1_us=45)
    assert part["steps"] == 2 and part["busy_pct"] == pytest.approx(100 * 20 / 30, abs=0.01)


def test_the_floor_is_weights_plus_kv_over_bandwidth():
    info = {"weight_bytes": 1_000_000_000, "kv_bytes_per_token": 1000, "block_size": 16}
    steps = [step(i, (i * 10.0, i * 10.0 + 5), kv=100) for i in range(5)]
    s = summarize(steps, info=info, bandwidth_gbps=1000.0)
    assert s["floor_bytes_per_step"] == 1_000_000_000 + 1000 * 1600
    assert s["floor_ms_per_step"] == pytest.approx(1.0016)
    assert s["floor_ratio"] == pytest.approx(0.01 / 1.0016, abs=1e-4)
    assert summarize(steps, info=info)["floor_ms_per_step"] is None       # no bandwidth, no floor


def test_nvml_means_and_request_percentiles_cover_the_window():
    steps = [step(0, (0, 10)), step(1, (10, 20))]
    nvml = [{"t_us": 5, "gpu_util": 80.0, "cpu_pct": 10.0}, {"t_us": 15, "gpu_util": 100.0, "cpu_pct": None},
            {"t_us": 500, "gpu_util": 0.0}]
    reqs = [{"arrival_us": 0, "first_token_us": 10, "finish_us": 20, "output_tokens": 2, "token_us": [10, 20],
             "finish_reason": "length"}]
    s = summarize(steps, reqs, nvml)
    assert s["gpu_util_mean"] == 90.0 and s["cpu_pct_mean"] == 10.0 and s["nvml_samples"] == 2
    assert s["requests_finished"] == 1 and s["finish_reasons"] == {"length": 1}
    assert s["ttft_ms"]["p50"] == pytest.approx(0.01)


def run_burst(eng, n=8, tokens=10):
    eng.submit(n, prompt_tokens=32, max_new_tokens=tokens)
    eng.run()


def test_recordings_compare_sync_with_async():
    # realtime: recordings start and stop by the wall clock, so the steps must happen on it too. A full
    # collection of the test process's heap (hundreds of ms to seconds after the browser and server tests) inside
    # a recording would stretch its window, so the collector waits until both are made; and it runs before the
    # engine starts its clock, which never catches up with a wall clock that ran ahead of it.
    gc.collect()
    gc.disable()
    try:
        eng = SyntheticEngine(gpu=True, mode="sync", compute_us=1500, realtime=True)
        tel = Telemetry(eng, nvml_hz=0, bandwidth_gbps=100.0)
        tel.start_recording("sync")
        run_burst(eng, tokens=40)      # 40 steps: a thread woken late once is a few % of the window, not 10
        a = tel.stop_recording()
        eng.set_mode("async")
        eng.iterate()                      # the switch happens at the next step boundary
        tel.start_recording("async")
        run_burst(eng, tokens=40)
        b = tel.stop_recording()
    finally:
        gc.enable()
    assert tel.recordings() == ["sync", "async"]
    assert a["recording"] == "sync" and a["modes"] == {"sync": a["steps"]}
    assert b["modes"] == {"async": b["steps"]}
    assert a["steps"] == b["steps"] == 40
    assert b["busy_pct"] > a["busy_pct"]
    assert b["idle_us_total"] < a["idle_us_total"]
    assert a["floor_ms_per_step"] is not None
    cmp = tel.compare(a, b, ("sync", "async"))
    assert cmp["labels"] == ["sync", "async"]
    assert cmp["headline"]["busy_pct"]["diff"] > 0
    assert cmp["metrics"]["decode_ms_per_step.p50"]["b"] < cmp["metrics"]["decode_ms_per_step.p50"]["a"]
    assert set(cmp["metrics"]) >= {f"idle_us_by_cause.{c}" for c in a["idle_us_by_cause"]}
    tel.close()


def test_a_recording_timeline_starts_at_the_recording():
    eng = SyntheticEngine(gpu=False, mode="sync")
    tel = Telemetry(eng, nvml_hz=0)
    run_burst(eng, 2)
    tel.start_recording("second")
    run_burst(eng, 3)
    tel.stop_recording()
    run_burst(eng, 2)
    tl = tel.timeline("second")
    assert tl["meta"]["recording"]["name"] == "second"
    assert len({r for s in tl["steps"] for r in s["request_ids"]}) == 3
    assert 0 <= tl["steps"][0]["cpu"]["schedule"][0] < 1e6
    assert len(tl["requests"]) == 3 and all(r["arrival_us"] >= 0 for r in tl["requests"])
    assert tl["summary"]["steps"] == len(tl["steps"])
    with pytest.raises(KeyError, match="no recording named"):
        tel.timeline("missing")
    tel.close()


def test_starting_a_recording_stops_the_running_one_and_names_are_kept():
    eng = SyntheticEngine(gpu=False)
    tel = Telemetry(eng, nvml_hz=0)
    assert tel.stop_recording() == {}
    tel.start_recording("a")
    run_burst(eng, 1)
    tel.start_recording("b")
    run_burst(eng, 1)
    tel.stop_recording()
    a, b = tel.recorder.recordings["a"], tel.recorder.recordings["b"]
    assert a.stop_us is not None and a.stop_us <= b.start_us
    assert {s["step"] for s in a.steps}.isdisjoint({s["step"] for s in b.steps})
    tel.close()


def test_compare_lists_shared_numeric_metrics():
    out = compare({"busy_pct": 50.0, "x": {"p50": 2.0}, "name": "a", "idle_us_by_cause": {"update": 30.0}},
                  {"busy_pct": 75.0, "x": {"p50": 1.0}, "idle_us_by_cause": {}})
    assert out["metrics"]["busy_pct"] == {"a": 50.0, "b": 75.0, "diff": 25.0, "ratio": 1.5}
    assert out["metrics"]["x.p50"]["ratio"] == 0.5
    assert out["metrics"]["idle_us_by_cause.update"] == {"a": 30.0, "b": 0.0, "diff": -30.0, "ratio": 0.0}
    assert "name" not in out["metrics"]


def test_per_mode_figures_cover_each_modes_stretches_while_there_was_work():
    # sync 0-2, async 3-6 (with a 1 ms pause with no request before 5), sync again 7-8; 1 token per step
    steps = [step(0, (0, 10)), step(1, (20, 30), idle=10, parts={"fill": 10}),
             step(2, (40, 50), idle=10, parts={"fill": 10}),
             step(3, (55, 65), idle=5, parts={"launch": 5}, mode="async"), step(4, (65, 75), idle=0, mode="async"),
             step(5, (1075, 1085), idle=1000, parts={"empty_queue": 1000}, mode="async"),
             step(6, (1085, 1095), idle=0, mode="async"),
             step(7, (1100, 1110), idle=5, parts={"update": 5}), step(8, (1120, 1130), idle=10, parts={"fill": 10})]
    pm = summarize(steps)["per_mode"]
    sync, run_async = pm["sync"], pm["async"]
    assert (sync["steps"], sync["stretches"], run_async["steps"], run_async["stretches"]) == (5, 2, 4, 1)
    # sync works 50 + 30 µs and computes 30 + 20 of them; a stretch's first gap (across the switch) is left out
    assert sync["busy_pct"] == pytest.approx(62.5) and sync["work_s"] == pytest.approx(80e-6)
    assert sync["ms_per_step"] == pytest.approx(0.02) and sync["idle_us_per_step"] == 10.0
    assert sync["idle_us_by_cause"] == {"fill": 30.0}
    assert sync["tokens_per_s"] == pytest.approx(5 / 80e-6)
    assert sync["decode_tokens_per_s"] == pytest.approx(3 / 60e-6)      # steps 0, 1 and 7 over their periods
    # async: the pause with no request counts against nothing
    assert run_async["busy_pct"] == pytest.approx(100.0) and run_async["ms_per_step"] == pytest.approx(0.01)
    assert run_async["idle_us_per_step"] == 0.0 and run_async["idle_us_by_cause"] == {}
    assert sync["latest"]["first_step"] == 7 and sync["latest"]["busy_pct"] == pytest.approx(100 * 20 / 30, abs=0.01)
    assert summarize(steps)["async_forecast"]["reason"].startswith("compute runs on the host")
    assert summarize([])["per_mode"] == {}


def test_stretches_split_at_a_switch_and_at_a_hole_in_the_step_numbers():
    steps = [step(0, (0, 1)), step(1, (1, 2)), step(3, (5, 6)), step(4, (6, 7), mode="async")]
    assert [[s["step"] for s in run] for run in stretches(steps)] == [[0, 1], [3], [4]]
    assert [[s["step"] for s in run] for run in stretches(steps, "async")] == [[4]]
