"""The seam for sources of steps that are not traces: a per-step record stream (SGLang's and Dynamo's per-step
forward-pass metrics, vLLM's per-iteration log lines) becomes an ordinary `batchscope.timeline/1`, built by the
same record builder our own engine's recorder uses (telemetry/records.py), the same summary and the same
timeline assembly and validation as an imported trace.

A source is anything with `steps()` yielding `SourceStep`s in step order, and a few words about itself:

    class MySource:                                   # a StepSource
        engine = "sglang"                             # meta.source.engine (the schema's names, or "unknown")
        tool = "SGLang forward-pass metrics"          # meta.source.tool
        steps_from = "SGLang's per-step metrics"      # meta.source.steps_from
        basis = "host"                                # how the step spans were timed: "host" clock or "gpu" events
        def steps(self): yield SourceStep(step=0, start_us=..., end_us=..., device_us=...)

    timeline = timeline_from_steps(MySource())

What a source does not supply is unknown, never 0: without `device_us` a step has no `device_busy_us`, and the
device's busy % over the window (`summary.busy_pct`) is None unless every step in it supplied its device time
(the steps' span figure stays beside it as `busy_pct_steps`); counts a source lacks are listed in
`meta.source.unknown` and their figures read None, as for a trace. A host-timed step without phases has its span
as its `launch` phase (as our engine's steps on a CPU). Between two steps the device ran none of
their work: the gap is idle time whose cause the source cannot tell (`unattributed`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Protocol

from ..export import build_timeline, created_now, validate_timeline
from ..records import step_record
from ..summary import summarize
from .headline import lead_with_device, unknown_is_none
from .to_timeline import UNKNOWN_FIELDS, mode_changes

UNKNOWN_CAUSE = "unattributed"


@dataclass(frozen=True)
class SourceStep:
    """One step as a source saw it. Times are µs on the source's own clock (any origin, one clock for all)."""
    step: int                                    # increasing
    start_us: float
    end_us: float
    num_requests: int | None = None
    prefill_tokens: int | None = None
    decode_tokens: int | None = None
    device_us: float | None = None               # the device's busy time in [start_us, end_us], when measured
    phases: Mapping[str, tuple[float, float]] = field(default_factory=dict)   # host phase -> (start, end)
    mode: str | None = None                      # "sync" | "async", when the source knows


class StepSource(Protocol):
    engine: str
    tool: str
    steps_from: str
    basis: str

    def steps(self) -> Iterable[SourceStep]: ...


@dataclass
class _AsTrace:
    """A SourceStep in the shape the recorder's record builder reads (engine/trace.py's StepTrace)."""
    step: int
    mode: str
    prefill_tokens: int
    decode_tokens: int
    sampled: int
    slot: int = 0
    request_ids: tuple = ()
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    queue_depth: int = 0
    running: int = 0
    carried: int = 0
    built_during_step: int | None = None
    preempted: tuple = ()
    prefill_tokens_by_request: dict | None = None
    error: str | None = None


def timeline_from_steps(source: StepSource, *, meta: dict | None = None) -> dict:
    """The source's steps as a validated timeline dict. `meta`: fields to set in the timeline's meta (model,
    device, gpu, dtype, config)."""
    steps = list(source.steps())
    origin = min((s.start_us for s in steps), default=0.0)
    records, prev = [], None
    for s in steps:
        records.append(_record(s, prev, origin, source.basis))
        prev = s
    unknown, inferred = _unknown(steps), []
    if any(s.mode is None for s in steps):
        inferred.append("mode (sync where the source does not say)")
    if "num_requests" not in unknown:
        inferred.append("tokens_out (one token per request per step)")
    summary = summarize(records)
    _device_busy(summary, steps, unknown)
    unknown_is_none(summary, unknown)
    out_meta = {"model": None, "device": None, "gpu": None, "dtype": None, "config": {}, "created": created_now(),
                "recording": None, "info": {},
                "source": {"tool": source.tool, "engine": source.engine, "files": [], "trace_start": None,
                           "steps_from": source.steps_from, "inferred": inferred, "unknown": unknown,
                           "notes": []}}
    out_meta.update(meta or {})
    tl = build_timeline(out_meta, records, [], [], mode_changes(records), summary)
    return validate_timeline(tl, source.tool)


def _device_busy(summary: dict, steps: list[SourceStep], unknown: list[str]) -> None:
    """busy % from the device times the steps supplied (the steps' span figure kept beside it), None unless
    every step supplied one: a missing device time is unknown, not idle."""
    if not all(s.device_us is not None for s in steps):
        unknown.append("device_busy_us")
        summary["busy_pct_steps"], summary["busy_basis_steps"] = summary.get("busy_pct"), summary.get("busy_basis")
        summary["busy_pct"] = summary["busy_basis"] = None
    elif summary.get("busy_pct") is not None:
        window = summary["t1_us"] - summary["t0_us"]
        summary["busy_pct_device_ops"] = round(100.0 * sum(s.device_us for s in steps) / window, 2)
        lead_with_device(summary)


def _record(s: SourceStep, prev: SourceStep | None, origin: float, basis: str) -> dict:
    tokens = s.num_requests or 0
    trace = _AsTrace(step=s.step, mode=s.mode or "sync", prefill_tokens=s.prefill_tokens or 0,
                     decode_tokens=s.decode_tokens or 0, sampled=tokens)
    gap = None if prev is None else round(max(0.0, s.start_us - prev.end_us), 1)
    by_cause = {UNKNOWN_CAUSE: gap} if gap else {}
    cpu = {p: [round(a - origin, 1), round(b - origin, 1)] for p, (a, b) in s.phases.items()}
    compute = [round(s.start_us - origin, 1), round(s.end_us - origin, 1)]
    gpu = {"compute": compute} if basis == "gpu" else None
    if not cpu and gpu is None:            # the host timed the forward: its span is the launch, as on a CPU
        cpu = {"launch": list(compute)}
    rec = step_record(trace, cpu, gpu, compute, basis, gap, UNKNOWN_CAUSE if gap else None, by_cause, tokens)
    rec["num_requests"] = tokens
    if s.device_us is not None:
        rec["device_busy_us"] = rec["device_ops_us"] = round(s.device_us, 1)
    return rec


def _unknown(steps: list[SourceStep]) -> list[str]:
    unknown = list(UNKNOWN_FIELDS)
    if all(s.prefill_tokens is None and s.decode_tokens is None for s in steps):
        unknown += ["prefill_tokens", "decode_tokens"]
    if all(s.num_requests is None for s in steps):
        unknown += ["num_requests", "tokens_out"]
    return unknown
