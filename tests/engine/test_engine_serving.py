"""The engine as a server uses it: seeded sampling, streaming, cancel, stop strings, bad input, failures."""
from __future__ import annotations

import asyncio
import random
import threading

import pytest

from helpers import random_prompts, reference_generate
from batchscope.engine import ConfigError, Engine, EngineConfig, ModeChange, SamplingParams, StepTrace


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return tiny_engine


@pytest.fixture(scope="module")
def qwen(qwen3_checkpoint):
    path, model, eos = qwen3_checkpoint
    eng = Engine(EngineConfig(model=path, device="cpu", dtype="float32", mode="async",
                              num_blocks=96, max_batch_tokens=64, max_running=12, seed=0))
    yield eng, model, eos
    eng.close()


def test_seeded_sampling_is_reproducible_across_runs_modes_and_batch_mates(engine):
    prompt = [5, 6, 7, 8, 9]
    params = SamplingParams(max_new_tokens=12, temperature=0.9, top_p=0.9, top_k=50, seed=1234, ignore_eos=True)
    engine.set_mode("async")
    alone = engine.generate([prompt], params)[0].token_ids
    crowd = random_prompts(6, 49152, 3, 40, seed=2)
    mates = [SamplingParams(max_new_tokens=9, temperature=1.0, seed=i, ignore_eos=True) for i in range(6)]
    engine.set_mode("sync")
    with_mates = engine.generate(crowd[:3] + [prompt] + crowd[3:], mates[:3] + [params] + mates[3:])[3].token_ids
    assert alone == with_mates
    engine.set_mode("async")
    assert engine.generate([prompt], params)[0].token_ids == alone
    other = engine.generate([prompt], SamplingParams(max_new_tokens=12, temperature=0.9, top_p=0.9, top_k=50,
                                                    seed=99, ignore_eos=True))[0].token_ids
    assert other != alone, "a different seed should give a different sample"


def test_top_k_one_is_greedy(engine, tiny_reference):
    prompt = [11, 12, 13]
    out = engine.generate([prompt], SamplingParams(max_new_tokens=8, temperature=1.5, top_k=1, seed=3,
                                                   ignore_eos=True))[0]
    assert out.token_ids == reference_generate(tiny_reference, prompt, 8, None)


def test_streaming_threads_and_asyncio(engine):
    params = SamplingParams(max_new_tokens=10, ignore_eos=True)
    handle = engine.submit("Stream me", params)
    deltas = list(handle)
    out = handle.result()
    assert deltas[-1].finished and deltas[-1].finish_reason == "length"
    assert [t for d in deltas for t in d.token_ids] == out.token_ids
    assert "".join(d.text for d in deltas) == out.text

    async def consume():
        h = engine.submit("Stream me", params)
        return [d async for d in h.astream()], h.result()
    adeltas, aout = asyncio.run(consume())
    assert [t for d in adeltas for t in d.token_ids] == aout.token_ids == out.token_ids


def test_a_finished_requests_text_is_decoded_by_its_reader_not_by_the_engine_loop(engine):
    tok = engine.tokenizer
    decoders = []
    original = tok.decode
    tok.decode = lambda *a, **k: decoders.append(threading.current_thread()) or original(*a, **k)
    try:
        handle = engine.submit([5, 6, 7], SamplingParams(max_new_tokens=9, ignore_eos=True), stream=False)
        out = handle.result(timeout=60)
        assert decoders == []             # finished and delivered without touching the tokenizer
        text = out.text
        assert decoders == [threading.current_thread()]
        assert text == original(out.token_ids, skip_special_tokens=True) and out.text is text
    finally:
        tok.decode = original


def test_stop_string_finishes_and_cuts_text(engine):
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    full = engine.generate(["Tell me"], params)[0]
    stop = engine.tokenizer.decode(full.token_ids[4:6], skip_special_tokens=True).strip()
    assert stop and stop in full.text
    out = engine.generate(["Tell me"], SamplingParams(max_new_tokens=12, ignore_eos=True, stop=(stop,)))[0]
    assert out.finish_reason == "stop"
    assert stop not in out.text and full.text.startswith(out.text)
    assert len(out.token_ids) < 12


def test_stop_strings_are_checked_on_the_new_text_only(engine):
    """The loop checks a request's stop strings every step: it decodes only the newest tokens' text (with a little
    context), not the whole output, which would grow with every token."""
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    full = engine.generate(["Tell me a story"], params)[0]
    stop = engine.tokenizer.decode(full.token_ids[30:32], skip_special_tokens=True).strip()
    assert stop and stop in full.text
    tok = engine.tokenizer
    lengths = []
    original = tok.decode
    tok.decode = lambda ids, *a, **k: lengths.append(len(ids)) or original(ids, *a, **k)
    try:
        handle = engine.submit("Tell me a story", SamplingParams(max_new_tokens=40, ignore_eos=True,
                                                                 stop=(stop, "never in this text \u2603")))
        out = handle.result(timeout=60)
        during = list(lengths)
    finally:
        tok.decode = original
    assert out.finish_reason == "stop" and out.text == full.text[:full.text.find(stop)]
    assert len(out.token_ids) >= 25 and during and max(during) <= 8, during


@pytest.mark.parametrize("prompt, params, message", [
    ("", SamplingParams(), "empty"),
    ([], SamplingParams(), "empty"),
    ([1] * 5000, SamplingParams(), "at most"),
    ("hi", SamplingParams(max_new_tokens=0), "max_new_tokens"),
    ("hi", SamplingParams(temperature=-1.0), "temperature"),
    ("hi", SamplingParams(top_p=0.0), "top_p"),
    ("hi", SamplingParams(top_k=-2), "top_k"),
    ([10 ** 9], SamplingParams(), "token ids"),
    ("hi", SamplingParams(max_new_tokens=4000), "could never run"),
])
def test_bad_requests_fail_alone_and_engine_keeps_serving(engine, prompt, params, message):
    with pytest.raises(ConfigError, match=message):
        engine.submit(prompt, params)
    assert engine.generate(["still here"], SamplingParams(max_new_tokens=3))[0].finish_reason in ("length", "eos")


def test_set_mode_rejects_unknown_and_keeps_the_mode_it_had(engine):
    for mode in ("sync", "async"):
        engine.set_mode(mode)
        with pytest.raises(ConfigError, match="turbo"):
            engine.set_mode("turbo")
        assert engine.mode == mode
        out = engine.generate([[4, 5, 6]], SamplingParams(max_new_tokens=3, ignore_eos=True))[0]
        assert out.finish_reason == "length" and len(out.token_ids) == 3


def test_exception_in_a_step_fails_only_that_steps_requests(engine, monkeypatch):
    runner = engine.runner
    original = runner._compute
    poisoned = {"armed": True}

    def flaky(batch, prev):
        if poisoned["armed"] and any(s.req.id == "victim" for s in batch.plan.seqs):
            poisoned["armed"] = False
            raise RuntimeError("injected device fault")
        return original(batch, prev)

    monkeypatch.setattr(runner, "_compute", flaky)
    victim = engine.submit([1, 2, 3], SamplingParams(max_new_tokens=5), request_id="victim")
    out = victim.result(timeout=60)
    assert out.finish_reason == "error" and "injected device fault" in out.error
    after = engine.generate([[4, 5, 6]], SamplingParams(max_new_tokens=5, ignore_eos=True))[0]
    assert after.finish_reason == "length" and len(after.token_ids) == 5


def test_cancel_in_flight(engine):
    handle = engine.submit([7, 8, 9], SamplingParams(max_new_tokens=3000, ignore_eos=True))
    for delta in handle:
        if len(delta.token_ids) and handle._queue.qsize() == 0:
            break
    handle.cancel()
    out = handle.result(timeout=60)
    assert out.finish_reason == "cancelled"
    assert 0 < len(out.token_ids) < 3000
    assert engine.stats()["running"] == 0


def test_two_hundred_random_requests_with_random_switches_finish_exactly_once(qwen):
    eng, _model, eos = qwen
    rng = random.Random(42)
    finishes: dict[str, list[str]] = {}
    lock = threading.Lock()

    def observe(ev):
        if isinstance(ev, StepTrace):
            with lock:
                for rid, reason, _p, _o in ev.finished:
                    finishes.setdefault(rid, []).append(reason)
    eng.add_observer(observe)
    stop = threading.Event()

    def switch():
        while not stop.is_set():
            eng.set_mode(rng.choice(["sync", "async"]))
            stop.wait(rng.uniform(0.0005, 0.01))
    switcher = threading.Thread(target=switch, daemon=True)
    switcher.start()
    try:
        handles, specs = [], []
        for i in range(200):
            n = rng.randint(1, 20)
            ignore = rng.random() < 0.5
            prompt = [rng.randrange(3, 512) for _ in range(rng.randint(1, 30))]
            handles.append(eng.submit(prompt, SamplingParams(max_new_tokens=n, ignore_eos=ignore,
                                                             temperature=rng.choice([0.0, 0.8]), seed=i)))
            specs.append((n, ignore, rng.random() < 0.1))
        for h, (_n, _ig, cancel) in zip(handles, specs):
            if cancel:
                h.cancel()
        outs = [h.result(timeout=120) for h in handles]
    finally:
        stop.set()
        switcher.join()
        eng.remove_observer(observe)
    for h, out, (n, ignore, cancel) in zip(handles, outs, specs):
        assert finishes.get(out.id) == [out.finish_reason], "every request finishes exactly once"
        assert len(out.token_ids) <= n
        if out.finish_reason == "length":
            assert len(out.token_ids) == n
        elif out.finish_reason == "eos":
            assert not ignore and out.token_ids[-1] == eos and eos not in out.token_ids[:-1]
        else:
            assert out.finish_reason == "cancelled" and cancel
        if out.finish_reason != "eos" and not ignore:
            assert eos not in out.token_ids
    assert eng.stats()["running"] == 0 and eng.stats()["queue"] == 0
    assert eng.stats()["kv_blocks_used"] == 0, "finished requests must give their KV blocks back"


def test_step_traces_show_overlap_only_in_async(engine):
    events = []
    engine.add_observer(events.append)
    try:
        engine.set_mode("async")
        engine.generate([[1, 2, 3], [4, 5, 6, 7]], SamplingParams(max_new_tokens=8, ignore_eos=True))
        engine.set_mode("sync")
        engine.generate([[1, 2, 3], [4, 5, 6, 7]], SamplingParams(max_new_tokens=8, ignore_eos=True))
    finally:
        engine.remove_observer(events.append)
    steps = [e for e in events if isinstance(e, StepTrace)]
    assert any(isinstance(e, ModeChange) and e.to_mode == "sync" for e in events)
    assert [s.step for s in steps] == sorted(s.step for s in steps)
    for s in steps:
        spans = [s.host[k] for k in ("schedule", "fill", "launch", "wait", "update")]
        assert all(a <= b for a, b in spans)
        assert spans[0][1] <= spans[1][0] <= spans[1][1] <= spans[2][0] <= spans[3][0]
    async_steps = [s for s in steps if s.mode == "async"]
    sync_steps = [s for s in steps if s.mode == "sync"]
    assert all(s.built_during_step is None for s in sync_steps)
    overlapped = [s for s in async_steps if s.built_during_step is not None]
    assert overlapped and all(s.built_during_step == s.step - 1 for s in overlapped)
    # async: step N+1 is launched before step N is waited for
    by_step = {s.step: s for s in async_steps}
    for s in overlapped:
        prev = by_step.get(s.step - 1)
        if prev is not None:
            assert s.host["launch"][1] <= prev.host["wait"][0]
    assert sum(s.carried for s in async_steps) > 0 and sum(s.carried for s in sync_steps) == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_out_of_device_memory_fails_that_step_and_the_engine_keeps_serving(engine, tiny_reference, monkeypatch,
                                                                            mode):
    """A huge prefill that runs out of device memory (injected here: CPU has no CUDA allocator) ends its
    requests with "error" and a reason that says what to change; later requests are exact and no KV block leaks."""
    import torch

    runner = engine.runner
    original = runner._compute

    def out_of_memory_on_big_steps(batch, prev):
        if batch.plan.num_tokens > 100:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 40.00 GiB")
        return original(batch, prev)

    engine.set_mode(mode)
    monkeypatch.setattr(runner, "_compute", out_of_memory_on_big_steps)
    huge = engine.submit(list(range(5, 305)), SamplingParams(max_new_tokens=4), request_id=f"huge-{mode}")
    out = huge.result(timeout=60)
    assert out.finish_reason == "error"
    assert "out of device memory" in out.error and "--max-batch-tokens" in out.error and "40.00 GiB" in out.error
    prompts = random_prompts(3, 256, 4, 20, seed=11)
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=6, ignore_eos=True))
    for prompt, o in zip(prompts, outs):
        assert o.token_ids == reference_generate(tiny_reference, prompt, 6, None)
    assert engine.stats()["running"] == 0
    assert engine.scheduler.allocator.num_used == 0


def test_a_generate_call_reaches_the_engine_as_one_batch(engine, monkeypatch):
    """Even when preparing its prompts is slow, one generate call is scheduled as one batch: the first step's
    shapes, and so bf16 rounding, cannot depend on how far the engine thread got meanwhile."""
    import time

    slow = engine._prompt_ids

    def slow_prompt_ids(prompt):
        time.sleep(0.03)                    # long enough for the engine thread to build a step in between
        return slow(prompt)

    monkeypatch.setattr(engine, "_prompt_ids", slow_prompt_ids)
    traces = []

    def keep(event):
        if isinstance(event, StepTrace):
            traces.append(event)

    engine.add_observer(keep)
    try:
        outs = engine.generate([[5, 6, 7, 8]] * 6, SamplingParams(max_new_tokens=3, ignore_eos=True))
    finally:
        engine.remove_observer(keep)
    ids = {o.id for o in outs}
    first = next(t for t in traces if ids & set(t.request_ids))
    assert set(first.request_ids) >= ids


def test_bench_names_runs_whose_tokens_differ_from_the_first():
    from batchscope.app.bench import _digest, disagreeing_runs

    runs = [{"system": "batchscope", "label": "async", "repeat": 0, "tokens_digest": _digest([[1, 2], [3]])},
            {"system": "batchscope", "label": "sync", "repeat": 0, "tokens_digest": _digest([[1, 2], [3]])},
            {"system": "transformers", "label": "tf", "repeat": 0, "tokens_digest": _digest([[9]])},
            {"system": "batchscope", "label": "sync", "repeat": 1, "tokens_digest": _digest([[1, 2], [4]])}]
    assert disagreeing_runs({"runs": runs}) == ["sync#1"]
    assert disagreeing_runs({"runs": runs[:3]}) == []


def test_a_reader_whose_event_loop_closed_does_not_fail_the_others_in_its_step(engine):
    """A client's event loop can close mid-stream (a server worker going away): the engine must treat that reader
    as gone, not fail the step that carried its token, which would end every request in the batch with "error"."""
    long = engine.submit([9, 8, 7], SamplingParams(max_new_tokens=40, ignore_eos=True))
    mates = [engine.submit([4, 5, 6 + i], SamplingParams(max_new_tokens=40, ignore_eos=True)) for i in range(3)]
    loop = asyncio.new_event_loop()

    async def read_one():
        stream = long.astream()
        await stream.__anext__()

    loop.run_until_complete(read_one())
    loop.close()
    for handle in [long] + mates:
        out = handle.result(timeout=60)
        assert out.finish_reason == "length" and len(out.token_ids) == 40, out.error


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_observers_hear_of_a_step_only_once_the_next_step_is_launched(engine, mode):
    """Telemetry never delays a launch: step N's trace reaches the observers after step N+1's launch, in both
    loops. In sync it arrives before the host blocks on N+1, so the observers run while the device computes."""
    import time

    traces, arrived = {}, {}

    def observe(event):
        if isinstance(event, StepTrace):
            traces[event.step], arrived[event.step] = event, time.perf_counter_ns()

    engine.set_mode(mode)
    engine.add_observer(observe)
    try:
        engine.generate([[1, 2, 3], [4, 5, 6, 7]], SamplingParams(max_new_tokens=8, ignore_eos=True))
    finally:
        engine.remove_observer(observe)
    pairs = [(traces[n], traces[n + 1]) for n in traces
             if n + 1 in traces and traces[n].mode == traces[n + 1].mode == mode]
    assert len(pairs) >= 5
    for this, following in pairs:
        assert following.host["launch"][1] <= arrived[this.step]
        if mode == "sync":
            assert arrived[this.step] <= following.host["wait"][0]


def test_a_step_failing_after_its_successor_launched_leaves_the_successors_carry_intact(engine, tiny_reference,
                                                                                      monkeypatch):
    """Async: step N fails while being consumed, after N+1 was launched with a newcomer's first token in it.
    Only N's requests fail; the newcomer's next step still gathers that token from N+1's output on the device."""
    runner = engine.runner
    original = runner.wait
    armed = {"on": True}

    def fail_once(launched):
        ids = {s.req.id for s in launched.batch.plan.seqs}
        newcomer = next((r for r in engine.scheduler.running if r.id == "joins-late"), None)
        if (armed["on"] and "fails-at-update" in ids and "joins-late" not in ids
                and newcomer is not None and newcomer.num_computed > 0):    # the newcomer is in N+1, launched
            armed["on"] = False
            raise RuntimeError("injected fault while consuming")
        return original(launched)

    engine.set_mode("async")
    monkeypatch.setattr(runner, "wait", fail_once)
    victim = engine.submit([1, 2, 3], SamplingParams(max_new_tokens=400, ignore_eos=True),
                           request_id="fails-at-update")
    next(iter(victim))                                  # it is decoding now
    prompt = [4, 5, 6, 7]
    out = engine.submit(prompt, SamplingParams(max_new_tokens=6, ignore_eos=True),
                        request_id="joins-late").result(timeout=60)
    assert not armed["on"], "the fault was never injected"
    assert victim.result(timeout=60).finish_reason == "error"
    assert out.finish_reason == "length", out.error
    assert out.token_ids == reference_generate(tiny_reference, prompt, 6, None)


def test_start_up_objects_are_out_of_the_collectors_walk_while_serving():
    """A full cyclic collection walks every tracked object with the GIL held; over the model and transformers'
    modules (about 370k objects even for the tiny model) that took 186 ms on this CPU, a stall of the engine
    thread and then of the GPU. Frozen at start-up, they are not walked; after close they are collectable again."""
    import gc
    eng = Engine(EngineConfig(model="tiny-random", device="cpu"))
    try:
        walked, frozen = len(gc.get_objects()), gc.get_freeze_count()
        assert frozen > 10 * walked, (frozen, walked)
        out = eng.generate([[5, 6, 7]], SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True))
        assert len(out[0].token_ids) == 4
    finally:
        eng.close()
    assert gc.get_freeze_count() == 0
