"""Load generation without a model: burst and load specs, arrival processes, lengths, metrics, and bursts,
A/B runs and continuous loads against a scripted engine."""
import asyncio
import random
import statistics
import threading
import time

import pytest

from pydantic import ValidationError

from batchscope.app.loadtest.manager import BurstManager
from batchscope.app.loadtest.client_timing import LatencySample, LoadTally, RequestTiming, burst_metrics
from batchscope.app.loadtest.arrivals import arrival_offsets, plan_burst, request_stream
from batchscope.app.loadtest.refusals import BusyError, ModeLocked, validation_reason
from batchscope.app.loadtest.specs import BurstSpec, Limits, LoadSpec
from batchscope.engine.request import TokenDelta

LIMITS = Limits(max_prompt_tokens=512, max_new_tokens=64, max_burst_requests=50, max_concurrent_bursts=2)


class ScriptedHandle:
    """Streams `n` one-token deltas, one per `step_s`, like an engine would."""

    def __init__(self, engine, n, step_s, fail):
        self.engine, self.n, self.step_s, self.fail = engine, n, step_s, fail
        self.cancelled = False

    async def astream(self):
        with self.engine.lock:
            self.engine.live += 1
            self.engine.most_live = max(self.engine.most_live, self.engine.live)
        try:
            async for d in self._stream():
                yield d
        finally:
            with self.engine.lock:
                self.engine.live -= 1

    async def _stream(self):
        if self.fail:
            yield TokenDelta([], "", finished=True, finish_reason="error", error="scripted failure")
            return
        for i in range(self.n):
            await asyncio.sleep(self.step_s)
            if self.cancelled:
                yield TokenDelta([], "", finished=True, finish_reason="cancelled")
                return
            last = i == self.n - 1
            yield TokenDelta([7], "x", finished=last, finish_reason="length" if last else None)

    def cancel(self):
        self.cancelled = True


class ScriptedEngine:
    def __init__(self, step_s=0.001, fail_every=0, gate: threading.Event | None = None):
        self.mode = "async"
        self.step_s, self.fail_every, self.gate = step_s, fail_every, gate
        self.submitted = []               # (mode, prompt, params)
        self.modes = []
        self.lock = threading.Lock()
        self.live = 0                     # requests streaming now, and the most there ever were
        self.most_live = 0

    def set_mode(self, mode, reason=None):
        self.modes.append(mode)
        self.mode = mode

    def submit(self, prompt, params):
        if self.gate is not None:
            self.gate.wait(10)
        with self.lock:
            self.submitted.append((self.mode, list(prompt), params))
            n = len(self.submitted)
        fail = self.fail_every and n % self.fail_every == 0
        handle = ScriptedHandle(self, params.max_new_tokens, self.step_s, fail)
        handle.id = f"req-{n}"            # the engine's id, as its request records name it
        return handle


class ScriptedTelemetry:
    def __init__(self):
        self.windows = []

    def now_us(self):
        return time.perf_counter_ns() / 1000

    def summary(self, t0, t1):
        self.windows.append((t0, t1))
        return {"busy_pct": 42.0}

    def wait_finished(self, request_ids, timeout_s=2.0):
        self.waited_for = list(request_ids)
        return True


def wait_state(get, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        d = get()
        if d.state != "running":
            return d
        time.sleep(0.01)
    raise AssertionError(f"still running: {d}")


# ----------------------------------------------------------------------------------------------- pure functions

def test_burst_arrivals_all_at_zero():
    assert arrival_offsets(5, "burst", 10.0, 1.0, random.Random(0)) == [0.0] * 5


def test_poisson_mean_gap_follows_rate():
    offs = arrival_offsets(4001, "poisson", 20.0, 1.0, random.Random(1))
    gaps = [b - a for a, b in zip(offs, offs[1:])]
    assert offs[0] == 0.0 and all(g >= 0 for g in gaps)
    assert statistics.mean(gaps) == pytest.approx(1 / 20.0, rel=0.1)


def test_gamma_burstiness_changes_spread_not_mean():
    def gaps(b):
        offs = arrival_offsets(4001, "gamma", 10.0, b, random.Random(2))
        return [y - x for x, y in zip(offs, offs[1:])]

    bursty, regular = gaps(0.25), gaps(8.0)
    assert statistics.mean(bursty) == pytest.approx(0.1, rel=0.15)
    assert statistics.mean(regular) == pytest.approx(0.1, rel=0.15)
    def cv(g):                          # coefficient of variation: 1 for exponential gaps
        return statistics.pstdev(g) / statistics.mean(g)
    assert cv(bursty) > 1.5 and cv(regular) < 0.5


def settled(**fields) -> BurstSpec:
    """A spec as the server runs it: checked by the model, then against the limits."""
    return BurstSpec(**fields).within(LIMITS)


def test_same_seed_same_burst_and_lengths_in_range():
    spec = settled(num_requests=20, prompt_tokens=[5, 9], max_new_tokens=[3, 6], arrival="poisson", rate=50, seed=11)
    a, b = plan_burst(spec, 49152), plan_burst(spec, 49152)
    assert [(p.offset_s, p.prompt, p.max_new_tokens, p.seed) for p in a] == \
           [(p.offset_s, p.prompt, p.max_new_tokens, p.seed) for p in b]
    assert all(5 <= len(p.prompt) <= 9 and 3 <= p.max_new_tokens <= 6 for p in a)
    assert all(1000 <= t < 49152 for p in a for t in p.prompt)
    other = plan_burst(spec.model_copy(update={"seed": 12}), 49152)
    assert [p.prompt for p in other] != [p.prompt for p in a]


def test_spec_without_seed_or_lengths_gets_them_within_the_limits():
    spec = settled(num_requests=2)
    assert isinstance(spec.seed, int)
    assert spec.prompt_tokens == (32, 128) and spec.max_new_tokens == (32, 64)     # the default, cut to the limit
    assert settled(prompt_tokens=7).prompt_tokens == (7, 7)                       # one number: a fixed length


@pytest.mark.parametrize("body, reason", [
    ({"num_requests": 0}, "num_requests"),
    ({"num_requests": 2.5}, "num_requests"),
    ({"prompt_tokens": [10, 5]}, "greater than max"),
    ({"prompt_tokens": [1]}, "[min, max]"),
    ({"max_new_tokens": [0, 4]}, "max_new_tokens: min must be at least 1"),
    ({"arrival": "uniform"}, "arrival must be"),
    ({"arrival": "poisson", "rate": 0}, "rate"),
    ({"burstiness": float("nan")}, "burstiness"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"seed": -1}, "seed"),
    ({"temperature": 5}, "temperature"),
    ({"bogus": 1}, "bogus"),
])
def test_bad_specs_say_why(body, reason):
    with pytest.raises(ValidationError) as e:
        BurstSpec(**body)
    assert reason in validation_reason(e.value)


@pytest.mark.parametrize("body", [{"num_requests": 51}, {"prompt_tokens": [1, 513]}, {"max_new_tokens": 65}])
def test_over_limit_specs_are_bad_input_not_busy(body):
    with pytest.raises(ValueError, match="over the limit") as e:
        settled(**body)
    assert not isinstance(e.value, BusyError)


def test_lengths_past_the_models_context_are_refused():
    with pytest.raises(ValueError, match="context of 100 tokens"):
        BurstSpec(prompt_tokens=[10, 60], max_new_tokens=50).within(LIMITS, max_model_len=100)


def test_metrics_from_known_timings():
    ms = 1_000_000
    a = RequestTiming(sent_ns=0, chunks=[(10 * ms, 1), (20 * ms, 1), (40 * ms, 2)], finish_ns=40 * ms,
                      prompt_tokens=8)
    b = RequestTiming(sent_ns=0, error="boom")
    m = burst_metrics([a, b], 0, 1000 * ms)
    assert m["completed"] == 1 and m["failed"] == 1 and m["output_tokens"] == 4
    assert m["ttft_ms"]["p50"] == pytest.approx(10.0)
    assert m["e2e_ms"]["p50"] == pytest.approx(40.0)
    assert m["tpot_ms"]["p50"] == pytest.approx(10.0)          # 30 ms over 3 further tokens
    # gaps: 10 ms for one token, then 20 ms for a chunk of two -> 10, 10, 10
    assert m["itl_ms"]["p99"] == pytest.approx(10.0) and m["itl_ms"]["mean"] == pytest.approx(10.0)
    assert m["output_tokens_per_s"] == pytest.approx(4.0)
    assert m["requests_per_s"] == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------ running the bursts

def test_burst_runs_to_done_with_results():
    eng, tel = ScriptedEngine(), ScriptedTelemetry()
    mgr = BurstManager(eng, LIMITS, vocab_size=49152, telemetry=tel)
    spec = BurstSpec(num_requests=8, prompt_tokens=[4, 6], max_new_tokens=[3, 5], arrival="poisson", rate=500,
                     seed=3)
    bid = mgr.start_burst(spec)
    d = wait_state(lambda: mgr.burst(bid))
    assert d.state == "done" and d.done == d.total == 8
    r = d.results
    assert r.completed == 8 and r.busy_pct == 42.0 and len(tel.windows) == 1
    # the window is taken once telemetry holds every request's finish: the manager names them all
    assert sorted(tel.waited_for) == sorted(f"req-{n}" for n in range(1, 9))
    for stats in (r.ttft_ms, r.tpot_ms, r.itl_ms, r.e2e_ms):
        assert stats.n > 0 and stats.p50 > 0 and stats.p50 <= stats.p90 <= stats.p99
    assert r.output_tokens == sum(p.max_new_tokens for p in plan_burst(spec.within(LIMITS), 49152))
    assert r.output_tokens_per_s > 0 and r.requests_per_s > 0
    assert all(p.ignore_eos and p.seed is not None for _, _, p in eng.submitted)
    mgr.close()


def test_the_raw_values_of_bursts_and_loads_carry_the_engine_ids_of_their_requests():
    eng = ScriptedEngine()
    mgr = BurstManager(eng, LIMITS, vocab_size=100)
    bid = mgr.start_burst(BurstSpec(num_requests=5, seed=2, max_new_tokens=[2, 6]))
    wait_state(lambda: mgr.burst(bid))
    lid = mgr.start_load(LoadSpec(concurrency=2, max_requests=6, max_new_tokens=[2, 6], seed=4))
    wait_state(lambda: mgr.load(lid))
    out = mgr.latest_values()
    ids = {f"req-{n}" for n in range(1, len(eng.submitted) + 1)}
    (_, burst), = out[f"burst {bid}"]
    assert len(burst["request_id"]) == len(burst["ttft_ms"]) == 5 and set(burst["request_id"]) <= ids
    # one id per gap, its own request's: a request of k tokens has k - 1 gaps
    tokens = {rid: eng.submitted[int(rid[4:]) - 1][2].max_new_tokens for rid in burst["request_id"]}
    assert len(burst["itl_request_id"]) == len(burst["itl_ms"])
    assert {rid: burst["itl_request_id"].count(rid) for rid in tokens} == {r: k - 1 for r, k in tokens.items()}
    (_, load), = out[f"load {lid}"]
    for key in ("ttft", "tpot", "itl", "e2e"):
        assert len(load[f"{key}_request_id"]) == len(load[f"{key}_ms"]) > 0
        assert set(load[f"{key}_request_id"]) <= ids - set(burst["request_id"])
    assert len(set(load["e2e_request_id"])) == 6
    mgr.close()


def test_failed_requests_are_counted_and_all_failed_is_an_error():
    mgr = BurstManager(ScriptedEngine(fail_every=2), LIMITS, vocab_size=100)
    bid = mgr.start_burst(BurstSpec(num_requests=6, seed=1, max_new_tokens=2))
    d = wait_state(lambda: mgr.burst(bid))
    assert d.state == "done" and d.results.failed == 3 and d.results.completed == 3
    assert d.results.errors == ["scripted failure"]
    mgr.engine.fail_every = 1
    bid = mgr.start_burst(BurstSpec(num_requests=3, seed=1, max_new_tokens=2))
    d = wait_state(lambda: mgr.burst(bid))
    assert d.state == "error" and "scripted failure" in d.error
    mgr.close()


def test_concurrent_burst_cap_and_unknown_ids():
    gate = threading.Event()
    mgr = BurstManager(ScriptedEngine(gate=gate), LIMITS, vocab_size=100)
    ids = [mgr.start_burst(BurstSpec(num_requests=1, max_new_tokens=1)) for _ in range(2)]
    with pytest.raises(BusyError, match="already running"):
        mgr.start_burst(BurstSpec(num_requests=1))
    with pytest.raises(BusyError, match="engine to itself"):
        mgr.start_ab(BurstSpec(num_requests=1))
    gate.set()
    for i in ids:
        assert wait_state(lambda i=i: mgr.burst(i)).state == "done"
    with pytest.raises(KeyError):
        mgr.burst("b-nope")
    with pytest.raises(KeyError):
        mgr.ab("ab-nope")
    mgr.close()


def test_ab_runs_same_burst_sync_then_async_and_restores_mode():
    eng, tel = ScriptedEngine(), ScriptedTelemetry()
    mgr = BurstManager(eng, LIMITS, vocab_size=49152, telemetry=tel)
    ab = mgr.start_ab(BurstSpec(num_requests=5, prompt_tokens=[3, 8], max_new_tokens=[2, 4], seed=9))
    d = wait_state(lambda: mgr.ab(ab))
    assert d.state == "done", d
    # a short warm-up in each mode, then sync, then async, then the mode it found
    assert eng.modes == ["sync", "async", "sync", "async", "async"] and eng.mode == "async"
    warm, measured = eng.submitted[:4], eng.submitted[4:]
    assert [m for m, _p, _s in warm] == ["sync", "sync", "async", "async"]
    sync = [(p, s.max_new_tokens, s.seed) for m, p, s in measured if m == "sync"]
    asyn = [(p, s.max_new_tokens, s.seed) for m, p, s in measured if m == "async"]
    assert len(sync) == 5 and sorted(sync) == sorted(asyn)
    assert d.sync.completed == d.async_.completed == 5
    assert d.sync.busy_pct == 42.0
    assert d.speedup == pytest.approx(d.async_.output_tokens_per_s / d.sync.output_tokens_per_s)
    assert mgr.burst(d.sync_burst).state == "done"
    assert d.model_dump()["async"] == d.async_.model_dump()        # `async` on the wire
    # while an A/B runs nothing else may start
    eng.gate = threading.Event()
    ab2 = mgr.start_ab(BurstSpec(num_requests=1, max_new_tokens=1))
    with pytest.raises(BusyError, match="A/B"):
        mgr.start_burst(BurstSpec(num_requests=1))
    eng.gate.set()
    assert wait_state(lambda: mgr.ab(ab2)).state == "done"
    mgr.close()


def test_close_cancels_running_bursts():
    eng = ScriptedEngine(step_s=0.01)
    mgr = BurstManager(eng, Limits(max_new_tokens=10_000), vocab_size=100)
    bid = mgr.start_burst(BurstSpec(num_requests=3, max_new_tokens=5000))
    time.sleep(0.05)
    mgr.close(timeout=10)
    d = mgr.burst(bid)
    assert d.state == "error" and d.error == "cancelled"
    with pytest.raises(BusyError, match="shutting down"):
        mgr.start_burst(BurstSpec(num_requests=1))


# ----------------------------------------------------------------------------------------------- continuous loads

def test_load_spec_takes_its_bounds_from_the_limits_unless_asked_for_less():
    spec = LoadSpec(kind="rate", rate=3).within(LIMITS)
    assert spec.duration_s == LIMITS.max_load_duration_s and spec.max_requests == LIMITS.max_load_requests
    assert isinstance(spec.seed, int) and spec.max_new_tokens == (32, 64)
    spec = LoadSpec(duration_s=2.5, max_requests=7).within(LIMITS)
    assert (spec.duration_s, spec.max_requests) == (2.5, 7)
    for over in ({"duration_s": LIMITS.max_load_duration_s + 1}, {"max_requests": LIMITS.max_load_requests + 1},
                 {"concurrency": LIMITS.max_load_concurrency + 1}):
        with pytest.raises(ValueError, match="over the limit") as e:
            LoadSpec(**over).within(LIMITS)
        assert not isinstance(e.value, BusyError)


@pytest.mark.parametrize("body, reason", [
    ({"kind": "forever"}, "kind must be"),
    ({"kind": "rate", "rate": -3}, "rate"),
    ({"concurrency": 0}, "concurrency"),
    ({"duration_s": 0}, "duration_s"),
    ({"max_requests": 0}, "max_requests"),
    ({"arrival": "gamma"}, "arrival must be"),
    ({"max_new_tokens": [9, 3]}, "greater than max"),
    ({"num_requests": 5}, "num_requests"),          # a burst's field: refused, not silently ignored
])
def test_bad_load_specs_say_why(body, reason):
    with pytest.raises(ValidationError) as e:
        LoadSpec(**body)
    assert reason in validation_reason(e.value)


def test_request_stream_is_seeded_endless_and_paced():
    spec = LoadSpec(kind="rate", rate=20, arrival="constant", prompt_tokens=[5, 9], max_new_tokens=[3, 6],
                    seed=4).within(LIMITS)
    a = [next(s) for s in [request_stream(spec, 49152)] for _ in range(50)]
    b = [p for p, _ in zip(request_stream(spec, 49152), range(50))]
    assert [(p.prompt, p.max_new_tokens, p.seed) for p in a] == [(p.prompt, p.max_new_tokens, p.seed) for p in b]
    assert [p.offset_s for p in a] == pytest.approx([i / 20 for i in range(50)])
    assert all(5 <= len(p.prompt) <= 9 and 3 <= p.max_new_tokens <= 6 for p in a)
    poisson = request_stream(spec.model_copy(update={"arrival": "poisson"}), 49152)
    offs = [next(poisson).offset_s for _ in range(4001)]
    assert statistics.mean(b - a for a, b in zip(offs, offs[1:])) == pytest.approx(1 / 20, rel=0.1)


def test_latency_sample_stays_bounded_and_unbiased():
    sample = LatencySample(1000, random.Random(0))
    for v in range(100_000):
        sample.add(float(v))
    assert len(sample.values) == 1000 and sample.seen == 100_000
    p = sample.percentiles()
    assert p["n"] == 100_000 and p["p50"] == pytest.approx(50_000, rel=0.1)


def test_a_latency_sample_keeps_each_value_with_its_id():
    sample = LatencySample(100, random.Random(0))
    for v in range(10_000):
        sample.add(float(v), f"req-{v}")
    assert len(sample.ids) == len(sample.values) == 100
    assert all(rid == f"req-{int(v)}" for v, rid in zip(sample.values, sample.ids))   # replaced together


def test_load_tally_counts_only_the_recent_window_as_recent():
    s = 1_000_000_000
    tally = LoadTally(window_s=10)
    tally.token_chunk(1 * s, 100)                  # long ago
    for i in range(20):
        tally.token_chunk(25 * s + i * s // 10, 5)
    done = RequestTiming(sent_ns=26 * s, chunks=[(26 * s + s // 2, 1)], finish_ns=27 * s, prompt_tokens=3)
    tally.finished(done)
    tally.finished(RequestTiming(sent_ns=26 * s, error="boom"))
    tally.finished(RequestTiming(sent_ns=26 * s), cancelled=True)
    recent = tally.recent(30 * s, 0)
    assert recent["window_s"] == 10 and recent["output_tokens_per_s"] == pytest.approx(100 / 10)
    assert recent["completed"] == 1 and recent["ttft_ms_p50"] == pytest.approx(500)
    assert (tally.completed, tally.failed, tally.cancelled) == (1, 1, 1)
    assert tally.results(0, 30 * s)["e2e_ms"]["p50"] == pytest.approx(1000)


def test_load_keeps_its_concurrency_and_ends_at_its_request_bound():
    eng = ScriptedEngine(step_s=0.002)
    mgr = BurstManager(eng, LIMITS, vocab_size=49152)
    spec = LoadSpec(concurrency=3, max_requests=12, prompt_tokens=[3, 5], max_new_tokens=[2, 6], seed=5)
    lid = mgr.start_load(spec)
    d = wait_state(lambda: mgr.load(lid))
    assert d.state == "done" and d.stop_reason == "max_requests"
    assert d.sent == d.completed == 12 and d.failed == d.cancelled == 0 and d.in_flight == 0
    assert eng.most_live == 3
    # what was sent is the head of the load's seeded stream, whole
    plan = [p for p, _ in zip(request_stream(d.spec, 49152), range(12))]
    assert sorted(p for _m, p, _s in eng.submitted) == sorted(p.prompt for p in plan)
    assert d.output_tokens == sum(p.max_new_tokens for p in plan) == d.results.output_tokens
    mgr.close()


def test_a_rate_load_sends_at_its_rate_until_stopped():
    eng = ScriptedEngine(step_s=0.001)
    mgr = BurstManager(eng, LIMITS, vocab_size=100)
    lid = mgr.start_load(LoadSpec(kind="rate", rate=50, arrival="constant", max_new_tokens=2, seed=1))
    time.sleep(0.5)
    d = mgr.stop_load(lid)
    assert d.state == "done" and d.stop_reason == "stopped"
    # one at 0, then one each 20 ms: a late send catches up at once, so only the last few may be missing
    due = 1 + int(d.elapsed_s * 50)
    assert due - 5 <= d.sent <= due, (d.sent, d.elapsed_s)
    assert d.completed + d.cancelled + d.failed == d.sent and d.failed == 0
    mgr.close()


def test_a_load_ends_at_its_duration_and_cancels_what_is_in_flight():
    eng = ScriptedEngine(step_s=0.05)
    mgr = BurstManager(eng, Limits(max_new_tokens=1000), vocab_size=100)
    t0 = time.monotonic()
    lid = mgr.start_load(LoadSpec(concurrency=2, duration_s=0.4, max_new_tokens=500))
    d = wait_state(lambda: mgr.load(lid), timeout=5)
    assert time.monotonic() - t0 < 2
    assert d.stop_reason == "duration" and d.cancelled == 2 and d.completed == 0 and d.failed == 0
    mgr.close()


def test_one_load_at_a_time_and_no_ab_beside_it():
    mgr = BurstManager(ScriptedEngine(step_s=0.01), LIMITS, vocab_size=100)
    lid = mgr.start_load(LoadSpec(concurrency=1))
    with pytest.raises(BusyError, match="already running"):
        mgr.start_load(LoadSpec())
    with pytest.raises(BusyError, match="stop it first"):
        mgr.start_ab(BurstSpec(num_requests=1))
    assert mgr.running_load() == lid
    mgr.stop_load(lid)
    assert mgr.running_load() is None
    with pytest.raises(KeyError):
        mgr.load("load-nope")
    mgr.close()


def test_a_load_that_only_fails_gives_up():
    mgr = BurstManager(ScriptedEngine(fail_every=1), LIMITS, vocab_size=100)
    lid = mgr.start_load(LoadSpec(concurrency=4))
    d = wait_state(lambda: mgr.load(lid))
    assert d.state == "error" and d.stop_reason == "error" and "scripted failure" in d.error
    assert d.sent < 100
    mgr.close()


def test_switches_during_a_load_are_noted_and_close_ends_it_as_shutdown():
    eng = ScriptedEngine(step_s=0.005)
    mgr = BurstManager(eng, LIMITS, vocab_size=100)
    lid = mgr.start_load(LoadSpec(concurrency=2, max_new_tokens=4))
    assert mgr.set_mode("sync") == "async"
    time.sleep(0.05)
    eng.set_mode("async")                           # behind the manager's back: seen in the stream
    time.sleep(0.05)
    mgr.close()
    d = mgr.load(lid)
    assert d.stop_reason == "shutdown" and d.state == "done"
    assert [(c.previous, c.mode) for c in d.mode_changes] == [("async", "sync"), ("sync", "async")]
    assert d.results.mode is None                   # it spanned both modes


def test_the_mode_is_locked_while_an_ab_runs_and_a_switch_behind_its_back_spoils_it():
    gate = threading.Event()
    eng = ScriptedEngine(step_s=0.002)
    mgr = BurstManager(eng, LIMITS, vocab_size=100)
    eng.gate = gate
    ab = mgr.start_ab(BurstSpec(num_requests=4, max_new_tokens=30, seed=2))
    assert "A/B" in mgr.mode_lock()
    with pytest.raises(ModeLocked, match="A/B comparison"):
        mgr.set_mode("sync")
    gate.set()
    while not (mgr.ab(ab).phase == "sync" and len(eng.submitted) > 4):     # past the warm-up's 4 requests
        time.sleep(0.001)
    eng.set_mode("async")                           # not through the server: nothing could refuse it
    d = wait_state(lambda: mgr.ab(ab))
    assert d.state == "done" and d.valid is False
    assert [(c.phase, c.mode) for c in d.mode_changes] == [("sync", "async")]
    assert mgr.mode_lock() is None and mgr.set_mode("sync") == "async"
    clean_id = mgr.start_ab(BurstSpec(num_requests=2, max_new_tokens=3))
    clean = wait_state(lambda: mgr.ab(clean_id))
    assert clean.valid is True and clean.mode_changes == []
    assert (clean.requests_per_half, clean.half_done, clean.total) == (2, 2, 4)
    mgr.close()
