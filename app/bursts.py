"""Running load tests: bursts and sync-vs-async A/B comparisons on background threads, and their results.

Requests are submitted and streamed from one asyncio loop on the burst's own thread, and timed there
(app/loadgen.py plans the burst and computes the metrics).
"""
from __future__ import annotations

import asyncio
import threading
import time
import uuid
from dataclasses import dataclass, field

from batchscope.engine.config import SamplingParams

from .errors import BusyError
from .loadgen import PlannedRequest, RequestTiming, burst_metrics, plan_burst
from .schemas import ABStatus, BurstList, BurstResults, BurstSpec, BurstStatus, Limits, Mode, RunState

MAX_KEPT_BURSTS = 100               # finished bursts (A/B halves included) and, separately, A/B runs kept to read
CANCEL_POLL_S = 0.05                # how often a request waiting for its arrival time looks for a cancel
MAX_ERRORS_REPORTED = 5


@dataclass
class Burst:
    id: str
    spec: BurstSpec                     # settled: lengths and seed known
    state: RunState = "running"
    done: int = 0
    total: int = 0
    results: BurstResults | None = None
    error: str | None = None
    created: float = field(default_factory=time.time)
    mode: Mode | None = None            # the engine mode when the burst started
    cancel: threading.Event = field(default_factory=threading.Event)
    # requests in flight, so that a cancel reaches those that have not streamed a token yet
    handles: set = field(default_factory=set, repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def stop(self) -> None:
        """Cancel from any thread: nothing more is sent, and what is in flight is cancelled in the engine."""
        with self.lock:
            self.cancel.set()
            handles = list(self.handles)
        for h in handles:
            h.cancel()

    def status(self) -> BurstStatus:
        return BurstStatus(id=self.id, state=self.state, done=self.done, total=self.total, mode=self.mode,
                           spec=self.spec, results=self.results, error=self.error)


@dataclass
class ABRun:
    id: str
    spec: BurstSpec
    state: RunState = "running"
    phase: Mode | None = None           # the half running now
    sync: Burst | None = None
    async_: Burst | None = None
    speedup: float | None = None
    error: str | None = None
    created: float = field(default_factory=time.time)

    def status(self) -> ABStatus:
        halves = [b for b in (self.sync, self.async_) if b is not None]
        return ABStatus(id=self.id, state=self.state, phase=self.phase, spec=self.spec,
                        done=sum(b.done for b in halves), total=2 * self.spec.num_requests,
                        sync=self.sync.results if self.sync else None,
                        async_=self.async_.results if self.async_ else None,
                        sync_burst=self.sync.id if self.sync else None,
                        async_burst=self.async_.id if self.async_ else None,
                        speedup=self.speedup, error=self.error)


class BurstManager:
    """Runs bursts and A/B comparisons on background threads and keeps their results (the last `keep` of each;
    `dropped` counts those forgotten).

    `engine` needs submit(prompt_ids, SamplingParams) -> handle with astream() and cancel(), set_mode() and mode;
    its `info["max_model_len"]`, when it has one, bounds a burst's lengths.
    `telemetry`, when given, needs now_us() and summary(t0_us, t1_us) -> dict with "busy_pct": it supplies the
    event-based GPU busy share over each burst's window.
    """

    def __init__(self, engine, limits: Limits, vocab_size: int, telemetry=None, keep: int = MAX_KEPT_BURSTS):
        self.engine = engine
        self.telemetry = telemetry
        self.limits = limits
        self.vocab_size = vocab_size
        self.keep = keep
        self._lock = threading.Lock()
        self._bursts: dict[str, Burst] = {}
        self._abs: dict[str, ABRun] = {}
        self._threads: list[threading.Thread] = []
        self._closed = False
        self.dropped = {"bursts": 0, "ab": 0}

    # -- public
    def start_burst(self, spec: BurstSpec) -> str:
        spec = self._settle(spec)
        burst = Burst(id=_new_id("b"), spec=spec, total=spec.num_requests)
        with self._lock:
            self._admit(ab=False)
            self._bursts[burst.id] = burst
            self._trim(self._bursts, "bursts")
        self._spawn(self._run_burst_thread, burst)
        return burst.id

    def start_ab(self, spec: BurstSpec) -> str:
        ab = ABRun(id=_new_id("ab"), spec=self._settle(spec))
        with self._lock:
            self._admit(ab=True)
            self._abs[ab.id] = ab
            self._trim(self._abs, "ab")
        self._spawn(self._run_ab_thread, ab)
        return ab.id

    def burst(self, burst_id: str) -> BurstStatus:
        with self._lock:
            b = self._bursts.get(burst_id)
            if b is None:
                raise KeyError(f"no burst with id {burst_id!r}")
            return b.status()

    def ab(self, ab_id: str) -> ABStatus:
        with self._lock:
            a = self._abs.get(ab_id)
            if a is None:
                raise KeyError(f"no A/B run with id {ab_id!r}")
            return a.status()

    def running(self) -> int:
        with self._lock:
            return self._running_count()

    def list(self) -> BurstList:
        with self._lock:
            return BurstList(bursts=[b.status() for b in self._bursts.values()],
                             ab=[a.status() for a in self._abs.values()], kept=self.keep, dropped=dict(self.dropped))

    def status(self) -> dict:
        with self._lock:
            return {"running": self._running_count(), "kept_bursts": len(self._bursts), "kept_ab": len(self._abs),
                    "max_kept": self.keep, "dropped": dict(self.dropped)}

    def cancel_all(self) -> None:
        """Refuse new bursts and cancel what runs, without waiting (safe from a signal handler)."""
        with self._lock:
            self._closed = True
            bursts = list(self._bursts.values())
        for b in bursts:
            b.stop()

    def close(self, timeout: float = 10.0) -> None:
        """Cancel what runs and wait for the threads (so the engine can be closed after); `timeout` bounds the
        whole wait, not each thread."""
        self.cancel_all()
        deadline = time.monotonic() + timeout
        for t in list(self._threads):
            t.join(max(0.0, deadline - time.monotonic()))

    # -- admission
    def _settle(self, spec: BurstSpec) -> BurstSpec:
        max_model_len = (getattr(self.engine, "info", None) or {}).get("max_model_len")
        return spec.within(self.limits, max_model_len)

    def _running_count(self) -> int:
        return (sum(b.state == "running" for b in self._bursts.values())
                + sum(a.state == "running" for a in self._abs.values()))

    def _admit(self, ab: bool) -> None:
        if self._closed:
            raise BusyError("the server is shutting down")
        if any(a.state == "running" for a in self._abs.values()):
            raise BusyError("an A/B comparison is running; it needs the engine to itself until it ends")
        n = self._running_count()
        if ab and n:
            raise BusyError(f"{n} burst(s) still running; an A/B comparison needs the engine to itself")
        if n >= self.limits.max_concurrent_bursts:
            raise BusyError(f"{n} bursts already running (limit {self.limits.max_concurrent_bursts})")

    def _trim(self, table: dict, kind: str) -> None:
        excess = len(table) - self.keep
        for key in list(table):
            if excess <= 0:
                break
            if table[key].state != "running":       # oldest first; running ones stay
                del table[key]
                self.dropped[kind] += 1
                excess -= 1

    def _spawn(self, target, item) -> None:
        t = threading.Thread(target=target, args=(item,), name=f"batchscope-{item.id}", daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    # -- the work
    def _run_burst_thread(self, burst: Burst) -> None:
        try:
            self._run_burst(burst)
        except Exception as e:  # a crashed burst must report, not vanish
            burst.error, burst.state = f"{type(e).__name__}: {e}", "error"

    def _run_ab_thread(self, ab: ABRun) -> None:
        original = self.engine.mode
        try:
            self._warm_up()
            for mode in ("sync", "async"):
                ab.phase = mode
                self.engine.set_mode(mode)
                burst = Burst(id=_new_id("b"), spec=ab.spec, total=ab.spec.num_requests)
                setattr(ab, "sync" if mode == "sync" else "async_", burst)
                with self._lock:
                    if self._closed:            # closed between the halves: do not start the next
                        raise RuntimeError("cancelled: the server is shutting down")
                    self._bursts[burst.id] = burst
                    self._trim(self._bursts, "bursts")
                self._run_burst(burst)
                if burst.state != "done":
                    raise RuntimeError(f"the {mode} half failed: {burst.error}")
            s, a = ab.sync.results, ab.async_.results
            if s.output_tokens_per_s > 0:
                ab.speedup = a.output_tokens_per_s / s.output_tokens_per_s
            ab.state = "done"
        except Exception as e:
            ab.error, ab.state = f"{e}", "error"
        finally:
            ab.phase = None
            try:
                self.engine.set_mode(original)
            except Exception:
                pass

    def _warm_up(self) -> None:
        """A few tokens in each mode first, so the first half of an A/B does not pay for a cold engine."""
        async def drain(handle):
            async for _delta in handle.astream():
                pass

        async def both_modes():
            for mode in ("sync", "async"):
                self.engine.set_mode(mode)
                params = SamplingParams(max_new_tokens=4, ignore_eos=True)
                await asyncio.gather(*(drain(self.engine.submit([1, 2, 3, 4], params)) for _ in range(2)))
        asyncio.run(both_modes())

    def _run_burst(self, burst: Burst) -> None:
        plan = plan_burst(burst.spec, self.vocab_size)
        burst.mode = getattr(self.engine, "mode", None)
        t0_us = self.telemetry.now_us() if self.telemetry is not None else None
        timings, start_ns, end_ns = asyncio.run(self._drive(burst, plan))
        t1_us = self.telemetry.now_us() if self.telemetry is not None else None
        window = self.telemetry.summary(t0_us, t1_us) if self.telemetry is not None else None
        errors = sorted({t.error for t in timings if t.error})[:MAX_ERRORS_REPORTED]
        results = BurstResults(**burst_metrics(timings, start_ns, end_ns), mode=burst.mode, errors=errors,
                               busy_pct=window.get("busy_pct") if window else None, telemetry=window,
                               window_us=(t0_us, t1_us) if window is not None else None)
        burst.results = results
        if burst.cancel.is_set():
            burst.error, burst.state = "cancelled", "error"
        elif results.completed == 0:
            burst.error, burst.state = "; ".join(errors) or "no request completed", "error"
        else:
            burst.state = "done"

    async def _drive(self, burst: Burst, plan: list[PlannedRequest]):
        start_ns = time.perf_counter_ns()
        timings = await asyncio.gather(*(self._one(burst, p, start_ns) for p in plan))
        return timings, start_ns, time.perf_counter_ns()

    async def _one(self, burst: Burst, p: PlannedRequest, start_ns: int) -> RequestTiming:
        # a late arrival (poisson, gamma) waits in short sleeps, so that a cancel is not held up by it
        while not burst.cancel.is_set():
            delay = p.offset_s - (time.perf_counter_ns() - start_ns) / 1e9
            if delay <= 0:
                break
            await asyncio.sleep(min(delay, CANCEL_POLL_S))
        t = RequestTiming(sent_ns=time.perf_counter_ns(), prompt_tokens=len(p.prompt))
        handle = None
        try:
            if burst.cancel.is_set():
                raise RuntimeError("cancelled")
            params = SamplingParams(max_new_tokens=p.max_new_tokens, temperature=burst.spec.temperature,
                                    seed=p.seed, ignore_eos=burst.spec.ignore_eos)
            handle = self.engine.submit(p.prompt, params)
            with burst.lock:
                burst.handles.add(handle)
                cancelled = burst.cancel.is_set()
            if cancelled:                   # stop() ran between the submit and the add
                handle.cancel()
            await self._follow(burst, handle, t)
        except Exception as e:          # one bad request is counted, the burst goes on
            t.error = f"{type(e).__name__}: {e}"
        finally:
            if handle is not None:
                with burst.lock:
                    burst.handles.discard(handle)
        burst.done += 1
        return t

    @staticmethod
    async def _follow(burst: Burst, handle, t: RequestTiming) -> None:
        """Time each chunk of tokens as it arrives, until the request finishes."""
        async for d in handle.astream():
            now = time.perf_counter_ns()
            if d.token_ids:
                t.chunks.append((now, len(d.token_ids)))
            if d.finished:
                t.finish_ns, t.finish_reason, t.error = now, d.finish_reason, d.error
            elif burst.cancel.is_set():
                handle.cancel()
        if t.finish_reason in ("error", "cancelled") and not t.error:
            t.error = t.finish_reason


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"
