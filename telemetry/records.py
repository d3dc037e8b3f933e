"""The records telemetry keeps: one dict per step, per request, per NVML sample, per mode switch.

Records are plain dicts (JSON-ready, cheap to build on the engine thread) with the firm field names of
the timeline format (docs/timeline.md, docs/timeline.schema.json). A step record is built once and never changed
afterwards, so other threads may read it freely.
A request record grows while the request runs (its owner is the engine thread) and is frozen at finish.

All times are microseconds since the session's origin on the host's `perf_counter` clock. On CPU there are no
CUDA events: a step record has no `gpu` key, and `compute_us` is the host `launch` span (the forward runs inside
launch there), marked `compute_basis: "host"`.
"""
from __future__ import annotations

from batchscope.engine.request import FINISH_REASONS  # noqa: F401 (part of the record schema, defined once)
from batchscope.engine.budget import REASONS as BUDGET_REASONS  # noqa: F401 (part of the record schema)
from batchscope.engine.trace import GPU_PHASES, HOST_PHASES  # noqa: F401 (the phase names are part of the record schema)

SCHEMA_ID = "batchscope.timeline/1"

# What the compute stream was waiting for during a GPU idle gap (see idle.py for how each is decided).
# Timelines imported from profiler traces add causes only a trace can tell apart (importers/gaps.py).
TRACE_IDLE_CAUSES = ("host_sync", "host_op", "stream_wait", "copy", "collective", "other_work", "unattributed")
IDLE_CAUSES = HOST_PHASES + ("h2d", "d2h", "telemetry", "empty_queue", "host_other", "gc", "preempted") + \
    TRACE_IDLE_CAUSES

# Where a step's `compute_us` comes from: CUDA events anchored to the host clock, events placed by the end of
# the host's wait (no anchor was given), the host launch span (CPU), or nothing (events could not be read).
COMPUTE_BASES = ("gpu", "gpu_wait", "host", "none")

NVML_FIELDS = ("gpu_util", "mem_util", "mem_used_mb", "power_w", "sm_clock_mhz")


def step_record(trace, cpu: dict, gpu: dict | None, compute: list | None, basis: str,
                idle_us: float | None, idle_cause: str | None, idle_by_cause: dict, tokens_out: int,
                cpu_us: dict | None = None) -> dict:
    """The record of one step. Every span in `cpu` and `gpu` belongs to this step: schedule/fill/launch built and
    launched it, wait/update consumed it; `cpu_us` holds the engine thread's CPU time in each.
    `built_during_step` / `consumed_at_launch` name the other step whose work overlapped (async), so no span is
    ever attributed to the wrong step."""
    rec = {
        "step": trace.step,
        "rank": 0,                  # the tensor-parallel rank whose GPU the spans are from (rank 0 plans steps)
        "mode": trace.mode,
        "slot": trace.slot,
        "num_requests": len(trace.request_ids),
        "prefill_tokens": trace.prefill_tokens,
        "decode_tokens": trace.decode_tokens,
        "request_ids": list(trace.request_ids),
        "kv_blocks_used": trace.kv_blocks_used,
        "kv_blocks_total": trace.kv_blocks_total,
        "queue_depth": trace.queue_depth,
        "running": trace.running,
        "sampled": trace.sampled,
        "carried": trace.carried,
        "tokens_out": tokens_out,
        "cpu": cpu,
        "compute_us": compute,
        "compute_basis": basis,
        "gpu_idle_before_us": idle_us,
        "idle_cause": idle_cause,
        "idle_by_cause_us": idle_by_cause,
        "built_during_step": trace.built_during_step,
        # the schema's second name for the same step: the one built over is the one consumed after the launch
        "consumed_at_launch": trace.built_during_step,
    }
    if gpu is not None:
        rec["gpu"] = gpu
    # the engine thread's CPU time in each host phase, µs, beside its wall span in `cpu` (absent from old traces)
    if cpu_us:
        rec["cpu_us"] = cpu_us
    if trace.preempted:
        rec["preempted"] = list(trace.preempted)
    # whose prompt tokens the step computed (the others decoded one token each): only steps with prefill have it
    if trace.prefill_tokens_by_request:
        rec["prefill_tokens_by_request"] = dict(trace.prefill_tokens_by_request)
    if trace.error:
        rec["error"] = str(trace.error)
    # the token budget the step ran with and why (decode_target, no_decode, fixed): absent from old traces
    budget = getattr(trace, "budget", None)
    if budget is not None:
        rec["budget"] = dict(budget)
    return rec


def rank_step_record(step: int, rank: int, mode: str | None, gpu: dict) -> dict:
    """Another tensor-parallel rank's part of a step: its own CUDA events on the same host clock (on CPU, its
    launch span as "compute"). The step's host spans and counts are in rank 0's step record."""
    return {"step": step, "rank": rank, "mode": mode, "gpu": gpu, "compute_us": gpu.get("compute")}


def request_record(rid: str, arrival_us: float | None, prompt_tokens: int | None) -> dict:
    """A request as first seen. `token_us` gets one entry per output token: the end of the update span of the
    step that delivered it (several tokens delivered at once share a time). `sent_us`, for a streamed request,
    one per token written to the client, joined in by delivery.py once the stream ended."""
    return {
        "id": rid,
        "arrival_us": arrival_us,
        "scheduled_us": None,       # the end of the schedule span of the first step it was in
        "first_token_us": None,
        "finish_us": None,
        "prompt_tokens": prompt_tokens,
        "output_tokens": 0,
        "finish_reason": None,
        "token_us": [],
        "sent_us": None,            # streamed: when each token's chunk was written to the client (delivery.py)
        "preemptions": 0,
    }


def mode_record(t_us: float, step: int, from_mode: str, to_mode: str, reason: str | None = None) -> dict:
    rec = {"t_us": t_us, "step": step, "from": from_mode, "to": to_mode}
    if reason:
        rec["reason"] = reason          # who switched, when not a user (an A/B's warm-up and halves)
    return rec


def span_end(rec: dict) -> float | None:
    """The latest host or device time a step record mentions (for windowing and "recent" queries)."""
    ends = [s[1] for s in rec["cpu"].values()]
    gpu = rec.get("gpu")
    if gpu:
        ends.extend(s[1] for s in gpu.values())
    return max(ends) if ends else None


def span_start(rec: dict) -> float | None:
    starts = [s[0] for s in rec["cpu"].values()]
    gpu = rec.get("gpu")
    if gpu:
        starts.extend(s[0] for s in gpu.values())
    return min(starts) if starts else None

