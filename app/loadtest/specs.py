"""What a load test asks for, checked once: the shape of its synthetic requests (`RequestShape`), a burst or an
A/B run (`BurstSpec`), a continuous load (`LoadSpec`), and the server's caps they are checked against (`Limits`).

POST /api/burst, /api/ab and /api/load take these as their bodies (a bad one is a 400 naming the field) and the
page's load-test panel builds the same models. They live here, below the server and the page, so that both import
them and neither imports the other. `within(limits)` settles a spec: lengths cut to the caps, a seed drawn.
"""
from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

Mode = Literal["sync", "async"]                     # the engine's two loops (engine.config.MODES)
DEFAULT_LENGTHS = (32, 128)                         # a burst's prompt and output lengths when the caller is silent


class Body(BaseModel):
    """A request body: an unknown field or a NaN is refused, not ignored (the server's own bodies too)."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Limits(BaseModel):
    """The server's caps on what one caller may ask for: a prompt's and an output's length, a queue's depth, a
    load test's size. Here rather than in app/server because every spec below is checked against them."""
    max_prompt_tokens: int = 4096
    max_new_tokens: int = 8192
    max_burst_requests: int = 256
    max_concurrent_bursts: int = 2
    max_waiting_requests: int = 1024    # engine queue depth beyond which new API requests are refused
    # a continuous load (POST /api/load) ends by itself at the first of these, so none runs on unattended
    max_load_duration_s: float = 600.0
    max_load_requests: int = 20_000
    max_load_concurrency: int = 256     # also the most requests a "rate" load keeps in flight
    # a sweep (POST /api/sweep): rates between its synchronous and throughput runs, the highest offered rate, and
    # its whole length; each point is bounded like a continuous load (duration and requests above)
    max_sweep_points: int = 16
    max_sweep_rate: float = 1000.0
    max_sweep_duration_s: float = 3600.0


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

