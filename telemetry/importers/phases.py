"""What a host range means as an idle cause: batchscope's own phase ranges, the phases other engines' functions and
scopes stand for (each engine's table is in its profile, engines/*_profile.py), and the runtime calls that block
the host. The tables are documented in docs/import.md; a name in none of them is plain host work (`host_op`,
named in the step's `idle_host_ops_us`).

At any instant the launching thread's cause comes from the ranges open on it, by priority: a batchscope phase
range (its own vocabulary, exactly); else a blocking CUDA/HIP call (the host waiting on the device); else the
innermost range that maps to an engine phase; else any recorded op (`host_op`); else nothing was recorded there
(`host_other`, "host work outside any recorded op").
"""
from __future__ import annotations

import re

import numpy as np

from ..records import HOST_PHASES
from . import names as N
from .engines import PROFILES

# labels a sweep gives (indices into LABELS); the gap module turns BLOCKING into `wait` or `host_sync`
# (`telemetry`: batchscope's range around handing a step to its observers, its own idle cause too)
LABELS = HOST_PHASES + ("telemetry", "blocking", "host_op", "host_other")
BLOCKING, HOST_OP, HOST_OTHER = LABELS.index("blocking"), LABELS.index("host_op"), LABELS.index("host_other")
PRIO_NONE, PRIO_ENGINE, PRIO_BLOCKING, PRIO_BATCHSCOPE = 0, 1, 2, 3

# the engines' own phase ranges (batchscope's), then every engine's (regex, phase) table, in registry order
_OWN = [p.own_phases for p in PROFILES if p.own_phases is not None]
ENGINE_PHASES = [(pattern, phase) for p in PROFILES for pattern, phase in p.phases]
_ENGINE = [(re.compile(p), HOST_PHASES.index(phase)) for p, phase in ENGINE_PHASES]


def name_role(name: str) -> tuple[int, int]:
    """(priority, label) of a host range's name."""
    for own in _OWN:
        if m := own.match(name):
            return PRIO_BATCHSCOPE, LABELS.index(m.group(1))
    for pattern, label in _ENGINE:
        if pattern.search(name):
            return PRIO_ENGINE, label
    return PRIO_NONE, HOST_OP


def host_roles(names: list[str], ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(priority, label) arrays for host rows with these name ids."""
    prio, label = np.zeros(len(names), np.int8), np.full(len(names), HOST_OP, np.int8)
    for nid in np.unique(ids):
        prio[nid], label[nid] = name_role(names[nid])
    return prio[ids], label[ids]


def runtime_roles(kinds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(priority, label) arrays for runtime calls: blocking ones wait on the device, the rest are host ops."""
    blocking = (kinds == N.RT_BLOCKING) | (kinds == N.RT_MEMCPY_SYNC)
    return (np.where(blocking, PRIO_BLOCKING, PRIO_NONE).astype(np.int8),
            np.where(blocking, BLOCKING, HOST_OP).astype(np.int8))
