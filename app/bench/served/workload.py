"""The served workload of `batchscope bench --workload served`: requests planned from a seed (arrival offsets,
prompt token ids, output lengths), sent to the engine at their planned times, their tokens timed as they stream
back, as a server's clients would see them, but in-process (no HTTP: the GPU machine has no web server).

- `plan_requests`: the plan, drawn by app/loadtest/plans.plan_burst, so the same options and seed give the very
  requests POST /api/ab draws for the same spec: every mode and every repeat gets the same plan.
- `drive`: a sender thread submits each request at its planned offset (time.sleep to the due time, then
  Engine.submit); a reader thread runs one asyncio loop that follows every request's `astream()` and stamps each
  chunk of tokens on arrival, as the server's event loop does (app/loadtest/sender.py). EOS is ignored, so every
  request runs to its planned length. Without streaming (`--no-stream`) there is no reader: each request comes
  back whole, and its token times are the engine's own, from the timeline.
- `run_mode`: one timed run in one mode, telemetry recording it; returns the client-side timings and the
  timeline.

The standard library, engine, telemetry and app/loadtest's plans and metrics only (no pydantic, no web server).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field

from batchscope.engine import SamplingParams

from ...loadtest.client_timing import RequestTiming
from ...loadtest.arrivals import PlannedRequest, plan_burst


@dataclass(frozen=True)
class ServedShape:
    """The fields plan_burst reads from a BurstSpec, from the bench's options."""
    num_requests: int
    arrival: str
    rate: float
    burstiness: float
    prompt_tokens: tuple[int, int]
    max_new_tokens: tuple[int, int]
    seed: int


def plan_requests(args, vocab_size: int) -> list[PlannedRequest]:
    shape = ServedShape(args.requests, args.arrival, args.rate, args.burstiness, tuple(args.prompt_tokens),
                        tuple(args.new_tokens), args.seed)
    return plan_burst(shape, vocab_size)


def requests_digest(requests) -> str:
    """One fingerprint of (arrival offset, prompt ids, output length) per request, in plan order: equal digests,
    equal requests. `requests`: PlannedRequests, or (offset_s, prompt, max_new_tokens) triples."""
    rows = [(round(r.offset_s, 6), list(r.prompt), r.max_new_tokens) if isinstance(r, PlannedRequest)
            else (round(r[0], 6), list(r[1]), r[2]) for r in requests]
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()[:16]


def plan_summary(plan: list[PlannedRequest]) -> dict:
    prompts = [len(p.prompt) for p in plan]
    news = [p.max_new_tokens for p in plan]
    return {"requests": len(plan), "arrival_span_s": round(plan[-1].offset_s, 6) if plan else 0.0,
            "prompt_tokens_total": sum(prompts), "new_tokens_total": sum(news),
            "prompt_tokens_range": [min(prompts), max(prompts)] if plan else None,
            "new_tokens_range": [min(news), max(news)] if plan else None,
            "digest": requests_digest(plan)}


@dataclass
class Sent:
    """One request as the sender submitted it: what it asked for and when, and what came back."""
    plan: PlannedRequest
    due_ns: int
    timing: RequestTiming
    prompt: list[int] = field(default_factory=list)     # exactly what went to Engine.submit
    max_new_tokens: int = 0
    output: object = None                               # the engine's RequestOutput
    error: str | None = None

    @property
    def lag_ms(self) -> float:
        return (self.timing.sent_ns - self.due_ns) / 1e6


def _params(p: PlannedRequest) -> SamplingParams:
    # the server's A/B sends these (app/loadtest/sender.py): greedy, the request's own seed, EOS ignored
    return SamplingParams(max_new_tokens=p.max_new_tokens, temperature=0.0, seed=p.seed, ignore_eos=True)


async def _follow(handle, t: RequestTiming) -> None:
    async for d in handle.astream():
        now = time.perf_counter_ns()
        if d.token_ids:
            t.chunks.append((now, len(d.token_ids)))
        if d.finished:
            t.finish_ns, t.finish_reason, t.error = now, d.finish_reason, d.error


def _send(engine, plan: list[PlannedRequest], start_ns: int, loop, sent: list[Sent], follows: list) -> None:
    """The sender thread: each request at its offset after start_ns, handed to the reader's loop at once (with
    no loop, submitted without streaming)."""
    for p in plan:
        due = start_ns + int(p.offset_s * 1e9)
        while (delay := due - time.perf_counter_ns()) > 0:
            time.sleep(delay / 1e9)
        s = Sent(p, due, RequestTiming(sent_ns=time.perf_counter_ns(), prompt_tokens=len(p.prompt)),
                 list(p.prompt), p.max_new_tokens)
        sent.append(s)
        try:
            handle = engine.submit(s.prompt, _params(p), stream=loop is not None)
        except Exception as e:          # counted as failed; the rest of the plan still goes
            s.error = s.timing.error = f"{type(e).__name__}: {e}"
            continue
        fut = asyncio.run_coroutine_threadsafe(_follow(handle, s.timing), loop) if loop is not None else None
        follows.append((s, handle, fut))


def drive(engine, plan: list[PlannedRequest], stream: bool = True) -> tuple[list[Sent], int, int]:
    """Send the plan, wait for every request to finish. -> (sent, in plan order; start ns; end ns), where start is
    the plan's time zero and end the last request's finish. `stream=False`: no reader; each request's output
    comes back whole, and its timing holds one chunk at its finish (its token times are the timeline's)."""
    loop = asyncio.new_event_loop() if stream else None
    reader = threading.Thread(target=loop.run_forever, name="bench-reader", daemon=True) if stream else None
    if reader is not None:
        reader.start()
    sent: list[Sent] = []
    follows: list = []
    start_ns = time.perf_counter_ns()
    sender = threading.Thread(target=_send, args=(engine, plan, start_ns, loop, sent, follows),
                              name="bench-sender", daemon=True)
    try:
        sender.start()
        sender.join()
        for s, handle, fut in follows:
            try:
                if fut is not None:
                    fut.result()
                s.output = handle.result()
            except Exception as e:
                s.error = s.timing.error = s.timing.error or f"{type(e).__name__}: {e}"
            if fut is None and s.output is not None:
                _whole(s.timing, s.output)
    finally:
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            reader.join(timeout=10)
            loop.close()
    ends = [s.timing.finish_ns for s in sent if s.timing.finish_ns is not None]
    return sent, start_ns, max(ends, default=time.perf_counter_ns())


def _whole(t: RequestTiming, out) -> None:
    """A request that did not stream: the engine's own finish (same clock as the sender's), its tokens at once."""
    t.finish_ns, t.finish_reason, t.error = out.finish_ns, out.finish_reason, out.error
    t.chunks = [(out.finish_ns, len(out.token_ids))] if out.token_ids else []


def run_mode(bs, mode: str, name: str, plan: list[PlannedRequest], progress,
             stream: bool = True) -> tuple[list[Sent], int, int, dict]:
    """One timed run of the plan in `mode` on a BatchscopeRunner (systems.py). -> (sent, start ns, end ns,
    timeline or None)."""
    bs.set_mode(mode)
    if bs.tel is not None:
        bs.tel.start_recording(name)
    with progress(name, sum(p.max_new_tokens for p in plan), bs.progress, bs.engine, counted=bs.tel is not None):
        sent, start_ns, end_ns = drive(bs.engine, plan, stream)
    timeline = None
    if bs.tel is not None:
        bs._await_rank_spans()
        bs.tel.stop_recording()
        timeline = bs.tel.timeline(name)
    return sent, start_ns, end_ns, timeline
