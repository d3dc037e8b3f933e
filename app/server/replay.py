"""Timelines that come in from outside (an upload, a file, `batchscope replay FILE`): bounded, depth-checked and
validated before anything keeps them. The JSON depth check guards every other body too (middleware.py)."""
from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

from batchscope.telemetry import TimelineError, load_timeline, validate_timeline

# An uploaded timeline: twice the largest recording this server keeps (telemetry.recorder.MAX_RECORDING_BYTES)
# and above the live ring's export (~30-40 MiB at 20,000 steps), so whatever it exports it can replay. Parsing
# and validating 64 MiB takes ~350 MB and ~20 s of one core; one replay is loaded at a time.
MAX_REPLAY_BYTES = 64 << 20
# JSON nesting accepted in any body: timelines and API bodies need under 10 levels; parsers recurse per level
MAX_JSON_DEPTH = 64

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


def read_timeline_file(path: str | Path) -> dict:
    """A local file, with no size limit (that is the way to replay one over MAX_REPLAY_BYTES)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise TimelineError(f"{path}: cannot read: {exc}") from exc
    return parse_timeline(raw, str(path))


def accept_timeline(obj) -> dict:
    """A validated timeline from a dict, JSON bytes, or a str (JSON text or a file path, e.g. a Gradio upload),
    at most MAX_REPLAY_BYTES and MAX_JSON_DEPTH deep. Raises TimelineError saying where and why."""
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
        raw = Path(obj).read_bytes()
    elif len(obj) > MAX_REPLAY_BYTES:
        raise ValueError(f"timeline is {len(obj) >> 20} MiB, over the replay limit of {MAX_REPLAY_BYTES >> 20} MiB")
    return parse_timeline(raw)


def _file_size(path) -> int:
    try:
        return os.stat(path).st_size
    except OSError as exc:
        raise TimelineError(f"{path}: cannot read: {exc}") from exc
