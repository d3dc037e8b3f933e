"""What a load test reports while it runs and once it has ended, as typed models: a burst's status and results
(client-side latency percentiles and throughput), an A/B comparison's two halves, a continuous load's running
figures, and the mode switches seen meanwhile. The routes return them as they are, so /api/docs lists every field.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .specs import BurstSpec, LoadSpec, Mode

RunState = Literal["running", "done", "error"]      # a burst's, an A/B run's or a load's; only "running" is live
# why a continuous load ended: asked to, one of its bounds, the server going down, or a failure
LoadStopReason = Literal["stopped", "duration", "max_requests", "shutdown", "error"]


class ModeChangeNote(BaseModel):
    """A mode switch seen while a run was going on."""
    t_s: float                                  # seconds after the run started
    previous: Mode | None
    mode: Mode
    phase: Mode | None = None                   # an A/B's half running when it happened


class LatencyStats(BaseModel):
    """Percentiles of one latency over a burst's requests, ms (None without data)."""
    n: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None


class BurstResults(BaseModel):
    """Client-side latencies (what a user of the server sees) and throughput of one burst."""
    ttft_ms: LatencyStats
    tpot_ms: LatencyStats
    itl_ms: LatencyStats
    e2e_ms: LatencyStats
    completed: int
    failed: int
    prompt_tokens: int
    output_tokens: int
    duration_s: float
    output_tokens_per_s: float
    requests_per_s: float
    mode: Mode | None = None                    # the engine's mode when the burst started
    busy_pct: float | None = None               # event-based busy share over the burst's window
    telemetry: dict[str, Any] | None = None     # the telemetry summary of that window
    window_us: tuple[float, float] | None = None
    errors: list[str] = []                      # up to five distinct request errors


class BurstStatus(BaseModel):
    id: str
    state: RunState
    done: int                                   # requests finished (or failed) so far
    total: int
    mode: Mode | None
    spec: BurstSpec
    results: BurstResults | None
    error: str | None


class ABStatus(BaseModel):
    """The same burst in sync, then in async. `async` is a Python keyword, hence the alias."""
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)
    id: str
    state: RunState
    phase: Mode | None                          # the half running now
    spec: BurstSpec
    done: int
    total: int
    sync: BurstResults | None
    async_: BurstResults | None = Field(alias="async")
    sync_burst: str | None
    async_burst: str | None
    speedup: float | None                       # async over sync output tokens/s
    # the halves' decode steps of like batch sizes, ratios with their intervals and a verdict, n per mode
    # (telemetry/figures.py compare: what the scoreboard would say of exactly these steps); None without telemetry
    compare: dict[str, Any] | None = None
    error: str | None
    requests_per_half: int = 0                  # `total` counts both halves; each half sends this many
    half_done: int = 0                          # requests finished in the half running now (or the last one)
    # the mode is locked while an A/B runs (POST /api/mode is a 409), so these stay empty unless the engine was
    # switched behind the server's back; then `valid` is false: the halves did not each run in one mode
    mode_changes: list[ModeChangeNote] = []
    valid: bool = True


class BurstList(BaseModel):
    bursts: list[BurstStatus]
    ab: list[ABStatus]
    kept: int
    dropped: dict[str, int]                     # older ones forgotten, per kind



class LoadRecent(BaseModel):
    """What the last `window_s` seconds of a continuous load looked like: what a presenter reads after a toggle."""
    window_s: float
    completed: int
    output_tokens_per_s: float
    requests_per_s: float
    ttft_ms_p50: float | None
    e2e_ms_p50: float | None


class LoadStatus(BaseModel):
    id: str
    state: RunState
    stop_reason: LoadStopReason | None          # None while it runs
    spec: LoadSpec                              # settled: lengths, seed and both bounds known
    mode: Mode | None                           # the engine's mode now
    elapsed_s: float
    remaining_s: float                          # until its duration bound
    sent: int
    completed: int
    failed: int
    cancelled: int                              # in flight when it was stopped
    skipped: int                                # kind "rate": arrivals not sent, max_load_concurrency in flight
    in_flight: int
    output_tokens: int
    recent: LoadRecent
    mode_changes: list[ModeChangeNote]          # switches made while it ran (it carries on through them)
    results: BurstResults | None                # the whole run, once it has ended (latencies from a sample)
    error: str | None

