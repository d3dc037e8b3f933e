"""Imported steps as ordinary timeline records: the fields batchscope's own telemetry writes (so every view and
the summary work unchanged), filled from the trace, plus what only a trace can show (docs/timeline.md, "Imported
steps"). What a trace cannot know (request ids, KV blocks, queue depth) is 0 or empty (the format requires the
fields) and `meta.source.unknown` says so: the summary and the page show it as unknown, never as 0."""
from __future__ import annotations

from .gaps import Gap, top_ops
from .step_plans import StepPlan
from .spans import StepSpans

_MARKER_CHARS = 200
DRAWN_STRETCHES = 48        # idle stretches inside a step kept in place for the Gantt (the rest: totals by cause)


def _r(x: float) -> float:
    return round(x, 1)


def _span(s, shift: float):
    return None if s is None else [_r(s[0] + shift), _r(s[1] + shift)]


def _parts(gap: Gap | None) -> dict:
    if gap is None:
        return {}
    return {k: _r(v) for k, v in sorted(gap.causes.items()) if _r(v) > 0}


def step_record(plan: StepPlan, mode: str, spans: StepSpans | None, before: Gap | None, inside: Gap | None,
                shift: float, rank: int, host_basis: bool, after_step: int | None) -> dict:
    compute = _span(spans.compute, shift) if spans is not None else None
    parts = _parts(before)
    idle = _r(before.total_us) if before is not None and compute is not None else None
    tokens = plan.requests if plan.requests is not None else 0
    rec = {
        "step": plan.number, "rank": rank, "mode": mode, "slot": 0,
        "num_requests": plan.requests or 0, "prefill_tokens": plan.prefill or 0, "decode_tokens": plan.decode or 0,
        "request_ids": [], "kv_blocks_used": 0, "kv_blocks_total": 0, "queue_depth": 0, "running": 0,
        "sampled": tokens, "carried": 0, "tokens_out": tokens,
        "cpu": {p: _span(s, shift) for p, s in plan.phases.items()},
        "compute_us": compute,
        "compute_basis": ("host" if host_basis else "gpu") if compute is not None else "none",
        "gpu_idle_before_us": idle,
        "idle_cause": max(parts, key=parts.get) if parts and idle else None,
        "idle_by_cause_us": parts if idle else {},
        "built_during_step": after_step if mode == "async" else None,
        "consumed_at_launch": after_step if mode == "async" else None,
    }
    if spans is not None and not host_basis:
        rec["gpu"] = {k: _span(v, shift) for k, v in (("h2d", spans.h2d), ("compute", spans.compute),
                                                       ("d2h", spans.d2h)) if v is not None}
    rec.update(_trace_fields(plan, None if host_basis else spans, before, inside, shift))
    if host_basis and before is not None:
        rec["idle_host_late_us"] = _r(before.host_late_us)
        rec["idle_host_ops_us"] = top_ops(before.host_ops)
    return rec


def _trace_fields(plan: StepPlan, spans: StepSpans | None, before: Gap | None, inside: Gap | None,
                  shift: float) -> dict:
    """What only a trace shows: idle inside the compute span, host lateness, the ops the host was in, collectives."""
    out = {}
    if plan.marker:
        out["marker"] = plan.marker[:_MARKER_CHARS]
    if spans is None or spans.compute is None:
        return out
    inside_us = inside.total_us if inside is not None else 0.0
    out["gpu_idle_inside_us"] = _r(inside_us)
    out["idle_inside_by_cause_us"] = _parts(inside)
    out.update(inside_ink(inside, shift))
    out["device_busy_us"] = _r(max(0.0, spans.compute[1] - spans.compute[0] - inside_us))
    out["idle_host_late_us"] = _r(before.host_late_us) if before is not None else 0.0
    out["idle_inside_host_late_us"] = _r(inside.host_late_us) if inside is not None else 0.0
    ops: dict = {}
    for gap in (before, inside):
        for name, us in (gap.host_ops.items() if gap is not None else ()):
            ops[name] = ops.get(name, 0.0) + us
    out["idle_host_ops_us"] = top_ops(ops)
    out["collective_us"] = _r(spans.collective_us)
    return out


def rank_step_record(number: int, rank: int, mode: str, spans: StepSpans, before: Gap | None, inside: Gap | None,
                     shift: float) -> dict:
    gpu = {k: _span(v, shift) for k, v in (("h2d", spans.h2d), ("compute", spans.compute), ("d2h", spans.d2h))
           if v is not None}
    parts = _parts(before)
    return {"step": number, "rank": rank, "mode": mode, "gpu": gpu, "compute_us": gpu.get("compute"),
            "gpu_idle_before_us": _r(before.total_us) if before is not None else None,
            "idle_cause": max(parts, key=parts.get) if parts else None, "idle_by_cause_us": parts,
            "collective_us": _r(spans.collective_us),
            "gpu_idle_inside_us": _r(inside.total_us if inside is not None else 0.0),
            "idle_inside_by_cause_us": _parts(inside), **inside_ink(inside, shift)}


def inside_ink(inside: Gap | None, shift: float) -> dict:
    """Where the idle inside a step was, for the Gantt to draw by cause: its largest DRAWN_STRETCHES stretches
    as [start_us, end_us, cause], and the rest as µs by cause (`idle_inside_spread_us`, drawn spread over the
    step's span: the ink stays true to the time at any zoom, only its place inside the step is lost)."""
    if inside is None:
        return {}
    stretches = [(a, b, cause or "host_other") for a, b, cause in inside.stretches if b > a]
    stretches.sort(key=lambda s: s[0] - s[1])
    spread: dict[str, float] = {}
    for a, b, cause in stretches[DRAWN_STRETCHES:]:
        spread[cause] = spread.get(cause, 0.0) + b - a
    drawn = sorted(stretches[:DRAWN_STRETCHES])
    out = {"idle_inside_stretches": [[_r(a + shift), _r(b + shift), cause] for a, b, cause in drawn]}
    if spread:
        out["idle_inside_spread_us"] = {k: _r(v) for k, v in sorted(spread.items())}
    return out
