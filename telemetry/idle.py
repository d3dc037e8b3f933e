"""Why the GPU sat idle between two steps.

The gap is [previous step's compute end, this step's compute start]. Each instant of it gets one cause:
- after this step's launch span ended, the host had handed the work over: the compute stream waited on this
  step's H2D copy ("h2d") or on launch latency ("launch");
- before that, the host span running at that instant is the cause ("schedule", "fill", "launch", "wait",
  "update" of whichever step it belonged to), except that the host waiting while the previous step's D2H copy
  ran counts as "d2h";
- time no host span covers is "empty_queue" when the engine had no request at all (every request of this step
  arrived after the instant), otherwise "host_other" (loop overhead between the spans).
The breakdown sums to the gap; the cause is its largest part. Host spans of one engine thread never overlap, so
at most one covers any instant.
"""
from __future__ import annotations

from collections import deque

from engine.trace import HOST_PHASES


class IdleAttributor:
    def __init__(self, history: int = 3):
        self._prev_end: float | None = None
        self._prev_d2h: list | None = None
        self._recent_cpu: deque = deque(maxlen=history)   # cpu span dicts of the last few steps

    def reset(self) -> None:
        self._prev_end = None
        self._prev_d2h = None
        self._recent_cpu.clear()

    def attribute(self, cpu: dict, gpu: dict | None, compute: list | None,
                  empty_until: float | None) -> tuple[float | None, str | None, dict]:
        """-> (gpu_idle_before_us, idle_cause, {cause: us}). `empty_until`: the first arrival of this step's
        requests when all of them are new (the engine was empty before it), else None."""
        idle, cause, parts = None, None, {}
        if compute is not None and self._prev_end is not None:
            g0, g1 = self._prev_end, compute[0]
            if g1 > g0:
                parts = self._split(g0, g1, cpu, gpu, empty_until)
                idle = round(g1 - g0, 1)
                cause = max(parts, key=parts.get) if parts else None
            else:
                idle = 0.0
        self._recent_cpu.append(cpu)
        if compute is not None:
            self._prev_end = compute[1]
            self._prev_d2h = gpu.get("d2h") if gpu else None
        return idle, cause, parts

    def _split(self, g0: float, g1: float, cpu: dict, gpu: dict | None, empty_until: float | None) -> dict:
        spans = [(s, e, phase) for spans in (*self._recent_cpu, cpu) for phase, (s, e) in spans.items()
                 if e > g0 and s < g1]
        h2d = gpu.get("h2d") if gpu else None
        launch_end = cpu["launch"][1] if "launch" in cpu else None
        cuts = {g0, g1}
        for s, e, _ in spans:
            cuts.update((s, e))
        for extra in (h2d, self._prev_d2h):
            if extra:
                cuts.update(extra)
        if launch_end is not None:
            cuts.add(launch_end)
        if empty_until is not None:
            cuts.add(empty_until)
        points = sorted(t for t in cuts if g0 <= t <= g1)
        parts: dict[str, float] = {}
        for a, b in zip(points, points[1:]):
            if b > a:
                label = self._label((a + b) / 2, spans, h2d, launch_end, empty_until)
                parts[label] = parts.get(label, 0.0) + (b - a)
        return {k: round(v, 1) for k, v in parts.items()}

    def _label(self, t, spans, h2d, launch_end, empty_until) -> str:
        if launch_end is not None and t >= launch_end:
            return "h2d" if h2d and h2d[0] <= t < h2d[1] else "launch"
        for s, e, phase in spans:
            if s <= t < e:
                d2h = self._prev_d2h
                if phase == "wait" and d2h and d2h[0] <= t < d2h[1]:
                    return "d2h"
                return phase if phase in HOST_PHASES else "host_other"
        if empty_until is not None and t < empty_until:
            return "empty_queue"
        return "host_other"
