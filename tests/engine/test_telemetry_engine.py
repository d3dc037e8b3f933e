"""Telemetry on the real engine (tiny-random on CPU): the story a user sees, switching modes under load."""
from __future__ import annotations

import asyncio
import json

import pytest

from batchscope.engine import HOST_PHASES, EngineConfig, SamplingParams
from batchscope.telemetry import Telemetry, load_timeline, to_perfetto

Engine = pytest.importorskip("batchscope.engine.engine").Engine


@pytest.fixture(scope="module")
def served():
    """One engine with telemetry attached: a burst in async, a switch to sync, a burst, a switch back."""
    eng = Engine(EngineConfig(model="tiny-random", device="cpu", dtype="float32", num_blocks=128,
                              max_batch_tokens=128))
    tel = Telemetry(eng, nvml_hz=20.0)
    prompts = [[(7 * i + j) % 400 + 3 for j in range(5 + 3 * i)] for i in range(4)]
    params = SamplingParams(max_new_tokens=9, ignore_eos=True)
    outputs = list(eng.generate(prompts, params))
    eng.set_mode("sync")
    outputs += eng.generate(prompts[:3], params)
    eng.set_mode("async")
    outputs += eng.generate(prompts[1:], SamplingParams(max_new_tokens=5, ignore_eos=True))
    yield eng, tel, outputs
    tel.close()
    eng.close()


def test_records_are_complete_and_consistent_on_the_real_engine(served):
    _, tel, outputs = served
    tl = load_timeline(json.dumps(tel.timeline()))          # through JSON and the loader's checks
    steps = tl["steps"]
    assert [r["step"] for r in steps] == sorted({r["step"] for r in steps})
    for rec in steps:
        spans = [rec["cpu"][p] for p in HOST_PHASES]
        assert all(s <= e for s, e in spans)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), f"step {rec['step']} spans out of order"
        assert "gpu" not in rec and rec["compute_basis"] == "host" and rec["compute_us"] == rec["cpu"]["launch"]
        assert rec["num_requests"] == len(rec["request_ids"]) > 0
    assert all(r["gpu_idle_before_us"] is not None for r in steps[1:])
    by_id = {r["id"]: r for r in tl["requests"]}
    for out in outputs:
        req = by_id[out.id]
        assert req["output_tokens"] == len(out.token_ids) == len(req["token_us"])
        assert req["finish_reason"] == out.finish_reason == "length"
        assert req["arrival_us"] <= req["first_token_us"] <= req["finish_us"]
    assert sum(r["tokens_out"] for r in steps) == sum(len(o.token_ids) for o in outputs)
    assert tel.status()["observer_errors"] == 0


def test_both_modes_and_the_switches_are_recorded(served):
    _, tel, _ = served
    tl = tel.timeline()
    modes = [r["mode"] for r in tl["steps"]]
    assert {"sync", "async"} <= set(modes)
    assert [(c["from"], c["to"]) for c in tl["mode_changes"]] == [("async", "sync"), ("sync", "async")]
    for change in tl["mode_changes"]:
        after = [r for r in tl["steps"] if r["step"] >= change["step"]]
        assert after and after[0]["mode"] == change["to"]
    sync_steps = [r for r in tl["steps"] if r["mode"] == "sync"]
    assert all(r["built_during_step"] is None for r in sync_steps)
    overlapped = [r for r in tl["steps"] if r["mode"] == "async" and r["built_during_step"] is not None]
    assert overlapped and all(r["built_during_step"] == r["step"] - 1 for r in overlapped)


def test_summary_status_and_perfetto_on_the_real_engine(served):
    _, tel, _ = served
    s = tel.summary()
    assert s["steps"] == len(tel.recorder.steps) and 0 < s["busy_pct"] <= 100
    assert s["tokens_per_s"] > 0 and s["requests_finished"] == len(served[2]) == 10 and s["busy_basis"] == "host"
    status = tel.status()
    assert status["device"] == "cpu" and status["sampler"] == "psutil" and status["nvml"] is False
    trace = json.loads(json.dumps(to_perfetto(tel.timeline())))
    named = {(e["pid"], e["tid"]) for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert all((e["pid"], e["tid"]) in named for e in trace["traceEvents"] if e["ph"] != "M")
    assert all("ts" in e and "dur" in e for e in trace["traceEvents"] if e["ph"] == "X")


def test_a_live_viewer_sees_the_engine_switch():
    async def main():
        eng = Engine(EngineConfig(model="tiny-random", device="cpu", dtype="float32", num_blocks=128,
                                  max_batch_tokens=128, mode="sync"))
        tel = Telemetry(eng, nvml_hz=0)
        sub = tel.hub.subscribe()
        hello = tel.hello()
        assert hello["mode"] == "sync" and hello["info"]["model"] == "tiny-random"
        params = SamplingParams(max_new_tokens=6, ignore_eos=True)
        await asyncio.to_thread(eng.generate, [[5, 6, 7], [8, 9]], params)
        eng.set_mode("async")
        await asyncio.to_thread(eng.generate, [[5, 6, 7]], params)
        seen: dict[str, list] = {}
        while "mode" not in seen or len([s for m in seen.get("steps", []) for s in m["steps"]]) < eng.stats()["steps"]:
            for msg in await asyncio.wait_for(sub.get(), timeout=10):
                seen.setdefault(msg["type"], []).append(msg)
        (mode,) = seen["mode"]
        assert (mode["from"], mode["to"]) == ("sync", "async") and isinstance(mode["step"], int)
        sub.close()
        tel.close()
        assert tel._observer not in eng.observers
        eng.close()

    asyncio.run(main())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_traces_report_their_own_steps_kv_usage_and_sync_ones_wait_for_the_next_launch(mode):
    """In sync a step's trace is built after the next step is launched (so observers run while the device
    computes); in async the next step is built before this one is consumed. Either way a trace reports the KV
    usage its own step ran with, not that of the step built since."""
    eng = Engine(EngineConfig(model="tiny-random", device="cpu", dtype="float32", mode=mode, num_blocks=64,
                              max_batch_tokens=64, block_size=16))
    runner = eng.runner
    launched = []
    launch = runner.launch
    runner.launch = lambda batch: launched.append(batch.plan.step) or launch(batch)
    seen = []
    eng.add_observer(lambda ev: seen.append((ev.step, ev.kv_blocks_used, len(launched)))
                     if hasattr(ev, "kv_blocks_used") else None)
    try:
        out = eng.generate([list(range(3, 17))], SamplingParams(max_new_tokens=6, ignore_eos=True))[0]
    finally:
        eng.close()
    assert len(out.token_ids) == 6
    # 14 prompt tokens fill one 16-slot block; the decode of position 16 (the 4th step) takes a second block
    assert [kv for _, kv, _ in seen] == [1, 1, 1, 2, 2, 2]
    first = seen[0][0]
    for step, _, launches in seen[:-1]:
        # sync: delivered once step + 1 was launched; async: step + 1 was launched before step was consumed
        assert launches == step - first + 2


def test_a_step_names_whose_prompt_tokens_it_computed():
    """Chunked prefill beside decodes on the real engine: a step with prefill says whose prompt tokens they were
    (adding up to its prefill tokens; its other requests decoded one token each), and a prompt longer than the
    token budget is split over steps whose parts add up to the prompt."""
    eng = Engine(EngineConfig(model="tiny-random", device="cpu", dtype="float32", num_blocks=64,
                              max_batch_tokens=32))
    tel = Telemetry(eng, nvml_hz=0)
    prompts = [list(range(3, 9)), list(range(10, 80))]
    try:
        outs = eng.generate(prompts, SamplingParams(max_new_tokens=6, ignore_eos=True))
        tl = load_timeline(json.dumps(tel.timeline()))
    finally:
        tel.close()
        eng.close()
    prefilled: dict[str, int] = {}
    for s in tl["steps"]:
        by = s.get("prefill_tokens_by_request", {})
        assert ("prefill_tokens_by_request" in s) == (s["prefill_tokens"] > 0)
        assert sum(by.values()) == s["prefill_tokens"] and set(by) <= set(s["request_ids"])
        assert s["decode_tokens"] == s["num_requests"] - len(by)
        for rid, n in by.items():
            prefilled[rid] = prefilled.get(rid, 0) + n
    assert [prefilled[o.id] for o in outs] == [len(p) for p in prompts]
    long_id = outs[1].id
    assert sum(long_id in s.get("prefill_tokens_by_request", {}) for s in tl["steps"]) >= 3
