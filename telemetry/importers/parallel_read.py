"""Reading a large trace on every core: the events array cut into pieces at event boundaries, each piece parsed
(ijson's C parser) and collected in a worker process, the pieces' columns merged in order.

The text still streams once, never whole: this process reads it (decompressing a .gz), finds where the events
array begins, and cuts a piece about every CHUNK_BYTES just after an event's closing brace (a `}` then `,` then
the `{"ph"...` of the next event). A cut can only be wrong inside a string or a nested object, and then the
pieces on both sides of it are not valid JSON arrays: any piece that fails to parse makes the whole read fall
back to the one-process reader, which reports what is wrong with the file, if anything. At most a few pieces
are in flight, so memory stays bounded. The trailing top-level keys (after the events) come from the last piece.
"""
from __future__ import annotations

import io
import json
import multiprocessing
import os
import re
import sys
import threading
from collections import deque
from concurrent.futures import ProcessPoolExecutor

import ijson

from .columns import EventCollector
from .bad_trace import TruncatedTraceError
from .kineto_json import BIG_INTEGER_NOTE, exact_backend, overflowed
from .opening import open_text

CHUNK_BYTES = 8 * 2**20
PARALLEL_FROM_BYTES = 48 * 2**20         # text size below which one process is quicker than starting workers
GZIP_RATIO = 8                           # a gzipped trace's text is about this many times its file
_EVENTS_START = re.compile(rb'(?<!\\)"traceEvents"\s*:\s*\[')
_BOUNDARY = re.compile(rb'\}\s*,\s*(?=\{\s*"(?:ph|cat|name|pid|tid|ts|dur|id|args|s|bp)"\s*:)')


class PieceFailed(Exception):
    """A piece did not parse on its own: the cuts cannot be trusted for this file."""


def worth_it(path: str, kind: str) -> bool:
    size = os.path.getsize(path) * (GZIP_RATIO if kind == "gzip" else 1)
    return (os.cpu_count() or 1) > 1 and size >= PARALLEL_FROM_BYTES


def _parse_piece(piece: bytes) -> dict:
    try:
        from ijson.backends import yajl2_c as backend
    except ImportError:
        backend = ijson
    col, exact = EventCollector(), False
    try:
        # a piece is in memory already: small reads keep the parser's buffer in cache
        col.add(backend.items(io.BytesIO(b"[" + piece + b"]"), "item", use_float=True, buf_size=16384))
    except ijson.JSONError as exc:
        if not overflowed(exc):
            raise PieceFailed(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
        col = EventCollector()          # an integer beyond 64 bits: this piece again, with the exact parser
        try:
            col.add(exact_backend().items(io.BytesIO(b"[" + piece + b"]"), "item", use_float=True))
        except (ijson.JSONError, TypeError) as again:
            raise PieceFailed(str(again).splitlines()[0] if str(again) else type(again).__name__) from None
        exact = True
    except TypeError as exc:
        raise PieceFailed(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    return {**col.export(), "exact_parser": exact}


def _context():
    # fork is quickest, but forking a process that runs other threads can leave locks held in the child
    single = threading.active_count() == 1 and sys.platform.startswith("linux")
    return multiprocessing.get_context("fork" if single else "spawn")


def read_events_parallel(path: str, layout: str, on_bytes=None, partial: bool = False,
                         workers: int | None = None) -> tuple[EventCollector, dict, list] | None:
    """(collector, trailing keys, notes), or None when the file must be read by one process instead."""
    workers = workers or min(os.cpu_count() or 1, 8)
    merged, notes, pending = EventCollector(), [], deque()
    try:
        with open_text(path, on_bytes) as text, ProcessPoolExecutor(workers, mp_context=_context()) as pool:
            pieces = _Pieces(text, layout, partial)
            exact = []

            def absorb(part: dict) -> None:
                exact.append(part.pop("exact_parser"))
                merged.merge(part)

            for piece in pieces:
                pending.append(pool.submit(_parse_piece, piece))
                while len(pending) > 2 * workers:
                    absorb(pending.popleft().result())
            while pending:
                absorb(pending.popleft().result())
            notes += pieces.notes + ([BIG_INTEGER_NOTE] if any(exact) else [])
            return merged, pieces.trailer, notes
    except PieceFailed:
        for f in pending:
            f.cancel()
        return None


class _Pieces:
    """Iterates over the events array's text in pieces that each hold whole events."""

    def __init__(self, text, layout: str, partial: bool):
        self.text, self.layout, self.partial = text, layout, partial
        self.trailer: dict = {}
        self.notes: list[str] = []

    def _read(self) -> bytes:
        try:
            return self.text.read(CHUNK_BYTES)
        except TruncatedTraceError as exc:
            if not self.partial:
                raise
            self.notes.append(f"the file ends early ({exc}); imported the events before the cut")
            return b""

    def __iter__(self):
        buf = self._read()
        start = _EVENTS_START.search(buf) if self.layout == "object" else re.compile(rb"\s*\[").match(buf)
        if start is None:
            raise PieceFailed("the events array does not start in the first piece")
        buf = buf[start.end():]
        while True:
            data = self._read()
            if not data:
                break
            buf += data
            if len(buf) < CHUNK_BYTES:
                continue
            cut = _last_boundary(buf)
            if cut is not None:
                yield buf[:cut[0]]
                buf = buf[cut[1]:]
        yield from self._last(buf)

    def _last(self, buf: bytes):
        end = _events_end(buf, self.layout)
        if end is None:
            if not self.partial:
                raise PieceFailed("no end of the events array")     # the one-process reader says what is wrong
            cut = _last_boundary(buf)
            if cut is not None:
                yield buf[:cut[0]]
            return
        events, self.trailer = end
        if events.strip():
            yield events


def _last_boundary(buf: bytes) -> tuple[int, int] | None:
    """(end of the last whole event, start of the next) near the end of `buf`."""
    for lookback in (2**20, len(buf)):
        last = None
        for last in _BOUNDARY.finditer(buf, max(0, len(buf) - lookback)):
            pass
        if last is not None:
            return last.start() + 1, last.end()
    return None


def _events_end(buf: bytes, layout: str) -> tuple[bytes, dict] | None:
    """The events text before the array's closing bracket, and the top-level keys after it."""
    pos = len(buf)
    for _ in range(64):
        pos = buf.rfind(b"]", 0, pos)
        if pos < 0:
            return None
        rest = buf[pos + 1:].strip()
        if layout == "array":
            if not rest:
                return buf[:pos], {}
            continue
        if rest == b"}":
            return buf[:pos], {}
        if rest.startswith(b",") and rest.endswith(b"}"):
            try:
                trailer = json.loads(b"{" + rest[1:])
            except ValueError:
                continue
            if isinstance(trailer, dict):
                return buf[:pos], trailer
    return None
