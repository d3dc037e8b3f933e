"""What a sweep reports while it runs and once it has ended, as typed models: each point's figures, each mode's
curve summary (knees, the rates that meet the SLOs) and the progress of the point running now. The routes return
them as they are, so /api/docs lists every field; the raw values behind the percentiles are in the export only
(GET /api/sweep/{id}.json), not in every poll.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..specs import Mode
from ..statuses import RunState
from .spec import SCHEMA, SLO, SweepSpec

PointKind = Literal["synchronous", "throughput", "constant", "poisson", "concurrent", "gamma"]
SweepStopReason = Literal["stopped", "shutdown", "error"]


class Latency(BaseModel):
    """Percentiles of one latency over a point's requests, ms (None without data)."""
    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None = None
    n: int = 0


class SweepPoint(BaseModel):
    model_config = ConfigDict(extra="allow")        # readers of other tools' reports add their own fields
    index: int                                      # in the order the points of its mode ran
    mode: str | None = None                         # "sync" | "async" here; a series name in a foreign report
    kind: PointKind
    offered_rate: float | None                      # req/s; None for synchronous, throughput and concurrent
    concurrency: int | None = None                  # in flight: synchronous 1, throughput the most it had
    complete: bool = True                           # False: cut short by a stop
    duration_s: float | None = None
    sent: int | None = None
    completed: int | None = None
    failed: int | None = None
    cancelled: int | None = None
    skipped: int | None = None                      # arrivals not sent: max_concurrency already in flight
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    requests_per_s: float | None
    output_tokens_per_s: float | None
    ttft_ms: Latency
    itl_ms: Latency
    tpot_ms: Latency
    e2e_ms: Latency
    slo_attainment: float | None                    # 0-1: share of the point's requests that met every SLO
    goodput_rps: float | None                       # requests that met every SLO, per second
    busy_pct: float | None = None                   # event busy % over the point's window (host spans on CPU)
    ms_per_step: float | None = None                # median step period over the window
    busy_basis: str | None = None
    steps: int | None = None
    window_us: list[float] | None = None            # telemetry's clock: where the point sits in the timeline
    mode_moved: bool = False                        # the engine ran another mode while it ran (not fair)


class RatePick(BaseModel):
    """A point of a curve picked for what it says (a knee, the highest rate meeting the SLOs...)."""
    index: int
    kind: PointKind
    offered_rate: float | None
    requests_per_s: float | None
    output_tokens_per_s: float | None
    slo_attainment: float | None


class CurveSummary(BaseModel):
    knees: dict[str, dict[str, RatePick | None]]    # latency -> "p50"/"p99" -> its knee, if it turns up
    slo_target: float
    slo_max: RatePick | None                        # the highest throughput whose point met the target
    slo_exit: RatePick | None                       # the first point, in load order, below the target
    slo_none_why: str | None = None                 # no point met the target: why, in words


class ModeCurve(BaseModel):
    points: list[SweepPoint]
    summary: CurveSummary | None = None


class SweepCurrent(BaseModel):
    """The point running now."""
    mode: Mode
    index: int
    kind: PointKind
    offered_rate: float | None
    elapsed_s: float
    duration_s: float | None
    requests: int | None
    sent: int
    finished: int
    in_flight: int
    draining: bool                                  # sending is over: what is in flight is finishing


class SweepStatus(BaseModel):
    # "schema" would shadow a BaseModel attribute: the field is schema_ in Python, "schema" on the wire
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)
    schema_: str = Field(SCHEMA, alias="schema")
    id: str
    state: RunState
    stop_reason: SweepStopReason | None
    error: str | None
    spec: SweepSpec                                 # settled: lengths, seed, bounds known
    slo: SLO
    modes: dict[str, ModeCurve]                     # in the order they ran
    points_done: int
    points_total: int
    current: SweepCurrent | None
    elapsed_s: float
    mode: Mode | None                               # the mode running now
    # spec.slo_from_sync's SLOs, once derived: the point they came from, per key {from_p99_ms, factor, slo_ms}
    slo_derived: dict | None = None


class SweepStarted(BaseModel):
    sweep_id: str
    points_total: int
    spec: SweepSpec


class SweepList(BaseModel):
    sweeps: list[dict]                              # id, state, created, modes, points_done, points_total
    imports: list[dict]                             # foreign reports uploaded: id, tool, label, series
