"""One trace file -> its tables: sniff the format, read the header, stream the events (on every core for a large
file, parallel_read.py), keep the trailing keys."""
from __future__ import annotations

from .bad_trace import NotATraceError
from .kineto_json import read_events, read_header
from .nsys_sqlite import read_nsys_sqlite
from .opening import file_kind
from .parallel_read import read_events_parallel, worth_it
from .tables import TraceTables, build_tables


def read_trace(path: str, on_bytes=None, partial: bool = False, workers: int | None = None) -> TraceTables:
    """`workers`: processes to parse with (default: one per core for large files; 1 reads in this process)."""
    kind = file_kind(path)
    if kind == "empty":
        raise NotATraceError(f"{path}: empty file")
    if kind == "sqlite":
        return read_nsys_sqlite(path, on_bytes)
    layout, header = read_header(path)
    got = None
    if workers != 1 and (workers or worth_it(path, kind)):
        got = read_events_parallel(path, layout, on_bytes, partial, workers)
    collector, trailer, notes = got or read_events(path, layout, on_bytes, partial)
    if collector.events == 0:
        raise NotATraceError(f"{path}: a trace with no events")
    for key, value in trailer.items():
        header.setdefault(key, value)
    return build_tables(path, collector, header, notes)
