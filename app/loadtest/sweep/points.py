"""One sweep point while it runs (`PointRun`): what Sender.send needs of a run (spec, flight, on_chunk), its
bounds and its progress; and how many requests a throughput run keeps in flight.

The throughput run keeps at most `PointRun.cap` requests in flight: what the engine finishes within its latency
budget, the longer of half the point's duration and twice an unloaded request's latency (the synchronous run's).
By Little's law (in flight = rate x latency) that is the requests/s achieved so far x the budget: it starts from the
synchronous run's rate and grows as batching pays, up to max_concurrency. A GPU that batches well reaches
max_concurrency once its first requests come back; a CPU that does not stops where a request takes about the
budget, instead of queueing hundreds that then take many times the point to drain (a "5 s a point" sweep of
SmolLM2-135M on a CPU whose throughput run queued ~240 requests). A point so lasts about its duration plus one
budget at most.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from ..client_timing import RequestTiming
from ..runs import InFlight
from .progress import SweepCurrent
from .spec import SweepSpec

CAP_SHARE = 0.5                     # a throughput run's latency budget: this share of a point,
CAP_UNLOADED = 2.0                  # or this many times an unloaded request's latency, whichever is longer


@dataclass
class PointRun:
    """One point while it runs: what Sender.send needs of a run (spec, flight, on_chunk) and its progress."""
    mode: str
    index: int
    kind: str
    offered_rate: float | None
    concurrency: int | None
    spec: SweepSpec
    start_ns: int = field(default_factory=time.perf_counter_ns)
    flight: InFlight = field(default_factory=InFlight, repr=False)
    sent: int = 0
    arrivals: int = 0                   # sent + skipped: what a request-count bound counts
    finished: int = 0
    in_flight: int = 0
    skipped: int = 0
    draining: bool = False              # sending is over
    cut: int = 0                        # cancelled at the drain bound
    mode_moved: bool = False
    cap: int | None = None              # a throughput run's requests in flight now (module docstring)
    budget_s: float | None = None       # and the latency it keeps them within
    peak: int = 0                       # the most it had in flight
    completed: int = 0                  # a throughput run's requests back so far, for its cap

    def bound_reached(self) -> bool:
        """Is the sending over (stopped, or past the duration or the request count)? Then it drains."""
        spec = self.spec
        if (self.flight.cancel.is_set()
                or (spec.requests is not None and self.arrivals >= spec.requests)
                or (spec.duration_s is not None and time.perf_counter_ns() - self.start_ns >= spec.duration_s * 1e9)):
            self.draining = True
        return self.draining

    def take(self) -> bool:
        """May one more request be sent? Counts it when so."""
        if self.bound_reached():
            return False
        self.sent += 1
        self.arrivals += 1
        return True

    def came_back(self, timing: RequestTiming) -> None:
        """A throughput run's cap, after a request came back: the rate achieved so far x the point's duration
        (module docstring); it only grows."""
        if self.cap is None or self.budget_s is None or not timing.ok:
            return
        self.completed += 1
        rate = self.completed / max((time.perf_counter_ns() - self.start_ns) / 1e9, 1e-3)
        self.cap = max(self.cap, min(self.concurrency, math.ceil(rate * self.budget_s)))

    def on_chunk(self, now_ns: int, tokens: int, mode) -> None:
        if mode is not None and mode != self.mode:
            self.mode_moved = True

    def progress(self) -> SweepCurrent:
        return SweepCurrent(mode=self.mode, index=self.index, kind=self.kind, offered_rate=self.offered_rate,
                            elapsed_s=(time.perf_counter_ns() - self.start_ns) / 1e9,
                            duration_s=self.spec.duration_s, requests=self.spec.requests, sent=self.sent,
                            finished=self.finished, in_flight=self.in_flight, draining=self.draining)


def latency_budget(sync_rps: float, duration_s: float | None) -> float | None:
    """The throughput run's latency budget (the module's docstring); None without a duration (a request-count bound:
    every request is sent, however long that takes) or without an unloaded rate to start from."""
    if duration_s is None or sync_rps <= 0:
        return None
    return max(CAP_SHARE * duration_s, CAP_UNLOADED / sync_rps)
