"""Timelines that come in from outside (an upload, a file, `batchscope replay FILE`): bounded, depth-checked and
validated before anything keeps them. The JSON depth check guards every other body too (middleware.py).

A profiler trace (Kineto / torch.profiler Chrome-trace JSON) is accepted wherever a timeline is: told apart by its
content (docs/import.md), plain or gzipped, and converted by the trace importer before it is validated like any
timeline. A gzipped timeline is accepted too."""
from __future__ import annotations

import itertools
import os
import re
import shutil
import tempfile
import zlib
from pathlib import Path

from batchscope.telemetry import TimelineError, load_timeline, validate_timeline

# An uploaded timeline: twice the largest recording this server keeps (telemetry.recorder.MAX_RECORDING_BYTES)
# and above the live ring's export (~30-40 MiB at 20,000 steps), so whatever it exports it can replay. Parsing
# and validating 64 MiB takes ~350 MB and ~20 s of one core; one replay is loaded at a time.
MAX_REPLAY_BYTES = 64 << 20
# JSON nesting accepted in any body: timelines and API bodies need under 10 levels; parsers recurse per level
MAX_JSON_DEPTH = 64

# Enough of the start of a file to tell a trace from a timeline: Kineto writes a few header keys (device
# properties, versions) before `traceEvents`; batchscope writes `schema` first.
SNIFF_BYTES = 1 << 20
GZIP_MAGIC = b"\x1f\x8b"
_TIMELINE_ID = re.compile(rb'"schema"\s*:\s*"batchscope\.timeline/')
_EVENT_ARRAY = re.compile(rb"\[\s*\{")         # a bare array of trace events (a timeline is an object)
_UPLOAD_NAME = re.compile(r"[^A-Za-z0-9_.+-]")

_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_STEP = [0] * 256
for _b in b"[{":
    _DEPTH_STEP[_b] = 1
for _b in b"]}":
    _DEPTH_STEP[_b] = -1


def json_depth_over(raw: bytes | str, limit: int = MAX_JSON_DEPTH) -> int | None:
    """The nesting depth of a JSON text when it is over `limit`, else None; without parsing it, so that a
    recursive parser never meets it. Works at C speed: strings are cut out, then the brackets are counted."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return None                     # the common case: too few brackets to nest that deep
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    depth = max(itertools.accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)
    return depth if depth > limit else None


def parse_timeline(raw: bytes | str, name: str = "timeline") -> dict:
    """load_timeline on JSON text, refusing nesting deeper than MAX_JSON_DEPTH before any parser recurses."""
    depth = json_depth_over(raw)
    if depth is not None:
        raise TimelineError(f"{name}: JSON nested {depth} levels deep, over the limit of {MAX_JSON_DEPTH}")
    try:
        return load_timeline(raw)
    except RecursionError:              # cannot happen within the depth limit; a 500 would be worse
        raise TimelineError(f"{name}: JSON nested too deeply to parse") from None


def is_trace(head: bytes) -> bool:
    """Whether the first bytes of a file (gzipped or not) are a profiler trace rather than a batchscope timeline:
    a bare JSON array of events (objects), or an object with `traceEvents` and no timeline schema id. A gzip stream that
    cannot be read counts as a trace, so that the importer says what is wrong with it."""
    text = head
    if head.startswith(GZIP_MAGIC):
        try:
            text = zlib.decompressobj(wbits=31).decompress(head, SNIFF_BYTES)
        except zlib.error:
            return True
        if not text:
            return True
    text = text[:SNIFF_BYTES].lstrip(b"\xef\xbb\xbf \t\r\n")
    if _EVENT_ARRAY.match(text):
        return True
    if _TIMELINE_ID.search(text):
        return False
    return b'"traceEvents"' in text


def read_timeline_file(path: str | Path, progress=None) -> dict:
    """A local file, with no size limit (that is the way to replay one over MAX_REPLAY_BYTES): a timeline, plain
    or gzipped, or a profiler trace imported on every core (`progress(bytes_done, bytes_total)` while it is read);
    a folder stands for the trace files in it (one run's ranks)."""
    if os.path.isdir(path) or is_trace(_head(path)):
        return _import_trace(path, progress=progress)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise TimelineError(f"{path}: cannot read: {exc}") from exc
    return parse_timeline(_gunzip(raw, str(path)), str(path))


def accept_timeline(obj, name: str | None = None) -> dict:
    """A validated timeline from a dict, JSON bytes, or a str (JSON text or a file path, e.g. a Gradio upload),
    at most MAX_REPLAY_BYTES and MAX_JSON_DEPTH deep; the bytes or the file may also be a gzipped timeline or a
    profiler trace (converted here; `name` is what its errors call it). Raises TimelineError saying where and why."""
    if isinstance(obj, dict):
        try:
            return validate_timeline(obj)
        except RecursionError:          # a dict built in Python can nest as deep as it likes
            raise TimelineError("timeline: nested too deeply to validate") from None
    raw = obj
    if isinstance(obj, Path) or (isinstance(obj, str) and not obj.lstrip().startswith(("{", "["))):
        size = _file_size(obj)
        if size > MAX_REPLAY_BYTES:
            raise ValueError(f"timeline file is {size >> 20} MiB, over the replay limit of "
                             f"{MAX_REPLAY_BYTES >> 20} MiB")
        if is_trace(_head(obj)):
            return _import_trace(obj, workers=1)
        raw = Path(obj).read_bytes()
    elif len(obj) > MAX_REPLAY_BYTES:
        raise ValueError(f"timeline is {len(obj) >> 20} MiB, over the replay limit of {MAX_REPLAY_BYTES >> 20} MiB")
    else:
        head = obj[:SNIFF_BYTES]
        if is_trace(head.encode("utf-8", "surrogatepass") if isinstance(head, str) else bytes(head)):
            return _import_uploaded_trace(obj.encode("utf-8", "surrogatepass") if isinstance(obj, str) else obj, name)
    # a gzipped timeline may not unpack to more than an uncompressed one may be
    return parse_timeline(_gunzip(raw, name or "timeline", MAX_REPLAY_BYTES), name or "timeline")


def _head(path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(SNIFF_BYTES // 4)        # compressed, for a gzip: plenty for SNIFF_BYTES of text
    except OSError as exc:
        raise TimelineError(f"{path}: cannot read: {exc}") from exc


def _gunzip(raw, name: str, limit: int | None = None):
    """The text of a gzipped timeline (anything else as it is), refusing more than `limit` bytes of it."""
    if isinstance(raw, str) or not raw[:2] == GZIP_MAGIC:
        return raw
    try:
        d = zlib.decompressobj(wbits=31)
        text = d.decompress(raw, (limit + 1) if limit else 0)
    except zlib.error as exc:
        raise TimelineError(f"{name}: corrupt gzip data: {exc}") from None
    if limit and len(text) > limit:
        raise ValueError(f"{name}: the gzipped timeline unpacks to over the replay limit of {limit >> 20} MiB")
    if not d.eof:
        raise TimelineError(f"{name}: truncated: the gzip stream ends before its end marker")
    return text


def _import_trace(path, workers: int | None = None, progress=None) -> dict:
    try:
        from batchscope.telemetry.importers import import_trace
    except ImportError:
        from .errors import NotInThisBuild
        raise NotInThisBuild(f"{path} is a profiler trace, and this build has no trace importer") from None
    return import_trace(path, workers=workers, progress=progress)


def _import_uploaded_trace(raw: bytes, name: str | None) -> dict:
    """An uploaded trace, through a file of its own (the importer streams files), in this process: the server
    takes one replay at a time. Its errors and the timeline name the upload, not the temporary file."""
    name = _UPLOAD_NAME.sub("_", os.path.basename(name or ""))[:200].lstrip(".") or "uploaded.pt.trace.json"
    folder = tempfile.mkdtemp(prefix="batchscope-upload-")
    path = os.path.join(folder, name)
    try:
        with open(path, "wb") as f:
            f.write(raw)
        try:
            timeline = _import_trace(path, workers=1)
        except TimelineError as exc:
            raise type(exc)(str(exc).replace(path, name)) from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for f in timeline["meta"].get("source", {}).get("files", []):
        f.pop("path", None)             # the server's temporary file: nothing the uploader can open
    return timeline


def _file_size(path) -> int:
    try:
        return os.stat(path).st_size
    except OSError as exc:
        raise TimelineError(f"{path}: cannot read: {exc}") from exc
