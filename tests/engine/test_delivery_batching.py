"""A step's deltas reach an event loop in one wakeup (issue #41): the engine thread makes one call_soon_threadsafe
a step and loop, not one a token a request, and every reader still gets every token, in order."""
from __future__ import annotations

import asyncio
import threading

from batchscope.engine import SamplingParams
from batchscope.engine.request import RequestHandle, StepDeliveries, TokenDelta


class CountingLoop:
    """Counts the loop's call_soon_threadsafe calls and how many deltas each one carried."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.calls = loop, []
        real = loop.call_soon_threadsafe

        def counted(cb, *args, **kw):
            self.calls.append(len(args[0]) if args and isinstance(args[0], list) else 1)
            return real(cb, *args, **kw)
        loop.call_soon_threadsafe = counted


def test_a_step_of_eight_streams_wakes_their_loop_once():
    handles = [RequestHandle(f"r{i}", engine=None) for i in range(8)]

    async def main():
        counting = CountingLoop(asyncio.get_running_loop())
        streams = [h.astream() for h in handles]
        firsts = [asyncio.ensure_future(s.__anext__()) for s in streams]
        await asyncio.sleep(0)          # every reader subscribed

        def step(tokens, finished):
            batch = StepDeliveries()
            for h, tok in zip(handles, tokens):
                h.deliver(TokenDelta([tok], "", finished, "length" if finished else None), batch=batch)
            batch.flush()
        t = threading.Thread(target=lambda: (step(range(8), False), step(range(8, 16), True)))
        t.start()
        t.join()
        got = [[(await f).token_ids] for f in firsts]
        for s, seen in zip(streams, got):
            async for d in s:
                seen.append(d.token_ids)
        return counting.calls, got

    calls, got = asyncio.run(main())
    assert calls == [8, 8]                          # two steps, one wakeup each
    assert got == [[[i], [8 + i]] for i in range(8)]
    assert all(h.done for h in handles)


def test_a_closed_loop_drops_its_readers_not_the_step():
    gone, kept = RequestHandle("gone", engine=None), RequestHandle("kept", engine=None)
    dead = asyncio.new_event_loop()
    gone._async_targets.append((dead, asyncio.Queue()))
    dead.close()
    batch = StepDeliveries()
    gone.deliver(TokenDelta([1], ""), batch=batch)
    kept.deliver(TokenDelta([2], ""), batch=batch)
    batch.flush()
    assert gone._async_targets == []
    assert next(iter(kept)).token_ids == [2]        # a thread reader is not batched


def test_engine_wakes_a_loop_once_a_step_and_every_token_arrives_in_order(tiny_engine):
    params = [SamplingParams(max_new_tokens=16, temperature=0.8, seed=i, ignore_eos=True) for i in range(8)]
    prompts = [[5 + i, 6, 7, 8 + i] for i in range(8)]

    async def main():
        counting = CountingLoop(asyncio.get_running_loop())
        handles = [tiny_engine.submit(p, q) for p, q in zip(prompts, params)]

        async def read(h):
            ids, text = [], ""
            async for d in h.astream():
                ids += d.token_ids
                text += d.text
            return ids, text
        got = await asyncio.gather(*(read(h) for h in handles))
        return counting.calls, got, [h.result(10) for h in handles]

    calls, got, outs = asyncio.run(main())
    for (ids, text), out in zip(got, outs):
        assert ids == out.token_ids and len(ids) == 16
        assert text == out.text
    deltas = sum(calls)
    assert deltas == 8 * 16                         # one delta a token, the last one with the finish
    assert len(calls) <= 16 + 8                     # one wakeup a step (requests may join on different steps)
    assert max(calls) == 8                          # a step of all eight is one wakeup


def test_a_reader_behind_gets_the_waiting_deltas_as_one_and_an_error_alone():
    def read(deltas, coalesce):
        h = RequestHandle("r", engine=None, detokenize=lambda ids: "".join(chr(97 + i % 26) for i in ids))
        for d in deltas:
            h.deliver(d)                # waiting before the reader subscribes: it is a step or more behind

        async def main():
            return [d async for d in h.astream(coalesce=coalesce)]
        return asyncio.run(main())

    lp = dict(logprobs=[-0.5], top_logprobs=[[(1, -0.5)]])
    deltas = [TokenDelta([0], "", **lp), TokenDelta([1], "", **lp), TokenDelta([2], "", True, "length", **lp)]
    one_by_one, joined = read(deltas, False), read(deltas, True)
    assert [d.token_ids for d in one_by_one] == [[0], [1], [2]]
    (d,) = joined
    assert d.token_ids == [0, 1, 2] and d.finished and d.finish_reason == "length"
    assert d.logprobs == [-0.5] * 3 and d.top_logprobs == [[(1, -0.5)]] * 3
    assert d.text == "".join(x.text for x in one_by_one) == "abc"

    failing = [TokenDelta([0], ""), TokenDelta([1], ""), TokenDelta([], "", True, "error", "boom")]
    got = read(failing, True)
    assert [(d.token_ids, d.finish_reason) for d in got] == [([0, 1], None), ([], "error")]
