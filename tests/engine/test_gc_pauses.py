"""Garbage-collector pauses as an idle cause (telemetry.gc_pauses, telemetry.idle): a collection that stops the
engine thread inside a GPU idle gap is named "gc", ahead of the host phase it interrupted, and shows up in a real
engine's timeline."""
from __future__ import annotations

import gc
import time

from batchscope.engine import Engine, EngineConfig, SamplingParams, StepTrace
from batchscope.telemetry import Telemetry, validate_timeline
from batchscope.telemetry.gc_pauses import CollectorPauses
from batchscope.telemetry.idle import IdleAttributor


def test_a_collection_takes_precedence_over_the_host_phase_it_interrupted():
    idle = IdleAttributor()
    idle.attribute({}, None, [0.0, 5.0], None)                 # the previous step's compute ended at 5
    idle.note("gc", [20.0, 35.0])                                # a collection inside this step's fill
    idle.note("gc", [1.0, 3.0])                                  # one before the gap: not in it
    cpu = {"schedule": [5.0, 15.0], "fill": [15.0, 50.0], "launch": [50.0, 55.0]}
    gap, cause, parts = idle.attribute(cpu, None, [55.0, 70.0], None)
    assert gap == 50.0
    assert parts == {"schedule": 10.0, "gc": 15.0, "fill": 20.0, "launch": 5.0}
    assert cause == "fill"
    # a longer collection names the gap
    idle.note("gc", [71.0, 100.0])
    gap, cause, parts = idle.attribute({"schedule": [70.0, 101.0], "launch": [101.0, 102.0]}, None,
                                       [102.0, 110.0], None)
    assert (gap, cause) == (32.0, "gc") and parts == {"schedule": 2.0, "gc": 29.0, "launch": 1.0}
    # before the first request arrived there was nothing to run: that part stays "empty_queue"
    idle.note("gc", [112.0, 130.0])
    gap, cause, parts = idle.attribute({"schedule": [140.0, 141.0], "launch": [141.0, 142.0]}, None,
                                       [142.0, 150.0], empty_until=120.0)
    assert parts == {"empty_queue": 10.0, "gc": 10.0, "host_other": 10.0, "schedule": 1.0, "launch": 1.0}


def test_pauses_are_recorded_on_the_engines_clock_until_closed():
    pauses = CollectorPauses()
    try:
        t0 = time.perf_counter_ns()
        gc.collect()
        t1 = time.perf_counter_ns()
        taken = pauses.take()
        assert any(g == 2 and t0 <= s <= e <= t1 for s, e, g in taken), taken
        assert pauses.take() == []
    finally:
        pauses.close()
    gc.collect()
    assert pauses.take() == []


def test_a_collection_between_steps_is_named_in_the_engines_timeline():
    """Sync mode on CPU, where a step's compute is its launch span: an engine observer runs on the engine thread
    between two launches, inside a gap. One that collects a heap of cycles there stops the engine thread for
    milliseconds: that gap's cause is "gc"."""
    eng = Engine(EngineConfig(model="tiny-random", device="cpu", mode="sync"))
    tel = Telemetry(eng, nvml_hz=1.0)
    spent: list[float] = []
    junk: list = []

    def collect_once(event) -> None:
        if not isinstance(event, StepTrace):
            return
        if event.step == 1:                    # built in an earlier gap than the one the collection lands in
            for _ in range(200_000):
                cell: list = []
                cell.append(cell)              # a cycle: only the collector frees it
                junk.append(cell)
        elif event.step == 3 and not spent:
            junk.clear()
            t = time.perf_counter()
            gc.collect()
            spent.append((time.perf_counter() - t) * 1e6)

    eng.add_observer(collect_once)
    try:
        outs = eng.generate([[5, 6, 7, 8]], SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True))
        assert len(outs[0].token_ids) == 8
        timeline = tel.timeline()
    finally:
        tel.close()
        eng.close()
    validate_timeline(timeline)
    assert spent and spent[0] > 1000, spent                 # a real pause: over a millisecond
    gc_us = [r["idle_by_cause_us"].get("gc", 0.0) for r in timeline["steps"]]
    hit = max(range(len(gc_us)), key=gc_us.__getitem__)
    assert gc_us[hit] >= 0.8 * spent[0], (gc_us, spent)
    assert timeline["steps"][hit]["idle_cause"] == "gc"
    # observers hear of step 3 once step 4 is launched (engine/loop.py), so the collection stalls the host before
    # step 5: that gap, and no other, is the collection's
    assert timeline["steps"][hit]["step"] == 5
