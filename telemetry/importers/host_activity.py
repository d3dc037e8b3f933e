"""What a thread was doing over stretches of time: for each query (a thread and a time span), the time under each
cause label (phases.py) and under each innermost recorded op.

One sweep per thread over the ranges that touch any query (the rest cannot be open during one: ranges on one
thread nest), with the ranges' starts and ends and the queries' bounds in time order. A stack holds the open
ranges, each entry carrying the best label of itself and everything under it, so the label at any instant is the
top's. Ranges that do not nest properly (a Python row ending a little after the op it encloses) are removed
wherever they sit and the entries above them relabelled.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import phases as P
from .tables import TraceTables

_END, _QEND, _START, _QSTART = 0, 1, 2, 3
# batchscope stamps each host phase just outside its profiler range, so entering and leaving a range (tens of µs
# under the profiler) is phase time for batchscope: a stretch of at most this long between two of its ranges,
# with nothing recorded in it, is split at its middle between the two phases
RANGE_EDGE_US = 50.0


@dataclass
class HostQuery:
    pid: int
    tid: int
    start: float
    end: float
    labels: dict = field(default_factory=dict)     # label index (phases.LABELS) -> µs
    ops: dict = field(default_factory=dict)        # innermost op's name id (-1: none) -> µs


def attribute(t: TraceTables, queries: list[HostQuery], transparent: set | frozenset = frozenset()) -> None:
    """Fill each query's `labels` and `ops`. Ranges named in `transparent` (step markers: being inside a step says
    nothing of what the host did in it) are left out."""
    threads: dict[tuple[int, int], list[HostQuery]] = {}
    for q in queries:
        if q.end > q.start:
            threads.setdefault((q.pid, q.tid), []).append(q)
    if not threads:
        return
    host_prio, host_label = P.host_roles(t.names, t.host.name)
    rt_prio, rt_label = P.runtime_roles(t.rt.kind)
    for (pid, tid), qs in threads.items():
        h = np.flatnonzero((t.host.pid == pid) & (t.host.tid == tid))
        if transparent:
            h = h[~np.isin(t.host.name[h], list(transparent))]
        r = np.flatnonzero((t.rt.pid == pid) & (t.rt.tid == tid))
        starts = np.concatenate([t.host.start[h], t.rt.start[r]])
        ends = np.concatenate([t.host.end[h], t.rt.end[r]])
        prios = np.concatenate([host_prio[h], rt_prio[r]])
        starts, ends = _widen_phase_ranges(starts, ends, prios == P.PRIO_BATCHSCOPE)
        ranges = (starts, ends, np.concatenate([t.host.name[h], t.rt.name[r]]), prios,
                  np.concatenate([host_label[h], rt_label[r]]))
        _sweep(ranges, sorted(qs, key=lambda q: q.start))


def _widen_phase_ranges(starts, ends, phase: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Phase ranges (batchscope's) widened over the short empty stretches between consecutive ones
    (RANGE_EDGE_US), each taking the half next to it."""
    idx = np.flatnonzero(phase)
    if len(idx) < 2:
        return starts, ends
    idx = idx[np.argsort(starts[idx], kind="stable")]
    starts, ends = starts.copy(), ends.copy()
    others = np.flatnonzero(~phase)
    o_start, o_end = starts[others], ends[others]
    order = np.argsort(o_start, kind="stable")
    o_start, o_end = o_start[order], np.maximum.accumulate(o_end[order]) if len(order) else o_end
    for a, b in zip(idx[:-1], idx[1:]):
        g0, g1 = ends[a], starts[b]
        if not 0 < g1 - g0 <= RANGE_EDGE_US:
            continue
        k = int(np.searchsorted(o_start, g1, side="left"))      # any other range open inside the stretch?
        if k and o_end[k - 1] > g0:
            continue
        mid = (g0 + g1) / 2
        ends[a], starts[b] = mid, mid
    return starts, ends


def _touching(starts, ends, qs) -> np.ndarray:
    """Indices of ranges overlapping any query's span."""
    spans = np.empty((len(qs), 2))
    spans[:, 0] = np.fromiter((q.start for q in qs), float, len(qs))
    spans[:, 1] = np.fromiter((q.end for q in qs), float, len(qs))
    merged = [list(spans[0])]
    for s, e in spans[1:]:
        if s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    m = np.array(merged)
    k = np.searchsorted(m[:, 0], ends, side="left") - 1
    return np.flatnonzero((k >= 0) & (m[np.maximum(k, 0), 1] > starts) & (ends > starts))


def _points(starts, ends, keep, qs) -> tuple[list, list, list]:
    n, nq = len(keep), len(qs)
    q0 = np.fromiter((q.start for q in qs), float, nq)
    q1 = np.fromiter((q.end for q in qs), float, nq)
    times = np.concatenate([ends[keep], q1, starts[keep], q0])
    types = np.concatenate([np.full(n, _END), np.full(nq, _QEND), np.full(n, _START), np.full(nq, _QSTART)])
    index = np.concatenate([np.arange(n), np.arange(nq), np.arange(n), np.arange(nq)])
    # at one instant: ends first, then query ends, then starts (outer before inner), then query starts
    inner_last = np.concatenate([np.zeros(n + nq), -ends[keep], np.zeros(nq)])
    order = np.lexsort((inner_last, types, times))
    return times[order].tolist(), types[order].tolist(), index[order].tolist()


def _sweep(ranges, qs: list[HostQuery]) -> None:
    starts, ends, names, prios, labels = ranges
    if not len(starts):
        for q in qs:
            q.labels[P.HOST_OTHER] = q.labels.get(P.HOST_OTHER, 0.0) + (q.end - q.start)
            q.ops[-1] = q.ops.get(-1, 0.0) + (q.end - q.start)
        return
    keep = _touching(starts, ends, qs)
    k_names, k_prios, k_labels = names[keep].tolist(), prios[keep].tolist(), labels[keep].tolist()
    times, types, index = _points(starts, ends, keep, qs)
    # the stack of open ranges as three parallel lists: range index, best priority, best label (of it and below)
    s_idx: list[int] = []
    s_prio: list[int] = []
    s_label: list[int] = []
    active: list[HostQuery] = []
    host_other = P.HOST_OTHER
    prev = times[0] if times else 0.0
    for t, kind, i in zip(times, types, index):
        if active and t > prev:
            if s_idx:
                label, op = s_label[-1], k_names[s_idx[-1]]
            else:
                label, op = host_other, -1
            dt = t - prev
            for q in active:
                got = q.labels
                got[label] = got.get(label, 0.0) + dt
                got = q.ops
                got[op] = got.get(op, 0.0) + dt
        prev = t
        if kind == _START:
            p = k_prios[i]
            s_idx.append(i)
            if s_prio and s_prio[-1] > p:
                s_prio.append(s_prio[-1])
                s_label.append(s_label[-1])
            else:
                s_prio.append(p)
                s_label.append(k_labels[i])
        elif kind == _END:
            if s_idx and s_idx[-1] == i:
                s_idx.pop(), s_prio.pop(), s_label.pop()
            else:
                _remove_inner(s_idx, s_prio, s_label, i, k_prios, k_labels)
        elif kind == _QSTART:
            active.append(qs[i])
        else:
            active.remove(qs[i])


def _remove_inner(s_idx: list, s_prio: list, s_label: list, i: int, prios: list, labels: list) -> None:
    """A range that ends while ranges opened after it are still open: drop it and relabel those above it."""
    if i not in s_idx:
        return
    depth = len(s_idx) - 1 - s_idx[::-1].index(i)
    above = s_idx[depth + 1:]
    del s_idx[depth:], s_prio[depth:], s_label[depth:]
    for j in above:
        s_idx.append(j)
        if s_prio and s_prio[-1] > prios[j]:
            s_prio.append(s_prio[-1])
            s_label.append(s_label[-1])
        else:
            s_prio.append(prios[j])
            s_label.append(labels[j])
