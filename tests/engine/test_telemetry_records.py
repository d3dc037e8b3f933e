"""Step and request records from a synthetic engine: complete, consistent, attributed to the right step."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from batchscope.engine.trace import HOST_PHASES, StepTrace
from batchscope.telemetry import IDLE_CAUSES, Telemetry, validate_timeline
from synthetic import SyntheticEngine

TOL = 0.2   # µs: records are rounded to 0.1 µs


@pytest.fixture
def story(sync_then_async):
    """A sync burst, a live switch to async, an idle pause, a second burst back in sync: story(gpu) -> (eng, tel)."""
    def tell(gpu: bool):
        eng, tel = sync_then_async(gpu, seed=1, requests=6, prompt_tokens=40, max_new_tokens=7)
        eng.idle(5000)
        eng.submit(3, prompt_tokens=16, max_new_tokens=4)
        eng.set_mode("sync")
        eng.run()
        return eng, tel
    return tell


def check_consistent(tl: dict, outputs: dict[str, int]) -> None:
    steps = tl["steps"]
    assert steps, "no steps recorded"
    assert all(b["step"] > a["step"] for a, b in zip(steps, steps[1:])), "steps must increase"
    for rec in steps:
        cpu = rec["cpu"]
        assert set(cpu) == set(HOST_PHASES), f"step {rec['step']} lacks host spans: {sorted(cpu)}"
        prev = None
        for phase in HOST_PHASES:
            s, e = cpu[phase]
            assert s <= e, (rec["step"], phase, cpu[phase])
            if prev is not None:
                assert s >= prev - TOL, f"step {rec['step']}: {phase} starts before the previous phase ended"
            prev = e
        assert rec["num_requests"] == len(rec["request_ids"])
        assert rec["idle_cause"] in (*IDLE_CAUSES, None)
        gpu = rec.get("gpu")
        if gpu is not None:
            for s, e in gpu.values():
                assert s <= e
            assert gpu["h2d"][1] <= gpu["compute"][0] + TOL
            assert gpu["compute"][1] <= gpu["d2h"][0] + TOL
            assert gpu["h2d"][0] >= cpu["schedule"][0] - TOL, "device work before the host built the step"
            assert gpu["d2h"][1] <= cpu["wait"][1] + TOL, "copy ended after the host stopped waiting for it"
            assert rec["compute_us"] == gpu["compute"] and rec["compute_basis"] == "gpu"
        else:
            assert rec["compute_us"] == cpu["launch"] and rec["compute_basis"] == "host"
    by_id = {r["id"]: r for r in tl["requests"]}
    assert set(by_id) == set(outputs)
    for rid, n in outputs.items():
        req = by_id[rid]
        assert req["output_tokens"] == n == len(req["token_us"]), rid
        assert req["token_us"] == sorted(req["token_us"])
        assert req["arrival_us"] <= req["first_token_us"] == req["token_us"][0] <= req["finish_us"]
        assert req["finish_us"] == req["token_us"][-1]
    # every token delivered shows up in exactly one step's tokens_out
    assert sum(r["tokens_out"] for r in steps) == sum(outputs.values())


@pytest.mark.parametrize("gpu", [True, False], ids=["gpu-events", "cpu"])
def test_records_are_complete_and_consistent(gpu, story):
    eng, tel = story(gpu)
    tl = json.loads(json.dumps(tel.timeline()))
    validate_timeline(tl)
    check_consistent(tl, eng.outputs)
    assert {r["mode"] for r in tl["steps"]} == {"sync", "async"}
    assert tel.status()["clock"]["failures"] == 0
    tel.close()


def test_cpu_records_have_no_gpu_key_and_use_the_launch_span(story):
    _, tel = story(gpu=False)
    for rec in tel.timeline()["steps"]:
        assert "gpu" not in rec
        assert rec["compute_basis"] == "host"
        assert rec["compute_us"] == rec["cpu"]["launch"]
    # gaps are still measured, so a CPU demo still shows them
    assert all(r["gpu_idle_before_us"] > 0 for r in tel.timeline()["steps"][1:])
    tel.close()


def test_async_hides_the_gaps_that_sync_opens(sync_then_async):
    _, tel = sync_then_async(True, requests=8, prompt_tokens=32, max_new_tokens=12, sync_steps=6, compute_us=3000)
    steps = tel.timeline()["steps"]
    sync = [r for r in steps if r["mode"] == "sync"][1:]
    overlapped = [r for r in steps if r["mode"] == "async"][1:]   # the first async step follows a drain
    assert all(r["gpu_idle_before_us"] > 50 for r in sync)
    assert all(r["idle_cause"] in HOST_PHASES + ("d2h", "h2d", "telemetry", "host_other") for r in sync)
    assert all(r["gpu_idle_before_us"] == 0 and r["idle_cause"] is None for r in overlapped)
    # each record names the step that overlapped it, so nothing is off by one
    assert all(r["built_during_step"] is None and r["consumed_at_launch"] is None for r in sync)
    assert all(r["built_during_step"] == r["step"] - 1 == r["consumed_at_launch"] for r in overlapped)
    tel.close()


def test_idle_parts_sum_to_the_gap_and_an_empty_queue_is_named(story):
    _, tel = story(gpu=True)
    steps = tel.timeline()["steps"]
    for rec in steps[1:]:
        parts = rec["idle_by_cause_us"]
        assert sum(parts.values()) == pytest.approx(rec["gpu_idle_before_us"], abs=1.0)
        if parts:
            assert rec["idle_cause"] == max(parts, key=parts.get)
    # the second burst arrived after a 5 ms pause with nothing to do
    first_of_burst = next(r for r in steps if any(i in r["request_ids"] for i in ("r6", "r7", "r8")))
    assert first_of_burst["idle_cause"] == "empty_queue"
    assert first_of_burst["idle_by_cause_us"]["empty_queue"] == pytest.approx(5000, abs=5)
    tel.close()


def test_mode_changes_are_recorded_at_the_step_they_take_effect(story):
    _, tel = story(gpu=True)
    tl = tel.timeline()
    changes = tl["mode_changes"]
    assert [(c["from"], c["to"]) for c in changes] == [("sync", "async"), ("async", "sync")]
    for change in changes:
        first = next(r for r in tl["steps"] if r["step"] >= change["step"])
        assert first["step"] == change["step"] and first["mode"] == change["to"]
        before = [r for r in tl["steps"] if r["step"] < change["step"]]
        assert before[-1]["mode"] == change["from"]
        assert before[-1]["cpu"]["update"][1] <= change["t_us"] <= first["cpu"]["schedule"][0]
    tel.close()


def test_a_named_recording_keeps_its_mode_changes_and_viewers_still_hear_them():
    eng = SyntheticEngine(gpu=True, mode="sync", seed=2)
    tel = Telemetry(eng, nvml_hz=0)
    heard = []
    tel.recorder.publish = lambda kind, rec, _orig=tel.recorder.publish: (heard.append(kind), _orig(kind, rec))
    tel.start_recording("switches")
    eng.submit(4, prompt_tokens=16, max_new_tokens=6)
    eng.run(max_steps=3)
    eng.set_mode("async")
    eng.run()
    tel.stop_recording()
    changes = tel.timeline("switches")["mode_changes"]
    assert [(c["from"], c["to"]) for c in changes] == [("sync", "async")]
    assert "mode" in heard
    tel.close()


def test_events_are_read_inside_the_callback(story):
    """The synthetic engine invalidates a step's events right after its trace is delivered (the engine re-records
    them two steps later): reading them late would fail and drop the GPU spans."""
    _, tel = story(gpu=True)
    assert all("gpu" in r for r in tel.timeline()["steps"])
    assert tel.status()["clock"]["failures"] == 0
    tel.close()


class _Pending:
    def elapsed_time(self, other):
        raise RuntimeError("CUDA error: device not ready")


def _trace(step, host, **kw):
    fields = {"step": step, "mode": "sync", "slot": step % 2, "request_ids": ["a"], "prefill_tokens": 0,
              "decode_tokens": 1, "sampled": 1, "carried": 0, "kv_blocks_used": 1, "kv_blocks_total": 8,
              "queue_depth": 0, "running": 1, "host": host}
    return StepTrace(**{**fields, **kw})


def _host(t0_ns):
    spans, t = {}, t0_ns
    for phase in HOST_PHASES:
        spans[phase] = (t, t + 10_000)
        t += 10_000
    return spans


def test_unreadable_events_leave_a_record_without_gpu_and_never_wait():
    eng = SyntheticEngine(gpu=True)
    tel = Telemetry(eng, nvml_hz=0)
    t0 = tel.origin_ns + 1_000_000
    ev = _Pending()
    tr = _trace(0, _host(t0), gpu_events={"h2d": (ev, ev), "compute": (ev, ev), "d2h": (ev, ev)},
                anchor=(ev, t0))
    tel._observer(tr)
    rec = tel.timeline()["steps"][0]
    assert "gpu" not in rec and rec["compute_basis"] == "none" and rec["compute_us"] is None
    status = tel.status()["clock"]
    assert status["failures"] == 1 and "device not ready" in status["last_error"]
    tel.close()


def test_a_failed_step_reported_early_still_exports_in_step_order():
    eng = SyntheticEngine(gpu=False)
    tel = Telemetry(eng, nvml_hz=0)
    t0 = tel.origin_ns + 1_000_000
    tel._observer(_trace(0, _host(t0)))
    # step 2 failed while being built (only schedule ran) and is reported before step 1 is consumed
    tel._observer(_trace(2, {"schedule": (t0 + 200_000, t0 + 210_000)}, error="ValueError: bad plan",
                         request_ids=["b"]))
    tel._observer(_trace(1, _host(t0 + 100_000)))
    tl = json.loads(json.dumps(tel.timeline()))
    validate_timeline(tl)
    assert [r["step"] for r in tl["steps"]] == [0, 1, 2]
    assert tl["steps"][2]["error"] == "ValueError: bad plan" and tl["steps"][2]["compute_us"] is None
    assert tel.status()["out_of_order_steps"] == 1
    tel.close()


def test_a_broken_trace_never_reaches_the_engine():
    eng = SyntheticEngine(gpu=False)
    tel = Telemetry(eng, nvml_hz=0)
    tel._observer(_trace(0, {"schedule": "not a span"}))
    tel._observer(SimpleNamespace(step=1))          # neither StepTrace nor ModeChange: ignored
    status = tel.status()
    assert status["observer_errors"] == 1 and status["last_observer_error"]
    tel.close()


def test_close_detaches_from_the_engine():
    eng = SyntheticEngine(gpu=False)
    tel = Telemetry(eng, nvml_hz=0)
    assert len(eng._observers) == 1
    tel.close()
    assert eng._observers == []
    eng.submit(1, 8, 2)
    eng.run()
    assert tel.timeline()["steps"] == []


def test_attaching_mid_request_still_exports_a_valid_timeline():
    eng = SyntheticEngine(gpu=True, mode="async")
    eng.submit(2, prompt_tokens=8, max_new_tokens=6)
    eng.run(max_steps=3)                               # tokens flowed before anyone was watching
    tel = Telemetry(eng, nvml_hz=0)
    eng.run()
    tl = json.loads(json.dumps(tel.timeline()))
    validate_timeline(tl)
    for req in tl["requests"]:
        assert req["arrival_us"] is None and req["finish_reason"] == "length"
        assert req["output_tokens"] == len(req["token_us"]) < req["output_tokens_engine"] == 6
    tel.close()
