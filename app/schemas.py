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
RunState = Literal["running", "done", "error"]      # a burst's, an A/B run's or a load's; only "running" is live
# why a continuous load ended: asked to, one of its bounds, the server going down, or a failure
LoadStopReason = Literal["stopped", "duration", "max_requests", "shutdown", "error"]
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
    # a continuous load (POST /api/load) ends by itself at the first of these, so none runs on unattended
    max_load_duration_s: float = 600.0
    max_load_requests: int = 20_000
    max_load_concurrency: int = 256     # also the most requests a "rate" load keeps in flight


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


class RequestShape(Body):
    """What each synthetic request looks like: shared by bursts, A/B runs and continuous loads."""
    prompt_tokens: tuple[int, int] | None = None    # [min, max] or one fixed length; None: DEFAULT_LENGTHS
    max_new_tokens: tuple[int, int] | None = None
    ignore_eos: StrictBool = True                   # fixed output lengths make runs comparable
    seed: int | None = Field(None, ge=0)            # None: one is drawn and reported, so the run can be repeated
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

    def _settled(self, limits: Limits, max_model_len: int | None) -> dict:
        """Lengths cut to the limits and a seed: the fields `within` fills in. A length the caller left out is cut
        to the limit: a default must not trip a limit the caller cannot see."""
        prompt = _capped("prompt_tokens", self.prompt_tokens, limits.max_prompt_tokens)
        new = _capped("max_new_tokens", self.max_new_tokens, limits.max_new_tokens)
        if max_model_len and prompt[1] + new[1] > max_model_len:
            raise ValueError(f"prompt_tokens max plus max_new_tokens max ({prompt[1] + new[1]}) exceeds the model's "
                             f"context of {max_model_len} tokens")
        seed = self.seed if self.seed is not None else random.SystemRandom().randrange(2**31)
        return {"prompt_tokens": prompt, "max_new_tokens": new, "seed": seed}


class BurstSpec(RequestShape):
    """One burst of synthetic requests: POST /api/burst and /api/ab, and the page's load-test panel.
    `within(limits)` checks it against the server's caps and fills in what the caller left out."""
    num_requests: int = Field(16, ge=1)
    arrival: Literal["burst", "poisson", "gamma"] = "burst"
    rate: float = Field(8.0, gt=0, le=10_000)       # requests/s for poisson and gamma
    burstiness: float = Field(1.0, gt=0, le=100)    # gamma shape: 1 is poisson, < 1 burstier, > 1 more regular

    def within(self, limits: Limits, max_model_len: int | None = None) -> BurstSpec:
        """This spec with its lengths and seed settled, or ValueError over a cap (a 400, not a 429)."""
        if self.num_requests > limits.max_burst_requests:
            raise ValueError(f"num_requests {self.num_requests} is over the limit of {limits.max_burst_requests}")
        return self.model_copy(update=self._settled(limits, max_model_len))


class LoadSpec(RequestShape):
    """A continuous load: POST /api/load. Requests keep coming, at a steady `rate` (kind "rate") or with
    `concurrency` always in flight (kind "concurrency"), until stopped or until a bound: `duration_s` and
    `max_requests`, each at most the server's limit (the default), so that a load nobody stops still ends."""
    kind: Literal["rate", "concurrency"] = "concurrency"
    concurrency: int = Field(8, ge=1)               # kind "concurrency": requests kept in flight
    rate: float = Field(2.0, gt=0, le=1000)         # kind "rate": requests/s
    arrival: Literal["poisson", "constant"] = "poisson"     # kind "rate": exponential or even gaps
    duration_s: float | None = Field(None, gt=0)    # None: the server's max_load_duration_s
    max_requests: int | None = Field(None, ge=1)    # None: the server's max_load_requests

    def within(self, limits: Limits, max_model_len: int | None = None) -> LoadSpec:
        """This spec with its lengths, seed and bounds settled, or ValueError over a cap."""
        if self.kind == "concurrency" and self.concurrency > limits.max_load_concurrency:
            raise ValueError(f"concurrency {self.concurrency} is over the limit of {limits.max_load_concurrency}")
        if self.duration_s is not None and self.duration_s > limits.max_load_duration_s:
            raise ValueError(f"duration_s {self.duration_s:g} is over the limit of {limits.max_load_duration_s:g} s")
        if self.max_requests is not None and self.max_requests > limits.max_load_requests:
            raise ValueError(f"max_requests {self.max_requests} is over the limit of {limits.max_load_requests}")
        bounds = {"duration_s": self.duration_s or limits.max_load_duration_s,
                  "max_requests": self.max_requests or limits.max_load_requests}
        return self.model_copy(update={**self._settled(limits, max_model_len), **bounds})


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
    loads_running: int = 0                      # continuous loads (POST /api/load)
    mode_lock: str | None = None                # why POST /api/mode is refused now (an A/B runs), if it is
    bursts: dict[str, Any] | None = None        # how many bursts run and are kept
    recording: str | None = None                # the named recording running, if any
    inflight: int | None = None                 # requests submitted through this server and not finished
    max_inflight: int | None = None
    telemetry: dict[str, Any] | None = None     # the telemetry session's own status (sampler, clock, hub)
    recordings: dict[str, Any] | None = None    # their count and caps


class ModeChanged(BaseModel):
    mode: Mode
    previous: Mode


class ModeLock(BaseModel):
    """GET /api/mode: the engine's mode and whether POST /api/mode is refused now (409) and why."""
    mode: Mode | None
    locked: bool
    reason: str | None = None


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


class StartedBurst(BaseModel):
    burst_id: str


class StartedAB(BaseModel):
    ab_id: str


class StartedLoad(BaseModel):
    load_id: str


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
