"""Opening a trace file: what kind it is (by its first bytes, never its name), a stream of its JSON text however it
is compressed, progress as the file is read, the last bytes of the text (where some writers put keys after the
events), and every way the bytes can fail turned into a one-line error."""
from __future__ import annotations

import gzip
import os
import zlib
from collections import deque
from pathlib import Path

from .bad_trace import NotATraceError, TraceImportError, TruncatedTraceError

GZIP_MAGIC = b"\x1f\x8b"
SQLITE_MAGIC = b"SQLite format 3\x00"
TAIL_BYTES = 256 * 1024          # kept from the end of the text: trailing top-level keys fit easily
PROGRESS_EVERY = 4 * 2**20       # bytes of file between progress calls


def file_kind(path: str | Path) -> str:
    """"gzip", "sqlite", "json" (anything else is tried as JSON) or "empty"."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as exc:
        raise TraceImportError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if not head:
        return "empty"
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(SQLITE_MAGIC):
        return "sqlite"
    return "json"


class _Counting:
    """The raw file, counting what has been read of it for progress."""

    def __init__(self, raw, on_bytes):
        self.raw, self.on_bytes = raw, on_bytes
        self.done = 0
        self._next_report = PROGRESS_EVERY

    def read(self, n=-1):
        data = self.raw.read(n)
        self.done += len(data)
        if self.on_bytes is not None and self.done >= self._next_report:
            self._next_report = self.done + PROGRESS_EVERY
            self.on_bytes(self.done)
        return data

    def readable(self):
        return True

    def close(self):
        self.raw.close()


class TraceText:
    """The file's JSON text as a binary stream (`read(n)`), decompressed where it was gzipped. Remembers the last
    TAIL_BYTES it returned and whether it reached the end, and turns gzip's failures into TraceImportErrors."""

    def __init__(self, path: str | Path, on_bytes=None):
        self.path = str(path)
        self.kind = file_kind(path)
        self.size = os.path.getsize(path)
        self.at_end = False
        self._tail: deque = deque()
        self._tail_len = 0
        self._raw = _Counting(open(path, "rb"), on_bytes)
        self._text = gzip.GzipFile(fileobj=self._raw, mode="rb") if self.kind == "gzip" else self._raw

    @property
    def bytes_read(self) -> int:
        return self._raw.done

    def read(self, n: int = -1) -> bytes:
        try:
            data = self._text.read(n)
        except EOFError as exc:
            raise TruncatedTraceError(f"{self.path}: truncated: the gzip stream ends after {self._raw.done:,} "
                                      f"of {self.size:,} bytes without its end marker") from exc
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise TruncatedTraceError(f"{self.path}: corrupt gzip data at byte {self._raw.done:,}: {exc}") from exc
        except OSError as exc:
            raise TraceImportError(f"{self.path}: cannot read: {exc.strerror or exc}") from exc
        if not data:
            self.at_end = True
            return data
        self._tail.append(data)
        self._tail_len += len(data)
        while self._tail_len - len(self._tail[0]) >= TAIL_BYTES:
            self._tail_len -= len(self._tail.popleft())
        return data

    def tail(self) -> bytes:
        return b"".join(self._tail)[-TAIL_BYTES:]

    def close(self) -> None:
        if self._text is not self._raw:
            self._text.close()
        self._raw.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def open_text(path: str | Path, on_bytes=None) -> TraceText:
    """The JSON text of a trace file; NotATraceError for an empty file or an SQLite one (not a JSON trace)."""
    text = TraceText(path, on_bytes)
    if text.kind == "empty":
        text.close()
        raise NotATraceError(f"{path}: empty file")
    if text.kind == "sqlite":
        text.close()
        raise NotATraceError(f"{path}: an SQLite file, not a JSON trace")
    return text
