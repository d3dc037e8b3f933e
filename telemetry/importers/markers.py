"""Step markers: the names engines give their steps, parsed into what they carry.

Each engine's kinds of marker (their names, what they carry, how they cut steps) are in its profile
(engines/*_profile.py); here are the two kinds any trace may hold, whatever its engine:
  profiler_step `ProfilerStep#N` (torch.profiler with a schedule)
  numbered      a user annotation `step_N`, `iteration N`, `iter#N`
and how markers are found. Kinds are tried in order of preference (KINDS: batchscope, sglang, vllm, atom,
transformers, vllm_frames, then these two); the first kind a trace holds is the one steps are split by.
CUDA-graph capture annotations (`capture_32_DECODE`) mark a capture trace, whose kernels never ran.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .engines import PROFILES, MarkerKind
from .tables import TraceTables

_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_NUMBERED = re.compile(r"^(?:step|iteration|iter)[\s_#:-]?(\d+)$", re.IGNORECASE)
CAPTURE = re.compile(r"^capture_\d+_\w+$")


def _profiler_step(name: str) -> dict | None:
    m = _PROFILER_STEP.match(name)
    return {"step": int(m.group(1))} if m else None


def _numbered(name: str) -> dict | None:
    m = _NUMBERED.match(name)
    return {"step": int(m.group(1))} if m else None


_ANY_ENGINE = (MarkerKind("profiler_step", 90, "torch.profiler's ProfilerStep#N annotations", _profiler_step,
                          evidence=None),
               MarkerKind("numbered", 95, "numbered step annotations", _numbered, evidence=None))
MARKER_KINDS: dict[str, MarkerKind] = {k.kind: k for k in sorted(
    [k for p in PROFILES for k in p.markers] + list(_ANY_ENGINE), key=lambda k: k.preference)}
KINDS = tuple(MARKER_KINDS)
DESCRIPTION = {k: m.description for k, m in MARKER_KINDS.items()}


@dataclass
class Marker:
    kind: str
    name: str
    start: float
    end: float
    pid: int
    tid: int
    step: int | None = None           # the engine's own step number, when the marker has one
    phase: str | None = None          # batchscope: the host phase this range is
    mode: str | None = None
    prefill: int | None = None
    decode: int | None = None
    requests: int | None = None
    on_device: bool = False           # a device-side annotation (pid = device, tid = stream)


def parse(name: str) -> tuple[str, dict] | None:
    """(kind, fields) of a step-marker name, or None."""
    for kind, marker_kind in MARKER_KINDS.items():
        fields = marker_kind.parse(name)
        if fields is not None:
            return kind, fields
    return None


def _parsed_names(t: TraceTables, ids: np.ndarray) -> dict[int, tuple[str, dict]]:
    out = {}
    for nid in np.unique(ids):
        got = parse(t.names[nid])
        if got is not None:
            out[int(nid)] = got
    return out


def find_markers(t: TraceTables) -> tuple[str | None, list[Marker]]:
    """The preferred kind of step marker in the trace and its markers in time order (host-side ones, or the
    device-side twins where the host side is missing, as in a GPU-only trace)."""
    host_rows = np.flatnonzero(t.host.code >= 1)          # annotations and Python functions
    for on_device, table, rows in ((False, t.host, host_rows), (True, t.gann, np.arange(len(t.gann)))):
        parsed = _parsed_names(t, table.name[rows])
        kinds = {k for k, _ in parsed.values()}
        for kind in KINDS:
            if kind not in kinds:
                continue
            ids = np.array([nid for nid, (k, _) in parsed.items() if k == kind])
            chosen = rows[np.isin(table.name[rows], ids)]
            if MARKER_KINDS[kind].python_frames and not on_device:     # a Python function row, not a same-named op
                chosen = chosen[t.host.code[chosen] == 2]
            return kind, [_marker(t, table, i, kind, parsed[int(table.name[i])][1], on_device) for i in chosen]
    return None, []


def _marker(t: TraceTables, table, i: int, kind: str, fields: dict, on_device: bool) -> Marker:
    pid = int(table.device[i]) if on_device else int(table.pid[i])
    tid = int(table.stream[i]) if on_device else int(table.tid[i])
    return Marker(kind=kind, name=t.names[table.name[i]], start=float(table.start[i]), end=float(table.end[i]),
                  pid=pid, tid=tid, on_device=on_device, **fields)


def capture_annotations(t: TraceTables) -> int:
    rows = np.flatnonzero(t.host.code == 1)
    ids = [nid for nid in np.unique(t.host.name[rows]) if CAPTURE.match(t.names[nid])]
    return int(np.isin(t.host.name[rows], ids).sum()) if ids else 0


def step_marker_names(t: TraceTables, kind: str | None) -> set[int]:
    """Name ids of the step markers (of `kind`, and torch.profiler's ProfilerStep#N), for the host sweep to see
    through: ranges that are phases (batchscope's), not markers, stay."""
    out = set()
    for nid, name in enumerate(t.names):
        got = parse(name) if name else None
        if got is not None and not MARKER_KINDS[got[0]].per_phase and (got[0] == kind or got[0] == "profiler_step"):
            out.add(nid)
    return out
