"""Several ranks' files of one run: which rank each is, and one clock for all.

Rank: `distributedInfo.rank` in the file, else a rank in its name (`rank3`, `-TP-3`, `tp3`), else the order the
files were given. Clock: each file's times are put on the wall clock (`baseTimeNanoseconds`, or Kineto's older
absolute timestamps). Ranks on one host share that clock; ranks on different hosts may not. The check (and the
documented alignment rule): a collective ends at nearly the same instant on every rank that takes part, so when
two ranks' files hold the same sequence of collective kernels, the median difference of their end times is the
skew. More than SKEW_US of it is reported and corrected (the rank's times shifted by it). Without collectives to
go by, files whose time windows do not overlap at all are refused: different runs, or clocks too far apart to
line up.
"""
from __future__ import annotations

import os
import re

import numpy as np

from . import names as N
from .bad_trace import ClockSkewError, TraceImportError
from .tables import TraceTables

SKEW_US = 50.0
MIN_COLLECTIVES = 2
_RANK_IN_NAME = re.compile(r"(?:rank|[-_.]tp[-_]?)(\d+)", re.IGNORECASE)


def rank_of(t: TraceTables) -> int | None:
    info = t.header.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return info["rank"]
    m = _RANK_IN_NAME.search(os.path.basename(t.path))
    return int(m.group(1)) if m else None


def order_ranks(tables: list[TraceTables]) -> list[int]:
    """Each file's rank (the order given where any file does not say), refusing two files of one rank."""
    found = [rank_of(t) for t in tables]
    seen: dict[int, str] = {}
    for rank, t in zip(found, tables):
        if rank is not None and rank in seen and len(tables) > 1:
            raise TraceImportError(f"{t.path}: says it is rank {rank}, as {seen[rank]} does")
        seen[rank] = t.path
    if len(tables) > 1 and None in found:
        return list(range(len(tables)))
    return [r or 0 for r in found]


def _collective_ends(t: TraceTables, device: int) -> tuple[list[str], np.ndarray]:
    rows = np.flatnonzero((t.dev.device == device) & (t.dev.kind == N.COLLECTIVE))
    return [t.names[n] for n in t.dev.name[rows]], t.dev.end[rows]


def clock_shifts(tables: list[TraceTables], devices: list[int]) -> tuple[list[float], list[str], list[dict]]:
    """Per file: µs to add to its own times for the common (reference: the first file's) wall clock; notes; and
    the skew found per file ({"file", "offset_us", "basis"})."""
    offsets = [t.abs_offset_us() for t in tables]
    notes: list[str] = []
    if len(tables) > 1 and any(o is None for o in offsets):
        notes.append("some files do not say when their clock started (no baseTimeNanoseconds): their times are "
                     "taken as they are")
    shifts = [o or 0.0 for o in offsets]
    skews = []
    ref_names, ref_ends = _collective_ends(tables[0], devices[0])
    for i in range(1, len(tables)):
        names, ends = _collective_ends(tables[i], devices[i])
        n = min(len(names), len(ref_names))
        same = n >= MIN_COLLECTIVES and np.mean([a == b for a, b in zip(names[:n], ref_names[:n])]) >= 0.9
        if same:
            skew = float(np.median((ends[:n] + shifts[i]) - (ref_ends[:n] + shifts[0])))
            if abs(skew) > SKEW_US:
                shifts[i] -= skew
                notes.append(f"{os.path.basename(tables[i].path)}: its clock is {skew:+.1f} µs off the first "
                             f"file's (median of {n} collective kernels' end times): aligned by that")
            skews.append({"file": os.path.basename(tables[i].path), "offset_us": round(skew, 1),
                          "basis": f"{n} collective kernel ends", "corrected": abs(skew) > SKEW_US})
            continue
        _check_overlap(tables[0], tables[i], shifts[0], shifts[i])
        skews.append({"file": os.path.basename(tables[i].path), "offset_us": None,
                      "basis": "no common collectives: clocks taken as shared", "corrected": False})
    return shifts, notes, skews


def _check_overlap(ref: TraceTables, other: TraceTables, ref_shift: float, shift: float) -> None:
    a0, a1 = ref.start_us + ref_shift, ref.end_us + ref_shift
    b0, b1 = other.start_us + shift, other.end_us + shift
    if min(a1, b1) > max(a0, b0):
        return
    raise ClockSkewError(f"{other.path}: its events ({(b0 - a0) / 1e6:+.3f} s from {os.path.basename(ref.path)}'s "
                         f"start) do not overlap that file's in time, and there are no common collective kernels "
                         f"to align the clocks by: different runs, or clocks too far apart to line up")
