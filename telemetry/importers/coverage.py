"""What a trace under-records, said before any figure is read as confident: CUDA-graph launches whose nodes the
profiler did not trace (a graph's kernels hidden inside one record: the idle inside it unseen, busy read high),
kernel launches with no device record (dropped by the profiler: busy read low), and a window too short for the
medians and comparisons built on it. Each is a sentence for `meta.source.under_recorded`, the CLI and the page.
"""
from __future__ import annotations

import os
import re

import numpy as np

from . import names as N
from .tables import TraceTables

MIN_GRAPH_LAUNCHES = 3
DROPPED_SHARE = 0.01          # launches without a device record: more than this share (and MIN_DROPPED) is said
MIN_DROPPED = 10
MIN_STEPS = 8                 # fewer steps than this: too short a window for the figures' medians
_KERNEL_LAUNCH = re.compile(r"^(cuda|hip|cu)(LaunchKernel|LaunchKernelExC|LaunchCooperativeKernel|ModuleLaunchKernel|"
                            r"LaunchKernelEx|ExtModuleLaunchKernel)(_v\d+)?$")


def under_recorded(tables: list[TraceTables], steps: list[dict]) -> list[str]:
    """The sentences for one import: each file's (named when there are several), then the steps'."""
    out = []
    for t in tables:
        named = f"{os.path.basename(t.path)}: " if len(tables) > 1 else ""
        out += [named + n for n in (_graph_nodes(t), _dropped(t)) if n]
    with_device = sum(1 for s in steps if s.get("compute_us"))
    return out + [n for n in (_without_device(with_device, len(steps)), _short(with_device)) if n]


def _without_device(with_device: int, steps: int) -> str | None:
    if with_device == steps:
        return None
    return (f"{steps - with_device} of {steps} steps have no device work in the trace (their device records or "
            f"launches are missing): every figure stands on the other {with_device}")


def _ops_per_call(t: TraceTables) -> np.ndarray:
    """How many device ops each runtime call (row of t.rt) launched."""
    launched = t.dev.launch[t.dev.launch >= 0]
    return np.bincount(launched, minlength=len(t.rt.start))


def _graph_nodes(t: TraceTables) -> str | None:
    graphs = np.flatnonzero(t.rt.kind == N.RT_GRAPH)
    if len(graphs) < MIN_GRAPH_LAUNCHES or not len(t.dev.start):
        return None
    ops = _ops_per_call(t)[graphs]
    if float(np.median(ops)) > 1:
        return None
    return (f"{len(graphs)} CUDA-graph launches show {'at most one device record' if ops.max() <= 1 else 'mostly one'}"
            f" each: the profiler did not trace the graphs' nodes, so the kernels inside a graph are one record, "
            f"the idle between them is unseen and busy reads high for graph steps")


def _dropped(t: TraceTables) -> str | None:
    if not len(t.dev.start):
        return None
    ids = {nid for nid in np.unique(t.rt.name) if _KERNEL_LAUNCH.match(t.names[nid] or "")}
    if not ids:
        return None
    last_op = float(t.dev.start.max())
    calls = np.flatnonzero(np.isin(t.rt.name, list(ids)) & (t.rt.start < last_op))  # (later ones: still in flight)
    if not len(calls):
        return None
    missing = int((_ops_per_call(t)[calls] == 0).sum())
    if missing < MIN_DROPPED or missing < DROPPED_SHARE * len(calls):
        return None
    return (f"{missing:,} of {len(calls):,} kernel launches have no device record (the profiler dropped them, a "
            f"full activity buffer for one): the device's busy reads low by their work, and the gaps they "
            f"filled read as idle")


def _short(steps: int) -> str | None:
    if steps >= MIN_STEPS:
        return None
    return (f"only {steps} step{'s' * (steps != 1)} with device work: too short a window for the figures' medians "
            f"(ms/step, idle per step) and for any comparison to stand on")
