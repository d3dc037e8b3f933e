"""The shapes the server takes and gives that are its own, as typed models: each field has one name from the engine
to the page.

Request bodies are checked here, once (a bad one is a 400 naming the field); the load tests' bodies and statuses
are app/loadtest's (specs.py, statuses.py). Responses are the models the routes return, so /api/docs lists every
field. Naming: `queue` is the number of requests waiting for admission, `kv_usage` the share of KV blocks in use
(0-1).
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, StrictInt

from ..loadtest.specs import Body, Limits, Mode


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


class CompareBody(Body):
    """POST /api/compare: each side one source or several ("live", "replay", a recording's name)."""
    base: str | list[str]
    new: str | list[str]
    min_effect_pct: float | None = Field(None, ge=0)     # --min-effect: the smallest change called slower/faster
    fail_above_pct: float | None = Field(None, ge=0)     # --fail-above: exit_code 1 when slower by more than it


class WhatIfBody(Body):
    """POST /api/whatif and /api/whatif/verify: `set` holds whatif's KEY: VALUE settings (GET /api/whatif/keys)."""
    recording: str
    set: dict[str, Any] = Field(default_factory=dict)
    runs: int = Field(3, ge=1, le=5)


class ProfileBody(Body):
    steps: StrictInt                    # 1 to the engine's maximum (engine/profiling.py MAX_WINDOW_STEPS)


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
    running_load: str | None = None             # the id of the continuous load running, to stop it by
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


class StartedBurst(BaseModel):
    burst_id: str


class StartedAB(BaseModel):
    ab_id: str


class StartedLoad(BaseModel):
    load_id: str


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
    # the scoreboard of the whole recording, per mode (telemetry/figures.py board), as the page shows it
    board: dict[str, Any] | None = None


class ProfileStatus(BaseModel):
    """GET /api/profile: the latest profiler window (engine/profiling.py) and, once written, where its trace is."""
    state: Literal["idle", "pending", "running", "writing", "done", "error"]
    id: int | None                              # counts the windows this server took
    steps: int | None                           # steps asked for
    max_steps: int
    first_step: int | None                      # the steps it covers (the timeline's step numbers)
    last_step: int | None
    start_ms: float | None                      # what starting the profiler held the engine thread for
    stop_ms: float | None                       # and stopping it
    error: str | None
    requested_at: float | None                  # unix time
    trace_url: str | None                       # the Kineto trace (gzipped Chrome trace JSON), once done
    trace_bytes: int | None
    importer: bool                              # whether this build can open the trace as a timeline
    open_url: str | None                        # POST: import the trace and load it as the replay
