"""Reading a Kineto / torch.profiler Chrome-trace JSON file in one streaming pass (ijson's C parser), never whole.

A trace is an object `{"schemaVersion": 1, "deviceProperties": [...], ..., "traceEvents": [...], "traceName": ...}`
(keys may come before or after the events; some tools write a bare array of events instead). The keys before the
events are read by a short first pass that stops where the events begin; the keys after them from the last bytes
of the text, kept while the events stream past. A file that is not JSON, JSON that is no trace, and a file that
ends early each give a one-line error; with `partial=True` a file that ends early gives what was read before.
"""
from __future__ import annotations

import json
import re

import ijson

from .columns import EventCollector
from .bad_trace import NotATraceError, TraceImportError, TruncatedTraceError
from .opening import open_text

_EVENTS_KEY = "traceEvents"


def _backend():
    try:
        from ijson.backends import yajl2_c
        return yajl2_c
    except ImportError:          # a platform without the compiled parser: correct, only slower
        return ijson


def exact_backend():
    """ijson's pure-Python parser: about 12x slower than the C one, but it reads integers of any size (the C
    parser stops at 2^63 with "integer overflow", though such a number is valid JSON: RTP-LLM's traces give
    a GPU process `sort_index` 2^64-1)."""
    from ijson.backends import python
    return python


def overflowed(exc: Exception) -> bool:
    return "integer overflow" in str(exc)


BIG_INTEGER_NOTE = ("the trace holds integers beyond 64 bits (valid JSON the fast parser cannot hold): read with "
                    "the exact, slower parser")


def read_header(path: str) -> tuple[str, dict]:
    """("object" | "array", the top-level keys before traceEvents). NotATraceError when the text is no trace."""
    try:
        return _read_header(path, _backend())
    except _Overflow:
        return _read_header(path, exact_backend())


class _Overflow(Exception):
    """The C parser met an integer beyond 64 bits: read again with the exact one."""


def _read_header(path: str, backend) -> tuple[str, dict]:
    header: dict = {}
    with open_text(path) as text:
        builder, key = None, None
        try:
            for prefix, event, value in backend.parse(text):
                if prefix == "" and event == "start_array":
                    return "array", header
                if prefix == "" and event in ("string", "number", "boolean", "null"):
                    raise NotATraceError(f"{path}: JSON, but a single {event}, not a trace")
                if prefix == "" and event == "map_key":
                    if value == _EVENTS_KEY:
                        return "object", header
                    key, builder = value, ijson.ObjectBuilder()
                    continue
                if builder is not None:
                    builder.event(event, value)
                    if prefix == key and event in ("end_map", "end_array", "string", "number", "boolean", "null"):
                        header[key], builder = builder.value, None
        except ijson.JSONError as exc:
            if overflowed(exc) and backend is not exact_backend():
                raise _Overflow() from None
            raise _json_error(path, exc, text.at_end) from None
    keys = ", ".join(sorted(header)[:8]) or "none"
    raise NotATraceError(f"{path}: JSON, but not a trace: no traceEvents (top-level keys: {keys})")


def read_events(path: str, layout: str, on_bytes=None, partial: bool = False) -> tuple[EventCollector, dict, list]:
    """Stream every event into an EventCollector. Returns (collector, trailing top-level keys, notes)."""
    try:
        return _read_events(path, layout, on_bytes, partial, _backend())
    except _Overflow:
        collector, trailer, notes = _read_events(path, layout, on_bytes, partial, exact_backend())
        return collector, trailer, [BIG_INTEGER_NOTE] + notes


def _read_events(path: str, layout: str, on_bytes, partial: bool, backend) -> tuple[EventCollector, dict, list]:
    collector, notes = EventCollector(), []
    prefix = "item" if layout == "array" else f"{_EVENTS_KEY}.item"
    with open_text(path, on_bytes) as text:
        try:
            collector.add(backend.items(text, prefix, use_float=True))
        except ijson.JSONError as exc:
            if overflowed(exc) and backend is not exact_backend():
                raise _Overflow() from None
            error = _json_error(path, exc, text.at_end)
            if not (partial and isinstance(error, TruncatedTraceError)):
                raise error from None
            notes.append(f"the file ends early ({error}); imported the {collector.events:,} events before the cut")
        except TruncatedTraceError as exc:
            if not partial:
                raise exc from None
            notes.append(f"the file ends early ({exc}); imported the {collector.events:,} events before the cut")
        except TypeError as exc:
            raise NotATraceError(f"{path}: JSON, but not a trace: its {exc}") from None
        trailer = _trailer(text.tail()) if layout == "object" else {}
    return collector, trailer, notes


def _json_error(path: str, exc: Exception, at_end: bool) -> TraceImportError:
    lines = [ln.strip() for ln in str(exc).replace("\\n", "\n").splitlines() if ln.strip()]
    msg = lines[0].lstrip("b'\"") if lines else type(exc).__name__
    if at_end and "premature EOF" in msg:
        return TruncatedTraceError(f"{path}: truncated: the JSON text stops before the trace ends")
    return NotATraceError(f"{path}: not valid JSON ({msg})")


_CLOSE = re.compile(rb"\]\s*,")


def _trailer(tail: bytes) -> dict:
    """The top-level keys written after the events array, from the text's last bytes: the first `],` from the
    end after which the rest parses as the remaining members of an object (a small json.loads on a few KB)."""
    text = tail.rstrip()
    if not text.endswith(b"}"):
        return {}
    for match in reversed(list(_CLOSE.finditer(text))[-64:]):
        rest = text[match.end():]
        try:
            obj = json.loads(b"{" + rest)
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
    return {}
