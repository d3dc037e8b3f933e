"""CUDA events -> host microseconds, without ever synchronising.

A CUDA event has no absolute time; `a.elapsed_time(b)` only gives the device time between two completed events
(a query, not a wait). When it launches a step, the engine records an anchor event on a stream that never holds
work and notes the host `perf_counter_ns()` at that moment: the event completes as soon as the device sees it,
even while other streams are busy, so its device time is (almost exactly) that host time. Any event of the step
then sits at `anchor_host + anchor.elapsed_time(event)`. The newest anchor is kept for a trace that comes without
one (a step that failed before its launch).

"As soon as the device sees it" varies, though: tens of µs while the device is busy. Steps mapped each through its
own anchor then jitter against each other, and a gap between two steps (one event through each anchor) is off by
the difference, either way. So the engine also keeps an epoch: an anchor recorded once a second whose event is
never re-recorded. Every step of that second is mapped through it, and gaps between them are device time alone.
What the epoch's own latency puts off is learnt from the steps' anchors: an anchor the epoch maps to before the
host recorded it shows the epoch was seen later than that anchor, and the mapping moves on by the largest such
lead (the least-delayed anchor wins); a new epoch starts where the old one maps it, so the lead carries over
(drift that carrying piles up is held by the bounds below; after an idle stretch of seconds nothing is carried).

Bounds keep the mapping honest when the anchor is a little off or the two clocks drift apart during a long busy
stretch. Two are strict: a step's device work cannot start before the host began building it, and its D2H copy
cannot end after the host stopped waiting for it. One is learned: when the host really blocked in its wait, the
copy's end is what woke it, so the copy ended at most `wake_slack_us` before the wait ended. A single slow
wake-up (the OS scheduling something else) must not move the clock, so that bound acts only once it has been
violated `persist` blocked steps in a row, and then by the smallest violation among them. A violated bound
shifts the mapping just enough; the shift is kept until the next anchor (or epoch). Within an epoch, gap lengths
come from device times alone, except where a shift or a larger lead moves the mapping.

Through an epoch the wake bound is left out: the steps' anchors already bound the mapping from below, and soundly
(the host time of an anchor is when its record call began, before the device can have seen it), while a wake-up
can be slow for a whole run (under a profiler every CUDA call is: tens of µs), which the wake bound would take for
drift and move the mapping by, one gap at a time.

A step's compute span starts with its first kernel. Its start event completes when the stream reaches it, which
on an idle device can be before that kernel has arrived (its launch still on its way), so the engine makes a
one-element kernel the step's first, between two events, and the span starts at the first event, or one start
kernel's run (measured at start-up) before the second when that is later.

Only events of the trace being delivered are read: they are complete (the step was consumed) and they will be
re-recorded two steps later, so no reference to them is kept (the epoch's, never re-recorded, is the one kept).
"""
from __future__ import annotations

from batchscope.engine.trace import GPU_PHASES, head_start_ms


def place(anchor_ns: float, offset_ms: float) -> float:
    """The host time (ns) of an event `offset_ms` of device time after an anchor recorded at host time `anchor_ns`
    (what `anchor.elapsed_time(event)` returns). The one mapping from device to host time: rank 0's steps and the
    other tensor-parallel ranks' (whose peers send their offsets) both go through it."""
    return anchor_ns + offset_ms * 1e6


MAX_LEAD_NS = 500_000       # a larger lead is a host that noted its anchor late (preempted), not the device
CARRY_WITHIN_NS = 3_000_000_000     # an older epoch (the engine sat idle) says nothing of the drift since


class EventClock:
    def __init__(self, origin_ns: int, wake_slack_us: float = 30.0, persist: int = 8):
        self.origin_ns = origin_ns
        self.wake_slack_ns = wake_slack_us * 1000.0
        self.persist = persist
        self._late_wakes: list[float] = []    # consecutive wake-bound violations (ns), newest last
        self._anchor: tuple | None = None     # (event, host_ns) of the newest anchor
        self._epoch: tuple | None = None      # (event, host_ns) of the current epoch
        self._lead_ns = 0.0                   # how much later than its record the epoch was seen, as learnt
        self._shift_ns = 0.0
        self.anchors = 0          # distinct anchors seen
        self.corrections = 0      # times a causal bound moved the mapping
        self.failures = 0         # traces whose events could not be read
        self.last_error: str | None = None

    def _us(self, ns: float) -> float:
        return round((ns - self.origin_ns) / 1000.0, 1)

    def resolve(self, trace) -> tuple[dict | None, str]:
        """Map the trace's GPU events to host µs. Returns ({phase: [start_us, end_us]}, basis) where basis is
        "gpu" (anchored), "gpu_wait" (no anchor: D2H end placed at the end of the host's wait) or "none"."""
        events = trace.gpu_events
        if not events:
            return None, "none"
        try:
            spans, basis = self._resolve(trace, events)
            head = getattr(trace, "compute_head", None)
            if head is not None and "compute" in spans:     # the span starts with the first kernel (trace.py)
                late = head_start_ms(head[0].elapsed_time(head[1]), getattr(trace, "start_kernel_ns", 0.0) / 1e6)
                if late > 0.0:
                    spans["compute"][0] = round(spans["compute"][0] + late * 1000.0, 1)
            return spans, basis
        except Exception as exc:   # an unrecorded or incomplete event: report it, never wait for it
            self.failures += 1
            self.last_error = f"step {trace.step}: {type(exc).__name__}: {exc}"
            return None, "none"

    def _resolve(self, trace, events: dict) -> tuple[dict, str]:
        epoch = getattr(trace, "epoch", None)
        if epoch is not None:
            return self._through_epoch(events, epoch, trace.anchor, trace.host), "gpu"
        if trace.anchor is not None and trace.anchor is not self._anchor:
            if self._anchor is None or trace.anchor[1] != self._anchor[1]:
                self._shift_ns = 0.0        # a fresh anchor: forget the old correction
                self._late_wakes.clear()
                self.anchors += 1
            self._anchor = trace.anchor
        if self._anchor is not None:
            return self._anchored(events, self._anchor, trace.host), "gpu"
        return self._by_wait(events, trace.host), "gpu_wait"

    def _through_epoch(self, events: dict, epoch: tuple, anchor: tuple | None, host: dict) -> dict:
        epoch_event, epoch_ns = epoch
        if self._epoch is None or epoch_ns != self._epoch[1]:
            lead = 0.0
            if self._epoch is not None and epoch_ns - self._epoch[1] <= CARRY_WITHIN_NS:
                # start where the old epoch (and what it learnt) maps this one
                old_event, old_ns = self._epoch
                lead = place(old_ns, old_event.elapsed_time(epoch_event)) + self._lead_ns - epoch_ns
            self._epoch, self._lead_ns = epoch, lead if 0.0 <= lead <= MAX_LEAD_NS else 0.0
            self._shift_ns = 0.0
            self._late_wakes.clear()
            self.anchors += 1
        if anchor is not None:
            lead = anchor[1] - place(epoch_ns, epoch_event.elapsed_time(anchor[0]))
            if self._lead_ns < lead <= MAX_LEAD_NS:
                self._lead_ns = lead
        # the anchors bound the mapping from below as the wake-up would, but soundly: no wake bound here
        return self._anchored(events, epoch, host, self._lead_ns, wake_bound=False)

    def _anchored(self, events: dict, anchor: tuple, host: dict, lead_ns: float = 0.0,
                  wake_bound: bool = True) -> dict:
        anchor_event, anchor_ns = anchor
        ns = {}
        for phase in GPU_PHASES:
            pair = events.get(phase)
            if pair is not None:
                start, end = pair
                ns[phase] = [place(anchor_ns, anchor_event.elapsed_time(start)) + lead_ns,
                             place(anchor_ns, anchor_event.elapsed_time(end)) + lead_ns]
        if ns:
            self._apply_bounds(ns, host, wake_bound)
        return {p: [self._us(a + self._shift_ns), self._us(b + self._shift_ns)] for p, (a, b) in ns.items()}

    def _apply_bounds(self, ns: dict, host: dict, wake_bound: bool = True) -> None:
        first = min(a for a, _ in ns.values())
        last = ns["d2h"][1] if "d2h" in ns else max(b for _, b in ns.values())
        shift = self._shift_ns
        wait = host.get("wait")
        if wake_bound and wait is not None and wait[1] - wait[0] > self.wake_slack_ns:  # blocked: woke on the copy
            early = wait[1] - self.wake_slack_ns - (last + shift)
            self._late_wakes = self._late_wakes + [early] if early > 0 else []
            if len(self._late_wakes) >= self.persist:                          # persistent, so not a slow wake-up
                shift += min(self._late_wakes)
                self._late_wakes = []
        if host:
            shift = max(shift, min(a for a, _ in host.values()) - first)     # built before it ran
        if wait is not None:
            shift = min(shift, wait[1] - last)                                 # copied before the host saw it
        if shift != self._shift_ns:
            self._shift_ns = shift
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
