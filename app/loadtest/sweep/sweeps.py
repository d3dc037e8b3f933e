"""Sweeps: in each mode, a synchronous run, a throughput run, then rising offered rates, each point timed on the
client side like a burst (spec.py says what a sweep asks for, curves.py how a point is judged).

A sweep has the engine to itself while it runs (BurstManager.hold_engine): it switches the mode itself, the mode
toggle is locked as an A/B locks it, and no burst, A/B or load starts beside it. Every point sends the same
seeded requests in the same order (plans.prompt_stream), so point i of each mode sees the same prompts.
The throughput run keeps in flight only what the engine finishes within a latency budget (points.py), so that a
point lasts about its duration plus that budget.
A stop ends the point running now (what it has in flight is cancelled and counted, nothing is dropped) and keeps
the points already done. `Sweeps` starts sweeps, keeps the last few and the foreign reports uploaded beside them.
"""
from __future__ import annotations

import asyncio
import math
import random
import threading
import time
import uuid
from dataclasses import dataclass, field

from ..client_timing import RequestTiming
from ..arrivals import prompt_stream
from ..sender import sleep_until
from .files import document
from .curves import curve_summary, point_figures, point_values
from .spec import SweepSpec, derive_slo, spaced_rates
from .points import PointRun, latency_budget
from .progress import ModeCurve, SweepList, SweepStarted, SweepStatus

MAX_KEPT_SWEEPS = 20
MAX_KEPT_IMPORTS = 8
STOP_WAIT_S = 10.0                  # POST /api/sweep/{id}/stop waits this long for the sweep to wind down
DRAIN_POLL_S = 0.02


@dataclass
class SweepRun:
    id: str
    spec: SweepSpec                     # settled
    meta: dict = field(default_factory=dict)
    state: str = "running"
    stop_reason: str | None = None
    error: str | None = None
    created: float = field(default_factory=time.time)
    start_ns: int = field(default_factory=time.perf_counter_ns)
    end_ns: int | None = None
    mode: str | None = None             # the mode running now
    points: dict[str, list[dict]] = field(default_factory=dict)     # per mode, in the order they ran
    values: dict[str, list[dict]] = field(default_factory=dict)     # the raw values behind each point
    summaries: dict[str, dict] = field(default_factory=dict)
    current: PointRun | None = None
    slo_derived: dict | None = None     # how spec.slo_from_sync's SLOs were derived, once the first point ran
    ended: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def stopping(self) -> bool:
        return self.stop_reason is not None

    def stop(self, reason: str = "stopped") -> None:
        """End it from any thread: the point running now is cut short, its requests in flight cancelled."""
        if self.stop_reason is None:
            self.stop_reason = reason
        pt = self.current
        if pt is not None:
            pt.flight.cancel_all()

    def describe(self) -> str:
        where = f"its {self.mode} half" if self.mode else "its warm-up"
        return f"a sweep ({self.id}) is running ({where})"

    @property
    def points_total(self) -> int:
        return len(self.spec.modes) * self.spec.runs_per_mode

    def status(self) -> SweepStatus:
        modes = {m: ModeCurve(points=pts, summary=self.summaries.get(m)) for m, pts in self.points.items()}
        running = self.state == "running"
        pt = self.current if running else None
        return SweepStatus(id=self.id, state=self.state, stop_reason=self.stop_reason, error=self.error,
                           spec=self.spec, slo=self.spec.slo, modes=modes,
                           points_done=sum(len(p) for p in self.points.values()), points_total=self.points_total,
                           current=pt.progress() if pt is not None else None,
                           elapsed_s=((self.end_ns or time.perf_counter_ns()) - self.start_ns) / 1e9,
                           mode=self.mode if running else None, slo_derived=self.slo_derived)

    def document(self) -> dict:
        return document(self.status().model_dump(mode="json"), self.values, self.meta, self.created)


class Sweeps:
    """Starts sweeps on the load tests' manager (`runs`: its engine, sender, telemetry and threads) and keeps the
    last `keep` of them, with the foreign reports uploaded to overlay on them."""

    def __init__(self, runs, keep: int = MAX_KEPT_SWEEPS):
        self.runs, self.keep = runs, keep
        self._sweeps: dict[str, SweepRun] = {}
        self._imports: dict[str, dict] = {}
        self._lock = threading.Lock()

    # -- public
    def start(self, spec: SweepSpec, meta: dict | None = None) -> SweepStarted:
        max_model_len = (getattr(self.runs.engine, "info", None) or {}).get("max_model_len")
        spec = spec.within(self.runs.limits, max_model_len)
        run = SweepRun(id=f"sweep-{uuid.uuid4().hex[:10]}", spec=spec, meta=dict(meta or {}))
        self.runs.hold_engine(run)          # EngineTaken while anything else runs
        with self._lock:
            self._sweeps[run.id] = run
            _trim(self._sweeps, self.keep)
        self.runs.spawn(self._run, run)
        return SweepStarted(sweep_id=run.id, points_total=run.points_total, spec=spec)

    def get(self, sweep_id: str) -> SweepRun:
        with self._lock:
            run = self._sweeps.get(sweep_id)
        if run is None:
            raise KeyError(f"no sweep with id {sweep_id!r}")
        return run

    def stop(self, sweep_id: str) -> SweepStatus:
        run = self.get(sweep_id)
        if run.state == "running":
            run.stop("stopped")
            run.ended.wait(STOP_WAIT_S)
        return run.status()

    def running(self) -> str | None:
        with self._lock:
            return next((r.id for r in self._sweeps.values() if r.state == "running"), None)

    def latest(self) -> SweepRun | None:
        with self._lock:
            return next(reversed(self._sweeps.values()), None)

    def add_import(self, report: dict) -> str:
        """Keep a foreign report (foreign.read_report's shape) to overlay; returns its id."""
        import_id = f"import-{uuid.uuid4().hex[:8]}"
        with self._lock:
            self._imports[import_id] = {**report, "id": import_id}
            _trim(self._imports, MAX_KEPT_IMPORTS)
        return import_id

    def get_import(self, import_id: str) -> dict:
        with self._lock:
            rep = self._imports.get(import_id)
        if rep is None:
            raise KeyError(f"no imported report with id {import_id!r}")
        return rep

    def list(self) -> SweepList:
        with self._lock:
            sweeps = [{"id": r.id, "state": r.state, "created": r.created, "modes": r.spec.modes,
                       "points_done": sum(len(p) for p in r.points.values()), "points_total": r.points_total}
                      for r in self._sweeps.values()]
            imports = [{"id": k, "tool": v.get("tool"), "label": v.get("label"),
                        "series": list(v.get("modes", {}))} for k, v in self._imports.items()]
        return SweepList(sweeps=sweeps, imports=imports)

    # -- running one
    def _run(self, run: SweepRun) -> None:
        engine = self.runs.engine
        original = engine.mode
        try:
            if run.spec.warm_up:
                self.runs.warm_up()
            for mode in run.spec.modes:
                if run.stopping:
                    break
                engine.set_mode(mode)
                run.mode = mode
                run.points[mode], run.values[mode] = [], []
                try:
                    self._run_mode(run, mode)
                finally:
                    run.summaries[mode] = curve_summary(run.points[mode], run.spec.slo.target, run.spec.slo)
        except Exception as e:          # a crashed sweep must report, not vanish
            run.error = f"{type(e).__name__}: {e}" if not isinstance(e, RuntimeError) else str(e)
            run.stop_reason = "error"
        finally:
            run.current = None
            try:
                engine.set_mode(original)
            except Exception:
                pass
            run.end_ns = time.perf_counter_ns()
            # only now does the engine go back: a switch made as soon as it is allowed must not be undone by ours
            run.state = "error" if run.error else "done"
            run.ended.set()

    def _run_mode(self, run: SweepRun, mode: str) -> None:
        spec = run.spec
        sync = self._point(run, mode, "synchronous", None, 1)
        if run.stopping:
            return
        top = self._point(run, mode, "throughput", None, spec.max_concurrency,
                          budget_s=latency_budget(sync["requests_per_s"], spec.duration_s))
        rates = spec.rates or spaced_rates(sync["requests_per_s"], top["requests_per_s"], spec.points)
        for rate in rates:
            if run.stopping:
                return
            self._point(run, mode, spec.arrival, rate, None)

    def _point(self, run: SweepRun, mode: str, kind: str, rate: float | None, concurrency: int | None,
               budget_s: float | None = None) -> dict:
        pt = PointRun(mode=mode, index=len(run.points[mode]), kind=kind, offered_rate=rate,
                      concurrency=concurrency, spec=run.spec, budget_s=budget_s)
        if budget_s is not None:        # the throughput run: first, what one at a time finishes in the budget
            sync_rps = run.points[mode][0]["requests_per_s"]
            pt.cap = max(1, min(concurrency, math.ceil(sync_rps * budget_s)))
        run.current = pt
        if run.stopping:                # stopped between the check and here: the stop found no point to cut
            pt.flight.cancel_all()
        tel = self.runs.telemetry
        t0_us = tel.now_us() if tel is not None else None
        timings, end_ns = asyncio.run(self._drive(pt))
        window = tel.summary(t0_us, tel.now_us()) if tel is not None else None
        stopped = run.stopping
        ended = [t for t in timings if t.ok or not pt.flight.cancel.is_set()]
        cancelled = len(timings) - len(ended)
        if kind == "synchronous" and run.spec.slo_from_sync and run.slo_derived is None:
            self._derive_slo(run, mode, pt.index, ended)
        figures = point_figures(ended, pt.start_ns, end_ns, run.spec.slo, cancelled=cancelled, skipped=pt.skipped,
                                cut=0 if stopped else cancelled)
        if budget_s is not None:        # the throughput run: the most it had in flight, not the bound it grew to
            concurrency = pt.peak
        point = {"index": pt.index, "mode": mode, "kind": kind, "offered_rate": rate, "concurrency": concurrency,
                 "complete": not stopped, **figures, **_window_figures(window),
                 "mode_moved": pt.mode_moved}
        run.points[mode].append(point)
        run.values[mode].append(point_values(ended, seed=run.spec.seed or 0))
        if not stopped and figures["completed"] == 0 and figures["failed"]:
            errors = sorted({t.error for t in ended if t.error})
            raise RuntimeError(f"the {kind} run in {mode} completed no request: {'; '.join(errors[:3])}")
        return point

    @staticmethod
    def _derive_slo(run: SweepRun, mode: str, index: int, ended: list[RequestTiming]) -> None:
        """The SLOs the caller left out, from the sweep's first synchronous run (spec.py's docstring): every point,
        this one included and both modes, is judged by them."""
        lat = point_figures(ended, 0, 1, run.spec.slo)
        slo, record = derive_slo(run.spec.slo, run.spec.slo_from_sync, lat["ttft_ms"]["p99"], lat["tpot_ms"]["p99"])
        run.spec = run.spec.model_copy(update={"slo": slo})
        run.slo_derived = {"mode": mode, "index": index, "kind": "synchronous", **record}

    async def _drive(self, pt: PointRun) -> tuple[list[RequestTiming], int]:
        """Send the point's requests (closed loop for synchronous and throughput, open loop at the offered rate
        otherwise) until a bound, then let what is in flight finish within the drain bound."""
        plan = prompt_stream(pt.spec, self.runs.vocab_size)
        pt.start_ns = time.perf_counter_ns()
        timings: list[RequestTiming] = []
        guard = asyncio.create_task(self._drain_guard(pt))

        async def one(p):
            pt.in_flight += 1
            pt.peak = max(pt.peak, pt.in_flight)
            try:
                timing = await self.runs.sender.send(pt, p)
                timings.append(timing)
                pt.came_back(timing)
            finally:
                pt.in_flight -= 1
                pt.finished += 1

        if pt.offered_rate is None:
            async def worker(k: int):
                while True:
                    while pt.cap is not None and k >= pt.cap:      # not yet let in by the slow start
                        if pt.bound_reached():
                            return
                        await asyncio.sleep(DRAIN_POLL_S)
                    if not pt.take():
                        return
                    await one(next(plan))
            await asyncio.gather(*(worker(k) for k in range(pt.concurrency)))
        else:
            await self._open_loop(pt, plan, one)
        guard.cancel()
        return timings, time.perf_counter_ns()

    async def _open_loop(self, pt: PointRun, plan, one) -> None:
        """Arrivals at the offered rate (even gaps, or Poisson from a generator of their own, so that the prompts
        stay those of every other point). An arrival while the throughput run's concurrency is already in flight is
        counted as skipped, not sent, and takes no prompt: the next one sent gets it."""
        rng = random.Random((pt.spec.seed or 0) + 1)
        end_s, tasks, t = pt.spec.duration_s, set(), 0.0
        while True:
            if end_s is not None and t >= end_s:        # the next arrival falls after the point: it ends on time
                await sleep_until(pt.flight, pt.start_ns + int(end_s * 1e9))
            elif not await sleep_until(pt.flight, pt.start_ns + int(t * 1e9)):
                break
            if pt.bound_reached():
                break
            t += rng.expovariate(pt.offered_rate) if pt.spec.arrival == "poisson" else 1.0 / pt.offered_rate
            if pt.in_flight >= pt.spec.max_concurrency:
                pt.skipped += 1
                pt.arrivals += 1
                continue
            if not pt.take():
                break
            task = asyncio.create_task(one(next(plan)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*list(tasks))

    @staticmethod
    async def _drain_guard(pt: PointRun) -> None:
        """Once sending is over (a closed loop notices only when a request returns, so also at the deadline), give
        what is in flight `drain_s` to finish, then cancel it (counted as cut)."""
        while not pt.draining and not pt.flight.cancel.is_set():
            if pt.spec.duration_s is not None and time.perf_counter_ns() - pt.start_ns >= pt.spec.duration_s * 1e9:
                break
            await asyncio.sleep(DRAIN_POLL_S)
        if await sleep_until(pt.flight, time.perf_counter_ns() + int(pt.spec.drain_s * 1e9)) and pt.in_flight:
            pt.cut = pt.in_flight
            pt.flight.cancel_all()


def _window_figures(window: dict | None) -> dict:
    """Event busy % and ms/step from telemetry's summary of the point's window."""
    if not window:
        return {"busy_pct": None, "ms_per_step": None, "busy_basis": None, "steps": None, "window_us": None}
    return {"busy_pct": window.get("busy_pct"), "ms_per_step": (window.get("step_ms") or {}).get("p50"),
            "busy_basis": window.get("busy_basis"), "steps": window.get("steps"),
            "window_us": [window.get("t0_us"), window.get("t1_us")] if window.get("t0_us") is not None else None}


def _trim(table: dict, keep: int) -> None:
    for key in list(table):
        if len(table) <= keep:
            break
        if getattr(table[key], "state", "done") != "running":
            del table[key]
