"""A new load in place of the recorded one: another arrival process, request count or length ranges (the what-if
keys `arrival`, `burstiness`, `requests`, `prompt_tokens`, `new_tokens`, `seed`). What is not asked keeps the
recording's: its mean arrival rate (then scaled by `rate`), its count, its lengths (cycled when there are more
requests). The load is seeded, so the prediction and its --verify run replay the same requests.

The processes are the load tester's (app/loadtest/arrivals.py): burst (all at once), poisson, gamma with shape
`burstiness` (1: poisson, below: burstier, above: more regular)."""
from __future__ import annotations

import random

from .recording import LoadItem

LOAD_KEYS = ("arrival", "burstiness", "requests", "prompt_tokens", "new_tokens", "seed")
ARRIVALS = ("burst", "poisson", "gamma")


def asks_new_load(settings: dict) -> bool:
    return any(k in settings for k in LOAD_KEYS)


def reshape(load: list[LoadItem], settings: dict) -> list[LoadItem]:
    """The recorded load, or the new one the settings describe (at the recorded mean rate: `rate` scales both)."""
    if not asks_new_load(settings):
        return load
    rng = random.Random(settings.get("seed", 0))
    n = settings.get("requests", len(load))
    t0 = min(i.arrival_us for i in load)
    span_s = (max(i.arrival_us for i in load) - t0) / 1e6
    rate = (len(load) - 1) / span_s if len(load) > 1 and span_s > 0 else None
    offsets = _offsets(n, settings.get("arrival", "poisson"), rate, settings.get("burstiness", 1.0), rng)
    out = []
    for k, offset in enumerate(offsets):
        recorded = load[k % len(load)]
        prompt = _length(settings.get("prompt_tokens"), recorded.prompt_tokens, rng)
        new = _length(settings.get("new_tokens"), recorded.output_tokens, rng)
        out.append(LoadItem(f"whatif-{k}", t0 + offset * 1e6, prompt, new))
    return out


def _offsets(n: int, arrival: str, rate: float | None, burstiness: float, rng: random.Random) -> list[float]:
    """Seconds from the first arrival. A recording whose requests all came at once has no rate: a burst."""
    if arrival == "burst" or rate is None:
        return [0.0] * n
    t, out = 0.0, [0.0]
    for _ in range(n - 1):
        t += rng.expovariate(rate) if arrival == "poisson" else rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
        out.append(t)
    return out


def _length(asked, recorded: int, rng: random.Random) -> int:
    if asked is None:
        return recorded
    lo, hi = asked
    return rng.randint(lo, hi)
