"""Memory stays flat over hours of serving: every buffer telemetry keeps is bounded."""
from __future__ import annotations

import gc
import types

from batchscope.engine.trace import StepTrace
from batchscope.telemetry import Telemetry
from synthetic import SyntheticEngine


def feed(tel: Telemetry, first: int, count: int) -> None:
    """Synthetic steps 10 µs of host work apart: one request arrives, gets its token and finishes each step, and
    one more arrives that the engine never finishes (a leak telemetry must not copy)."""
    base = tel.origin_ns
    for n in range(first, first + count):
        t = base + n * 100_000
        host = {"schedule": (t, t + 10_000), "fill": (t + 10_000, t + 20_000), "launch": (t + 20_000, t + 60_000),
                "wait": (t + 60_000, t + 61_000), "update": (t + 61_000, t + 70_000)}
        tel._observer(StepTrace(
            step=n, mode="async" if n % 2 else "sync", slot=n % 2, request_ids=[f"r{n}", f"ghost{n}"],
            prefill_tokens=8, decode_tokens=1, sampled=2, carried=0, kv_blocks_used=n % 50, kv_blocks_total=64,
            queue_depth=n % 7, running=2, host=host, arrivals=[(f"r{n}", t, 8), (f"ghost{n}", t, 8)],
            tokens=[(f"r{n}", 1), (f"ghost{n}", 1)], finished=[(f"r{n}", "length", 8, 1)]))


def held_objects(root, apart=(), kinds=None) -> int:
    """How many objects `root` holds, directly or through its buffers and records. Code, classes and modules are
    shared with the whole process and not followed, so what other threads allocate is not counted; nor are the
    objects in `apart` (bounded on their own terms)."""
    shared = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.CodeType,
              types.MethodDescriptorType, types.WrapperDescriptorType)
    seen, stack = {id(a) for a in apart}, [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, shared):
            continue
        seen.add(id(obj))
        if kinds is not None:
            kinds[type(obj).__name__] = kinds.get(type(obj).__name__, 0) + 1
        stack.extend(gc.get_referents(obj))
    return len(seen)


def test_the_ring_stays_bounded_over_100000_steps():
    tel = Telemetry(SyntheticEngine(gpu=False), nvml_hz=0, ring_steps=2000, ring_requests=500,
                    hub_max_pending=4000)
    tel.recorder.max_active = 1000
    stalled = tel.hub.subscribe(max_queue=8)          # a viewer that never reads
    feed(tel, 0, 50_000)
    # every buffer is full by now: from here on, any record, list or dict that stays alive is a leak
    tel.hub.flush()
    before: dict = {}
    mid = held_objects(tel, apart=[tel.hub], kinds=before)
    feed(tel, 50_000, 50_000)
    tel.hub.flush()
    after: dict = {}
    end = held_objects(tel, apart=[tel.hub], kinds=after)
    rec = tel.recorder
    assert rec.steps_seen == 100_000 and tel.status()["observer_errors"] == 0
    assert len(rec.steps) == 2000 and rec.steps[-1]["step"] == 99_999
    assert len(rec.requests) == 500 and rec.requests[-1]["id"] == "r99999"
    assert len(rec.active) <= rec.max_active and rec.evicted_active >= 100_000 - rec.max_active
    # the hub's frames depend on when its sender last ran, so it is held to its own bounds instead
    assert len(tel.hub._pending) <= tel.hub._pending.maxlen
    assert stalled.queued() <= 8
    # the walk sees the rings themselves (each step record is a dict of lists) ...
    assert mid > 2000 * 5
    # ... and a leak of even one small container per ten steps would add 5,000 (the margin: in a full test run,
    # threads other tests left behind allocate too, and a couple of thousand of their objects were once reachable)
    grown = {k: after[k] - before.get(k, 0) for k in after if after[k] > before.get(k, 0)}
    assert end - mid < 5_000, f"telemetry holds {end - mid} more objects after the last 50,000 steps: {grown}"
    tl = tel.timeline()
    assert len(tl["steps"]) == 2000 and tl["summary"]["steps"] == 2000
    tel.close()


def test_a_recording_stops_storing_at_its_cap_and_says_so():
    tel = Telemetry(SyntheticEngine(gpu=False), nvml_hz=0, max_recording_steps=300)
    tel.start_recording("long")
    feed(tel, 0, 1000)
    tel.stop_recording()
    rec = tel.recorder.recordings["long"]
    assert len(rec.steps) == 300 and rec.dropped["steps"] == 700
    assert tel.timeline("long")["meta"]["recording"]["dropped"]["steps"] == 700
    tel.close()


def test_only_the_newest_recordings_are_kept():
    tel = Telemetry(SyntheticEngine(gpu=False), nvml_hz=0)
    for i in range(12):
        tel.start_recording(f"run{i}")
        feed(tel, i * 10, 10)
    tel.stop_recording()
    assert tel.recordings() == [f"run{i}" for i in range(4, 12)]
    tel.close()
