"""Steps where the trace has no step markers, inferred from its own rhythm (and said so in `meta.source`).

1. The host's blocking pattern. A serving loop blocks on the device a fixed number of times per step (reading the
   sampled tokens, `.item()` checks). On the thread that launches most device work, the numbers of launches
   between consecutive blocking calls repeat with that period; the step boundary is the blocking call after which
   the device has, on average, waited longest (the host preparing the next batch).
2. Without blocking calls, graph launches (cudaGraphLaunch / hipGraphLaunch) in the same way.
3. Otherwise the device timeline: steps are split at idle gaps of at least 10x the median gap (and 50 µs).
"""
from __future__ import annotations

import numpy as np

from . import names as N
from .busy import DeviceBusy
from .step_plans import StepPlan
from .tables import TraceTables

MIN_PERIODS = 3
MAX_PERIOD = 64
AGREEMENT = 0.7
GAP_FACTOR, GAP_MIN_US = 10.0, 50.0


def infer_steps(t: TraceTables, busy: DeviceBusy) -> tuple[list[StepPlan], str]:
    """(plans, how they were found)."""
    launched = np.unique(t.dev.launch[busy.rows][t.dev.launch[busy.rows] >= 0])
    if len(launched):
        pids, tids = t.rt.pid[launched], t.rt.tid[launched]
        pairs, counts = np.unique(np.stack([pids, tids]), axis=1, return_counts=True)
        pid, tid = (int(x) for x in pairs[:, int(np.argmax(counts))])
        calls = launched[(pids == pid) & (tids == tid)]
        on_thread = np.flatnonzero((t.rt.pid == pid) & (t.rt.tid == tid))
        kinds = t.rt.kind[on_thread]
        for wanted, what in (((N.RT_BLOCKING, N.RT_MEMCPY_SYNC), "blocking calls"), ((N.RT_GRAPH,), "graph launches")):
            seps = on_thread[np.isin(kinds, wanted)]
            got = _periodic(t, busy, calls, seps, after=what == "blocking calls")
            if got is not None:
                plans, period = got
                for p in plans:
                    p.thread = (pid, tid)
                return plans, f"inferred from the launching thread's {what} (thread {tid}: {period} per step)"
    return _device_gaps(busy)


def _periodic(t: TraceTables, busy: DeviceBusy, calls: np.ndarray, seps: np.ndarray, after: bool):
    """Plans split at every p-th separator, or None when the launch counts between separators do not repeat."""
    if len(seps) < MIN_PERIODS:
        return None
    cut = t.rt.end[seps] if after else t.rt.start[seps]          # a step starts after a block, or at a graph launch
    launch_at = np.sort(t.rt.start[calls])
    counts = np.diff(np.searchsorted(launch_at, cut))             # launches between consecutive separators
    period = _period(counts)
    if period is None:
        return None
    waits = _wait_after(t, busy, calls, cut)
    phase = int(np.argmax([np.mean(waits[k::period]) for k in range(period)]))
    bounds = list(cut[phase::period])
    edges = [-np.inf] + bounds + [np.inf]
    plans = [StepPlan(number=i, host_windows=[(float(a), float(b))]) for i, (a, b) in enumerate(zip(edges, edges[1:]))]
    return plans, period


def _period(counts: np.ndarray) -> int | None:
    n = len(counts)
    for p in range(1, min(MAX_PERIOD, n // MIN_PERIODS) + 1):
        agree = np.mean(counts[p:] == counts[:-p]) if n > p else 0.0
        if agree >= AGREEMENT and np.any(counts[:p] > 0):
            return p
    return None


def _wait_after(t: TraceTables, busy: DeviceBusy, calls: np.ndarray, cut: np.ndarray) -> np.ndarray:
    """For each separator: how long the device had been idle when the first op launched after it started."""
    rows = busy.rows[t.dev.launch[busy.rows] >= 0]                 # in start order
    with_ops, first = np.unique(t.dev.launch[rows], return_index=True)
    first_start = t.dev.start[rows[first]]
    by_start = calls[np.argsort(t.rt.start[calls])]
    k = np.searchsorted(t.rt.start[by_start], cut)
    out = np.zeros(len(cut))
    ok = k < len(by_start)
    call = by_start[np.minimum(k, len(by_start) - 1)]
    pos = np.clip(np.searchsorted(with_ops, call), 0, max(len(with_ops) - 1, 0))
    ok &= (with_ops[pos] == call) if len(with_ops) else False
    op_start = first_start[pos] if len(with_ops) else np.zeros(len(cut))
    b = np.searchsorted(busy.starts, op_start, side="right") - 1
    ok &= (b >= 1) & (busy.starts[np.maximum(b, 0)] == op_start)
    out[ok] = busy.starts[b[ok]] - busy.ends[b[ok] - 1]
    return out


def _device_gaps(busy: DeviceBusy) -> tuple[list[StepPlan], str]:
    if not len(busy.starts):
        return [], "no device activity"
    gaps = busy.starts[1:] - busy.ends[:-1]
    cut = max(GAP_MIN_US, GAP_FACTOR * float(np.median(gaps))) if len(gaps) else np.inf
    split = np.flatnonzero(gaps >= cut)
    starts = np.concatenate([[busy.starts[0]], busy.starts[split + 1]])
    ends = np.concatenate([busy.ends[split], [busy.ends[-1]]])
    plans = [StepPlan(number=i, device_windows=[(busy.device, float(s), float(e))])
             for i, (s, e) in enumerate(zip(starts, ends))]
    how = (f"inferred from the device timeline: split at idle gaps of {cut:.0f} µs or more"
           if len(plans) > 1 else "no step boundary found: the whole trace is one step")
    return plans, how
