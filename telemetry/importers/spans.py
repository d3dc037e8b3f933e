"""Which device ops belong to which step, and each step's spans on each device.

An op belongs to a step when its launching call started inside one of the step's host windows, or, failing that
(no launching call in the file), when it started inside one of the step's device windows on its device. A step's
`compute` span runs from the first to the last of its ops that are not copies between host and device; those
copies are its `h2d` and `d2h` spans (batchscope's three streams). A step without compute ops has no compute span.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import names as N
from .step_plans import StepPlan
from .tables import TraceTables


@dataclass
class StepSpans:
    compute: tuple[float, float] | None
    h2d: tuple[float, float] | None
    d2h: tuple[float, float] | None
    first_launch: float | None        # when the earliest launching call of its ops started
    ops: int
    collective_us: float


def assign_ops(t: TraceTables, plans: list[StepPlan]) -> np.ndarray:
    """The plan index of every device op (-1: no step)."""
    owner = np.full(len(t.dev), -1, dtype=np.int64)
    windows = sorted((s, e, k) for k, p in enumerate(plans) for s, e in p.host_windows)
    launched = np.flatnonzero(t.dev.launch >= 0)
    if windows and len(launched):
        ws = np.array([w[0] for w in windows])
        we = np.array([w[1] for w in windows])
        wk = np.array([w[2] for w in windows])
        at = t.rt.start[t.dev.launch[launched]]
        k = np.searchsorted(ws, at, side="right") - 1
        inside = (k >= 0) & (at < we[np.maximum(k, 0)])
        owner[launched[inside]] = wk[k[inside]]
    for k, plan in enumerate(plans):
        for device, s, e in plan.device_windows:
            lo, hi = np.searchsorted(t.dev.start, [s, e], side="left")
            rows = np.arange(lo, hi)
            rows = rows[(owner[rows] == -1) & (t.dev.device[rows] == device) & (t.dev.end[rows] <= e + 1.0)]
            owner[rows] = k
    return owner


def step_spans(t: TraceTables, owner: np.ndarray, device: int, count: int) -> list[StepSpans | None]:
    """Per plan index, its spans on `device` (None: no op of it ran there)."""
    out: list[StepSpans | None] = [None] * count
    rows = np.flatnonzero((owner >= 0) & (t.dev.device == device))
    if not len(rows):
        return out
    rows = rows[np.argsort(owner[rows], kind="stable")]
    bounds = np.flatnonzero(np.diff(owner[rows])) + 1
    for group in np.split(rows, bounds):
        out[int(owner[group[0]])] = _spans(t, group)
    return out


def _span(t: TraceTables, rows: np.ndarray) -> tuple[float, float] | None:
    return (float(t.dev.start[rows].min()), float(t.dev.end[rows].max())) if len(rows) else None


def _spans(t: TraceTables, rows: np.ndarray) -> StepSpans:
    kind = t.dev.kind[rows]
    h2d, d2h = rows[kind == N.COPY_H2D], rows[kind == N.COPY_D2H]
    compute = rows[(kind != N.COPY_H2D) & (kind != N.COPY_D2H)]
    calls = t.dev.launch[rows]
    calls = calls[calls >= 0]
    coll = rows[kind == N.COLLECTIVE]
    return StepSpans(compute=_span(t, compute if len(compute) else rows), h2d=_span(t, h2d), d2h=_span(t, d2h),
                     first_launch=float(t.rt.start[calls].min()) if len(calls) else None, ops=len(rows),
                     collective_us=union_us(t.dev.start[coll], t.dev.end[coll]))


def union_us(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of intervals."""
    if not len(starts):
        return 0.0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return float((reach[last] - s[first]).sum())
