"""Running load tests on background threads, and their results: bursts, sync-vs-async A/B comparisons, and
continuous loads that run until stopped (or until their bounds).

Requests are submitted and streamed from one asyncio loop on the run's own thread, and timed there (arrivals.py
draws the requests, sender.py sends and times them, client_timing.py adds them up). Mode switches made through the
server go through `BurstManager.set_mode`, which refuses them while an A/B runs: each half must run in one mode. A
sweep (sweep/sweeps.py) takes the engine for itself through `hold_engine`: while it runs nothing else starts and the
mode is locked, as for an A/B.
"""
from __future__ import annotations

import asyncio
import threading
import time

from batchscope.engine.config import SamplingParams

from .arrivals import PlannedRequest, plan_burst
from .client_timing import RequestTiming, burst_metrics
from .refusals import BusyError, EngineTaken, ModeLocked
from .runs import ABRun, Burst, LoadRun, new_id
from .sender import Sender, sleep_until
from .specs import BurstSpec, Limits, LoadSpec, Mode
from .sweep.curves import point_values
from .statuses import ABStatus, BurstList, BurstResults, BurstStatus, LoadStatus

__all__ = ["BurstManager", "ModeLocked"]

MAX_KEPT_BURSTS = 100               # finished bursts (A/B halves included), A/B runs and loads kept to read, each
MAX_ERRORS_REPORTED = 5
LOAD_STOP_WAIT_S = 5.0              # POST /api/load/{id}/stop waits this long for the load to wind down


class BurstManager:
    """Runs bursts, A/B comparisons and continuous loads on background threads and keeps their results (the last
    `keep` of each kind; `dropped` counts those forgotten).

    `engine` needs submit(prompt_ids, SamplingParams) -> handle with astream() and cancel(), set_mode() and mode;
    its `info["max_model_len"]`, when it has one, bounds a burst's lengths. `telemetry`, when given, needs now_us()
    and summary(t0_us, t1_us) -> dict with "busy_pct": it supplies the busy share over each burst's window.
    """

    def __init__(self, engine, limits: Limits, vocab_size: int, telemetry=None, keep: int = MAX_KEPT_BURSTS):
        self.engine = engine
        self.telemetry = telemetry
        self.limits = limits
        self.vocab_size = vocab_size
        self.sender = Sender(engine, limits, vocab_size, telemetry=telemetry)
        self.keep = keep
        self._lock = threading.Lock()
        self._bursts: dict[str, Burst] = {}
        self._abs: dict[str, ABRun] = {}
        self._loads: dict[str, LoadRun] = {}
        self._threads: list[threading.Thread] = []
        self._holder = None             # a sweep (sweep/sweeps.py) that has the engine to itself while it runs
        self._closed = False
        self.dropped = {"bursts": 0, "ab": 0, "loads": 0}

    # -- public
    def start_burst(self, spec: BurstSpec) -> str:
        spec = self._settle(spec)
        burst = Burst(id=new_id("b"), spec=spec, total=spec.num_requests)
        with self._lock:
            self._admit(ab=False)
            self._bursts[burst.id] = burst
            self._trim(self._bursts, "bursts")
        self.spawn(self._run_burst_thread, burst)
        return burst.id

    def start_ab(self, spec: BurstSpec) -> str:
        ab = ABRun(id=new_id("ab"), spec=self._settle(spec))
        with self._lock:
            self._admit(ab=True)
            self._abs[ab.id] = ab
            self._trim(self._abs, "ab")
        self.spawn(self._run_ab_thread, ab)
        return ab.id

    def start_load(self, spec: LoadSpec) -> str:
        spec = self._settle(spec)
        with self._lock:
            self._admit_load()
            run = LoadRun(id=new_id("load"), spec=spec, mode=getattr(self.engine, "mode", None))
            self._loads[run.id] = run
            self._trim(self._loads, "loads")
        self.spawn(self.sender.run_load, run)
        return run.id

    def stop_load(self, load_id: str) -> LoadStatus:
        """Stop a load (a finished one is left as it is) and say where it stands: ended, unless cancelling what it
        has in flight takes longer than LOAD_STOP_WAIT_S."""
        run = self._find(self._loads, load_id, "load")
        if run.state == "running":
            run.stop("stopped")
            run.ended.wait(LOAD_STOP_WAIT_S)
        return run.status(self.engine.mode)

    def _find(self, runs: dict, run_id: str, what: str):
        """The run of that id in `runs` (KeyError naming `what` when there is none)."""
        with self._lock:
            run = runs.get(run_id)
        if run is None:
            raise KeyError(f"no {what} with id {run_id!r}")
        return run

    def burst(self, burst_id: str) -> BurstStatus:
        return self._find(self._bursts, burst_id, "burst").status()

    def ab(self, ab_id: str) -> ABStatus:
        return self._find(self._abs, ab_id, "A/B run").status()

    def load(self, load_id: str) -> LoadStatus:
        return self._find(self._loads, load_id, "load").status(self.engine.mode)

    def running_load(self) -> str | None:
        """The id of the continuous load running now, if any (there is at most one)."""
        with self._lock:
            return next((r.id for r in self._loads.values() if r.state == "running"), None)

    def running(self) -> int:
        with self._lock:
            return self._running_count()

    def latest_values(self) -> dict[str, list[tuple[str, dict]]]:
        """The raw latencies of the newest finished burst, A/B and continuous load (a load's are a sample of the
        whole run), each as (series, values) pairs, for the page's CDFs."""
        with self._lock:
            burst = next((b for b in reversed(self._bursts.values()) if b.values and b.expect_mode is None), None)
            ab = next((a for a in reversed(self._abs.values()) if a.state == "done"), None)
            load = next((r for r in reversed(self._loads.values()) if r.state != "running"), None)
        out = {}
        if burst is not None:
            out[f"burst {burst.id}"] = [(burst.mode or "burst", burst.values)]
        if ab is not None:
            out[f"A/B {ab.id}"] = [("sync", ab.sync.values), ("async", ab.async_.values)]
        if load is not None:
            out[f"load {load.id}"] = [(load.results.mode or "load", load.tally.values())]
        return out

    def list(self) -> BurstList:
        with self._lock:
            return BurstList(bursts=[b.status() for b in self._bursts.values()],
                             ab=[a.status() for a in self._abs.values()], kept=self.keep, dropped=dict(self.dropped))

    def status(self) -> dict:
        with self._lock:
            return {"running": self._running_count(), "kept_bursts": len(self._bursts), "kept_ab": len(self._abs),
                    "sweep_running": getattr(self._holding(), "id", None),
                    "loads_running": sum(r.state == "running" for r in self._loads.values()),
                    "kept_loads": len(self._loads), "max_kept": self.keep, "dropped": dict(self.dropped)}

    # -- the mode, guarded
    def mode_lock(self) -> str | None:
        """Why the mode may not be switched now (an A/B runs), or None."""
        with self._lock:
            return self._mode_lock()

    def _mode_lock(self) -> str | None:
        holder = self._holding()
        if holder is not None:
            return (f"{holder.describe()} and sets the mode itself: a switch now would spoil it. The toggle comes "
                    "back when it ends")
        ab = next((a for a in self._abs.values() if a.state == "running"), None)
        if ab is None:
            return None
        where = f"its {ab.phase} half" if ab.phase else "its warm-up"
        return (f"an A/B comparison ({ab.id}) is running ({where}) and sets the mode itself: a switch now would "
                "spoil it. The toggle comes back when it ends")

    def set_mode(self, mode: Mode) -> Mode | None:
        """Switch the engine's mode for a user of the server; ModeLocked while an A/B runs. Running loads note the
        switch. Returns the mode before."""
        with self._lock:            # an A/B cannot start between the check and the switch
            reason = self._mode_lock()
            if reason:
                raise ModeLocked(reason)
            previous = self.engine.mode
            self.engine.set_mode(mode)
            loads = [r for r in self._loads.values() if r.state == "running"]
        for run in loads:
            run.note_mode(previous, mode)
        return previous

    def cancel_all(self) -> None:
        """Refuse new runs and cancel what runs, without waiting (safe from a signal handler)."""
        with self._lock:
            self._closed = True
            bursts = list(self._bursts.values())
            loads = list(self._loads.values())
        for b in bursts:
            b.stop()
        for run in loads:
            if run.state == "running":
                run.stop("shutdown")
        holder = self._holder
        if holder is not None and holder.state == "running":
            holder.stop("shutdown")

    def close(self, timeout: float = 10.0) -> None:
        """Cancel what runs and wait for the threads (so the engine can be closed after); `timeout` bounds the
        whole wait, not each thread."""
        self.cancel_all()
        deadline = time.monotonic() + timeout
        for t in list(self._threads):
            t.join(max(0.0, deadline - time.monotonic()))

    # -- admission
    def _settle(self, spec: BurstSpec | LoadSpec) -> BurstSpec | LoadSpec:
        max_model_len = (getattr(self.engine, "info", None) or {}).get("max_model_len")
        return spec.within(self.limits, max_model_len)

    def _running_count(self) -> int:
        return (sum(b.state == "running" for b in self._bursts.values())
                + sum(a.state == "running" for a in self._abs.values()))

    def _running_ab(self) -> ABRun | None:
        return next((a for a in self._abs.values() if a.state == "running"), None)

    def hold_engine(self, run) -> None:
        """Give the engine to `run` alone until its `state` leaves "running": no burst, A/B, load or other such run
        starts meanwhile (EngineTaken), and the mode is locked. EngineTaken if any run goes on now. `run` needs
        id, state, stop(reason) and describe() (a sentence: what runs)."""
        with self._lock:
            if self._closed:
                raise BusyError("the server is shutting down")
            busy = self._engine_user()
            if busy:
                raise EngineTaken(f"{busy}; a sweep needs the engine to itself: wait for it to end or stop it")
            self._holder = run

    def _holding(self):
        h = self._holder
        return h if h is not None and h.state == "running" else None

    def _engine_user(self) -> str | None:
        """What runs on the engine now, in words, or None."""
        holder, ab = self._holding(), self._running_ab()
        load = next((r for r in self._loads.values() if r.state == "running"), None)
        n = sum(b.state == "running" for b in self._bursts.values())
        if holder is not None:
            return holder.describe()
        if ab is not None:
            return f"an A/B comparison ({ab.id}) is running"
        if load is not None:
            return f"continuous load {load.id} is running"
        return f"{n} burst(s) running" if n else None

    def _refuse_while_held(self) -> None:
        holder = self._holding()
        if holder is not None:
            raise EngineTaken(f"{holder.describe()}; it needs the engine to itself until it ends (or is stopped)")

    def _admit(self, ab: bool) -> None:
        if self._closed:
            raise BusyError("the server is shutting down")
        self._refuse_while_held()
        if self._running_ab() is not None:
            raise BusyError("an A/B comparison is running; it needs the engine to itself until it ends")
        load = next((r for r in self._loads.values() if r.state == "running"), None)
        if ab and load is not None:
            raise BusyError(f"continuous load {load.id} is running; stop it first: an A/B comparison needs the "
                            "engine to itself")
        n = self._running_count()
        if ab and n:
            raise BusyError(f"{n} burst(s) still running; an A/B comparison needs the engine to itself")
        if n >= self.limits.max_concurrent_bursts:
            raise BusyError(f"{n} bursts already running (limit {self.limits.max_concurrent_bursts})")

    def _admit_load(self) -> None:
        if self._closed:
            raise BusyError("the server is shutting down")
        self._refuse_while_held()
        if self._running_ab() is not None:
            raise BusyError("an A/B comparison is running; it needs the engine to itself until it ends")
        load = next((r for r in self._loads.values() if r.state == "running"), None)
        if load is not None:
            raise BusyError(f"continuous load {load.id} is already running; stop it first (one at a time)")

    def _trim(self, table: dict, kind: str) -> None:
        excess = len(table) - self.keep
        for key in list(table):
            if excess <= 0:
                break
            if table[key].state != "running":       # oldest first; running ones stay
                del table[key]
                self.dropped[kind] += 1
                excess -= 1

    def spawn(self, target, item) -> None:
        """Run `target(item)` on a thread of its own, named for the item's id; `close` waits for it."""
        t = threading.Thread(target=target, args=(item,), name=f"batchscope-{item.id}", daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    # -- bursts and A/B
    def _run_burst_thread(self, burst: Burst) -> None:
        try:
            self._run_burst(burst)
        except Exception as e:  # a crashed burst must report, not vanish
            burst.error, burst.state = f"{type(e).__name__}: {e}", "error"

    def _run_ab_thread(self, ab: ABRun) -> None:
        original = self.engine.mode
        state, error = "error", None
        try:
            self.warm_up()
            for mode in ("sync", "async"):
                ab.phase = mode
                self.engine.set_mode(mode, reason=f"A/B {ab.id}: {mode} half")
                burst = Burst(id=new_id("b"), spec=ab.spec, total=ab.spec.num_requests, expect_mode=mode)
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
            ab.compare = self._compare_halves(ab)
            state = "done"
        except Exception as e:
            error = f"{e}"
        finally:
            ab.phase = None
            try:
                self.engine.set_mode(original, reason=f"A/B {ab.id}: back to {original}")
            except Exception:
                pass
            # only now does the lock go: a switch made as soon as it is allowed must not be undone by ours
            ab.error, ab.state = error, state

    def warm_up(self) -> None:
        """A few tokens in each mode first, so the first half of an A/B does not pay for a cold engine."""
        async def drain(handle):
            async for _delta in handle.astream():
                pass

        async def both_modes():
            for mode in ("sync", "async"):
                self.engine.set_mode(mode, reason="A/B warm-up")
                params = SamplingParams(max_new_tokens=4, ignore_eos=True)
                await asyncio.gather(*(drain(self.engine.submit([1, 2, 3, 4], params)) for _ in range(2)))
        asyncio.run(both_modes())

    def _compare_halves(self, ab) -> dict | None:
        """Async against sync over the two halves' own steps, as the scoreboard compares them (matched decode
        steps, warm-up left out, an interval and a verdict): telemetry's board over the window both halves
        span."""
        if self.telemetry is None or not (ab.sync.results.window_us and ab.async_.results.window_us):
            return None
        summary = self.telemetry.summary(ab.sync.results.window_us[0], ab.async_.results.window_us[1])
        c = (summary.get("board") or {}).get("compare")
        if c is None:
            return None
        # one burst each way is one switch by design: the A/B reads the steps' own verdict (the scoreboard's needs
        # several switches, telemetry/alternations.py), and says where compute on the host leaves no winner
        verdict = "no winner here" if c["verdict"] == "no winner here" else c["step_verdict"]
        reason = c["reason"] if verdict == "no winner here" else c["step_reason"]
        return {**c, "verdict": verdict, "reason": reason}

    def _run_burst(self, burst: Burst) -> None:
        plan = plan_burst(burst.spec, self.vocab_size)
        burst.mode = getattr(self.engine, "mode", None)
        tel = self.telemetry
        t0_us = tel.now_us() if tel is not None else None
        timings, start_ns, end_ns = asyncio.run(self._drive(burst, plan))
        # the window holds every request of the burst, its delivery times joined (telemetry records a finish late)
        if tel is not None:
            tel.wait_finished([t.request_id for t in timings if not t.error])
        t1_us = tel.now_us() if tel is not None else None
        window = tel.summary(t0_us, t1_us) if tel is not None else None
        errors = sorted({t.error for t in timings if t.error})[:MAX_ERRORS_REPORTED]
        results = BurstResults(**burst_metrics(timings, start_ns, end_ns), mode=burst.mode, errors=errors,
                               busy_pct=window.get("busy_pct") if window else None, telemetry=window,
                               window_us=(t0_us, t1_us) if window is not None else None)
        burst.results = results
        burst.values = point_values(timings, seed=burst.spec.seed or 0)
        if burst.flight.cancel.is_set():
            burst.error, burst.state = "cancelled", "error"
        elif results.completed == 0:
            burst.error, burst.state = "; ".join(errors) or "no request completed", "error"
        else:
            burst.state = "done"

    async def _drive(self, burst: Burst, plan: list[PlannedRequest]):
        start_ns = burst.start_ns = time.perf_counter_ns()
        timings = await asyncio.gather(*(self._one(burst, p, start_ns) for p in plan))
        return timings, start_ns, time.perf_counter_ns()

    async def _one(self, burst: Burst, p: PlannedRequest, start_ns: int) -> RequestTiming:
        # a late arrival (poisson, gamma) waits in short sleeps, so that a cancel is not held up by it
        await sleep_until(burst.flight, start_ns + int(p.offset_s * 1e9))
        t = await self.sender.send(burst, p)
        burst.done += 1
        return t
