"""A device's busy time: the union of its kernel, copy and memset intervals over all its streams (never a sum), as
merged blocks; its idle stretches are the spaces between blocks, each ended by the op that starts the next block."""
from __future__ import annotations

import numpy as np

from .tables import TraceTables


class DeviceBusy:
    def __init__(self, t: TraceTables, device: int):
        rows = np.flatnonzero(t.dev.device == device)          # t.dev is sorted by start
        self.device, self.rows = device, rows
        s, e = t.dev.start[rows], t.dev.end[rows]
        self.longest = float((e - s).max()) if len(rows) else 0.0   # how far back an op overlapping a time began
        if not len(rows):
            self.starts = self.ends = np.zeros(0)
            self.first = np.zeros(0, dtype=np.int64)
            return
        reach = np.maximum.accumulate(e)
        new = np.ones(len(s), dtype=bool)
        new[1:] = s[1:] > reach[:-1]
        first = np.flatnonzero(new)
        last = np.append(first[1:] - 1, len(s) - 1)
        self.starts, self.ends = s[first], reach[last]
        self.first = rows[first]              # the op (row of t.dev) that starts each block

    @property
    def lo(self) -> float | None:
        return float(self.starts[0]) if len(self.starts) else None

    @property
    def hi(self) -> float | None:
        return float(self.ends[-1]) if len(self.ends) else None

    def busy_us(self, lo: float, hi: float) -> float:
        if hi <= lo or not len(self.starts):
            return 0.0
        i, j = np.searchsorted(self.ends, lo, side="right"), np.searchsorted(self.starts, hi, side="left")
        if j <= i:
            return 0.0
        s = np.maximum(self.starts[i:j], lo)
        e = np.minimum(self.ends[i:j], hi)
        return float(np.clip(e - s, 0.0, None).sum())

    def idle_within(self, lo: float, hi: float) -> list[tuple[float, float, int]]:
        """Idle stretches inside [lo, hi] as (start, end, row of the op that ends it; -1 when `hi` cuts it)."""
        if hi <= lo:
            return []
        if not len(self.starts):
            return [(lo, hi, -1)]
        out = []
        j = int(np.searchsorted(self.starts, lo, side="right"))    # first block starting after lo
        t = lo if j == 0 else max(lo, float(self.ends[j - 1]))
        while t < hi:
            if j >= len(self.starts):
                out.append((t, hi, -1))
                break
            b = float(self.starts[j])
            if b >= hi:                       # a block starting right at `hi` is what ends the stretch
                out.append((t, hi, int(self.first[j]) if b == hi else -1))
                break
            if b > t:
                out.append((t, b, int(self.first[j])))
            t = max(t, float(self.ends[j]))
            j += 1
        return out
