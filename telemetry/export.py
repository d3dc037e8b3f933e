"""`batchscope.timeline/1` JSON: build it, move it to another origin, validate it, load it for replay.

Validation is the JSON Schema (telemetry/schema.py, published as docs/timeline.schema.json) plus the checks a
schema cannot express: steps strictly increasing, every span ending no earlier than it starts, a step's host spans
in loop order, each request's token count matching its token times. A file that fails any of them is rejected
with a TimelineError naming the file, the place and the reason.
"""
from __future__ import annotations

import datetime as _dt
import io
import json
from pathlib import Path

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from .records import GPU_PHASES, HOST_PHASES, SCHEMA_ID
from .schema import SCHEMA

_VALIDATOR = Draft202012Validator(SCHEMA)


class TimelineError(ValueError):
    """A timeline file or object is not a valid batchscope.timeline/1; the message says where and why."""


def build_timeline(meta: dict, steps: list, requests: list, nvml: list, mode_changes: list,
                   summary: dict, rank_steps: list | None = None) -> dict:
    """`rank_steps` (tensor parallel: the other ranks' GPU spans) is left out when there are none, so a
    single-GPU timeline reads exactly as before it existed."""
    tl = {"schema": SCHEMA_ID, "meta": meta, "steps": steps, "requests": requests, "nvml": nvml,
          "mode_changes": mode_changes, "summary": summary}
    if rank_steps:
        tl["rank_steps"] = rank_steps
    return tl


def created_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ---- origin shifts: records are shared with the live ring, so shifting builds new dicts ------------------------
def _add(t, d):
    return None if t is None else round(t + d, 1)


def _span(s, d):
    return None if s is None else [round(s[0] + d, 1), round(s[1] + d, 1)]


def shift_step(rec: dict, d: float) -> dict:
    out = dict(rec)
    out["cpu"] = {p: _span(s, d) for p, s in rec["cpu"].items()}
    if rec.get("gpu") is not None:
        out["gpu"] = {p: _span(s, d) for p, s in rec["gpu"].items()}
    out["compute_us"] = _span(rec.get("compute_us"), d)
    return out


def shift_request(rec: dict, d: float) -> dict:
    out = dict(rec)
    for key in ("arrival_us", "first_token_us", "finish_us"):
        out[key] = _add(rec.get(key), d)
    out["token_us"] = [round(t + d, 1) for t in rec.get("token_us", [])]
    if rec.get("sent_us") is not None:         # a streamed request's chunk write times, on the same clock
        out["sent_us"] = [round(t + d, 1) for t in rec["sent_us"]]
    return out


def shift_sample(rec: dict, d: float) -> dict:
    out = dict(rec)
    out["t_us"] = _add(rec["t_us"], d)
    if rec.get("fine"):
        out["fine"] = [[round(t + d, 1), v] for t, v in rec["fine"]]
    return out


def shift_mode(rec: dict, d: float) -> dict:
    return {**rec, "t_us": _add(rec["t_us"], d)}


def shift_rank_step(rec: dict, d: float) -> dict:
    return {**rec, "gpu": {p: _span(s, d) for p, s in rec["gpu"].items()},
            "compute_us": _span(rec.get("compute_us"), d)}


def shift_records(parts: dict, d: float) -> dict:
    """{"steps","requests","nvml","mode_changes","rank_steps"} with every time moved by d µs."""
    return {"steps": [shift_step(r, d) for r in parts["steps"]],
            "requests": [shift_request(r, d) for r in parts["requests"]],
            "nvml": [shift_sample(r, d) for r in parts["nvml"]],
            "mode_changes": [shift_mode(r, d) for r in parts["mode_changes"]],
            "rank_steps": [shift_rank_step(r, d) for r in parts.get("rank_steps", [])]}


# ---- validation and loading ---------------------------------------------------------------------------------------
def _where(path) -> str:
    out = "$"
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _semantic_errors(tl: dict):
    last = None
    for i, rec in enumerate(tl["steps"]):
        where = f"$.steps[{i}]"
        if last is not None and rec["step"] <= last:
            yield f"{where}.step: steps must increase, but step {rec['step']} follows step {last}"
        last = rec["step"]
        prev_end, prev_phase = None, None
        for phase in HOST_PHASES:
            span = rec["cpu"].get(phase)
            if span is None:
                continue
            if span[1] < span[0]:
                yield f"{where}.cpu.{phase}: span {span} ends before it starts"
            if prev_end is not None and span[0] < prev_end:
                yield f"{where}.cpu.{phase}: starts at {span[0]} before {prev_phase} ended at {prev_end}"
            prev_end, prev_phase = span[1], phase
        for phase in GPU_PHASES:
            span = (rec.get("gpu") or {}).get(phase)
            if span is not None and span[1] < span[0]:
                yield f"{where}.gpu.{phase}: span {span} ends before it starts"
        comp = rec.get("compute_us")
        if comp is not None and comp[1] < comp[0]:
            yield f"{where}.compute_us: span {comp} ends before it starts"
        # the waits of a request (request_waits.py) read a step's prompt tokens from it: they must add up
        by_request = rec.get("prefill_tokens_by_request")
        if by_request is not None:
            if sum(by_request.values()) != rec["prefill_tokens"]:
                yield (f"{where}.prefill_tokens_by_request: adds up to {sum(by_request.values())}, but "
                       f"prefill_tokens is {rec['prefill_tokens']}")
            strangers = sorted(set(by_request) - set(rec["request_ids"]))
            if strangers:
                yield f"{where}.prefill_tokens_by_request: {strangers} are not in request_ids"
    for i, req in enumerate(tl["requests"]):
        n, times = req["output_tokens"], req["token_us"]
        if len(times) != n:
            yield (f"$.requests[{i}] ({req['id']!r}): output_tokens is {n} but token_us has {len(times)} "
                   f"entries")
        if any(b < a for a, b in zip(times, times[1:])):
            yield f"$.requests[{i}] ({req['id']!r}): token_us is not in time order"


def validate_timeline(tl, source: str = "timeline") -> dict:
    """Return the timeline if it is a valid batchscope.timeline/1, else raise TimelineError."""
    if not isinstance(tl, dict):
        raise TimelineError(f"{source}: expected a JSON object at the top level, got {type(tl).__name__}")
    if tl.get("schema") != SCHEMA_ID:
        raise TimelineError(f"{source}: schema is {tl.get('schema')!r}, expected {SCHEMA_ID!r}")
    error = best_match(_VALIDATOR.iter_errors(tl))
    if error is not None:
        raise TimelineError(f"{source}: {_where(error.absolute_path)}: {error.message}")
    problems = list(_semantic_errors(tl))
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise TimelineError(f"{source}: {problems[0]}{more}")
    return tl


def load_timeline(source) -> dict:
    """Load and validate a timeline for replay. `source`: a path, JSON text or bytes, a binary or text file
    object, or an already-parsed dict. Raises TimelineError with a clear message when it is malformed."""
    name = "timeline"
    if isinstance(source, dict):
        return validate_timeline(source, name)
    try:
        if isinstance(source, Path) or (isinstance(source, str) and not source.lstrip().startswith(("{", "["))):
            name = str(source)
            text = Path(source).read_text(encoding="utf-8")
        elif isinstance(source, (bytes, bytearray)):
            text = source.decode("utf-8")
        elif isinstance(source, str):
            text = source
        elif isinstance(source, io.IOBase) or hasattr(source, "read"):
            name = getattr(source, "name", name)
            raw = source.read()
            text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw
        else:
            raise TimelineError(f"cannot load a timeline from {type(source).__name__}")
    except OSError as exc:
        raise TimelineError(f"{name}: cannot read: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise TimelineError(f"{name}: not UTF-8 text: {exc}") from exc
    try:
        tl = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TimelineError(f"{name}: not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
    return validate_timeline(tl, name)
