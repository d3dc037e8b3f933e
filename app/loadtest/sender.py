"""Sending a run's requests to the engine and timing them as they stream back: one request of any run (burst,
A/B half, continuous load), and a continuous load's whole life (rate or concurrency, its bounds, its give-up rule).
BurstManager (manager.py) owns the runs; this is how their requests travel."""
from __future__ import annotations

import asyncio
import time

from batchscope.engine.config import SamplingParams

from .client_timing import RequestTiming
from .arrivals import PlannedRequest, request_stream
from .runs import Burst, InFlight, LoadRun
from .specs import Limits
from .statuses import BurstResults

CANCEL_POLL_S = 0.05                # how often a request waiting for its arrival time looks for a cancel
LOAD_GIVE_UP_AFTER = 16             # a load whose first this-many requests all fail stops: it would only spin


class Sender:
    def __init__(self, engine, limits: Limits, vocab_size: int, telemetry=None):
        self.engine, self.limits, self.vocab_size = engine, limits, vocab_size
        # where each request's delivery times go, as the SSE path's chunk write times do (app/server/streaming.py):
        # telemetry's recorder joins them with the engine's token times into requests[].sent_us and the delay
        recorder = getattr(telemetry, "recorder", None)
        self.on_sent = recorder.note_sent if recorder is not None else None

    def run_load(self, run: LoadRun) -> None:
        try:
            asyncio.run(self._drive_load(run))
        except Exception as e:  # a crashed load must report, not vanish
            run.error = f"{type(e).__name__}: {e}"
            run.stop("error")
        finally:
            run.end_ns = time.perf_counter_ns()
            if run.stop_reason is None:
                run.stop_reason = "stopped"
            mode = run.mode if not run.mode_changes else None      # a load that spanned switches has no one mode
            run.results = BurstResults(**run.tally.results(run.start_ns, run.end_ns), mode=mode)
            run.state = "error" if run.stop_reason == "error" else "done"
            run.ended.set()

    async def _drive_load(self, run: LoadRun) -> None:
        """Send requests until the load is stopped, reaches its request bound (then let those in flight finish)
        or its duration bound (then cancel them)."""
        spec, plan = run.spec, request_stream(run.spec, self.vocab_size)
        deadline_ns = run.start_ns + int(spec.duration_s * 1e9)
        watchdog = asyncio.create_task(self._load_deadline(run, deadline_ns))
        if spec.kind == "concurrency":
            async def worker():
                while run.take():
                    await self._load_request(run, next(plan))
            await asyncio.gather(*(worker() for _ in range(spec.concurrency)))
        else:
            sent = set()
            for p in plan:
                if not await sleep_until(run.flight, run.start_ns + int(p.offset_s * 1e9)):
                    break
                # an open-loop load faster than the engine would pile up without end: past the cap, arrivals
                # are counted as skipped rather than sent
                if run.in_flight >= self.limits.max_load_concurrency:
                    run.skipped += 1
                    continue
                if not run.take():
                    break
                task = asyncio.create_task(self._load_request(run, p))
                sent.add(task)
                task.add_done_callback(sent.discard)
            await asyncio.gather(*list(sent))
        watchdog.cancel()

    @staticmethod
    async def _load_deadline(run: LoadRun, deadline_ns: int) -> None:
        if await sleep_until(run.flight, deadline_ns):
            run.stop("duration")

    async def _load_request(self, run: LoadRun, p: PlannedRequest) -> None:
        run.in_flight += 1
        try:
            t = await self.send(run, p)
        finally:
            run.in_flight -= 1
        cancelled = not t.ok and run.flight.cancel.is_set()
        run.tally.finished(t, cancelled=cancelled)
        if not t.ok and not cancelled and run.tally.completed == 0 and run.tally.failed >= LOAD_GIVE_UP_AFTER:
            run.error = f"the first {run.tally.failed} requests all failed: {t.error}"
            run.stop("error")

    async def send(self, run: Burst | LoadRun, p: PlannedRequest) -> RequestTiming:
        t = RequestTiming(sent_ns=time.perf_counter_ns(), prompt_tokens=len(p.prompt))
        handle = None
        delivered: list[int] = []       # perf_counter ns at which each token reached this consumer
        try:
            if run.flight.cancel.is_set():
                raise RuntimeError("cancelled")
            params = SamplingParams(max_new_tokens=p.max_new_tokens, temperature=run.spec.temperature,
                                    seed=p.seed, ignore_eos=run.spec.ignore_eos)
            handle = self.engine.submit(p.prompt, params)
            t.request_id = getattr(handle, "id", None)
            run.flight.add(handle)
            await self._follow(run, handle, t, delivered)
        except Exception as e:          # one bad request is counted, the run goes on
            t.error = f"{type(e).__name__}: {e}"
        finally:
            if handle is not None:
                run.flight.discard(handle)
                if delivered and self.on_sent is not None:
                    self.on_sent(handle.id, delivered)
        return t

    async def _follow(self, run: Burst | LoadRun, handle, t: RequestTiming, delivered: list[int]) -> None:
        """Time each chunk of tokens as it arrives, until the request finishes; `delivered` gets each token's
        arrival (this consumer is the in-process run's client: its arrival is the token's delivery)."""
        async for d in handle.astream():
            now = time.perf_counter_ns()
            if d.token_ids:
                t.chunks.append((now, len(d.token_ids)))
                delivered.extend([now] * len(d.token_ids))
            run.on_chunk(now, len(d.token_ids), getattr(self.engine, "mode", None))
            if d.finished:
                t.finish_ns, t.finish_reason, t.error = now, d.finish_reason, d.error
            elif run.flight.cancel.is_set():
                handle.cancel()
        if t.finish_reason in ("error", "cancelled") and not t.error:
            t.error = t.finish_reason


async def sleep_until(flight: InFlight, t_ns: int) -> bool:
    """Sleep until perf_counter_ns reaches t_ns, in short naps so that a cancel is not held up; False if the run
    was cancelled first."""
    while not flight.cancel.is_set():
        delay = (t_ns - time.perf_counter_ns()) / 1e9
        if delay <= 0:
            return True
        await asyncio.sleep(min(delay, CANCEL_POLL_S))
    return False
