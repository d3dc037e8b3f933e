"""What the engine tells its observers about each step: raw, unresolved, cheap to build.

The engine records host spans with `time.perf_counter_ns()` (and its thread's CPU time in each, with
`time.thread_time_ns()`) and CUDA events on its streams; it never resolves
event times itself (that is telemetry's job, and resolving only events already known complete keeps it free of
synchronisation). A StepTrace is handed to observers once the step's outputs have been consumed and the next
step, if there is one yet, has been launched (loop.py: observers run while the device computes), so every event
in it has completed. Events belong to an IO slot that is re-recorded two steps later: observers must read them
inside the callback, not keep them. A failed step's trace is handed over at once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

HOST_PHASES = ("schedule", "fill", "launch", "wait", "update")
GPU_PHASES = ("h2d", "compute", "d2h")


@dataclass
class StepTrace:
    step: int                       # increasing from 0
    mode: str                       # "sync" | "async": the loop that ran this step
    slot: int                       # IO slot 0 | 1
    request_ids: list[str]
    prefill_tokens: int             # prompt (or recompute) tokens computed in this step
    decode_tokens: int              # one-token decodes in this step
    sampled: int                    # rows sampled (requests that produced a token)
    carried: int                    # decode inputs gathered on the device from the previous step's output
    kv_blocks_used: int
    kv_blocks_total: int
    queue_depth: int                # requests waiting (not running) when the step was scheduled
    running: int                    # requests holding KV blocks when the step was scheduled
    # host spans, perf_counter_ns: schedule/fill/launch belong to building this step, wait/update to consuming it
    host: dict[str, tuple[int, int]] = field(default_factory=dict)
    # the engine thread's CPU time in each of those spans, thread_time_ns: far below the span's wall time when
    # the thread was not running (waiting for the GIL, or for a CPU)
    host_cpu: dict[str, int] = field(default_factory=dict)
    # CUDA events (start, end) per GPU phase; None on CPU. Complete when the trace is delivered.
    gpu_events: dict[str, tuple[Any, Any]] | None = None
    # the events just before and after the step's start kernel (its first, runner.mark_start), and how long that
    # kernel runs between them, measured at start-up: the compute span starts head_start_ms after its start event
    compute_head: tuple[Any, Any] | None = None
    start_kernel_ns: float = 0.0
    # (event, host perf_counter_ns) recorded at launch on a stream that holds no work, so the event completes
    # as soon as the device sees it: maps this step's events to host time. None on CPU.
    anchor: tuple[Any, int] | None = None
    # (event, host perf_counter_ns) of the clock epoch: an anchor recorded once a second and kept, through which
    # every step of that second is mapped (so their gaps are device time); None on CPU
    epoch: tuple[Any, int] | None = None
    # the step the GPU was still running while this one was built and launched, consumed right after this
    # one's launch (async: step - 1); None when the device was idle (sync, or the first step after a pause)
    built_during_step: int | None = None
    # request lifecycle seen by this step
    arrivals: list[tuple[str, int, int]] = field(default_factory=list)        # (id, arrival_ns, prompt_tokens)
    tokens: list[tuple[str, int]] = field(default_factory=list)               # (id, tokens delivered now)
    finished: list[tuple[str, str, int, int]] = field(default_factory=list)   # (id, reason, prompt, output)
    preempted: list[str] = field(default_factory=list)
    # whose prompt (or recompute) tokens `prefill_tokens` are: id -> tokens; the other requests decoded one each
    prefill_tokens_by_request: dict[str, int] = field(default_factory=dict)
    error: str | None = None        # the exception text when this step failed (its requests failed with it)
    # the token budget the step was planned within: {"tokens", "reason"} (budget.REASONS), "target_ms" when sized
    # for a step-time target
    budget: dict | None = None


def head_start_ms(before_to_after_ms: float, start_kernel_ms: float) -> float:
    """How long before a step's first kernel ran its start event completed, from the device time between the
    events around its start kernel: nothing when that is the kernel's own run time (the stream was busy, or the
    launch was already there), else what the device waited for the kernel beyond it (an idle device and the
    kernel's launch still on its way)."""
    return max(0.0, before_to_after_ms - start_kernel_ms)


@dataclass
class ModeChange:
    """Delivered to observers (as a separate callback) when the loop switches at a step boundary."""
    t_ns: int
    step: int                       # the first step run by the new mode
    from_mode: str
    to_mode: str
    reason: str | None = None       # who asked, when not a user: e.g. "A/B: sync half" (shown beside the switch)


@dataclass
class RankSpans:
    """GPU spans of the other tensor-parallel ranks, delivered as they come in (a step's peers finish it at about
    the time rank 0 does, so they usually arrive with the trace of the next step or two). Each entry is
    (rank, step, anchor_ns, {phase: (start_ms, end_ms)}): the host perf_counter time of the rank's clock anchor
    and each span's device time after it, unresolved like a StepTrace's events; on CPU the phase is "compute"
    (the rank's launch span, the forward running inside it) and the anchor is its start."""
    spans: list
