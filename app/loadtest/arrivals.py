"""A load test's requests, planned before they are sent: when each arrives, its synthetic prompt, its output
length and seed.

A burst is a list of planned requests (arrival offset, prompt token ids, output length, seed), all drawn from one
seeded generator, so the same spec and seed give the same burst every time: that is what makes an A/B fair.
A continuous load draws the same kind of requests from an endless seeded stream (`request_stream`).
`batchscope bench --workload served` plans its requests here too, so this module needs nothing beyond the standard
library at import: the specs (pydantic) are only named in annotations.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from .specs import BurstSpec, LoadSpec, RequestShape

__all__ = ["arrival_offsets", "synthetic_prompt", "PlannedRequest", "plan_burst", "request_stream", "prompt_stream"]


def arrival_offsets(n: int, arrival: str, rate: float, burstiness: float, rng: random.Random) -> list[float]:
    """Seconds after the burst's start at which each of n requests is sent; the first one goes at 0."""
    if arrival == "burst":
        return [0.0] * n
    if arrival == "poisson":
        gaps = [rng.expovariate(rate) for _ in range(n - 1)]
    elif arrival == "gamma":
        # mean gap stays 1/rate whatever the shape; the shape alone sets how clumped arrivals are
        gaps = [rng.gammavariate(burstiness, 1.0 / (rate * burstiness)) for _ in range(n - 1)]
    else:
        raise ValueError(f"unknown arrival process {arrival!r}")
    out, t = [0.0], 0.0
    for g in gaps:
        t += g
        out.append(t)
    return out


def synthetic_prompt(rng: random.Random, length: int, vocab_size: int) -> list[int]:
    # skip the low ids, where tokenizers keep their special tokens (EOS, chat markers)
    low = min(1000, vocab_size // 2)
    return [rng.randrange(low, vocab_size) for _ in range(length)]


@dataclass
class PlannedRequest:
    index: int
    offset_s: float
    prompt: list[int]
    max_new_tokens: int
    seed: int


def plan_burst(spec: BurstSpec, vocab_size: int) -> list[PlannedRequest]:
    """The whole burst, drawn from the spec's seed: identical for identical specs. `spec` is settled
    (BurstSpec.within): its lengths and seed are known. Anything with the same fields will do (the bench passes
    its own)."""
    rng = random.Random(spec.seed)
    offsets = arrival_offsets(spec.num_requests, spec.arrival, spec.rate, spec.burstiness, rng)
    plan = []
    for i, off in enumerate(offsets):
        p = rng.randint(*spec.prompt_tokens)
        m = rng.randint(*spec.max_new_tokens)
        plan.append(PlannedRequest(i, off, synthetic_prompt(rng, p, vocab_size), m, rng.randrange(2**31)))
    return plan


def request_stream(spec: LoadSpec, vocab_size: int) -> Iterator[PlannedRequest]:
    """A continuous load's requests, one after another for ever, drawn from the spec's seed. For kind "rate",
    `offset_s` is when each is due after the load's start; kind "concurrency" sends each when a slot frees up."""
    rng = random.Random(spec.seed)
    t, i = 0.0, 0
    while True:
        p = rng.randint(*spec.prompt_tokens)
        m = rng.randint(*spec.max_new_tokens)
        yield PlannedRequest(i, t, synthetic_prompt(rng, p, vocab_size), m, rng.randrange(2**31))
        if spec.kind == "rate":
            t += rng.expovariate(spec.rate) if spec.arrival == "poisson" else 1.0 / spec.rate
        i += 1


def prompt_stream(shape: RequestShape, vocab_size: int) -> Iterator[PlannedRequest]:
    """Requests drawn from the shape's seed alone, one after another, without arrival times (`offset_s` 0): the
    same sequence whoever sends them and however fast, so that every point of a sweep, in either mode, sends the
    same prompts in the same order. `shape` is settled (its lengths and seed are known)."""
    rng = random.Random(shape.seed)
    i = 0
    while True:
        p = rng.randint(*shape.prompt_tokens)
        m = rng.randint(*shape.max_new_tokens)
        yield PlannedRequest(i, 0.0, synthetic_prompt(rng, p, vocab_size), m, rng.randrange(2**31))
        i += 1
