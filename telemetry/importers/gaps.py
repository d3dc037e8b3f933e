"""Every idle microsecond of a device, named: the gap before each step (previous compute end to this compute
start, batchscope's `gpu_idle_before_us`) and the idle stretches inside each step's compute span (launch-bound
stretches between kernels, which CUDA events around a forward cannot see).

Inside the gap before a step, time when the device was busy with copies or other work is named by that work
(`d2h`, `h2d`, `copy`, `collective`, `other_work`). Each idle stretch is followed to the op that ends it and that
op's launching call (correlation id):
  - the call started after the device went idle: the host was late. Until the call, the cause is what the
    launching thread was doing (host_activity.py, phases.py); from the call's start to the op, `launch`;
  - the call started before but was still running (a graph launch, a slow launch): `launch`;
  - the call had returned: the device waited on itself, on an event of another stream (`stream_wait`, when the
    trace has the CUDA synchronisation record) or to start the queued op (`launch`: launch latency);
  - no launching call in the file (launched before the window): `unattributed`.
`host_late_us` counts the first two kinds.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import names as N
from . import phases as P
from .busy import DeviceBusy
from .columns import WAIT_EVENT
from .host_activity import HostQuery
from .tables import TraceTables

_BUSY_CAUSE = [(N.COPY_D2H, "d2h"), (N.COPY_H2D, "h2d"), (N.COPY_OTHER, "copy"), (N.COLLECTIVE, "collective"),
               (N.MEMSET, "other_work"), (N.KERNEL, "other_work")]
HOST_OPS_KEPT = 3


@dataclass
class Gap:
    """One region's idle time (the gap before a step, or the idle inside its compute span) by cause."""
    inside: bool
    total_us: float = 0.0
    idle_us: float = 0.0                                # the part when the device ran nothing at all
    causes: dict = field(default_factory=dict)
    host_late_us: float = 0.0
    host_ops: dict = field(default_factory=dict)        # name -> µs the launching thread spent in it
    host_labels: dict = field(default_factory=dict)     # the host sweep's label -> µs, shared by its queries
    host_op_ids: dict = field(default_factory=dict)     # and its innermost op's name id -> µs
    stretches: list = field(default_factory=list)       # (start, end, cause) of idle stretches, for --kernels
    queries: list = field(default_factory=list)         # (HostQuery, stretch index) awaiting the host sweep

    def add(self, cause: str, us: float) -> None:
        if us > 0:
            self.causes[cause] = self.causes.get(cause, 0.0) + us


class GapFinder:
    """Names the gaps of one device (`busy`) of one trace."""

    def __init__(self, t: TraceTables, busy: DeviceBusy, keep_stretches: bool = False):
        self.t, self.busy, self.keep = t, busy, keep_stretches
        waits = t.sync.kind == WAIT_EVENT
        self._wait_start, self._wait_end = t.sync.start[waits], t.sync.end[waits]
        self._wait_stream = t.sync.stream[waits]

    def between(self, g0: float, g1: float) -> Gap:
        gap = Gap(inside=False, total_us=g1 - g0)
        self._busy_parts(gap, g0, g1)
        for a, b, row in self.busy.idle_within(g0, g1):
            gap.idle_us += b - a
            self._idle(gap, a, b, row)
        return gap

    def inside(self, r0: float, r1: float) -> Gap:
        gap = Gap(inside=True)
        for a, b, row in self.busy.idle_within(r0, r1):
            gap.total_us += b - a
            gap.idle_us += b - a
            self._idle(gap, a, b, row)
        return gap

    def _busy_parts(self, gap: Gap, g0: float, g1: float) -> None:
        """Time in [g0, g1] when the device was busy (copies, other work), named by the highest-ranked op kind."""
        t = self.t
        lo, hi = np.searchsorted(t.dev.start, [g0 - self.busy.longest, g1], side="left")
        rows = np.arange(lo, hi)
        rows = rows[(t.dev.device[rows] == self.busy.device) & (t.dev.end[rows] > g0)]
        covered: list[tuple[float, float]] = []
        for kind, cause in _BUSY_CAUSE:
            spans = sorted((max(float(t.dev.start[r]), g0), min(float(t.dev.end[r]), g1))
                           for r in rows[t.dev.kind[rows] == kind])
            for s, e in _subtract(_merge(spans), covered):
                gap.add(cause, e - s)
            covered = _merge(covered + spans)

    def _idle(self, gap: Gap, a: float, b: float, row: int) -> None:
        t = self.t
        call = int(t.dev.launch[row]) if row >= 0 else -1
        if call < 0:
            self._stretch(gap, a, b, "unattributed")
            return
        ls, le = float(t.rt.start[call]), float(t.rt.end[call])
        keep = self.keep or gap.inside                  # idle inside a step is always drawn, stretch by stretch
        if ls >= a:                                     # the host was late
            host_end = min(ls, b)
            pid, tid = int(t.rt.pid[call]), int(t.rt.tid[call])
            if keep:                                    # its own tallies, to name its stretch
                query = HostQuery(pid, tid, a, host_end)
            else:                                       # straight into the gap's
                query = HostQuery(pid, tid, a, host_end, gap.host_labels, gap.host_op_ids)
            gap.queries.append((query, len(gap.stretches) if keep and host_end > a else -1))
            gap.host_late_us += b - a
            self._stretch(gap, a, host_end, None)
            self._stretch(gap, host_end, b, "launch")
        elif le > a:                                    # the launch call was still running
            gap.host_late_us += b - a
            self._stretch(gap, a, b, "launch")
        else:
            self._stretch(gap, a, b, "stream_wait" if self._stream_waited(row, a, b) else "launch")

    def _stretch(self, gap: Gap, a: float, b: float, cause: str | None) -> None:
        if b <= a:
            return
        if cause is not None:
            gap.add(cause, b - a)
        if self.keep or gap.inside:
            gap.stretches.append([a, b, cause])

    def _stream_waited(self, row: int, a: float, b: float) -> bool:
        if not len(self._wait_start):
            return False
        on = self._wait_stream == self.t.dev.stream[row]
        return bool(np.any(on & (self._wait_start < b) & (self._wait_end > a)))


def resolve(gap: Gap, names: list[str]) -> None:
    """After the host sweep: the host-late parts' labels become causes (a blocking call is `wait` between steps,
    `host_sync` inside one), and the ops the thread was in become `host_ops` (named; the largest few are kept)."""
    blocking = "host_sync" if gap.inside else "wait"
    cause_of = [blocking if i == P.BLOCKING else label for i, label in enumerate(P.LABELS)]
    labels, ops = dict(gap.host_labels), dict(gap.host_op_ids)
    for query, index in gap.queries:
        if query.labels is gap.host_labels:
            continue
        for label, us in query.labels.items():
            labels[label] = labels.get(label, 0.0) + us
        for nid, us in query.ops.items():
            ops[nid] = ops.get(nid, 0.0) + us
        if index >= 0:
            gap.stretches[index][2] = cause_of[max(query.labels, key=query.labels.get)] if query.labels \
                else "host_other"
    for label, us in labels.items():
        gap.add(cause_of[label], us)
    for nid, us in ops.items():
        name = names[nid][:120] if nid >= 0 else "(no recorded op)"
        gap.host_ops[name] = gap.host_ops.get(name, 0.0) + us
    gap.queries, gap.host_labels, gap.host_op_ids = [], {}, {}


def top_ops(ops: dict, n: int = HOST_OPS_KEPT) -> dict:
    return {k: round(v, 1) for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:n] if v >= 0.05}


def _merge(spans: list) -> list:
    out: list[list[float]] = []
    for s, e in sorted(spans):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [tuple(x) for x in out]


def _subtract(spans: list, covered: list) -> list:
    """Parts of disjoint sorted `spans` not inside disjoint sorted `covered`."""
    out = []
    for s, e in spans:
        for c0, c1 in covered:
            if c1 <= s or c0 >= e:
                continue
            if c0 > s:
                out.append((s, c0))
            s = max(s, c1)
            if s >= e:
                break
        if s < e:
            out.append((s, e))
    return out
