"""Load generation: synthetic bursts of requests, their client-side metrics, and sync-vs-async A/B runs.

A burst is a list of planned requests (arrival offset, prompt token ids, output length, seed), all drawn from one
seeded generator, so the same spec and seed give the same burst every time: that is what makes an A/B fair.
Requests are submitted and streamed from one asyncio loop on the burst's own thread; each token's arrival is
timed on the client side (what a user of the server would see).
"""
from __future__ import annotations

import asyncio
import math
import random
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from batchscope.engine.config import SamplingParams

ARRIVALS = ("burst", "poisson", "gamma")
MAX_KEPT_BURSTS = 100               # finished bursts (A/B halves included) and, separately, A/B runs kept to read
CANCEL_POLL_S = 0.05                # how often a request waiting for its arrival time looks for a cancel


class BusyError(ValueError):
    """The request is fine but the server is at capacity right now (too many bursts, a deep queue): retry later.
    The server answers 429; an input over a configured cap is a plain ValueError (400)."""


@dataclass
class Limits:
    max_prompt_tokens: int = 4096
    max_new_tokens: int = 8192
    max_burst_requests: int = 256
    max_concurrent_bursts: int = 2
    max_waiting_requests: int = 1024    # engine queue depth beyond which new API requests are refused


# ---------------------------------------------------------------------------------------------------- the spec

@dataclass
class BurstSpec:
    num_requests: int = 16
    prompt_tokens: tuple[int, int] = (32, 128)
    max_new_tokens: tuple[int, int] = (32, 128)
    arrival: str = "burst"
    rate: float = 8.0                   # requests/s for poisson and gamma
    burstiness: float = 1.0             # gamma shape: 1 is poisson, < 1 burstier, > 1 more regular
    ignore_eos: bool = True             # fixed output lengths make runs comparable
    seed: int | None = None             # None: one is drawn and reported, so the burst can be re-run
    temperature: float = 0.0

    @classmethod
    def from_dict(cls, d: dict, limits: Limits) -> "BurstSpec":
        """Validate a user-supplied dict (JSON body or UI form); raises ValueError with the reason."""
        if not isinstance(d, dict):
            raise ValueError("burst spec must be a JSON object")
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown burst field(s): {', '.join(sorted(unknown))}")
        spec = cls(**{k: v for k, v in d.items() if v is not None})
        # a default the user did not send must not trip a limit they cannot see
        for name, limit in (("prompt_tokens", limits.max_prompt_tokens), ("max_new_tokens", limits.max_new_tokens)):
            if d.get(name) is None:
                setattr(spec, name, tuple(min(x, limit) for x in getattr(spec, name)))
        spec.num_requests = _int("num_requests", spec.num_requests, 1)
        if spec.num_requests > limits.max_burst_requests:
            raise ValueError(f"num_requests {spec.num_requests} is over the limit of {limits.max_burst_requests}")
        spec.prompt_tokens = _range("prompt_tokens", spec.prompt_tokens, limits.max_prompt_tokens)
        spec.max_new_tokens = _range("max_new_tokens", spec.max_new_tokens, limits.max_new_tokens)
        if spec.arrival not in ARRIVALS:
            raise ValueError(f"arrival must be one of {', '.join(ARRIVALS)}, got {spec.arrival!r}")
        spec.rate = _positive("rate", spec.rate, 10_000.0)
        spec.burstiness = _positive("burstiness", spec.burstiness, 100.0)
        if not isinstance(spec.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be true or false, got {spec.ignore_eos!r}")
        if spec.seed is None:
            spec.seed = random.SystemRandom().randrange(2**31)
        spec.seed = _int("seed", spec.seed, 0)
        if isinstance(spec.temperature, bool) or not isinstance(spec.temperature, (int, float)) \
                or not 0.0 <= spec.temperature <= 2.0:
            raise ValueError(f"temperature must be a number in [0, 2], got {spec.temperature!r}")
        return spec


def _int(name: str, v: Any, low: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
    return v


def _range(name: str, v: Any, limit: int) -> tuple[int, int]:
    if isinstance(v, int) and not isinstance(v, bool):
        v = (v, v)                      # a single number means a fixed length
    if not isinstance(v, (list, tuple)) or len(v) != 2:
        raise ValueError(f"{name} must be [min, max], got {v!r}")
    lo, hi = _int(f"{name} min", v[0], 1), _int(f"{name} max", v[1], 1)
    if lo > hi:
        raise ValueError(f"{name} min {lo} is greater than max {hi}")
    if hi > limit:
        raise ValueError(f"{name} max {hi} is over the limit of {limit}")
    return (lo, hi)


def _positive(name: str, v: Any, limit: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 < v <= limit:
        raise ValueError(f"{name} must be a number in (0, {limit:g}], got {v!r}")
    return float(v)


# ------------------------------------------------------------------------------------------ arrivals and lengths

def arrival_offsets(n: int, arrival: str, rate: float, burstiness: float, rng: random.Random) -> list[float]:
    """Seconds after the burst's start at which each of n requests is sent; the first one goes at 0."""
    if arrival == "burst":
        return [0.0] * n
    if arrival == "poisson":
        gaps = [rng.expovariate(rate) for _ in range(n - 1)]
    elif arrival == "gamma":
        # mean gap stays 1/rate whatever the shape; the shape alone sets how clumped arrivals are
        gaps = [rng.gammavariate(burstiness, 1.0 / (rate * burstiness)) for _ in range(n - 1)]
    else:
        raise ValueError(f"unknown arrival process {arrival!r}")
    out, t = [0.0], 0.0
    for g in gaps:
        t += g
        out.append(t)
    return out


def synthetic_prompt(rng: random.Random, length: int, vocab_size: int) -> list[int]:
    # skip the low ids, where tokenizers keep their special tokens (EOS, chat markers)
    low = min(1000, vocab_size // 2)
    return [rng.randrange(low, vocab_size) for _ in range(length)]


@dataclass
class PlannedRequest:
    index: int
    offset_s: float
    prompt: list[int]
    max_new_tokens: int
    seed: int


def plan_burst(spec: BurstSpec, vocab_size: int) -> list[PlannedRequest]:
    """The whole burst, drawn from the spec's seed: identical for identical specs."""
    rng = random.Random(spec.seed)
    offsets = arrival_offsets(spec.num_requests, spec.arrival, spec.rate, spec.burstiness, rng)
    plan = []
    for i, off in enumerate(offsets):
        p = rng.randint(*spec.prompt_tokens)
        m = rng.randint(*spec.max_new_tokens)
        plan.append(PlannedRequest(i, off, synthetic_prompt(rng, p, vocab_size), m, rng.randrange(2**31)))
    return plan


# ------------------------------------------------------------------------------------------------------ metrics

@dataclass
class RequestTiming:
    """Client-side clock (perf_counter_ns) of one request: when it was sent, when each chunk of tokens arrived."""
    sent_ns: int
    chunks: list[tuple[int, int]] = field(default_factory=list)    # (arrival ns, tokens in the chunk)
    finish_ns: int | None = None
    prompt_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None

    @property
    def output_tokens(self) -> int:
        return sum(k for _, k in self.chunks)


def percentiles(values: list[float], ps=(50, 90, 99)) -> dict[str, float | None]:
    """Linear-interpolated percentiles (numpy's default method); None for an empty list."""
    out: dict[str, float | None] = {}
    xs = sorted(values)
    for p in ps:
        if not xs:
            out[f"p{p}"] = None
            continue
        k = (len(xs) - 1) * p / 100.0
        lo = math.floor(k)
        hi = min(lo + 1, len(xs) - 1)
        out[f"p{p}"] = xs[lo] + (xs[hi] - xs[lo]) * (k - lo)
    return out


def _stats(values: list[float]) -> dict[str, float | None]:
    d = percentiles(values)
    d["mean"] = sum(values) / len(values) if values else None
    return d


def burst_metrics(timings: list[RequestTiming], start_ns: int, end_ns: int) -> dict:
    """TTFT/TPOT/ITL/E2E percentiles in ms and throughput over [start, end] for the requests that finished."""
    ok = [t for t in timings if t.error is None and t.finish_ns is not None]
    ttft, tpot, itl, e2e = [], [], [], []
    for t in ok:
        e2e.append((t.finish_ns - t.sent_ns) / 1e6)
        if not t.chunks:
            continue
        first = t.chunks[0][0]
        ttft.append((first - t.sent_ns) / 1e6)
        n = t.output_tokens
        if n > 1:
            tpot.append((t.chunks[-1][0] - first) / 1e6 / (n - 1))
        # a chunk of k tokens after a gap g counts as k inter-token gaps of g/k: tokens that arrive together
        for (prev, _), (now, k) in zip(t.chunks, t.chunks[1:]):
            itl.extend([(now - prev) / 1e6 / k] * k)
    duration_s = max(end_ns - start_ns, 1) / 1e9
    out_tokens = sum(t.output_tokens for t in ok)
    return {
        "ttft_ms": _stats(ttft), "tpot_ms": _stats(tpot), "itl_ms": _stats(itl), "e2e_ms": _stats(e2e),
        "completed": len(ok), "failed": len(timings) - len(ok),
        "prompt_tokens": sum(t.prompt_tokens for t in ok), "output_tokens": out_tokens,
        "duration_s": duration_s,
        "output_tokens_per_s": out_tokens / duration_s,
        "requests_per_s": len(ok) / duration_s,
    }


# ------------------------------------------------------------------------------------------------------ running

@dataclass
class Burst:
    id: str
    spec: BurstSpec
    state: str = "running"              # "running" | "done" | "error"
    done: int = 0
    total: int = 0
    results: dict | None = None
    error: str | None = None
    created: float = field(default_factory=time.time)
    mode: str | None = None             # the engine mode when the burst started
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

    def to_dict(self) -> dict:
        return {"id": self.id, "state": self.state, "done": self.done, "total": self.total, "mode": self.mode,
                "spec": asdict(self.spec), "results": self.results, "error": self.error}


@dataclass
class ABRun:
    id: str
    spec: BurstSpec
    state: str = "running"
    phase: str | None = None            # "sync" | "async" while running
    sync: Burst | None = None
    async_: Burst | None = None
    speedup: float | None = None
    error: str | None = None
    created: float = field(default_factory=time.time)

    def to_dict(self) -> dict:
        def part(b: Burst | None) -> dict | None:
            return None if b is None else b.results
        progress = [b for b in (self.sync, self.async_) if b is not None]
        return {"id": self.id, "state": self.state, "phase": self.phase, "spec": asdict(self.spec),
                "done": sum(b.done for b in progress), "total": 2 * self.spec.num_requests,
                "sync": part(self.sync), "async": part(self.async_),
                "sync_burst": self.sync.id if self.sync else None,
                "async_burst": self.async_.id if self.async_ else None,
                "speedup": self.speedup, "error": self.error}


class BurstManager:
    """Runs bursts and A/B comparisons on background threads and keeps their results (the last `keep` of each;
    `dropped` counts those forgotten).

    `engine` needs submit(prompt_ids, SamplingParams) -> handle with astream() and cancel(), set_mode() and mode.
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
    def start_burst(self, spec: dict | BurstSpec) -> str:
        spec = spec if isinstance(spec, BurstSpec) else BurstSpec.from_dict(spec, self.limits)
        burst = Burst(id=_new_id("b"), spec=spec, total=spec.num_requests)
        with self._lock:
            self._admit(ab=False)
            self._bursts[burst.id] = burst
            self._trim(self._bursts, "bursts")
        self._spawn(self._run_burst_thread, burst)
        return burst.id

    def start_ab(self, spec: dict | BurstSpec) -> str:
        spec = spec if isinstance(spec, BurstSpec) else BurstSpec.from_dict(spec, self.limits)
        ab = ABRun(id=_new_id("ab"), spec=spec)
        with self._lock:
            self._admit(ab=True)
            self._abs[ab.id] = ab
            self._trim(self._abs, "ab")
        self._spawn(self._run_ab_thread, ab)
        return ab.id

    def burst(self, burst_id: str) -> dict:
        with self._lock:
            b = self._bursts.get(burst_id)
            if b is None:
                raise KeyError(f"no burst with id {burst_id!r}")
            return b.to_dict()

    def ab(self, ab_id: str) -> dict:
        with self._lock:
            a = self._abs.get(ab_id)
            if a is None:
                raise KeyError(f"no A/B run with id {ab_id!r}")
            return a.to_dict()

    def running(self) -> int:
        with self._lock:
            return self._running_count()

    def list(self) -> dict:
        with self._lock:
            return {"bursts": [b.to_dict() for b in self._bursts.values()],
                    "ab": [a.to_dict() for a in self._abs.values()], "kept": self.keep, "dropped": dict(self.dropped)}

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
            if s["output_tokens_per_s"] > 0:
                ab.speedup = a["output_tokens_per_s"] / s["output_tokens_per_s"]
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
        results = burst_metrics(timings, start_ns, end_ns)
        results["busy_pct"] = None
        if self.telemetry is not None:
            window = self.telemetry.summary(t0_us, t1_us)
            results["busy_pct"] = window.get("busy_pct")
            results["telemetry"] = window
            results["window_us"] = [t0_us, t1_us]
        results["mode"] = burst.mode
        results["errors"] = sorted({t.error for t in timings if t.error})[:5]
        burst.results = results
        if burst.cancel.is_set():
            burst.error, burst.state = "cancelled", "error"
        elif results["completed"] == 0:
            burst.error, burst.state = "; ".join(results["errors"]) or "no request completed", "error"
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
        except Exception as e:          # one bad request is counted, the burst goes on
            t.error = f"{type(e).__name__}: {e}"
        finally:
            if handle is not None:
                with burst.lock:
                    burst.handles.discard(handle)
        burst.done += 1
        return t


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"
