"""What a sweep asks for (`SweepSpec`) and the service levels its points are judged by (`SLO`), checked once.

A sweep runs, in each mode it names, a synchronous run (one request at a time), a throughput run (`max_concurrency`
requests always in flight), then `points` offered rates evenly spaced between the request rates those two
measured (GuideLLM's sweep), or the `rates` the caller gives (the same in every mode). Every point runs for
`duration_s` or sends `requests` requests, whichever bound comes first; then what is still in flight may take
`drain_s` to finish before it is cancelled. POST /api/sweep takes a SweepSpec as its body.

The TTFT and ITL SLOs a caller leaves out are the model's own: SLO_TTFT_FACTOR x the TTFT p99 and SLO_ITL_FACTOR x
the ITL p99 (each request's mean gap, what the ITL SLO is held against) of the sweep's first point, its first mode's
synchronous run, rounded up to two significant figures (`derive_slo`). A fixed 500 ms / 50 ms says nothing on a
small CPU model whose every request, alone, takes longer; k x its unloaded latency asks "how much load before
latency grows k-fold", which has an answer on any model.
"""
from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, StrictBool, field_validator

from ..specs import Body, Limits, Mode, RequestShape

SCHEMA = "batchscope.sweep/1"               # the export's format (docs/sweep.md), also named in every status
DEFAULT_POINT_S = 10.0                      # a point's length when the caller gives neither duration nor requests
DEFAULT_DRAIN_S = 30.0                      # at most this long (or the point's duration, if longer) to finish
DEFAULT_TTFT_MS = 500.0                     # SLO defaults: an interactive chat's first token within half a second
DEFAULT_ITL_MS = 50.0                       # and 20 tokens/s or better after it (a sweep derives its own instead)
SLO_TTFT_FACTOR = 3.0                       # a sweep's derived SLOs: 3x the synchronous run's TTFT p99
SLO_ITL_FACTOR = 2.0                        # and 2x its ITL p99
DERIVABLE = ("ttft_ms", "itl_ms")
DEFAULT_TARGET = 0.99
DEFAULT_RATE_POINTS = 4

PositiveRate = Annotated[float, Field(gt=0)]


class SLO(Body):
    """Service levels a request must meet, all of them, to count as good. None: not checked. `itl_ms` is held
    against each request's mean gap between tokens after the first (its TPOT), as `vllm bench serve --goodput
    tpot:` does: one slow gap does not fail a request, a slow stream does. `target` is the attainment (share of
    requests that met them) a point must reach for the sweep to say its rate meets the SLOs."""
    ttft_ms: float | None = Field(DEFAULT_TTFT_MS, gt=0)
    itl_ms: float | None = Field(DEFAULT_ITL_MS, gt=0)
    e2e_ms: float | None = Field(None, gt=0)
    target: float = Field(DEFAULT_TARGET, gt=0, le=1)


class SweepSpec(RequestShape):
    modes: list[Mode] = Field(default_factory=lambda: ["sync", "async"], min_length=1, max_length=2)
    points: int = Field(DEFAULT_RATE_POINTS, ge=1)      # offered rates between the synchronous and throughput runs
    rates: list[PositiveRate] | None = Field(None, min_length=1)    # or these (req/s), in every mode
    duration_s: float | None = Field(None, gt=0)        # per point
    requests: int | None = Field(None, ge=1)            # per point
    max_concurrency: int | None = Field(None, ge=1)     # the throughput run's; None: the server's limit
    arrival: Literal["constant", "poisson"] = "constant"    # how the rate points space their requests
    drain_s: float | None = Field(None, gt=0)
    warm_up: StrictBool = True                          # a few requests in each mode before the first point
    slo: SLO = Field(default_factory=SLO)
    # the SLO latencies taken from the sweep's first synchronous run (module docstring); left out of a request:
    # those of ttft_ms and itl_ms its slo does not give. Until that run has ended they hold the defaults.
    slo_from_sync: list[Literal["ttft_ms", "itl_ms"]] | None = None

    @field_validator("modes")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"each mode once, got {v}")
        return v

    @property
    def runs_per_mode(self) -> int:
        return 2 + (len(self.rates) if self.rates else self.points)

    def within(self, limits: Limits, max_model_len: int | None = None) -> SweepSpec:
        """This spec with lengths, seed, bounds and rates settled, or ValueError over a cap (a 400)."""
        fields = self._settled(limits, max_model_len)
        if self.rates is not None:
            if "points" in self.model_fields_set and self.points != len(self.rates):
                raise ValueError(f"points {self.points} but {len(self.rates)} rates: give one or the other")
            fields["points"] = len(self.rates)
            fields["rates"] = sorted(self.rates)
        points = fields.get("points", self.points)
        if points > limits.max_sweep_points:
            raise ValueError(f"points {points} is over the limit of {limits.max_sweep_points}")
        duration = self.duration_s
        if duration is None and self.requests is None:
            duration = min(DEFAULT_POINT_S, limits.max_load_duration_s)
        if duration is not None and duration > limits.max_load_duration_s:
            raise ValueError(f"duration_s {duration:g} is over the limit of {limits.max_load_duration_s:g} s")
        if self.requests is not None and self.requests > limits.max_load_requests:
            raise ValueError(f"requests {self.requests} is over the limit of {limits.max_load_requests}")
        conc = self.max_concurrency or limits.max_load_concurrency
        if conc > limits.max_load_concurrency:
            raise ValueError(f"max_concurrency {conc} is over the limit of {limits.max_load_concurrency}")
        _check_rates(fields.get("rates"), duration, limits)
        if duration is not None:
            total = len(self.modes) * (2 + points) * duration
            if total > limits.max_sweep_duration_s:
                raise ValueError(f"{len(self.modes)} mode(s) x {2 + points} runs x {duration:g} s is {total:g} s, "
                                 f"over the limit of {limits.max_sweep_duration_s:g} s for one sweep")
        drain = self.drain_s or max(DEFAULT_DRAIN_S, duration or 0.0)
        derive = self.slo_from_sync
        if derive is None:
            given = self.slo.model_fields_set if "slo" in self.model_fields_set else set()
            derive = [k for k in DERIVABLE if k not in given]
        return self.model_copy(update={**fields, "duration_s": duration, "max_concurrency": conc,
                                       "drain_s": drain, "slo_from_sync": sorted(set(derive))})


def _check_rates(rates: list[float] | None, duration: float | None, limits: Limits) -> None:
    for r in rates or ():
        if r > limits.max_sweep_rate:
            raise ValueError(f"rate {r:g} req/s is over the limit of {limits.max_sweep_rate:g}")
        if duration is not None and r * duration > limits.max_load_requests:
            raise ValueError(f"rate {r:g} req/s for {duration:g} s is {r * duration:,.0f} requests, over the limit "
                             f"of {limits.max_load_requests:,} per point")


def spaced_rates(sync_rps: float, throughput_rps: float, n: int) -> list[float]:
    """GuideLLM's sweep: n rates evenly spaced from the synchronous run's request rate to the throughput run's,
    the first (the synchronous rate itself, already measured) left out, so the last is the throughput rate.
    Ascending whichever run measured more (on a machine where concurrency does not pay, they swap)."""
    lo, hi = sorted((sync_rps, throughput_rps))
    if hi <= 0:
        raise ValueError("neither the synchronous nor the throughput run completed a request: no rate to sweep")
    return [lo + (hi - lo) * (i + 1) / n for i in range(n)]


def round_up(v: float) -> float:
    """Up to two significant figures: 37.2 -> 38, 111 -> 120, 1234 -> 1300 (an SLO reads as a round number)."""
    if v <= 0:
        return v
    step = 10 ** (math.floor(math.log10(v)) - 1)
    return round(math.ceil(v / step - 1e-9) * step, 6)


def derive_slo(slo: SLO, keys: list[str], ttft_p99: float | None, itl_p99: float | None) -> tuple[SLO, dict]:
    """The SLO with `keys` taken from a synchronous run's p99s, and the record of it (docs/sweep.md
    `slo_derived`): per key the p99 it came from, the factor and the SLO. A key whose p99 the run has not (no
    request finished; one-token outputs have no gap) keeps its value and says so (`from_p99_ms` null)."""
    basis = {"ttft_ms": (ttft_p99, SLO_TTFT_FACTOR), "itl_ms": (itl_p99, SLO_ITL_FACTOR)}
    update, record = {}, {}
    for key in keys:
        p99, factor = basis[key]
        if p99 is None or p99 <= 0:
            record[key] = {"from_p99_ms": None, "factor": factor, "slo_ms": getattr(slo, key)}
            continue
        update[key] = max(round_up(factor * p99), 0.001)
        record[key] = {"from_p99_ms": round(p99, 3), "factor": factor, "slo_ms": update[key]}
    return slo.model_copy(update=update), record
