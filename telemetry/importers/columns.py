"""The hot loop: trace events, one dict at a time as ijson builds them, into compact typed columns.

Only what the import needs is kept, as numbers: device ops (kernels, copies, memsets), runtime and driver calls,
host ranges (CPU ops, annotations, Python functions), the device-side twins of annotations, CUDA synchronisation
records and the profiler's own window; names are interned once. Flow events are dropped (launches and device ops
join on their correlation ids, which the flows only repeat), and so are instants, counters and overhead rows.
Metadata (`ph: "M"`) rows are kept whole: Kineto writes them last, and excerpts have none at all.
"""
from __future__ import annotations

import zlib
from array import array
from collections import Counter

from ..export import TimelineError

# cat -> (table, code). Tables: "dev" device ops (code: 0 kernel, 1 copy, 2 memset), "host" host ranges (code:
# 0 CPU op, 1 annotation, 2 Python function), "rt" runtime/driver calls, "gann" device-side annotations,
# "sync" CUDA synchronisation records, "window" the profiler's own span. Legacy (2022) names map to modern ones.
TABLE_OF_CAT = {
    "kernel": ("dev", 0), "Kernel": ("dev", 0), "mtia_ccp_events": ("dev", 0),
    "gpu_memcpy": ("dev", 1), "Memcpy": ("dev", 1),
    "gpu_memset": ("dev", 2), "Memset": ("dev", 2),
    "cpu_op": ("host", 0), "Operator": ("host", 0),
    "user_annotation": ("host", 1),
    "python_function": ("host", 2),
    "cuda_runtime": ("rt", 0), "cuda_driver": ("rt", 0), "Runtime": ("rt", 0), "Driver": ("rt", 0),
    "mtia_runtime": ("rt", 0), "xpu_runtime": ("rt", 0), "xpu_driver": ("rt", 0),
    "privateuse1_runtime": ("rt", 0), "privateuse1_driver": ("rt", 0),
    "gpu_user_annotation": ("gann", 0),
    "cuda_sync": ("sync", 0),
    "Trace": ("window", 0),
}
_TABLES = ("dev", "rt", "host", "gann", "sync")
_NAME_COLUMN = {"dev": 6, "rt": 5, "host": 4, "gann": 4, "sync": -1}      # the column holding name ids
SYNC_KINDS = {"Stream Sync": 0, "Event Sync": 1, "Context Sync": 2, "Wait Event": 3, "Stream Wait Event": 3}
WAIT_EVENT = 3


def _columns(spec: str) -> list:
    return [array(t) for t in spec]


class EventCollector:
    """Feed it events (`add`); read the columns afterwards. Times stay as the file wrote them (µs)."""

    def __init__(self):
        self.names: dict[str, int] = {}
        self._ids: dict = {}                      # non-integer pid/tid values -> negative ids
        # ts, dur, device, stream, correlation, code, name
        self.dev = _columns("ddqqqbi")
        # ts, dur, pid, tid, correlation, name
        self.rt = _columns("ddqqqi")
        # ts, dur, pid, tid, name, code
        self.host = _columns("ddqqib")
        # ts, dur, device, stream, name
        self.gann = _columns("ddqqi")
        # ts, dur, device, stream, kind, wait_on_stream
        self.sync = _columns("ddqqbq")
        self.window: list[tuple[float, float]] = []
        self.meta: list[dict] = []
        self.skipped: Counter = Counter()
        self.events = 0

    def name_id(self, name) -> int:
        nid = self.names.get(name)
        if nid is None:
            nid = self.names[name] = len(self.names)
        return nid

    def other_id(self, value) -> int:
        """A pid or tid that is not an integer ("Spans", "PyTorch Profiler", a hex string): a negative id, the
        same in every process that reads part of one file."""
        if isinstance(value, str) and value.lstrip("-").isdigit():
            return int(value)
        got = self._ids.get(value)
        if got is None:
            got = self._ids[value] = -2 - zlib.crc32(repr(value).encode()) % (1 << 30)
        return got

    # -- moving a part read elsewhere (parallel_read.py) -------------------------------------------------------
    def export(self) -> dict:
        names = [None] * len(self.names)
        for name, nid in self.names.items():
            names[nid] = name
        return {"names": names, "tables": {k: [c.tobytes() for c in getattr(self, k)] for k in _TABLES},
                "window": self.window, "meta": self.meta, "skipped": dict(self.skipped), "events": self.events}

    def merge(self, part: dict) -> None:
        """Absorb another collector's export, its name ids mapped onto this one's."""
        import numpy as np

        mapping = np.array([self.name_id(name) for name in part["names"]], dtype=np.int32)
        for key in _TABLES:
            cols = getattr(self, key)
            for i, (col, raw) in enumerate(zip(cols, part["tables"][key])):
                if i == _NAME_COLUMN[key]:
                    local = np.frombuffer(raw, dtype=np.int32)
                    raw = mapping[local].tobytes() if len(local) else raw
                col.frombytes(raw)
        self.window.extend(part["window"])
        self.meta.extend(part["meta"])
        self.skipped.update(part["skipped"])
        self.events += part["events"]

    def add(self, events) -> None:
        """Consume an iterable of event dicts. An event that is not an object, or a field of the wrong kind (a
        string timestamp), raises TypeError naming the event; errors of the text itself pass through."""
        try:
            self._loop(events, self.events)
        except TimelineError:
            raise
        except (TypeError, ValueError, OverflowError) as exc:
            msg = str(exc)
            raise TypeError(msg if msg.startswith("event ") else
                            f"event {self.events} has a field of the wrong kind ({msg})") from None

    def _loop(self, events, n: int) -> None:
        """The hot loop, kept flat: it runs once per event of a huge file."""
        table_of_cat, names, ids = TABLE_OF_CAT, self.names, self.other_id
        dev, rt, host = self.dev, self.rt, self.host
        skipped, meta = self.skipped, self.meta
        for e in events:
            n += 1
            self.events = n
            if e.__class__ is not dict:
                raise TypeError(f"event {n} is a {type(e).__name__}, not an object")
            if e.get("ph") != "X":
                if e.get("ph") == "M":
                    meta.append(e)
                continue
            cat = e.get("cat")
            where = table_of_cat.get(cat)
            if where is None:
                skipped[cat] += 1
                continue
            table, code = where
            name = e.get("name", "")
            nid = names.get(name)
            if nid is None:
                nid = names[name] = len(names)
            ts, dur = e.get("ts", 0.0), e.get("dur", 0.0) or 0.0
            pid, tid = e.get("pid", -1), e.get("tid", -1)
            if pid.__class__ is not int:
                pid = ids(pid)
            if tid.__class__ is not int:
                tid = ids(tid)
            if table == "host":
                host[0].append(ts), host[1].append(dur), host[2].append(pid), host[3].append(tid)
                host[4].append(nid), host[5].append(code)
            elif table == "rt":
                corr = (e.get("args") or {}).get("correlation", -1)
                rt[0].append(ts), rt[1].append(dur), rt[2].append(pid), rt[3].append(tid)
                rt[4].append(corr if corr.__class__ is int else -1), rt[5].append(nid)
            elif table == "dev":
                args = e.get("args") or {}
                device, stream, corr = args.get("device", pid), args.get("stream", tid), args.get("correlation", -1)
                dev[0].append(ts), dev[1].append(dur)
                dev[2].append(device if device.__class__ is int else pid)
                dev[3].append(stream if stream.__class__ is int else tid)
                dev[4].append(corr if corr.__class__ is int else -1), dev[5].append(code), dev[6].append(nid)
            else:
                self._add_rare(table, e, ts, dur, pid, tid, nid)

    def _add_rare(self, table: str, e: dict, ts: float, dur: float, pid: int, tid: int, nid: int) -> None:
        args = e.get("args") or {}
        if table == "gann":
            device = args.get("device", pid)
            cols = self.gann
            cols[0].append(ts), cols[1].append(dur), cols[2].append(device if isinstance(device, int) else pid)
            cols[3].append(tid), cols[4].append(nid)
        elif table == "sync":
            kind = SYNC_KINDS.get(args.get("cuda_sync_kind", e.get("name")), 4)
            stream, device, waits = args.get("stream", -1), args.get("device", pid), args.get("wait_on_stream", -1)
            cols = self.sync
            cols[0].append(ts), cols[1].append(dur), cols[2].append(device if isinstance(device, int) else pid)
            cols[3].append(stream if isinstance(stream, int) else -1), cols[4].append(kind)
            cols[5].append(waits if isinstance(waits, int) else -1)
        else:
            self.window.append((ts, ts + dur))
