"""Load generation: synthetic bursts of requests and their client-side metrics.

A burst is a list of planned requests (arrival offset, prompt token ids, output length, seed), all drawn from one
seeded generator, so the same spec and seed give the same burst every time: that is what makes an A/B fair.
app/bursts.py runs them; each token's arrival is timed on the client side (what a user of the server would see).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from batchscope.telemetry.summary import percentiles

from .schemas import BurstSpec

__all__ = ["arrival_offsets", "synthetic_prompt", "PlannedRequest", "plan_burst", "RequestTiming",
           "burst_metrics"]


# ------------------------------------------------------------------------------------------ arrivals and lengths

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
    (BurstSpec.within): its lengths and seed are known."""
    rng = random.Random(spec.seed)
    offsets = arrival_offsets(spec.num_requests, spec.arrival, spec.rate, spec.burstiness, rng)
    plan = []
    for i, off in enumerate(offsets):
        p = rng.randint(*spec.prompt_tokens)
        m = rng.randint(*spec.max_new_tokens)
        plan.append(PlannedRequest(i, off, synthetic_prompt(rng, p, vocab_size), m, rng.randrange(2**31)))
    return plan


# ------------------------------------------------------------------------------------------------------ metrics

@dataclass
class RequestTiming:
    """Client-side clock (perf_counter_ns) of one request: when it was sent, when each chunk of tokens arrived."""
    sent_ns: int
    chunks: list[tuple[int, int]] = field(default_factory=list)    # (arrival ns, tokens in the chunk)
    finish_ns: int | None = None
    prompt_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None

    @property
    def output_tokens(self) -> int:
        return sum(k for _, k in self.chunks)


def burst_metrics(timings: list[RequestTiming], start_ns: int, end_ns: int) -> dict:
    """TTFT/TPOT/ITL/E2E percentiles in ms and throughput over [start, end] for the requests that finished."""
    ok = [t for t in timings if t.error is None and t.finish_ns is not None]
    ttft, tpot, itl, e2e = [], [], [], []
    for t in ok:
        e2e.append((t.finish_ns - t.sent_ns) / 1e6)
        if not t.chunks:
            continue
        first = t.chunks[0][0]
        ttft.append((first - t.sent_ns) / 1e6)
        n = t.output_tokens
        if n > 1:
            tpot.append((t.chunks[-1][0] - first) / 1e6 / (n - 1))
        # a chunk of k tokens after a gap g counts as k inter-token gaps of g/k: tokens that arrive together
        for (prev, _), (now, k) in zip(t.chunks, t.chunks[1:]):
            itl.extend([(now - prev) / 1e6 / k] * k)
    duration_s = max(end_ns - start_ns, 1) / 1e9
    out_tokens = sum(t.output_tokens for t in ok)
    return {
        "ttft_ms": percentiles(ttft), "tpot_ms": percentiles(tpot), "itl_ms": percentiles(itl),
        "e2e_ms": percentiles(e2e),
        "completed": len(ok), "failed": len(timings) - len(ok),
        "prompt_tokens": sum(t.prompt_tokens for t in ok), "output_tokens": out_tokens,
        "duration_s": duration_s,
        "output_tokens_per_s": out_tokens / duration_s,
        "requests_per_s": len(ok) / duration_s,
    }
