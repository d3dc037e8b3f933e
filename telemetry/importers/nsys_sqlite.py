"""Nsight Systems SQLite exports (`nsys export --type sqlite`) -> the tables a Kineto trace gives, so everything
after reading (steps, gaps, causes, the timeline) is the same code for both.

What maps where: CUPTI kernels, copies and memsets are the device ops (a copy named by its direction, as Kineto
names them); CUPTI runtime and driver calls the launches (joined to their ops by correlation id, graph kernels by
their graph launch's); CUPTI synchronisation records the waits; NVTX push/pop and start/end ranges the host
annotations (batchscope's `step N ...` and phase ranges among them); thread and process names from their tables.
Times are the export's ns since the session start, kept as µs, and the session's UTC start puts them on the wall
clock. Read with SQL, one table at a time; a table the export lacks is simply empty (a trace without CUDA).
"""
from __future__ import annotations

import os
import sqlite3

from .columns import SYNC_KINDS, EventCollector
from .bad_trace import NotATraceError, TraceImportError
from .tables import TraceTables, build_tables

_COPY_NAMES = {1: "Memcpy HtoD", 2: "Memcpy DtoH", 3: "Memcpy HtoA", 4: "Memcpy AtoH", 5: "Memcpy AtoA",
               6: "Memcpy AtoD", 7: "Memcpy DtoA", 8: "Memcpy DtoD", 9: "Memcpy HtoH", 10: "Memcpy PtoP",
               11: "Memcpy HtoD (unified)", 12: "Memcpy DtoH (unified)", 13: "Memcpy DtoD (unified)"}
# CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_*: 1 event sync, 2 stream wait event, 3 stream sync, 4 context sync
_SYNC_KIND = {1: SYNC_KINDS["Event Sync"], 2: SYNC_KINDS["Stream Wait Event"], 3: SYNC_KINDS["Stream Sync"],
              4: SYNC_KINDS["Context Sync"]}
_RANGE_TYPES = ("NvtxPushPopRange", "NvtxStartEndRange")
SUPPORTED_SCHEMA_MAJOR = 3
META_TABLES = ("EXPORT_META_DATA", "META_DATA_EXPORT")     # the export's version rows: 2022.x, then 2023.x on


def _pid(global_id: int) -> int:
    return (global_id >> 24) & 0xFFFFFF


def _tid(global_id: int) -> int:
    return global_id & 0xFFFFFF


def read_nsys_sqlite(path: str, on_bytes=None) -> TraceTables:
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        have = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    except sqlite3.DatabaseError as exc:
        raise NotATraceError(f"{path}: an SQLite file that cannot be read ({exc})") from None
    try:
        if "StringIds" not in have or not have & {*META_TABLES, "TARGET_INFO_SESSION_START_TIME"}:
            raise NotATraceError(f"{path}: an SQLite file, but not an Nsight Systems export (no StringIds table)")
        header = _header(con, have, path)
        col = EventCollector()
        strings = dict(con.execute("SELECT id, value FROM StringIds"))
        _device_ops(con, have, col, strings)
        _runtime(con, have, col, strings)
        _sync(con, have, col)
        _ranges(con, have, col, strings)
        meta = _names(con, have, strings)
        if on_bytes is not None:
            on_bytes(os.path.getsize(path))
    except sqlite3.DatabaseError as exc:
        raise TraceImportError(f"{path}: an Nsight Systems export this reader does not understand ({exc}; "
                               f"{header_version(con, have)})") from None
    finally:
        con.close()
    col.meta = meta
    return build_tables(path, col, header, [])


def header_version(con, have: set) -> str:
    try:
        rows = _meta(con, have)
    except sqlite3.DatabaseError:
        return "version unknown"
    return f"Nsight Systems {rows.get('EXPORT_PRODUCT_VERSION', '?')}, schema {rows.get('EXPORT_SCHEMA_VERSION', '?')}"


def _meta(con, have: set) -> dict:
    table = next((t for t in META_TABLES if t in have), None)
    return dict(con.execute(f"SELECT name, value FROM {table}")) if table else {}


def _header(con, have: set, path: str) -> dict:
    meta = _meta(con, have)
    major = str(meta.get("EXPORT_SCHEMA_VERSION_MAJOR", SUPPORTED_SCHEMA_MAJOR))
    if major.isdigit() and int(major) != SUPPORTED_SCHEMA_MAJOR:
        raise TraceImportError(f"{path}: an Nsight Systems export of schema {meta.get('EXPORT_SCHEMA_VERSION')} "
                               f"({meta.get('EXPORT_PRODUCT_VERSION', 'unknown version')}); this reader knows schema "
                               f"{SUPPORTED_SCHEMA_MAJOR}.x: export it again with an nsys of that schema")
    header = {"batchscope_tool": f"Nsight Systems {meta.get('EXPORT_PRODUCT_VERSION', '')}".strip(),
              "batchscope_format": f"nsys-sqlite (schema {meta.get('EXPORT_SCHEMA_VERSION', 'unknown')})"}
    if "TARGET_INFO_SESSION_START_TIME" in have:
        row = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
        if row and row[0]:
            header["baseTimeNanoseconds"] = int(row[0])
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in have or "CUPTI_ACTIVITY_KIND_KERNEL" in have:
        header["cupti_version"] = meta.get("EXPORT_PRODUCT_VERSION", "nsys")      # the vendor: CUDA
    return header


def _columns(con, table: str) -> set:
    return {r[1] for r in con.execute(f"PRAGMA table_info({table})")}


def _device_ops(con, have: set, col: EventCollector, strings: dict) -> None:
    dev, name_id = col.dev, col.name_id

    def add(start, end, device, stream, corr, code, name):
        dev[0].append(start / 1000.0), dev[1].append((end - start) / 1000.0), dev[2].append(device or 0)
        dev[3].append(stream or 0), dev[4].append(corr or 0), dev[5].append(code), dev[6].append(name_id(name))
        col.events += 1

    if "CUPTI_ACTIVITY_KIND_KERNEL" in have:
        cols = _columns(con, "CUPTI_ACTIVITY_KIND_KERNEL")
        label = "demangledName" if "demangledName" in cols else "shortName"
        for start, end, device, stream, corr, nid in con.execute(
                f"SELECT start, end, deviceId, streamId, correlationId, {label} FROM CUPTI_ACTIVITY_KIND_KERNEL"):
            add(start, end, device, stream, corr, 0, strings.get(nid, f"kernel {nid}"))
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in have:
        for start, end, device, stream, corr, kind in con.execute(
                "SELECT start, end, deviceId, streamId, correlationId, copyKind FROM CUPTI_ACTIVITY_KIND_MEMCPY"):
            add(start, end, device, stream, corr, 1, _COPY_NAMES.get(kind, "Memcpy"))
    if "CUPTI_ACTIVITY_KIND_MEMSET" in have:
        for start, end, device, stream, corr in con.execute(
                "SELECT start, end, deviceId, streamId, correlationId FROM CUPTI_ACTIVITY_KIND_MEMSET"):
            add(start, end, device, stream, corr, 2, "Memset")


def _runtime(con, have: set, col: EventCollector, strings: dict) -> None:
    rt, name_id = col.rt, col.name_id
    for table in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER"):
        if table not in have:
            continue
        for start, end, gtid, corr, nid in con.execute(
                f"SELECT start, end, globalTid, correlationId, nameId FROM {table}"):
            rt[0].append(start / 1000.0), rt[1].append((end - start) / 1000.0), rt[2].append(_pid(gtid))
            rt[3].append(_tid(gtid)), rt[4].append(corr or 0), rt[5].append(name_id(strings.get(nid, "cuda?")))
            col.events += 1


def _sync(con, have: set, col: EventCollector) -> None:
    if "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION" not in have:
        return
    sync = col.sync
    for start, end, device, stream, kind in con.execute(
            "SELECT start, end, deviceId, streamId, syncType FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"):
        if kind not in _SYNC_KIND:
            continue
        sync[0].append(start / 1000.0), sync[1].append((end - start) / 1000.0), sync[2].append(device or 0)
        sync[3].append(stream if stream is not None else -1), sync[4].append(_SYNC_KIND[kind]), sync[5].append(-1)
        col.events += 1


def _ranges(con, have: set, col: EventCollector, strings: dict) -> None:
    if "NVTX_EVENTS" not in have:
        return
    types = [r[0] for r in con.execute(
        f"SELECT id FROM ENUM_NSYS_EVENT_TYPE WHERE name IN ({','.join('?' * len(_RANGE_TYPES))})", _RANGE_TYPES)] \
        if "ENUM_NSYS_EVENT_TYPE" in have else [59, 60]
    host, name_id = col.host, col.name_id
    for start, end, gtid, text, tid_ in con.execute(
            f"SELECT start, end, globalTid, text, textId FROM NVTX_EVENTS WHERE end IS NOT NULL AND eventType IN "
            f"({','.join('?' * len(types))})", types):
        name = text if text is not None else strings.get(tid_, "")
        host[0].append(start / 1000.0), host[1].append((end - start) / 1000.0), host[2].append(_pid(gtid or 0))
        host[3].append(_tid(gtid or 0)), host[4].append(name_id(name)), host[5].append(1)
        col.events += 1


def _names(con, have: set, strings: dict) -> list:
    """Process and thread names as the Kineto metadata rows the tables already read."""
    meta = []
    if "PROCESSES" in have:
        for gpid, pid, name in con.execute("SELECT globalPid, pid, name FROM PROCESSES"):
            meta.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
    if "ThreadNames" in have:
        for nid, gtid in con.execute("SELECT nameId, globalTid FROM ThreadNames"):
            meta.append({"ph": "M", "name": "thread_name", "pid": _pid(gtid), "tid": _tid(gtid),
                         "args": {"name": strings.get(nid, "")}})
    return meta
