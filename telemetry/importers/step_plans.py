"""Step plans: what each step is before its device work is known. From markers: a step's number, counts, mode and
host phases, and the windows its device work is found by: the host windows whose launches belong to it (ops whose
launching call started inside), and device windows (ops starting inside, on one device: a marker's device-side
twin, a device-only marker, or a step inferred from the device timeline).

Per-phase markers (batchscope's: MarkerKind.per_phase): every range names its step, so a step's windows are exactly
its own fill/launch/wait/update ranges (the schedule range, which cannot know its step yet, belongs to the next
fill on its thread). Other engines: a step's host window runs from its marker's start to the next marker's start
on the same thread, so work launched just after the marked span (vLLM's sampling runs outside `execute_model`'s
annotation) stays with its step. A CPU-only trace of an engine whose loop turns are Python functions
(transformers') takes each turn's host phases from its profile's loop functions (`loop_phases`).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from ..records import HOST_PHASES
from .engines import EngineProfile
from .markers import MARKER_KINDS, Marker
from .tables import TraceTables


@dataclass
class StepPlan:
    number: int
    marker: str | None = None
    mode: str | None = None
    prefill: int | None = None
    decode: int | None = None
    requests: int | None = None
    phases: dict = field(default_factory=dict)            # host phase -> [start, end]
    host_windows: list = field(default_factory=list)      # [(start, end)]
    device_windows: list = field(default_factory=list)    # [(device, start, end)]
    thread: tuple | None = None                           # (pid, tid) the host windows are on


def from_markers(t: TraceTables, kind: str, markers: list[Marker]) -> tuple[list[StepPlan], list[str]]:
    if MARKER_KINDS[kind].per_phase:
        return _per_phase(markers)
    return _windowed(t, kind, markers)


def _per_phase(markers: list[Marker]) -> tuple[list[StepPlan], list[str]]:
    plans: dict[int, StepPlan] = {}
    pending_schedule: dict[tuple, list] = {}
    for m in sorted(markers, key=lambda m: m.start):
        thread = (m.pid, m.tid)
        if m.phase == "schedule" or m.step is None:
            pending_schedule[thread] = [m.start, m.end]
            continue
        plan = plans.setdefault(m.step, StepPlan(number=m.step, thread=thread))
        if m.phase == "fill" and thread in pending_schedule:
            plan.phases["schedule"] = pending_schedule.pop(thread)
        plan.phases[m.phase] = [m.start, m.end]
        if m.phase == "launch":
            plan.marker, plan.mode = m.name, m.mode
            plan.prefill, plan.decode, plan.requests = m.prefill, m.decode, m.requests
    notes = []
    unlaunched = [n for n, p in plans.items() if "launch" not in p.phases]
    if unlaunched:
        notes.append(f"{len(unlaunched)} step(s) had only part of their ranges in the window and no launch "
                     f"(steps {_brief(sorted(unlaunched))}): left out")
    out = []
    for n in sorted(plans):
        plan = plans[n]
        if "launch" not in plan.phases:
            continue
        plan.phases = {p: plan.phases[p] for p in HOST_PHASES if p in plan.phases}
        plan.host_windows = [tuple(s) for s in plan.phases.values()]
        out.append(plan)
    return out, notes


def _windowed(t: TraceTables, kind: str, markers: list[Marker]) -> tuple[list[StepPlan], list[str]]:
    threads: dict[tuple, int] = {}
    for m in markers:
        threads[(m.pid, m.tid)] = threads.get((m.pid, m.tid), 0) + 1
    main = max(threads, key=threads.get)
    ms = sorted((m for m in markers if (m.pid, m.tid) == main), key=lambda m: m.start)
    ms = _outermost(ms)
    notes = []
    if len(threads) > 1:
        notes.append(f"step markers on {len(threads)} threads; steps follow the one with the most "
                     f"({threads[main]} markers)")
    numbers = [m.step for m in ms]
    if any(n is None for n in numbers) or any(b <= a for a, b in zip(numbers, numbers[1:])):
        numbers = list(range(len(ms)))
    plans = []
    for i, m in enumerate(ms):
        plan = StepPlan(number=numbers[i], marker=m.name, mode=m.mode, prefill=m.prefill, decode=m.decode,
                        requests=m.requests, thread=main)
        if m.on_device:
            plan.device_windows.append((m.pid, m.start, m.end))
        else:
            stop = ms[i + 1].start if i + 1 < len(ms) else np.inf
            plan.host_windows.append((m.start, stop))
        plans.append(plan)
    if not ms[0].on_device:
        _add_device_twins(t, ms, plans)
    return plans, notes


def _outermost(ms: list[Marker]) -> list[Marker]:
    """Markers of one thread, nested ones (a marker inside another of the same kind) dropped."""
    out = []
    for m in ms:
        if out and m.start < out[-1].end and m.end <= out[-1].end:
            continue
        out.append(m)
    return out


def _add_device_twins(t: TraceTables, ms: list[Marker], plans: list[StepPlan]) -> None:
    """A record_function annotation that launched device work also appears on the device, spanning its first to
    last op there: each such twin becomes a device window of the latest same-named step marker before it."""
    if not len(t.gann):
        return
    ids = {}
    for nid, name in enumerate(t.names):
        ids.setdefault(name, nid)
    by_name: dict[int, list[int]] = {}
    for i, m in enumerate(ms):
        by_name.setdefault(ids[m.name], []).append(i)
    starts = {nid: [ms[i].start for i in idx] for nid, idx in by_name.items()}
    for row in np.flatnonzero(np.isin(t.gann.name, list(by_name))):
        nid = int(t.gann.name[row])
        k = bisect.bisect_right(starts[nid], float(t.gann.start[row]) + 1.0) - 1   # Kineto widens twins by 1 ns
        if k >= 0:
            plans[by_name[nid][k]].device_windows.append((int(t.gann.device[row]), float(t.gann.start[row]),
                                                          float(t.gann.end[row])))


def _brief(nums: list[int]) -> str:
    return ", ".join(map(str, nums[:6])) + (", ..." if len(nums) > 6 else "")


def loop_phases(t: TraceTables, plans: list[StepPlan], engine: EngineProfile) -> tuple[list[StepPlan], list[str]]:
    """A CPU-only trace of an engine whose loop turns are Python function rows (transformers'): each turn's host
    phases from the first call of each of its profile's `loop_functions` on the loop's thread (for transformers:
    schedule = prepare_next_batch up to prepare_batch_tensors, fill = prepare_batch_tensors, launch =
    compute_batch, wait = retrieve_device_outputs, update = update_batch). A turn that ran no forward (the loop
    waiting for requests) is no step: left out, and said so. Kept steps are numbered from 0 in order."""
    ids: dict[str, set[int]] = {p: set() for p, _ in engine.loop_functions}
    step_ids = set()
    for nid, name in enumerate(t.names):
        if engine.loop_forward is not None and engine.loop_forward.search(name):
            step_ids.add(nid)
        for phase, pattern in engine.loop_functions:
            if pattern.search(name):
                ids[phase].add(nid)
    h = t.host
    kept, idle, unordered = [], 0, 0
    for plan in plans:
        (s, e), (pid, tid) = plan.host_windows[0], plan.thread
        rows = np.flatnonzero((h.code == 2) & (h.pid == pid) & (h.tid == tid) & (h.start >= s) & (h.start < e))
        rows = rows[np.argsort(h.start[rows], kind="stable")]
        first = {}
        for phase, names in ids.items():
            mine = rows[np.isin(h.name[rows], list(names))] if names else rows[:0]
            if len(mine):
                first[phase] = [float(h.start[mine[0]]), float(h.end[mine[0]])]
        if "launch" not in first:          # no launch function: the innermost loop_forward is the forward
            steps = rows[np.isin(h.name[rows], list(step_ids))] if step_ids else rows[:0]
            if len(steps):
                first["launch"] = [float(h.start[steps[-1]]), float(h.end[steps[-1]])]
        if "launch" not in first:
            idle += 1
            continue
        if "schedule" in first and "fill" in first:
            first["schedule"][1] = min(first["schedule"][1], first["fill"][0])
        phases, prev_end = {}, None
        for phase in HOST_PHASES:          # in loop order; a span that would overlap the one before is left out
            span = first.get(phase)
            if span is not None and (prev_end is None or span[0] >= prev_end):
                phases[phase] = span
                prev_end = span[1]
        if "launch" not in phases:         # its forward overlaps the phase before: no span to trust
            unordered += 1
            continue
        plan.phases = phases
        plan.number = len(kept)
        kept.append(plan)
    notes = [f"{idle} turn(s) of {engine.loop_name} ran no forward (waiting for requests): not steps"] if idle else []
    if unordered:
        notes.append(f"{unordered} step(s) whose forward overlaps their scheduling in the trace: left out")
    return kept, notes
