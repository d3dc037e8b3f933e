"""Sweeps without a model: the spec and its bad inputs, GuideLLM's rate spacing, a point's SLO attainment and
goodput on known timings, knees, and whole sweeps against a scripted engine (point order, rising rates, the
same prompts in both modes, the engine held and the mode locked, a clean stop), and the export's schema."""
import json
import threading
import time
from pathlib import Path

import jsonschema
import pytest
from pydantic import ValidationError

from batchscope.app.loadtest.manager import BurstManager
from batchscope.app.loadtest.client_timing import RequestTiming
from batchscope.app.loadtest.arrivals import prompt_stream
from batchscope.app.loadtest.refusals import EngineTaken, ModeLocked, validation_reason
from batchscope.app.loadtest.specs import BurstSpec, Limits, LoadSpec
from batchscope.app.loadtest.sweep.sweeps import Sweeps
from batchscope.app.loadtest.sweep.files import to_csv
from batchscope.app.loadtest.sweep.curves import (curve_summary, knee, meets_slo, none_met_why, point_figures,
                                                  point_values)
from batchscope.app.loadtest.sweep.spec import SLO, SweepSpec, derive_slo, round_up, spaced_rates
from test_loadgen import ScriptedEngine, ScriptedTelemetry

LIMITS = Limits(max_prompt_tokens=64, max_new_tokens=512, max_load_concurrency=8, max_load_requests=2000,
                max_load_duration_s=60, max_sweep_points=6, max_sweep_rate=500, max_sweep_duration_s=300)
SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "sweep.schema.json").read_text())
MS = 1_000_000


def settled(**fields) -> SweepSpec:
    return SweepSpec(**fields).within(LIMITS)


# ------------------------------------------------------------------------------------------------ the spec

def test_the_published_schema_is_a_valid_json_schema_for_batchscope_sweep_1():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["properties"]["schema"]["const"] == "batchscope.sweep/1"
    assert set(SCHEMA["$defs"]["point"]["required"]) >= {"offered_rate", "requests_per_s", "output_tokens_per_s",
                                                         "ttft_ms", "itl_ms", "e2e_ms", "slo_attainment",
                                                         "goodput_rps"}
    bad = {"schema": "batchscope.sweep/1", "slo": {"ttft_ms": 1, "itl_ms": 1, "e2e_ms": None, "target": 0.9},
           "modes": {"sync": {"points": [{"index": 0, "kind": "synchronous", "offered_rate": 3.0}]}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)



def test_rates_are_spaced_as_guidellm_spaces_them():
    # GuideLLM 0.8.1, sweep_size=4: synchronous 3.0 req/s, throughput 55.5 -> constant 29.25 and 55.5
    assert spaced_rates(3.0, 55.5, 2) == pytest.approx([29.25, 55.5])
    assert spaced_rates(2.0, 10.0, 4) == pytest.approx([4.0, 6.0, 8.0, 10.0])
    assert spaced_rates(10.0, 2.0, 2) == pytest.approx([6.0, 10.0])       # rising, whichever run measured more
    with pytest.raises(ValueError, match="no rate to sweep"):
        spaced_rates(0.0, 0.0, 3)


def test_a_spec_is_settled_within_the_limits():
    spec = settled(points=3, prompt_tokens=8, max_new_tokens=[4, 6])
    assert spec.modes == ["sync", "async"] and spec.duration_s == 10.0 and spec.requests is None
    assert spec.max_concurrency == LIMITS.max_load_concurrency and spec.drain_s == 30.0
    assert isinstance(spec.seed, int) and spec.runs_per_mode == 5
    assert spec.slo == SLO() and spec.slo.ttft_ms == 500 and spec.slo.itl_ms == 50 and spec.slo.target == 0.99
    given = settled(rates=[8, 2, 4], requests=20)
    assert given.rates == [2, 4, 8] and given.points == 3 and given.duration_s is None


def test_the_slos_a_caller_leaves_out_come_from_the_synchronous_run():
    assert settled().slo_from_sync == ["itl_ms", "ttft_ms"]
    assert settled(slo={"ttft_ms": 300}).slo_from_sync == ["itl_ms"]
    assert settled(slo={"ttft_ms": None, "itl_ms": 40}).slo_from_sync == []     # null: not checked, not derived
    assert settled(slo_from_sync=[]).slo_from_sync == []
    again = SweepSpec.model_validate(settled(slo={"ttft_ms": 300}).model_dump()).within(LIMITS)
    assert again.slo_from_sync == ["itl_ms"] and again.slo.ttft_ms == 300     # a settled spec settles the same
    assert [round_up(v) for v in (37.2, 111, 1234, 0.53, 50)] == [38, 120, 1300, 0.53, 50]
    slo, record = derive_slo(SLO(), ["ttft_ms", "itl_ms"], ttft_p99=37.2, itl_p99=None)
    assert slo.ttft_ms == 120 and slo.itl_ms == 50        # 3 x 37.2 = 111.6 -> 120; no gap measured: kept
    assert record == {"ttft_ms": {"from_p99_ms": 37.2, "factor": 3.0, "slo_ms": 120},
                      "itl_ms": {"from_p99_ms": None, "factor": 2.0, "slo_ms": 50.0}}


@pytest.mark.parametrize("body, reason", [
    ({"points": 0}, "points"),
    ({"points": -2}, "points"),
    ({"rates": [0]}, "rates.0"),
    ({"rates": [2, -1]}, "rates.1"),
    ({"rates": []}, "rates"),
    ({"slo": {"ttft_ms": 0}}, "slo.ttft_ms"),
    ({"slo": {"itl_ms": -5}}, "slo.itl_ms"),
    ({"slo": {"e2e_ms": 0}}, "slo.e2e_ms"),
    ({"slo": {"target": 1.5}}, "slo.target"),
    ({"modes": []}, "modes"),
    ({"modes": ["sync", "sync"]}, "each mode once"),
    ({"modes": ["fast"]}, "modes.0 must be"),
    ({"duration_s": 0}, "duration_s"),
    ({"requests": 0}, "requests"),
    ({"max_concurrency": 0}, "max_concurrency"),
    ({"arrival": "gamma"}, "arrival must be"),
    ({"rate": 3}, "rate"),                          # a load's field: refused, not silently ignored
])
def test_bad_sweep_specs_say_why(body, reason):
    with pytest.raises(ValidationError) as e:
        SweepSpec(**body)
    assert reason in validation_reason(e.value)


@pytest.mark.parametrize("body, reason", [
    ({"points": 7}, "points 7 is over the limit of 6"),
    ({"rates": [600]}, "rate 600 req/s is over the limit of 500"),
    ({"rates": [300], "duration_s": 10}, "3,000 requests, over the limit of 2,000 per point"),
    ({"duration_s": 61}, "over the limit of 60 s"),
    ({"requests": 2001}, "requests 2001 is over the limit"),
    ({"max_concurrency": 9}, "max_concurrency 9 is over the limit of 8"),
    ({"points": 6, "duration_s": 30}, "over the limit of 300 s for one sweep"),
    ({"points": 2, "rates": [1, 2, 3]}, "points 2 but 3 rates"),
    ({"max_new_tokens": 513}, "over the limit"),
])
def test_over_limit_sweeps_are_bad_input(body, reason):
    with pytest.raises(ValueError, match=reason):
        settled(**body)


# -------------------------------------------------------------------------------------- a point's figures

def timing(ttft_ms, *gaps_ms, error=None) -> RequestTiming:
    if error:
        return RequestTiming(sent_ns=0, error=error)
    t, chunks = ttft_ms * MS, [(ttft_ms * MS, 1)]
    for g in gaps_ms:
        t += g * MS
        chunks.append((t, 1))
    return RequestTiming(sent_ns=0, chunks=chunks, finish_ns=t, prompt_tokens=4)


def test_slo_attainment_and_goodput_on_known_timings():
    slo = SLO(ttft_ms=100, itl_ms=20, e2e_ms=None)
    good = timing(50, 10, 10)                       # TTFT 50, mean gap 10: meets both
    late = timing(150, 10)                          # TTFT over
    slow = timing(50, 50, 50)                       # mean gap 50 over the ITL SLO
    one = timing(80)                                # one token: no gap to judge, meets the ITL SLO
    failed = timing(0, error="boom")
    f = point_figures([good, late, slow, one, failed], 0, 2000 * MS, slo, cancelled=3, skipped=1, cut=1)
    # judged: the 5 that ended, the skipped arrival and the one cut at the drain bound; the 2 cancelled at a
    # stop are left out
    assert f["slo_attainment"] == pytest.approx(2 / 7)
    assert f["goodput_rps"] == pytest.approx(2 / 2.0)
    assert f["requests_per_s"] == pytest.approx(4 / 2.0) and f["completed"] == 4 and f["failed"] == 1
    assert f["sent"] == 8 and f["cancelled"] == 3 and f["skipped"] == 1
    assert f["ttft_ms"]["p50"] == pytest.approx(65.0) and f["ttft_ms"]["n"] == 4
    assert f["tpot_ms"]["n"] == 3 and f["itl_ms"]["n"] == 5
    assert f["output_tokens"] == 3 + 2 + 3 + 1 and f["output_tokens_per_s"] == pytest.approx(4.5)
    # an E2E SLO fails the long ones too
    assert point_figures([good, slow], 0, 1000 * MS, SLO(ttft_ms=None, itl_ms=None, e2e_ms=80))["slo_attainment"] \
        == pytest.approx(0.5)
    # nothing judged: no attainment rather than a made-up one
    assert point_figures([], 0, MS, slo)["slo_attainment"] is None


def test_meets_slo_edges():
    slo = SLO(ttft_ms=100, itl_ms=20, e2e_ms=500)
    assert meets_slo({"ttft_ms": 100, "tpot_ms": 20, "e2e_ms": 500}, slo)          # at the limit is within
    assert not meets_slo({"ttft_ms": None, "tpot_ms": None, "e2e_ms": 10}, slo)    # never produced a token
    assert meets_slo({"ttft_ms": 5, "tpot_ms": None, "e2e_ms": 10}, slo)
    assert meets_slo({"ttft_ms": 9e9, "tpot_ms": 9e9, "e2e_ms": 9e9}, SLO(ttft_ms=None, itl_ms=None))


def test_point_values_keep_the_raw_values_aligned_and_capped():
    ts = [timing(10 + i, 5, 5) for i in range(30)]
    for i, t in enumerate(ts):
        t.request_id = f"req-{i}"
    v = point_values(ts)
    assert v["ttft_ms"] == [10.0 + i for i in range(30)] and len(v["itl_ms"]) == 60
    assert v["request_id"] == [f"req-{i}" for i in range(30)]
    assert v["n"] == {"ttft_ms": 30, "tpot_ms": 30, "e2e_ms": 30, "itl_ms": 60}
    capped = point_values(ts, cap=7)
    assert len(capped["itl_ms"]) == 7 and capped["n"]["itl_ms"] == 60 and len(capped["ttft_ms"]) == 7
    assert capped["ttft_ms"] == sorted(capped["ttft_ms"])            # a sample, kept in order
    # sampled together: each kept request keeps its own TTFT beside its id
    assert all(f"req-{int(ttft) - 10}" == rid for ttft, rid in zip(capped["ttft_ms"], capped["request_id"]))
    # every gap with the id of its own request, also when sampled
    assert v["itl_request_id"] == [f"req-{i}" for i in range(30) for _ in range(2)]
    assert len(capped["itl_request_id"]) == 7 and set(capped["itl_request_id"]) <= set(v["request_id"])
    ts[3].chunks[2] = (ts[3].chunks[2][0] + 99 * MS, 1)             # one slow gap: its id is req-3's
    ts[3].finish_ns += 99 * MS
    slow = point_values(ts)
    assert slow["itl_request_id"][slow["itl_ms"].index(max(slow["itl_ms"]))] == "req-3"


def curve(rps, lat, kinds=None):
    kinds = kinds or ["synchronous", *["constant"] * (len(rps) - 2), "throughput"]
    rates = [None if k != "constant" else float(i) for i, k in enumerate(kinds)]
    return [{"index": i, "kind": k, "offered_rate": r, "requests_per_s": x, "output_tokens_per_s": 10 * x,
             "ttft_ms": {"p50": y, "p99": 2 * y}, "e2e_ms": {"p50": y, "p99": y}, "slo_attainment": a}
            for i, (k, r, x, y, a) in enumerate(zip(kinds, rates, rps, lat, [1, 1, 0.995, 0.9, 0.5]))]


def test_the_knee_is_where_latency_turns_up():
    pts = curve([1, 2, 3, 4, 4.2], [10, 11, 12, 15, 60])
    assert knee(pts, "ttft_ms") == 3
    assert knee(curve([1, 2, 3, 4, 5], [10, 10.5, 11, 11, 12]), "ttft_ms") is None     # it never turns up
    assert knee(pts[:2], "ttft_ms") is None                                           # too few points
    s = curve_summary(pts, target=0.99)
    assert s["knees"]["ttft_ms"]["p50"]["index"] == 3 and s["knees"]["ttft_ms"]["p50"]["offered_rate"] == 3.0
    assert s["slo_max"]["index"] == 2 and s["slo_max"]["requests_per_s"] == 3
    assert s["slo_exit"]["index"] == 3                  # the lowest load below the target
    assert curve_summary(pts, target=0.4)["slo_exit"] is None
    assert s["slo_none_why"] is None


def test_when_no_rate_meets_the_slos_the_summary_says_why():
    pts = curve([1, 2, 3, 4, 4.2], [10, 11, 12, 15, 60])
    for p in pts:
        p["slo_attainment"] = 0.2
        p["tpot_ms"] = {"p50": 150.0, "p90": 170.0, "p99": 180.0}
    s = curve_summary(pts, 0.99, SLO(ttft_ms=500, itl_ms=50))
    assert s["slo_max"] is None
    assert s["slo_none_why"] == ("no rate met ITL p99 ≤ 50 ms: the lowest load (0: synchronous) had ITL p99 "
                                 "180 ms")
    both = none_met_why({**pts[0], "ttft_ms": {"p99": 812.0}}, SLO(ttft_ms=500, itl_ms=50), 0.99)
    assert both.startswith("no rate met TTFT p99 ≤ 500 ms and ITL p99 ≤ 50 ms: ") and "TTFT p99 812 ms" in both
    within = none_met_why({**pts[0], "tpot_ms": {"p99": 10.0}}, SLO(ttft_ms=500, itl_ms=50), 0.99)
    assert within.startswith("no rate had 99% of its requests meet the SLOs: the lowest load (0: synchronous) had 20%")


# ---------------------------------------------------------------------------------------- whole sweeps

def sweeps(engine=None, telemetry=None):
    eng = engine or ScriptedEngine(step_s=0.001)
    mgr = BurstManager(eng, LIMITS, vocab_size=49152, telemetry=telemetry or ScriptedTelemetry())
    return eng, mgr, Sweeps(mgr)


def ended(sw, sweep_id, timeout=60):
    run = sw.get(sweep_id)
    assert run.ended.wait(timeout), "the sweep did not end"
    return run.status()


SMALL = {"prompt_tokens": [4, 8], "max_new_tokens": [3, 5], "seed": 5, "warm_up": False}


def test_a_sweep_runs_sync_throughput_then_rising_rates_in_each_mode():
    eng, mgr, sw = sweeps()
    started = sw.start(SweepSpec(points=3, requests=12, **SMALL))
    assert started.points_total == 10
    st = ended(sw, started.sweep_id)
    assert st.state == "done" and st.stop_reason is None and st.error is None
    assert list(st.modes) == ["sync", "async"] and st.points_done == 10 and st.current is None
    assert eng.modes[:2] == ["sync", "async"] and eng.mode == "async"           # the mode it found is back
    for mode, c in st.modes.items():
        pts = c.points
        assert [p.kind for p in pts] == ["synchronous", "throughput", "constant", "constant", "constant"]
        assert [p.index for p in pts] == list(range(5)) and {p.mode for p in pts} == {mode}
        assert pts[0].offered_rate is None and pts[1].offered_rate is None
        assert pts[0].concurrency == 1 and pts[1].concurrency == LIMITS.max_load_concurrency
        rates = [p.offered_rate for p in pts[2:]]
        assert rates == sorted(rates) and len(set(rates)) == 3
        assert rates == pytest.approx(spaced_rates(pts[0].requests_per_s, pts[1].requests_per_s, 3))
        for p in pts:
            assert p.complete
            assert p.sent + p.skipped == 12 and p.completed == p.sent and p.failed == p.cancelled == 0
            assert p.busy_pct == 42.0 and p.ttft_ms.p50 > 0 and p.ttft_ms.p50 <= p.ttft_ms.p99
            assert 0 <= p.slo_attainment <= 1 and not p.mode_moved
        assert c.summary.slo_target == 0.99
    doc = sw.get(started.sweep_id).document()
    jsonschema.validate(doc, SCHEMA)
    assert len(doc["modes"]["sync"]["distributions"]) == 5
    assert len(to_csv(doc).splitlines()) == 1 + 10
    mgr.close()


def test_every_point_in_both_modes_sends_the_same_prompts_in_the_same_order():
    eng, mgr, sw = sweeps()
    st = ended(sw, sw.start(SweepSpec(points=1, requests=6, **SMALL)).sweep_id)
    spec = st.spec
    stream = prompt_stream(spec, 49152)
    expected = [(p.prompt, p.max_new_tokens, p.seed) for p, _ in zip(stream, range(6))]
    for mode in ("sync", "async"):
        sent = [(p, s.max_new_tokens, s.seed) for m, p, s in eng.submitted if m == mode]
        counts = [p.sent for p in st.modes[mode].points]
        assert sum(counts) == len(sent)
        at = 0
        for n in counts:                            # each point starts the stream again
            assert sorted(sent[at:at + n]) == sorted(expected[:n])
            at += n
    mgr.close()


def test_a_sweep_holds_the_engine_and_locks_the_mode_until_it_ends():
    gate = threading.Event()
    eng, mgr, sw = sweeps(ScriptedEngine(gate=gate))
    sid = sw.start(SweepSpec(points=1, requests=2, **SMALL)).sweep_id
    for start in (lambda: mgr.start_burst(BurstSpec(num_requests=1)), lambda: mgr.start_ab(BurstSpec()),
                  lambda: mgr.start_load(LoadSpec()), lambda: sw.start(SweepSpec(**SMALL))):
        with pytest.raises(EngineTaken, match=sid):
            start()
    with pytest.raises(ModeLocked, match="sweep"):
        mgr.set_mode("sync")
    assert sid in mgr.mode_lock()
    gate.set()
    assert ended(sw, sid).state == "done"
    assert mgr.mode_lock() is None
    mgr.set_mode("sync")
    # and a sweep waits for nothing: it is refused while another run goes on
    eng.gate = threading.Event()
    bid = mgr.start_burst(BurstSpec(num_requests=1, max_new_tokens=1))
    with pytest.raises(EngineTaken, match="burst"):
        sw.start(SweepSpec(**SMALL))
    eng.gate.set()
    while mgr.burst(bid).state == "running":
        time.sleep(0.01)
    mgr.close()


def test_a_stopped_sweep_keeps_what_it_ran_and_loses_no_request():
    eng, mgr, sw = sweeps(ScriptedEngine(step_s=0.01))
    sid = sw.start(SweepSpec(points=2, duration_s=30, max_new_tokens=400, prompt_tokens=4, seed=1,
                             warm_up=False)).sweep_id
    run = sw.get(sid)
    while not (run.current and run.current.in_flight):
        time.sleep(0.01)
    t0 = time.monotonic()
    st = sw.stop(sid)
    assert time.monotonic() - t0 < 5
    assert st.state == "done" and st.stop_reason == "stopped" and st.current is None
    (p,) = st.modes["sync"].points
    assert p.kind == "synchronous" and not p.complete
    assert p.sent == p.completed + p.failed + p.cancelled and p.cancelled >= 1
    assert "async" not in st.modes and eng.mode == "async"
    assert sw.stop(sid).stop_reason == "stopped"        # again: harmless
    mgr.close()


def test_a_point_gives_what_is_in_flight_its_drain_bound_then_cuts_it():
    eng, mgr, sw = sweeps(ScriptedEngine(step_s=0.01))
    st = ended(sw, sw.start(SweepSpec(modes=["async"], rates=[50], duration_s=0.2, drain_s=0.1, prompt_tokens=4,
                                      max_new_tokens=60, seed=2, warm_up=False, max_concurrency=8)).sweep_id)
    for p in st.modes["async"].points:
        assert p.complete and p.cancelled >= 1 and p.completed == 0
        assert p.sent == p.cancelled and p.slo_attainment == 0.0       # cut requests count as misses
    mgr.close()


def test_shutdown_stops_a_sweep():
    eng, mgr, sw = sweeps(ScriptedEngine(step_s=0.01))
    sid = sw.start(SweepSpec(points=1, duration_s=30, max_new_tokens=400, prompt_tokens=4, warm_up=False)).sweep_id
    while not sw.get(sid).current:
        time.sleep(0.01)
    mgr.close(timeout=10)
    st = sw.get(sid).status()
    assert st.state == "done" and st.stop_reason == "shutdown"
