"""Why the GPU sat idle between two steps.

The gap is [previous step's compute end, this step's compute start]. Each instant of it gets one cause:
- after this step's launch span ended, the host had handed the work over: the compute stream waited on this
  step's H2D copy ("h2d") or on launch latency ("launch");
- before that, the host span running at that instant is the cause ("schedule", "fill", "launch", "wait",
  "update" of whichever step it belonged to), except that the host waiting while the previous step's D2H copy
  ran counts as "d2h";
- time spent inside telemetry's own observer callback is "telemetry" (so its cost is never hidden);
- an instant inside a collection of Python's garbage collector is "gc", whatever span it interrupted: the
  collector holds the GIL, so the engine thread could do nothing then (telemetry/gc_pauses.py); before the first
  request existed, though, there was nothing to do anyway (below);
- "preempted": the engine thread was not running although its phase had work to do. Each step says its thread's
  CPU time per phase (`cpu_us`) beside the wall span; in a phase of fixed host work (schedule, fill, launch,
  update: not wait, whose job is to block) where the thread ran markedly less than the wall time (off-CPU at least
  PREEMPTED_MIN_SHARE of the span and PREEMPTED_MIN_US), the thread was waiting for the GIL (another Python thread
  held it) or for a CPU (the cores were busy). That share of every instant of the gap the span covers is
  "preempted", the rest keeps the phase's name: where in the span the thread stood still is not known, so the
  gap is split in proportion. Steps without `cpu_us` (old traces) never say "preempted";
- time no host span covers is "empty_queue" when the engine had no request at all (every request of this step
  arrived after that instant), otherwise "host_other" (loop bookkeeping between spans, other observers).
The parts sum to the gap; `idle_cause` is the largest. Host spans come from one engine thread, so they never
overlap and one sweep in time order labels the whole gap; collections never overlap each other either, and the
sweep runs over the pieces of the gap between them.
"""
from __future__ import annotations

from collections import deque

from batchscope.engine.trace import HOST_PHASES

_LABELS = frozenset(HOST_PHASES + ("telemetry",))
# phases whose work is fixed host work: their thread off the CPU is starvation ("wait" blocks on the device on
# purpose, so its off-CPU time is the wait itself)
PREEMPTIBLE = frozenset(("schedule", "fill", "launch", "update"))
# "markedly less CPU than wall": small shortfalls are page-ins, short syscalls and clock granularity, not a thread
# kept from running
PREEMPTED_MIN_SHARE = 0.2
PREEMPTED_MIN_US = 50.0


def off_cpu_share(phase: str, span: list, cpu_us: float | None) -> float:
    """The share of a host span the engine thread spent not running, when it counts as starvation, else 0."""
    if cpu_us is None or phase not in PREEMPTIBLE:
        return 0.0
    wall = span[1] - span[0]
    off = wall - cpu_us
    if wall <= 0 or off < PREEMPTED_MIN_US or off < PREEMPTED_MIN_SHARE * wall:
        return 0.0
    return min(1.0, off / wall)


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


class IdleAttributor:
    def __init__(self, history: int = 32):
        self._prev_end: float | None = None
        self._prev_d2h: list | None = None
        self._spans: deque = deque(maxlen=history)    # recent host spans (start, end, label, off-CPU share)
        self._collections: deque = deque(maxlen=history)   # recent garbage collections (start, end)

    def note(self, label: str, span: list) -> None:
        """A host span outside any step that later gaps may overlap: telemetry's own callback, or a collection
        ("gc"), which takes precedence over whatever the engine thread was in."""
        if label == "gc":
            self._collections.append((span[0], span[1]))
        else:
            self._spans.append((span[0], span[1], label, 0.0))

    def attribute(self, cpu: dict, gpu: dict | None, compute: list | None, empty_until: float | None,
                  cpu_us: dict | None = None) -> tuple[float | None, str | None, dict]:
        """-> (gpu_idle_before_us, idle_cause, {cause: us}). `empty_until`: the first arrival of this step's
        requests when all of them are new (the engine was empty before it), else None. `cpu_us`: the engine
        thread's CPU time per phase (None or absent: not measured, never "preempted")."""
        cpu_us = cpu_us or {}
        for phase, span in cpu.items():
            self._spans.append((span[0], span[1], phase if phase in _LABELS else "host_other",
                                off_cpu_share(phase, span, cpu_us.get(phase))))
        idle, cause, parts = None, None, {}
        if compute is not None and self._prev_end is not None:
            g0, g1 = self._prev_end, compute[0]
            if g1 > g0:
                parts = self._split(g0, g1, cpu, gpu, empty_until)
                idle = round(g1 - g0, 1)
                cause = max(parts, key=parts.get) if parts else None
            else:
                idle = 0.0
        if compute is not None:
            self._prev_end = compute[1]
            self._prev_d2h = gpu.get("d2h") if gpu else None
        return idle, cause, parts

    def _split(self, g0: float, g1: float, cpu: dict, gpu: dict | None, empty_until: float | None) -> dict:
        parts: dict[str, float] = {}

        def add(label: str, us: float) -> None:
            if us > 0:
                parts[label] = parts.get(label, 0.0) + us

        def uncovered(a: float, b: float) -> None:
            if empty_until is not None and a < empty_until:
                add("empty_queue", min(b, empty_until) - a)
                a = min(b, empty_until)
            add("host_other", b - a)

        # after the launch ended the device side is the cause: the H2D copy, or launch latency
        launch_end = cpu["launch"][1] if "launch" in cpu else None
        host_end = g1
        if launch_end is not None and launch_end < g1:
            host_end = max(g0, launch_end)
            h2d = gpu.get("h2d") if gpu else None
            in_h2d = _overlap(host_end, g1, *h2d) if h2d else 0.0
            add("h2d", in_h2d)
            add("launch", g1 - host_end - in_h2d)

        # before it, whatever the host thread was doing, except while a collection had stopped it
        def sweep(t: float, end: float) -> None:
            d2h = self._prev_d2h
            for s, e, label, off in sorted(x for x in self._spans if x[1] > t and x[0] < end):
                s, e = max(s, t), min(e, end)
                if e <= s:
                    continue
                if s > t:
                    uncovered(t, s)
                if off:
                    add("preempted", (e - s) * off)
                    add(label, (e - s) * (1.0 - off))
                elif label == "wait" and d2h:
                    copying = _overlap(s, e, *d2h)
                    add("d2h", copying)
                    add("wait", e - s - copying)
                else:
                    add(label, e - s)
                t = e
            if t < end:
                uncovered(t, end)

        t = g0
        for s, e in sorted(c for c in self._collections if c[1] > g0 and c[0] < host_end):
            s, e = max(s, t, empty_until if empty_until is not None else s), min(e, host_end)
            if e <= s:
                continue
            sweep(t, s)
            add("gc", e - s)
            t = e
        sweep(t, host_end)
        return {k: round(v, 1) for k, v in parts.items()}
