"""Recordings of any kind, opened for a compare: a timeline JSON (plain or gzipped), a bench result (its runs'
timelines), a profiler trace or Nsight export (through the importer), or a running server's history (a URL).

Every failure is a CompareInputError: one line naming the input and what is wrong with it.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

from ..export import TimelineError, validate_timeline

SNIFF_BYTES = 1 << 16
GZIP_MAGIC = b"\x1f\x8b"
SQLITE_MAGIC = b"SQLite format 3\x00"
BENCH_SCHEMA = "batchscope.bench"          # batchscope.bench/1, batchscope.bench.served/1
URL_TIMEOUT_S = 60.0
_BATCHSCOPE_SCHEMA = re.compile(rb'"schema"\s*:\s*"batchscope\.')


class CompareInputError(ValueError):
    """A recording given to compare cannot be used; the message says which and why."""


@dataclass
class Recording:
    name: str           # what the output calls it: the file (and the bench run), or the URL
    timeline: dict
    kind: str           # "timeline" (batchscope's own telemetry) or "trace" (imported from a profiler)


def open_recordings(spec: str) -> list[Recording]:
    """One argument of `batchscope compare`, as the recordings it holds (a bench result with repeats: several).
    `BENCH.json#LABEL` picks a bench result's runs of one label (sync, async, ...)."""
    if spec.startswith(("http://", "https://")):
        return [_recording(spec, _fetch(spec))]
    path, label = spec, None
    if "#" in spec and not os.path.exists(spec):
        path, label = spec.rsplit("#", 1)
    head = _head(path)
    if head.startswith(SQLITE_MAGIC) or _looks_like_trace(head):
        return [_recording(path, _import(path))]
    raw = _read(path)
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CompareInputError(f"{path}: not a timeline, a bench result or a profiler trace ({e})") from None
    if isinstance(doc, dict) and str(doc.get("schema", "")).startswith(BENCH_SCHEMA):
        return _bench_runs(path, doc, label)
    if not isinstance(doc, dict) or "schema" not in doc:
        raise CompareInputError(f"{path}: not a timeline, a bench result or a profiler trace (no batchscope schema)")
    if label is not None:
        raise CompareInputError(f"{path}: '#{label}' picks a bench result's runs, and this is not a bench result")
    return [_recording(path, _valid(doc, path))]


def _recording(name: str, timeline: dict) -> Recording:
    kind = "trace" if (timeline.get("meta") or {}).get("source") else "timeline"
    return Recording(name=name, timeline=timeline, kind=kind)


def _valid(doc, name: str) -> dict:
    try:
        return validate_timeline(doc, name)
    except TimelineError as e:
        raise CompareInputError(str(e)) from None
    except RecursionError:
        raise CompareInputError(f"{name}: nested too deeply to read") from None


def _head(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError as e:
        raise CompareInputError(f"{path}: cannot read: {e.strerror or e}") from None
    if head.startswith(GZIP_MAGIC):
        try:
            return zlib.decompressobj(wbits=31).decompress(head, SNIFF_BYTES)
        except zlib.error as e:
            raise CompareInputError(f"{path}: corrupt gzip data: {e}") from None
    return head


def _looks_like_trace(head: bytes) -> bool:
    """A Kineto trace: a bare array of events, or an object with traceEvents and no batchscope schema."""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text.startswith(b"["):
        return True
    if _BATCHSCOPE_SCHEMA.search(text):
        return False
    return b'"traceEvents"' in text


def _read(path: str) -> bytes:
    try:
        raw = Path(path).read_bytes()
        return gzip.decompress(raw) if raw.startswith(GZIP_MAGIC) else raw
    except OSError as e:
        raise CompareInputError(f"{path}: cannot read: {e.strerror or e}") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise CompareInputError(f"{path}: corrupt gzip data: {e}") from None


def _import(path: str) -> dict:
    from ..importers import import_trace       # numpy and the importer load only for a trace

    try:
        return import_trace(path, workers=1)
    except TimelineError as e:
        raise CompareInputError(f"cannot import {path}: {e}") from None


def _bench_runs(path: str, doc: dict, label: str | None) -> list[Recording]:
    runs = [r for r in doc.get("runs") or [] if isinstance(r, dict) and r.get("timeline")]
    labels = sorted({str(r.get("label")) for r in runs})
    if not runs:
        raise CompareInputError(f"{path}: a bench result with no timelines (was it run with --no-telemetry?)")
    if label is None and len(labels) > 1:
        raise CompareInputError(f"{path}: a bench result with runs of {', '.join(labels)}: name one, e.g. "
                                f"{path}#{labels[0]}")
    label = label if label is not None else labels[0]
    chosen = [r for r in runs if str(r.get("label")) == label]
    if not chosen:
        raise CompareInputError(f"{path}: no run labelled {label!r} (it has {', '.join(labels)})")
    out = []
    for run in chosen:
        tl_path = _beside(path, run["timeline"])
        tl = open_recordings(tl_path)[0].timeline
        out.append(_recording(f"{path}#{label}" + (f" (repeat {run['repeat'] + 1})" if len(chosen) > 1 else ""), tl))
    return out


def _beside(bench_path: str, recorded: str) -> str:
    """A bench run's timeline where the bench wrote it, or, the result having moved, beside the result."""
    if os.path.exists(recorded):
        return recorded
    here = os.path.join(os.path.dirname(bench_path) or ".", os.path.basename(recorded))
    for candidate in (here, here + ".gz"):
        if os.path.exists(candidate):
            return candidate
    raise CompareInputError(f"{bench_path}: its timeline {os.path.basename(recorded)} is neither at {recorded} "
                            f"nor beside the result")


def _fetch(url: str) -> dict:
    """A running server's recording so far (GET /api/timeline.json); a bare server address gets that route."""
    if url.rstrip("/").count("/") <= 2:
        url = url.rstrip("/") + "/api/timeline.json"
    request = urllib.request.Request(url)
    token = os.environ.get("BATCHSCOPE_TOKEN")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=URL_TIMEOUT_S) as response:
            body = response.read()
    except urllib.error.HTTPError as e:
        raise CompareInputError(f"{url}: the server answered {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        raise CompareInputError(f"{url}: cannot reach it: {getattr(e, 'reason', e)}") from None
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CompareInputError(f"{url}: the answer is not JSON") from None
    return _valid(doc, url)
