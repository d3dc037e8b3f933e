"""CUDA events -> host microseconds, without ever synchronising.

A CUDA event has no absolute time; `a.elapsed_time(b)` only gives the device time between two completed events
(it is a query, not a wait). The engine records an anchor event while the device has no queued work and notes the
host `perf_counter_ns()` at that moment, so the anchor's device time is (almost exactly) that host time. Any
later event then sits at `anchor_host + anchor.elapsed_time(event)`. The engine re-anchors on idle periods, which
bounds drift between the device and host clocks.

Two causal bounds keep the mapping honest when the anchor is a little off: a step's device work cannot start
before the host began building the step, and its D2H copy cannot end after the host stopped waiting for it. A
violated bound shifts the mapping just enough to hold, and the shift is kept until the next anchor.

Only events of the trace being delivered are read: they are complete (the step was consumed) and they will be
re-recorded two steps later, so nothing here keeps a reference to them.
"""
from __future__ import annotations

from engine.trace import GPU_PHASES


class EventClock:
    def __init__(self, origin_ns: int):
        self.origin_ns = origin_ns
        self._anchor_key: tuple[int, int] | None = None   # (id(event), host_ns) of the anchor in use
        self._shift_ns = 0.0
        self.anchors = 0          # distinct anchors seen
        self.corrections = 0      # times a causal bound moved the mapping
        self.failures = 0         # traces whose events could not be read
        self.last_error: str | None = None

    def _us(self, ns: float) -> float:
        return round((ns - self.origin_ns) / 1000.0, 1)

    def resolve(self, trace, cpu: dict) -> tuple[dict | None, str]:
        """Map the trace's GPU events to host µs. Returns ({phase: [start_us, end_us]}, basis) where basis is
        "gpu" (anchored), "gpu_wait" (no anchor: D2H end placed at the end of the host's wait) or "none"."""
        events = trace.gpu_events
        if not events:
            return None, "none"
        try:
            if trace.anchor is not None:
                return self._anchored(events, trace.anchor, trace.host), "gpu"
            return self._by_wait(events, trace.host), "gpu_wait"
        except Exception as exc:   # an unrecorded or incomplete event: report it, never wait for it
            self.failures += 1
            self.last_error = f"step {trace.step}: {type(exc).__name__}: {exc}"
            return None, "none"

    def _anchored(self, events: dict, anchor: tuple, host: dict) -> dict:
        anchor_event, anchor_ns = anchor
        key = (id(anchor_event), anchor_ns)
        if key != self._anchor_key:           # a fresh anchor: forget the old correction
            self._anchor_key = key
            self._shift_ns = 0.0
            self.anchors += 1
        ns = {}
        for phase in GPU_PHASES:
            pair = events.get(phase)
            if pair is not None:
                start, end = pair
                ns[phase] = [anchor_ns + anchor_event.elapsed_time(start) * 1e6,
                             anchor_ns + anchor_event.elapsed_time(end) * 1e6]
        self._apply_bounds(ns, host)
        return {p: [self._us(a + self._shift_ns), self._us(b + self._shift_ns)] for p, (a, b) in ns.items()}

    def _apply_bounds(self, ns: dict, host: dict) -> None:
        if not ns:
            return
        first = min(a for a, _ in ns.values()) + self._shift_ns
        last = max(b for _, b in ns.values()) + self._shift_ns
        lo = min(a for a, _ in host.values()) if host else None      # the host began building this step
        hi = host["wait"][1] if "wait" in host else None              # the host saw this step's copy complete
        if hi is not None and last > hi:
            self._shift_ns -= last - hi
            self.corrections += 1
        elif lo is not None and first < lo:
            self._shift_ns += lo - first
            self.corrections += 1

    def _by_wait(self, events: dict, host: dict) -> dict:
        # Relative times come from the step's own events; the last one is placed at the end of the host's wait.
        ref = events.get("h2d", events.get("compute"))[0]
        rel = {p: [ref.elapsed_time(s) * 1e6, ref.elapsed_time(e) * 1e6] for p, (s, e) in events.items()
               if p in GPU_PHASES}
        end_ns = host["wait"][1] if "wait" in host else max(b for _, b in host.values())
        offset = end_ns - max(b for _, b in rel.values())
        return {p: [self._us(offset + a), self._us(offset + b)] for p, (a, b) in rel.items()}

    def status(self) -> dict:
        return {"anchors": self.anchors, "corrections": self.corrections, "failures": self.failures,
                "last_error": self.last_error}
