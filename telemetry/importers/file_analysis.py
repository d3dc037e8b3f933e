"""One trace file analysed: its steps (from markers, or inferred), and per device that ran work, each step's spans
and the gaps before and inside it, every host-late part attributed to what its launching thread was doing.

A CPU-only trace of batchscope's own engine is timed as batchscope times itself on a CPU: each step's compute
is its launch range (the forward runs inside it), and the gaps between launches are the engine thread's. So is
one of transformers' continuous batching with Python stacks (its loop's functions give the phases, compute_batch
the launch). Any other trace without device activity is refused: there is no device idle time to name.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import host_activity
from .busy import DeviceBusy
from .bad_trace import NoDeviceActivityError
from .gaps import Gap, GapFinder, resolve
from .inference import infer_steps
from .engines import ENGINE_OF_KIND
from .markers import DESCRIPTION, MARKER_KINDS, capture_annotations, find_markers, step_marker_names
from .recognition import recognise
from .step_plans import StepPlan, from_markers, loop_phases
from .spans import StepSpans, assign_ops, step_spans
from .tables import TraceTables

CUT_NOTE = "the file ends early"          # kineto_json.py / parallel_read.py: a partial import's note


@dataclass
class Lane:
    """One device's view of the steps (index = plan index)."""
    device: int
    busy: DeviceBusy | None
    spans: list
    between: list
    inside: list


@dataclass
class FileAnalysis:
    tables: TraceTables
    plans: list[StepPlan]
    engine: str
    engine_evidence: str
    steps_from: str
    inferred: list = field(default_factory=list)
    lanes: list = field(default_factory=list)
    host_basis: bool = False
    modes: list = field(default_factory=list)            # per plan: "sync" | "async"
    notes: list = field(default_factory=list)
    owner: np.ndarray | None = None                      # per device op: its plan index (-1: none)


def analyse(t: TraceTables, keep_stretches: bool = False) -> FileAnalysis:
    kind, markers = find_markers(t)
    engine, evidence = recognise(t, kind)
    devices, counts = np.unique(t.dev.device, return_counts=True)
    notes = list(t.notes)
    if capture_annotations(t):
        notes.append("CUDA-graph capture annotations found: kernels recorded while a graph is captured never ran, "
                     "so this trace's idle time says nothing about serving")
    cut = any(n.startswith(CUT_NOTE) for n in t.notes)
    if not len(devices) and cut and len(t.rt.start):
        raise NoDeviceActivityError(f"{t.path}: the file was cut before its device events (a profiler writes them "
                                    f"after the host's): the part written holds {len(t.rt.start):,} launches and "
                                    f"runtime calls but no kernel, copy or memset, so there is no device time to "
                                    f"name")
    if not len(devices):
        if kind is None or not MARKER_KINDS[kind].host_timed:
            raise NoDeviceActivityError(f"{t.path}: no device activity: the trace has no kernel, copy or memset "
                                        f"(a CPU-only profile), so there is no device idle time to name")
        plans, more = from_markers(t, kind, markers)
        engine_profile = ENGINE_OF_KIND.get(kind)
        if engine_profile is not None and engine_profile.loop_functions:   # its loop's functions give the phases
            plans, more = loop_phases(t, plans, engine_profile)
            if not plans:
                raise NoDeviceActivityError(f"{t.path}: no device activity and no turn of "
                                            f"{engine_profile.loop_name} ran a forward in the trace: no step to "
                                            f"time")
        fa = FileAnalysis(t, plans, engine, evidence, DESCRIPTION[kind], host_basis=True, notes=notes + more)
        fa.notes.append("no device activity (a CPU-only profile): each step's compute is its launch range, as "
                        "batchscope times itself on a CPU")
        fa.lanes = [_host_lane(t, plans)]
        fa.modes = [p.mode or "sync" for p in plans]
        return fa
    busy_by_device = {int(d): DeviceBusy(t, int(d)) for d in devices}
    main = max(busy_by_device, key=lambda d: busy_by_device[d].busy_us(-np.inf, np.inf))
    inferred = []
    if kind is not None:
        plans, more = from_markers(t, kind, markers)
        notes += more
        steps_from = DESCRIPTION[kind]
    else:
        plans, steps_from = infer_steps(t, busy_by_device[main])
        inferred.append("steps")
    if cut and len(plans) > 1:             # the cut may have taken part of the last step's device work
        notes.append(f"the last step ({plans[-1].number}) may have lost device work to the cut: left out")
        plans = plans[:-1]
    owner = assign_ops(t, plans)
    if inferred:
        plans, owner = _without_empty(plans, owner)
    order = [main] + [d for d in busy_by_device if d != main]
    fa = FileAnalysis(t, plans, engine, evidence, steps_from, inferred=inferred, notes=notes, owner=owner)
    fa.lanes = [_device_lane(t, busy_by_device[d], owner, plans, keep_stretches) for d in order]
    _attribute_host_time(t, fa.lanes, step_marker_names(t, kind))
    fa.notes += _coverage_notes(t, fa.lanes[0], owner)
    fa.modes = _modes(plans, fa.lanes[0].spans, inferred)
    if any(p.mode is None for p in plans) and "mode" not in inferred:
        inferred.append("mode")
    return fa


def _coverage_notes(t: TraceTables, lane: Lane, owner: np.ndarray) -> list[str]:
    """Say when steps have no device work or device work belongs to no step (launches missing from the file)."""
    notes = []
    empty = sum(1 for sp in lane.spans if sp is None or sp.compute is None)
    if empty:
        notes.append(f"{empty} of {len(lane.spans)} steps have no device work tied to them on device {lane.device} "
                     f"(their launches are not in the trace): no compute span, no gap")
    rows = lane.busy.rows
    if len(rows):
        loose = rows[owner[rows] < 0]
        share = float((t.dev.end[loose] - t.dev.start[loose]).sum() / (t.dev.end[rows] - t.dev.start[rows]).sum()) \
            if (t.dev.end[rows] - t.dev.start[rows]).sum() > 0 else 0.0
        if share >= 0.05:
            notes.append(f"{100 * share:.0f}% of device {lane.device}'s op time belongs to no step (launched outside "
                         f"every step's window, or before the trace began)")
    return notes


def _without_empty(plans: list[StepPlan], owner: np.ndarray) -> tuple[list[StepPlan], np.ndarray]:
    """Inferred steps that got no device op (a window before the first launch) are no steps: drop, renumber."""
    used = np.unique(owner[owner >= 0])
    remap = np.full(len(plans) + 1, -1, dtype=np.int64)
    remap[used] = np.arange(len(used))
    kept = [plans[int(k)] for k in used]
    for number, plan in enumerate(kept):
        plan.number = number
    return kept, remap[owner]


def _device_lane(t: TraceTables, busy: DeviceBusy, owner, plans, keep: bool) -> Lane:
    spans = step_spans(t, owner, busy.device, len(plans))
    finder = GapFinder(t, busy, keep)
    between: list[Gap | None] = [None] * len(plans)
    inside: list[Gap | None] = [None] * len(plans)
    prev_end = None
    for k, sp in enumerate(spans):
        if sp is None or sp.compute is None:
            continue
        c0, c1 = sp.compute
        if prev_end is not None:
            between[k] = finder.between(prev_end, c0) if c0 > prev_end else Gap(inside=False)
        inside[k] = finder.inside(max(c0, prev_end) if prev_end is not None else c0, c1)
        prev_end = c1 if prev_end is None else max(prev_end, c1)
    return Lane(busy.device, busy, spans, between, inside)


def _host_lane(t: TraceTables, plans: list[StepPlan]) -> Lane:
    """CPU-only batchscope: compute = the launch range; the gap between launches is the engine thread's."""
    spans, between = [], []
    prev_end = None
    for plan in plans:
        s, e = plan.phases["launch"]
        spans.append(StepSpans(compute=(s, e), h2d=None, d2h=None, first_launch=s, ops=0, collective_us=0.0))
        gap = None
        if prev_end is not None:
            gap = Gap(inside=False, total_us=max(0.0, s - prev_end))
            if s > prev_end:
                gap.host_late_us = s - prev_end
                gap.queries.append((host_activity.HostQuery(plan.thread[0], plan.thread[1], prev_end, s), -1))
        between.append(gap)
        prev_end = e
    lane = Lane(-1, None, spans, between, [None] * len(plans))
    _attribute_host_time(t, [lane])
    return lane


def _attribute_host_time(t: TraceTables, lanes: list[Lane], transparent=frozenset()) -> None:
    gaps = [g for lane in lanes for g in lane.between + lane.inside if g is not None]
    host_activity.attribute(t, [q for g in gaps for q, _ in g.queries], transparent)
    for g in gaps:
        resolve(g, t.names)


def _modes(plans: list[StepPlan], spans: list, inferred: list) -> list[str]:
    """batchscope's steps say their loop. Any other engine's step is async when it was launched before the device
    finished the step before it (the host built ahead: an overlap scheduler), else sync, step by step whatever
    engine wrote it; a step with nothing to go by (no launch, no device work, the first) takes its neighbour's."""
    if all(p.mode for p in plans):
        return [p.mode for p in plans]
    seen: list[str | None] = []
    prev_end = None
    for sp in spans:
        mode = None
        if sp is not None and sp.compute is not None:
            if prev_end is not None and sp.first_launch is not None:
                mode = "async" if sp.first_launch < prev_end else "sync"
            prev_end = sp.compute[1]
        seen.append(mode)
    known = [m for m in seen if m is not None]
    last = known[0] if known else "sync"
    filled = []
    for m in seen:
        last = m or last
        filled.append(last)
    return [p.mode or m for p, m in zip(plans, filled)]
