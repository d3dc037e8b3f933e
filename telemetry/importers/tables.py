"""One trace file as numeric tables: device ops, runtime calls, host ranges, device-side annotations, CUDA
synchronisation records, and the process/thread names its metadata gives. Columns are numpy arrays, each table
sorted by start; times are µs on the file's own clock (`to_abs_us` moves them onto the wall clock when known).

Joins: a device op's launching call is the runtime call with the same correlation id (`dev.launch`, -1 when the
call is not in the file: launched before the window, or a trimmed excerpt). Every kernel of a CUDA/HIP graph
carries the correlation of its graph launch. A copy whose call returned only after the copy ended was waited for
by the host (a synchronous or pageable copy): its call is marked blocking like cudaStreamSynchronize.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import names as N
from .columns import EventCollector

ABSOLUTE_TS_US = 1e15          # a ts this large is already µs since the epoch (Kineto before baseTimeNanoseconds)


class Columns:
    """Equal-length numpy columns as attributes; `take` selects rows."""

    def __init__(self, **cols):
        self.__dict__.update(cols)
        self._names = list(cols)

    def add(self, **cols) -> None:
        self.__dict__.update(cols)
        self._names += [k for k in cols if k not in self._names]

    def __len__(self) -> int:
        return len(getattr(self, self._names[0])) if self._names else 0

    def take(self, idx) -> "Columns":
        return Columns(**{k: getattr(self, k)[idx] for k in self._names})


def _np(arr, dtype) -> np.ndarray:
    return np.frombuffer(arr, dtype=dtype).copy() if len(arr) else np.zeros(0, dtype=dtype)


def _sorted(cols: Columns) -> Columns:
    return cols.take(np.argsort(cols.start, kind="stable")) if len(cols) else cols


@dataclass
class TraceTables:
    path: str
    names: list[str]
    dev: Columns
    rt: Columns
    host: Columns
    gann: Columns
    sync: Columns
    header: dict = field(default_factory=dict)
    window: tuple[float, float] | None = None
    processes: dict = field(default_factory=dict)      # pid -> process name
    labels: dict = field(default_factory=dict)         # pid -> "CPU" | "GPU n"
    threads: dict = field(default_factory=dict)        # (pid, tid) -> thread name
    notes: list = field(default_factory=list)
    events: int = 0
    skipped: dict = field(default_factory=dict)

    @property
    def start_us(self) -> float | None:
        firsts = [float(t.start[0]) for t in (self.dev, self.rt, self.host) if len(t)]
        return min(firsts) if firsts else None

    @property
    def end_us(self) -> float | None:
        lasts = [float(t.end.max()) for t in (self.dev, self.rt, self.host) if len(t)]
        return max(lasts) if lasts else None

    def abs_offset_us(self) -> float | None:
        """What to add to this file's times for µs since the Unix epoch, or None when the file does not say."""
        start = self.start_us
        if start is not None and start >= ABSOLUTE_TS_US:
            return 0.0
        base = self.header.get("baseTimeNanoseconds")
        return float(base) / 1000.0 if isinstance(base, (int, float)) and base > 0 else None

    def name(self, nid: int) -> str:
        return self.names[nid]


def build_tables(path: str, col: EventCollector, header: dict, notes: list) -> TraceTables:
    names = [None] * len(col.names)
    for name, nid in col.names.items():
        names[nid] = name if isinstance(name, str) else str(name)
    d = col.dev
    dev = Columns(start=_np(d[0], "f8"), dur=_np(d[1], "f8"), device=_np(d[2], "i8"), stream=_np(d[3], "i8"),
                  corr=_np(d[4], "i8"), code=_np(d[5], "i1"), name=_np(d[6], "i4"))
    dev.add(end=dev.start + np.maximum(dev.dur, 0.0), kind=N.op_kinds(names, dev.code, dev.name))
    r = col.rt
    rt = Columns(start=_np(r[0], "f8"), dur=_np(r[1], "f8"), pid=_np(r[2], "i8"), tid=_np(r[3], "i8"),
                 corr=_np(r[4], "i8"), name=_np(r[5], "i4"))
    rt.add(end=rt.start + np.maximum(rt.dur, 0.0), kind=N.runtime_kinds(names, rt.name))
    h = col.host
    host = Columns(start=_np(h[0], "f8"), dur=_np(h[1], "f8"), pid=_np(h[2], "i8"), tid=_np(h[3], "i8"),
                   name=_np(h[4], "i4"), code=_np(h[5], "i1"))
    host.add(end=host.start + np.maximum(host.dur, 0.0))
    g = col.gann
    gann = Columns(start=_np(g[0], "f8"), dur=_np(g[1], "f8"), device=_np(g[2], "i8"), stream=_np(g[3], "i8"),
                   name=_np(g[4], "i4"))
    gann.add(end=gann.start + np.maximum(gann.dur, 0.0))
    s = col.sync
    sync = Columns(start=_np(s[0], "f8"), dur=_np(s[1], "f8"), device=_np(s[2], "i8"), stream=_np(s[3], "i8"),
                   kind=_np(s[4], "i1"), waits=_np(s[5], "i8"))
    sync.add(end=sync.start + np.maximum(sync.dur, 0.0))
    tables = TraceTables(path=path, names=names, dev=_sorted(dev), rt=_sorted(rt), host=_sorted(host),
                         gann=_sorted(gann), sync=_sorted(sync), header=header, notes=list(notes),
                         events=col.events, skipped=dict(col.skipped))
    if col.window:
        tables.window = (min(w[0] for w in col.window), max(w[1] for w in col.window))
    _read_metadata(tables, col.meta)
    _join_launches(tables)
    return tables


def _read_metadata(tables: TraceTables, meta: list) -> None:
    for e in meta:
        args, pid = e.get("args") or {}, e.get("pid")
        if e.get("name") == "process_name" and "name" in args:
            tables.processes[pid] = str(args["name"])
        elif e.get("name") == "process_labels" and "labels" in args:
            tables.labels[pid] = str(args["labels"])
        elif e.get("name") == "thread_name" and "name" in args:
            tables.threads[(pid, e.get("tid"))] = str(args["name"]).strip()


def _join_launches(t: TraceTables) -> None:
    """dev.launch: the index (into t.rt) of each device op's launching call, or -1; and blocking copies."""
    launch = np.full(len(t.dev), -1, dtype=np.int64)
    valid = np.flatnonzero(t.rt.corr > 0)
    if len(valid) and len(t.dev):
        order = valid[np.argsort(t.rt.corr[valid], kind="stable")]
        keys = t.rt.corr[order]
        pos = np.clip(np.searchsorted(keys, t.dev.corr), 0, len(keys) - 1)
        hit = (keys[pos] == t.dev.corr) & (t.dev.corr > 0)
        launch[hit] = order[pos[hit]]
    t.dev.add(launch=launch)
    # a copy to the host whose call outlived it: the host waited for it
    d2h = np.flatnonzero((t.dev.kind == N.COPY_D2H) & (launch >= 0))
    if len(d2h):
        calls = launch[d2h]
        waited = t.rt.end[calls] >= t.dev.end[d2h] - 0.5
        t.rt.kind[calls[waited & (t.rt.kind[calls] == N.RT_OTHER)]] = N.RT_MEMCPY_SYNC
