"""Answers that follow requests in the engine: server-sent events while tokens come, or the outputs at the end.

Every streamed route (/api/generate, /v1/completions, /v1/chat/completions) goes through `sse_stream`: one loop
over the requests' token deltas, with the route saying only what each event looks like, and (given somewhere to
put them) when each token's chunk was written, for the delivery delay (telemetry/delivery.py).
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from batchscope.engine.request import TokenDelta

DeltaEvent = Callable[[int, TokenDelta, int], dict | None]   # (request index, delta, tokens so far) -> event


def delivery_sink(state) -> Callable[[str, list[int]], None] | None:
    """Where a stream's chunk write times go (sse_stream's `on_sent`): telemetry's recorder joins them with the
    engine's token times into `requests[].sent_us` and the delivery-delay histogram. None without telemetry."""
    recorder = getattr(state.telemetry, "recorder", None)
    return recorder.note_sent if recorder is not None else None


def sse_stream(handles: list, event: DeltaEvent, *, first: dict | None = None,
               last: Callable[[int], dict | None] | None = None,
               on_error: Callable[[TokenDelta], dict] | None = None,
               on_sent: Callable[[str, list[int]], None] | None = None) -> StreamingResponse:
    """Server-sent events for requests as their tokens come: `first`, then `event(...)` for each delta (None
    skips it), then `last(tokens in all)`, then `data: [DONE]`. With `on_error`, a request that fails in the
    engine ends the stream with that event instead (OpenAI clients expect it); without, `event` reports it.
    A client that hangs up cancels the requests still running. With `on_sent`, once the stream ends, each
    request's `(id, write times)`: perf_counter ns at which each of its tokens' chunk was written (a token whose
    delta made no chunk goes with its request's next one; tokens never written have none)."""
    sent: list[list[int]] = [[] for _ in handles]
    unsent = [0] * len(handles)     # tokens of each request whose chunk is not written yet

    async def events() -> AsyncIterator[tuple[int | None, dict]]:
        if first is not None:
            yield None, first
        produced = 0
        async for i, d in merged(handles):
            produced += len(d.token_ids)
            unsent[i] += len(d.token_ids)
            if on_error is not None and d.finished and d.finish_reason == "error":
                yield i, on_error(d)
                return
            ev = event(i, d, produced)
            if ev is not None:
                yield i, ev
        tail = last(produced) if last is not None else None
        if tail is not None:
            yield None, tail

    def written(i: int | None) -> None:
        """The chunk just yielded is written: the ASGI send returned before this generator resumed."""
        t = time.perf_counter_ns()
        for j in range(len(handles)) if i is None else (i,):
            if unsent[j]:
                sent[j].extend([t] * unsent[j])
                unsent[j] = 0

    async def body():
        try:
            async for i, ev in events():
                yield f"data: {json.dumps(ev, separators=(',', ':'))}\n\n"
                if on_sent is not None:
                    written(i)
            yield "data: [DONE]\n\n"
            if on_sent is not None:
                written(None)
        finally:
            if on_sent is not None:
                for handle, times in zip(handles, sent):
                    if times:
                        on_sent(handle.id, times)
    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def final_outputs(handles: list, request: Request) -> list:
    """Wait for requests to finish without holding a thread; cancel them if the client hangs up first."""
    async def one(handle):
        async for d in handle.astream():
            if d.finished:
                break
        # the finishing delta can arrive a moment before the handle marks itself done
        return handle.result(0) if handle.done else await run_in_threadpool(handle.result, 5)

    async def cancel_on_hang_up():
        # the body is read already, so the next message is the disconnect (or the end of the exchange)
        while (await request.receive())["type"] != "http.disconnect":
            pass
        for h in handles:
            h.cancel()

    watcher = asyncio.create_task(cancel_on_hang_up())
    try:
        return await asyncio.gather(*(one(h) for h in handles))
    finally:
        watcher.cancel()


async def merged(handles: list) -> AsyncIterator[tuple[int, Any]]:
    """(index, TokenDelta) from several requests as they come; cancels the unfinished ones if abandoned."""
    try:
        if len(handles) == 1:
            async for d in handles[0].astream(coalesce=True):     # a writer a step behind catches up at once
                yield 0, d
            return
        q: asyncio.Queue = asyncio.Queue()

        async def pump(i, h):
            async for d in h.astream(coalesce=True):
                await q.put((i, d))
        tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]
        try:
            left = len(handles)
            while left:
                i, d = await q.get()
                left -= d.finished
                yield i, d
        finally:
            for t in tasks:
                t.cancel()
    finally:
        for h in handles:
            if not h.done:
                h.cancel()
