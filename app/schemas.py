"""The shapes the server takes and gives, as typed models: each field has one name from the engine to the page.

Request bodies are checked here, once (a bad one is a 400 naming the field); the load-test panel builds the same
BurstSpec. Responses are the models the routes return, so /api/docs lists every field.
Naming: `queue` is the number of requests waiting for admission, `kv_usage` the share of KV blocks in use (0-1).
"""
from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

Mode = Literal["sync", "async"]                     # the engine's two loops (engine.config.MODES)
RunState = Literal["running", "done", "error"]      # a burst's or an A/B run's; "running" is the only live one
DEFAULT_LENGTHS = (32, 128)                         # a burst's prompt and output lengths when the caller is silent


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Limits(BaseModel):
    """The server's caps on what one caller may ask for."""
    max_prompt_tokens: int = 4096
    max_new_tokens: int = 8192
    max_burst_requests: int = 256
    max_concurrent_bursts: int = 2
    max_waiting_requests: int = 1024    # engine queue depth beyond which new API requests are refused


# ------------------------------------------------------------------------------------------------- requests

class ModeBody(Body):
    mode: Mode


class GenerateBody(Body):
    prompt: str | list[int]
    max_new_tokens: int | None = None   # default: 128, capped by the server's limit
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    ignore_eos: bool = False
    stop: list[str] | str | None = None
    chat: bool | None = None            # wrap text as one user message through the chat template (None: when
                                        # the model has one; token ids are never wrapped). false: raw text
    stream: bool = False                # SSE of text deltas


class RecordingBody(Body):
    name: str | None = None


class BurstSpec(Body):
    """One burst of synthetic requests: POST /api/burst and /api/ab, and the page's load-test panel.
    `within(limits)` checks it against the server's caps and fills in what the caller left out."""
    num_requests: int = Field(16, ge=1)
    prompt_tokens: tuple[int, int] | None = None    # [min, max] or one fixed length; None: DEFAULT_LENGTHS
    max_new_tokens: tuple[int, int] | None = None
    arrival: Literal["burst", "poisson", "gamma"] = "burst"
    rate: float = Field(8.0, gt=0, le=10_000)       # requests/s for poisson and gamma
    burstiness: float = Field(1.0, gt=0, le=100)    # gamma shape: 1 is poisson, < 1 burstier, > 1 more regular
    ignore_eos: StrictBool = True                   # fixed output lengths make runs comparable
    seed: int | None = Field(None, ge=0)            # None: one is drawn and reported, so the burst can be re-run
    temperature: float = Field(0.0, ge=0, le=2)

    @field_validator("prompt_tokens", "max_new_tokens", mode="before")
    @classmethod
    def _as_pair(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):
            return (v, v)                           # one number: a fixed length
        if v is not None and (not isinstance(v, (list, tuple)) or len(v) != 2):
            raise ValueError(f"must be [min, max], got {v!r}")
        return v

    @field_validator("prompt_tokens", "max_new_tokens")
    @classmethod
    def _ordered(cls, v: tuple[int, int] | None) -> tuple[int, int] | None:
        if v is not None:
            if v[0] < 1:
                raise ValueError(f"min must be at least 1, got {v[0]}")
            if v[0] > v[1]:
                raise ValueError(f"min {v[0]} is greater than max {v[1]}")
        return v

    def within(self, limits: Limits, max_model_len: int | None = None) -> BurstSpec:
        """This spec with its lengths and seed settled, or ValueError over a cap (a 400, not a 429). A length
        the caller left out is cut to the limit: a default must not trip a limit the caller cannot see."""
        if self.num_requests > limits.max_burst_requests:
            raise ValueError(f"num_requests {self.num_requests} is over the limit of {limits.max_burst_requests}")
        prompt = _capped("prompt_tokens", self.prompt_tokens, limits.max_prompt_tokens)
        new = _capped("max_new_tokens", self.max_new_tokens, limits.max_new_tokens)
        if max_model_len and prompt[1] + new[1] > max_model_len:
            raise ValueError(f"prompt_tokens max plus max_new_tokens max ({prompt[1] + new[1]}) exceeds the model's "
                             f"context of {max_model_len} tokens")
        seed = self.seed if self.seed is not None else random.SystemRandom().randrange(2**31)
        return self.model_copy(update={"prompt_tokens": prompt, "max_new_tokens": new, "seed": seed})


def _capped(name: str, lengths: tuple[int, int] | None, limit: int) -> tuple[int, int]:
    if lengths is None:
        return (min(DEFAULT_LENGTHS[0], limit), min(DEFAULT_LENGTHS[1], limit))
    if lengths[1] > limit:
        raise ValueError(f"{name} max {lengths[1]} is over the limit of {limit}")
    return lengths


# ------------------------------------------------------------------------------------------------ responses

class Health(BaseModel):
    status: Literal["ok"] = "ok"
    model: str | None
    device: str | None
    mode: Mode | None                   # None on a replay-only server
    replay_only: bool


class EngineCounters(BaseModel):
    """What /api/status and the websocket's "stats" message both say about the engine, under the same names."""
    queue: int | None = None            # requests waiting for admission
    running: int | None = None          # requests holding KV blocks
    steps: int | None = None
    kv_blocks_used: int | None = None
    kv_blocks_total: int | None = None
    kv_usage: float | None = None       # kv_blocks_used / kv_blocks_total, 0-1


class Status(Health, EngineCounters):
    busy_note: str                      # why NVML utilization and the event-based busy % differ
    limits: Limits
    uptime_s: float
    replay_loaded: bool
    rss_mb: float | None
    shutting_down: bool
    max_replay_bytes: int
    max_json_depth: int
    dtype: str | None = None
    gpu_name: str | None = None
    nvml_available: bool = False
    nvml_reason: str | None = None
    info: dict[str, Any] | None = None          # the engine's description of itself (model shapes, kernels...)
    bursts_running: int = 0
    bursts: dict[str, Any] | None = None        # how many bursts run and are kept
    recording: str | None = None                # the named recording running, if any
    inflight: int | None = None                 # requests submitted through this server and not finished
    max_inflight: int | None = None
    telemetry: dict[str, Any] | None = None     # the telemetry session's own status (sampler, clock, hub)
    recordings: dict[str, Any] | None = None    # their count and caps


class ModeChanged(BaseModel):
    mode: Mode
    previous: Mode


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
    error: str | None


class BurstList(BaseModel):
    bursts: list[BurstStatus]
    ab: list[ABStatus]
    kept: int
    dropped: dict[str, int]                     # older ones forgotten, per kind


class StartedBurst(BaseModel):
    burst_id: str


class StartedAB(BaseModel):
    ab_id: str


class RecordingInfo(BaseModel):
    name: str
    state: Literal["recording", "stopped"]
    start_us: float
    stop_us: float | None
    bytes: int                                  # an estimate of its JSON size
    max_bytes: int
    steps: int
    requests: int
    nvml: int
    truncated: bool                             # it hit a cap and dropped records
    full: bool
    full_at_us: float | None
    dropped: dict[str, int]


class RecordingCaps(BaseModel):
    count: int
    max_count: int
    bytes: int
    max_bytes: int
    max_bytes_each: int
    policy: str
    dropped: int
    dropped_names: list[str]
    truncated: list[str]


class RecordingStarted(BaseModel):
    recording: str
    state: Literal["recording"] = "recording"
    max_bytes: int
    max_steps: int
    dropped_recordings: list[str]               # the oldest recordings forgotten to keep the caps
    recordings: RecordingCaps


class RecordingStopped(BaseModel):
    recording: str
    state: Literal["stopped"] = "stopped"
    summary: dict[str, Any]                     # telemetry's summary of the recording (docs/timeline.md)
    stored: RecordingInfo


class Recordings(BaseModel):
    recordings: list[str]
    active: str | None
    details: list[RecordingInfo]
    limits: RecordingCaps | None


class ReplayLoaded(BaseModel):
    loaded: bool
    steps: int
    requests: int
    meta: dict[str, Any]
