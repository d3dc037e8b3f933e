"""What a load-test run is while it goes on and after: a burst, an A/B comparison, a continuous load. Each
keeps its own progress and reports it as its typed status (statuses.py); manager.py runs them.
"""
from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field

from .client_timing import LoadTally
from .specs import BurstSpec, LoadSpec, Mode
from .statuses import ABStatus, BurstResults, BurstStatus, LoadRecent, LoadStatus, ModeChangeNote, RunState

LOAD_RECENT_S = 10.0                # a load's "recent" figures cover this many seconds


class InFlight:
    """A run's cancel flag and the engine handles of its requests in flight, so that a cancel from any thread also
    reaches the requests that have not streamed a token yet."""

    def __init__(self):
        self.cancel = threading.Event()
        self._handles: set = set()
        self._lock = threading.Lock()

    def add(self, handle) -> None:
        with self._lock:
            self._handles.add(handle)
            cancelled = self.cancel.is_set()
        if cancelled:                   # the cancel ran between the submit and the add
            handle.cancel()

    def discard(self, handle) -> None:
        with self._lock:
            self._handles.discard(handle)

    def cancel_all(self) -> None:
        with self._lock:
            self.cancel.set()
            handles = list(self._handles)
        for h in handles:
            h.cancel()


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
    flight: InFlight = field(default_factory=InFlight, repr=False)
    # an A/B half: the mode it must run in, and any other mode seen while its tokens streamed
    expect_mode: Mode | None = None
    start_ns: int = 0
    mode_changes: list[ModeChangeNote] = field(default_factory=list)
    values: dict | None = field(default=None, repr=False)     # raw latencies once it has ended, for CDFs

    def stop(self) -> None:
        """Cancel from any thread: nothing more is sent, and what is in flight is cancelled in the engine."""
        self.flight.cancel_all()

    def on_chunk(self, now_ns: int, tokens: int, mode: Mode | None) -> None:
        if self.expect_mode is None or mode == self.expect_mode:
            return
        last = self.mode_changes[-1].mode if self.mode_changes else self.expect_mode
        if mode != last:
            self.mode_changes.append(ModeChangeNote(t_s=(now_ns - self.start_ns) / 1e9, previous=last, mode=mode,
                                                    phase=self.expect_mode))

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
    compare: dict | None = None         # the halves' steps compared as the scoreboard compares (figures.compare)
    error: str | None = None
    created: float = field(default_factory=time.time)

    def status(self) -> ABStatus:
        halves = [b for b in (self.sync, self.async_) if b is not None]
        changes = [c for b in halves for c in b.mode_changes]
        return ABStatus(id=self.id, state=self.state, phase=self.phase, spec=self.spec,
                        done=sum(b.done for b in halves), total=2 * self.spec.num_requests,
                        sync=self.sync.results if self.sync else None,
                        async_=self.async_.results if self.async_ else None,
                        sync_burst=self.sync.id if self.sync else None,
                        async_burst=self.async_.id if self.async_ else None,
                        speedup=self.speedup, compare=self.compare, error=self.error,
                        requests_per_half=self.spec.num_requests,
                        half_done=halves[-1].done if halves else 0, mode_changes=changes, valid=not changes)


@dataclass
class LoadRun:
    """A continuous load: requests keep coming until it is stopped or reaches a bound of its spec."""
    id: str
    spec: LoadSpec                      # settled: lengths, seed and both bounds known
    mode: Mode | None = None            # the engine's mode as last seen
    state: RunState = "running"
    stop_reason: str | None = None
    error: str | None = None
    created: float = field(default_factory=time.time)
    start_ns: int = field(default_factory=time.perf_counter_ns)
    end_ns: int | None = None
    sent: int = 0
    skipped: int = 0
    in_flight: int = 0
    tally: LoadTally = field(default_factory=lambda: LoadTally(window_s=LOAD_RECENT_S))
    results: BurstResults | None = None
    mode_changes: list[ModeChangeNote] = field(default_factory=list)
    flight: InFlight = field(default_factory=InFlight, repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    ended: threading.Event = field(default_factory=threading.Event, repr=False)

    def stop(self, reason: str = "stopped") -> None:
        """End it from any thread: nothing more is sent, what is in flight is cancelled. The first reason stays."""
        with self.lock:
            if self.stop_reason is None:
                self.stop_reason = reason
        self.flight.cancel_all()

    def take(self) -> bool:
        """May one more request be sent? Counts it when so; at `max_requests` it ends the sending (what is in
        flight finishes)."""
        with self.lock:
            if self.flight.cancel.is_set() or self.stop_reason is not None:
                return False
            if self.sent >= self.spec.max_requests:
                self.stop_reason = "max_requests"
                return False
            self.sent += 1
            return True

    def note_mode(self, previous: Mode | None, mode: Mode | None, now_ns: int | None = None) -> None:
        with self.lock:
            if mode is None or mode == self.mode:
                return
            now_ns = now_ns or time.perf_counter_ns()
            self.mode_changes.append(ModeChangeNote(t_s=(now_ns - self.start_ns) / 1e9, previous=previous,
                                                    mode=mode))
            self.mode = mode

    def on_chunk(self, now_ns: int, tokens: int, mode: Mode | None) -> None:
        if tokens:
            self.tally.token_chunk(now_ns, tokens)
        if mode != self.mode:           # a switch that did not go through the server (see BurstManager.set_mode)
            self.note_mode(self.mode, mode, now_ns)

    def status(self, mode: Mode | None) -> LoadStatus:
        now = self.end_ns or time.perf_counter_ns()
        elapsed = (now - self.start_ns) / 1e9
        remaining = max(0.0, self.spec.duration_s - elapsed) if self.state == "running" else 0.0
        t = self.tally
        with self.lock:
            changes = list(self.mode_changes)
        return LoadStatus(id=self.id, state=self.state, stop_reason=self.stop_reason, spec=self.spec, mode=mode,
                          elapsed_s=elapsed, remaining_s=remaining, sent=self.sent, completed=t.completed,
                          failed=t.failed, cancelled=t.cancelled, skipped=self.skipped, in_flight=self.in_flight,
                          output_tokens=t.output_tokens, recent=LoadRecent(**t.recent(now, self.start_ns)),
                          mode_changes=changes, results=self.results, error=self.error)


def new_id(prefix: str) -> str:
    """A run's id: its kind's prefix and ten hex digits ("b-…" a burst, "ab-…" an A/B, "load-…" a load)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"
