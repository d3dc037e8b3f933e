"""One trace file -> its tables: sniff the format, read the header, stream the events, keep the trailing keys."""
from __future__ import annotations

from .errors import NotATraceError, TraceImportError
from .kineto_json import read_events, read_header
from .opening import file_kind
from .tables import TraceTables, build_tables


def read_trace(path: str, on_bytes=None, partial: bool = False) -> TraceTables:
    kind = file_kind(path)
    if kind == "empty":
        raise NotATraceError(f"{path}: empty file")
    if kind == "sqlite":
        raise TraceImportError(f"{path}: an SQLite file (an Nsight Systems export?): not a Kineto JSON trace")
    layout, header = read_header(path)
    collector, trailer, notes = read_events(path, layout, on_bytes, partial)
    if collector.events == 0:
        raise NotATraceError(f"{path}: a trace with no events")
    for key, value in trailer.items():
        header.setdefault(key, value)
    return build_tables(path, collector, header, notes)
