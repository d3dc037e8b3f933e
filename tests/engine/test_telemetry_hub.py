"""Live fan-out: coalesced frames with the firm message types, drops told to slow viewers, the engine never held up."""
from __future__ import annotations

import asyncio
import gc
import json
import threading
import time

import pytest

from batchscope.telemetry import SCHEMA_ID, Telemetry
from batchscope.telemetry.hub import Hub, SubscriptionClosed
from synthetic import SyntheticEngine


def test_a_viewer_gets_steps_requests_mode_and_stats():
    async def main():
        eng = SyntheticEngine(gpu=True, mode="sync")
        tel = Telemetry(eng, nvml_hz=0, hub_hz=50)
        sub = tel.hub.subscribe(max_queue=1000)

        def serve():                 # the engine runs on its own thread, as the real one does
            eng.submit(3, prompt_tokens=16, max_new_tokens=4)
            eng.run(max_steps=2)
            eng.set_mode("async")
            eng.run()

        worker = threading.Thread(target=serve)
        worker.start()
        by_type: dict[str, list] = {}
        while True:
            for msg in await asyncio.wait_for(sub.get(), timeout=10):
                by_type.setdefault(msg["type"], []).append(msg)
            steps = [s for m in by_type.get("steps", []) for s in m["steps"]]
            finished = [r for m in by_type.get("requests", []) for r in m["requests"] if r["state"] == "finished"]
            if (len(steps) == eng.step_no and len(finished) == 3 and "mode" in by_type and "stats" in by_type
                    and "board" in by_type):
                break
        worker.join()
        assert set(by_type) <= {"steps", "requests", "nvml", "mode", "stats", "board"}
        board = by_type["board"][-1]
        assert board["scope"] == "live" and set(board["modes"]) == {"sync", "async"}
        assert board["compare"]["verdict"] == "not enough steps"        # a handful of steps prove nothing
        assert [s["step"] for s in steps] == list(range(eng.step_no))
        (mode,) = by_type["mode"]
        assert set(mode) == {"type", "t_us", "step", "from", "to"}
        assert (mode["from"], mode["to"]) == ("sync", "async") and mode["step"] == 2
        assert all(len(r["token_us"]) == r["output_tokens"] == 4 for r in finished)
        stats = by_type["stats"][-1]
        # the engine's counters under the names /api/status uses for them too
        assert {"t_us", "mode", "queue", "running", "kv_blocks_used", "kv_blocks_total", "kv_usage", "tokens_per_s",
                "busy_pct_1s"} <= set(stats)
        assert stats["kv_usage"] == stats["kv_blocks_used"] / stats["kv_blocks_total"]
        sub.close()
        tel.close()

    asyncio.run(main())


def test_hello_gives_a_new_viewer_something_to_draw():
    eng = SyntheticEngine(gpu=False, mode="sync", realtime=True)
    tel = Telemetry(eng, nvml_hz=0)
    eng.submit(2, prompt_tokens=8, max_new_tokens=3)
    eng.run()
    tel.sampler.sample_once()
    hello = json.loads(json.dumps(tel.hello()))
    assert hello["type"] == "hello" and hello["schema"] == SCHEMA_ID
    assert hello["model"] == "synthetic" and hello["info"]["block_size"] == 16 and hello["mode"] == "sync"
    assert {"nvml", "nvml_reason", "gpu_name", "device", "sampler", "busy_note"} <= set(hello["status"])
    assert hello["status"]["sampler"] == "psutil" and hello["status"]["nvml"] is False
    recent = hello["recent"]
    assert [s["step"] for s in recent["steps"]] == list(range(eng.step_no))
    assert recent["nvml"] and len(recent["requests"]) == 2
    assert hello["t_us"] > 0
    tel.close()


def test_a_slow_viewer_loses_its_oldest_frames_and_is_told_how_many():
    hub = Hub(start=False)
    sub = hub.subscribe(max_queue=2)
    for i in range(5):
        hub.publish("step", {"step": i})
        hub.flush()
        assert sub.queued() <= 2
    msgs = sub.get_nowait()
    assert msgs[0] == {"type": "dropped", "frames": 3, "total_frames": 3}
    assert msgs[1] == {"type": "steps", "steps": [{"step": 3}]}
    assert sub.get_nowait() == [{"type": "steps", "steps": [{"step": 4}]}]     # told once
    assert sub.get_nowait() is None
    hub.close()


def test_get_text_is_the_same_frame_encoded_once():
    async def main():
        hub = Hub(start=False)
        a, b = hub.subscribe(), hub.subscribe()
        hub.publish("mode", {"t_us": 1.0, "step": 7, "from": "async", "to": "sync"})
        hub.publish("step", {"step": 7})
        hub.flush()
        texts, msgs = await a.get_text(), await b.get()
        assert [json.loads(t) for t in texts] == msgs
        assert msgs[0] == {"type": "mode", "t_us": 1.0, "step": 7, "from": "async", "to": "sync"}
        hub.close()

    asyncio.run(main())


def test_closing_ends_a_waiting_viewer():
    async def main():
        hub = Hub(hz=50)
        sub = hub.subscribe()
        waiter = asyncio.ensure_future(sub.get())
        await asyncio.sleep(0.05)
        await asyncio.to_thread(hub.close)
        with pytest.raises(SubscriptionClosed):
            await asyncio.wait_for(waiter, timeout=5)
        assert [m async for m in sub] == []
        assert hub.subscribers == 0

    asyncio.run(main())


def produce(tel: Telemetry, steps: int) -> float:
    eng = tel.engine
    eng.submit(16, prompt_tokens=16, max_new_tokens=steps)
    start = time.perf_counter()
    eng.run(max_steps=steps)
    return time.perf_counter() - start


def test_a_stalled_viewer_does_not_slow_the_engine():
    steps = 1500
    # Both runs are timed on the wall clock: a full collection of the test process's heap (hundreds of ms after
    # the browser tests) landing in one of them would be measured as the viewer's cost, so it waits.
    gc.collect()
    gc.disable()
    try:
        base = Telemetry(SyntheticEngine(gpu=True, mode="sync"), nvml_hz=0, hub_hz=200)
        produce(base, 50)                                  # warm up
        alone = produce(base, steps)
        base.close()

        tel = Telemetry(SyntheticEngine(gpu=True, mode="sync"), nvml_hz=0, hub_hz=200)
        stalled = tel.hub.subscribe(max_queue=4)           # subscribed, never reads
        produce(tel, 50)
        with_stalled = produce(tel, steps)
    finally:
        gc.enable()
    tel.hub.flush()
    assert with_stalled < 3 * alone + 0.5, (alone, with_stalled)
    assert tel.status()["steps_seen"] == steps + 50
    for _ in range(8):                  # more frames than its queue holds, however fast the steps ran
        produce(tel, 2)
        tel.hub.flush()
    assert stalled.queued() <= 4 and stalled.dropped_frames > 0
    tel.close()


def test_even_a_viewer_that_blocks_the_hub_does_not_block_the_engine():
    tel = Telemetry(SyntheticEngine(gpu=True, mode="sync"), nvml_hz=0, hub_hz=200)
    frozen = tel.hub.subscribe(max_queue=4)
    frozen._lock.acquire()                             # so stuck that the flusher itself blocks offering to it
    try:
        time.sleep(0.05)                               # let the flusher reach it
        produce(tel, 1000)
        assert tel.status()["steps_seen"] == 1000      # every step recorded while the hub hung
        assert len(tel.hub._pending) <= tel.hub._pending.maxlen
    finally:
        frozen._lock.release()
    tel.close()


def test_the_pending_buffer_is_bounded_when_nothing_drains_it():
    hub = Hub(start=False, max_pending=100)
    for i in range(1000):
        hub.publish("step", {"step": i})
    assert len(hub._pending) == 100 and hub.pending_overflow == 900
    hub.close()


def test_an_idle_engine_makes_one_frame_a_second_and_new_work_goes_out_at_once():
    """Only sampler records for longer than idle_s: one frame per idle_s carrying every held sample and the stats.
    A step makes the very next flush send a frame, and the flushes after it stay at full rate."""
    hub = Hub(start=False, hz=20, idle_s=0.2, stats=lambda: {"queue": 0})
    sub = hub.subscribe()
    frames = []
    deadline = time.monotonic() + 1.0
    t = 0
    while time.monotonic() < deadline:
        hub.publish("nvml", {"t_us": t})
        t += 1
        frame = hub.flush()
        if frame is not None:
            frames.append(frame)
        time.sleep(0.01)
    assert 3 <= len(frames) <= 7, len(frames)                 # ~1 s / 0.2 s, not one per flush (~60)
    samples = [s["t_us"] for f in frames for m in f.messages if m["type"] == "nvml" for s in m["samples"]]
    assert samples == list(range(len(samples))) and len(samples) >= t - 25     # held, not dropped
    assert all(any(m["type"] == "stats" for m in f.messages) for f in frames)
    hub.publish("step", {"step": 1})
    frame = hub.flush()
    assert frame is not None and any(m["type"] == "steps" for m in frame.messages)
    hub.publish("nvml", {"t_us": -1})
    assert hub.flush() is not None                           # still active: every flush sends
    hub.close()
    del sub


def test_viewers_together_hold_at_most_the_cap_and_a_stalled_one_resumes_on_recent_frames():
    """Fifty viewers, ten of them stalled (joining at different times), frames of 50 KB: the frames held for all
    of them together stay under the one cap, and a stalled viewer that resumes skips to frames of the last
    `max_lag_s`, after a dropped notice and a catch-up that says what it had read."""
    cap, lag = 1 << 20, 0.05
    calls = []
    hub = Hub(start=False, max_queue_bytes=cap, max_lag_s=lag, clock=time.monotonic,
              catch_up=lambda since, step: calls.append((since, step)) or {"steps": []})
    readers = [hub.subscribe() for _ in range(40)]
    stalled = []
    pad = "x" * 50_000
    for i in range(120):
        if i % 10 == 0 and len(stalled) < 10:
            stalled.append(hub.subscribe())
        hub.publish("step", {"step": i, "t": time.monotonic(), "pad": pad})
        hub.flush()
        for r in readers[:-1] if i >= 60 else readers:      # the last reader stops after step 59
            while r.get_nowait() is not None:
                pass
        assert hub.status()["queued_bytes"] <= cap + 60_000, i
        time.sleep(0.01)
    newest = time.monotonic()
    assert all(r.dropped_frames == 0 for r in readers[:-1])
    batch = stalled[0].get_nowait()
    assert batch[0]["type"] == "dropped" and batch[0]["frames"] > 100
    assert batch[1] == {"type": "catch_up", "steps": []}
    (step,) = batch[2]["steps"]
    assert newest - step["t"] <= lag + 0.03, (newest - step["t"], step["step"])      # recent, not stale
    assert calls[-1][1] is None                         # it had read no step
    batch = readers[-1].get_nowait()
    assert batch[0]["type"] == "dropped" and batch[2]["steps"][0]["step"] > 100
    assert calls[-1][1] == 59                           # the catch-up starts after the last step it read
    assert hub.status()["catch_ups"] == 2
    hub.close()


class Page:
    """What the page keeps of the feed (assets/js/feed.js): steps in order, each request's latest state, switches."""

    def __init__(self):
        self.steps, self.requests, self.switches, self.types = [], {}, set(), []

    def take(self, msgs: list) -> None:
        for m in msgs:
            self.types.append(m["type"])
            for rec in m.get("steps") or []:
                if not self.steps or rec["step"] > self.steps[-1]:
                    self.steps.append(rec["step"])
            for rec in m.get("requests") or []:
                self.requests[rec["id"]] = rec
            if m["type"] == "mode":
                self.switches.add((m["step"], m["to"]))
            for c in m.get("mode_changes") or []:
                self.switches.add((c["step"], c["to"]))


def test_a_viewer_that_fell_behind_catches_up_on_requests_and_switches():
    """A viewer that skipped frames must not keep requests that finished in them as running, nor miss a switch:
    the catch-up carries every request finished since its last frame, those running, and the switches."""
    eng = SyntheticEngine(gpu=False, mode="sync")
    tel = Telemetry(eng, nvml_hz=0, hub_hz=0.2)          # flushed by hand below
    sub = tel.hub.subscribe(max_queue=3)
    page = Page()
    eng.submit(2, prompt_tokens=8, max_new_tokens=2)
    eng.run()
    tel.hub.flush()
    while (msgs := sub.get_nowait()) is not None:
        page.take(msgs)
    read_up_to = page.steps[-1]
    for i in range(12):                                 # frames it does not read
        if i == 6:
            eng.set_mode("async")
        eng.submit(2, prompt_tokens=8, max_new_tokens=3)
        eng.run(max_steps=2)
        tel.hub.flush()
    eng.run()
    tel.hub.flush()
    first = sub.get_nowait()
    assert [m["type"] for m in first[:2]] == ["dropped", "catch_up"]
    catch_up = first[1]
    assert catch_up["gap"] is None or catch_up["gap"]["first_step"] == read_up_to + 1
    page.take(first)
    while (msgs := sub.get_nowait()) is not None:
        page.take(msgs)
    finished = {r["id"] for r in tel.recorder.requests}
    assert len(finished) == 26 and set(page.requests) == finished
    assert all(page.requests[rid]["state"] == "finished" for rid in finished)
    assert all(len(page.requests[rid]["token_us"]) == page.requests[rid]["output_tokens"] for rid in finished)
    assert {(c["step"], c["to"]) for c in tel.recorder.mode_changes} <= page.switches
    assert page.steps[-1] == tel.recorder.last_step
    tel.close()


def test_a_catch_up_sends_the_live_edge_and_names_the_gap():
    """Steps 0-99 end 0.1 s apart up to now: a viewer that read up to step 40 gets the last 2 s of steps (79-99),
    told that 41-78 are a gap; requests finished since its last frame and those running; switches since then."""
    from types import SimpleNamespace

    from batchscope.telemetry.catchup import catch_up

    now = 10e6
    steps = [{"step": n, "cpu": {"schedule": [now - (99 - n) * 1e5 - 50, now - (99 - n) * 1e5]}} for n in range(100)]
    done = [{"id": f"r{n}", "finish_us": now - (9 - n) * 1e6, "token_us": [1.0], "output_tokens": 1} for n in range(10)]
    running = [{"id": "r10", "finish_us": None, "first_token_us": 5.0, "token_us": [5.0]}]
    rec = SimpleNamespace(steps=steps, last_step=99, requests=done, active_requests=lambda: running, rank_steps=[],
                          nvml=[{"t_us": now - 3e6}, {"t_us": now - 0.5e6}],
                          mode_changes=[{"t_us": now - 6e6, "step": 40, "from": "sync", "to": "async"},
                                        {"t_us": now - 1e6, "step": 90, "from": "async", "to": "sync"}])
    body = catch_up(rec, now, since_us=now - 4.5e6, after_step=40)
    assert [s["step"] for s in body["steps"]] == list(range(79, 100))
    assert body["gap"] == {"first_step": 41, "last_step": 78, "steps": 38}
    assert [(r["id"], r["state"]) for r in body["requests"]] == [(f"r{n}", "finished") for n in range(5, 10)] + \
        [("r10", "decoding")]
    assert [m["step"] for m in body["mode_changes"]] == [90]
    assert body["nvml"] == [{"t_us": now - 0.5e6}]
    assert catch_up(rec, now, since_us=now, after_step=99)["gap"] is None and \
        catch_up(rec, now, since_us=now, after_step=99)["steps"] == []
