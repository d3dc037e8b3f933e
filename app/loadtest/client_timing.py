"""A load test's client-side metrics: each request timed as its tokens stream back (what a user of the server
would see), and TTFT, TPOT, ITL and E2E percentiles with throughput over a run.

A burst's requests are all kept (`burst_metrics`); a continuous load keeps its metrics in a `LoadTally`, whose
memory stays bounded however long it runs. app/loadtest/manager.py and sender.py fill them in.
"""
from __future__ import annotations

import random
import threading
from collections import deque
from dataclasses import dataclass, field

from batchscope.telemetry import percentiles

__all__ = ["RequestTiming", "burst_metrics", "LatencySample", "LoadTally", "LATENCIES", "ids_key"]


@dataclass
class RequestTiming:
    """Client-side clock (perf_counter_ns) of one request: when it was sent, when each chunk of tokens arrived."""
    sent_ns: int
    chunks: list[tuple[int, int]] = field(default_factory=list)    # (arrival ns, tokens in the chunk)
    finish_ns: int | None = None
    prompt_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None
    request_id: str | None = None       # the engine's id: the request's record in the timeline

    @property
    def output_tokens(self) -> int:
        return sum(k for _, k in self.chunks)

    @property
    def ok(self) -> bool:
        return self.error is None and self.finish_ns is not None

    def latencies(self) -> dict[str, list[float]]:
        """This request's TTFT, TPOT, ITL and E2E in ms (lists: ITL has one value per token after the first)."""
        out: dict[str, list[float]] = {"ttft_ms": [], "tpot_ms": [], "itl_ms": [], "e2e_ms": []}
        out["e2e_ms"].append((self.finish_ns - self.sent_ns) / 1e6)
        if not self.chunks:
            return out
        first = self.chunks[0][0]
        out["ttft_ms"].append((first - self.sent_ns) / 1e6)
        n = self.output_tokens
        if n > 1:
            out["tpot_ms"].append((self.chunks[-1][0] - first) / 1e6 / (n - 1))
        # a chunk of k tokens after a gap g counts as k inter-token gaps of g/k: tokens that arrive together
        for (prev, _), (now, k) in zip(self.chunks, self.chunks[1:]):
            out["itl_ms"].extend([(now - prev) / 1e6 / k] * k)
        return out


LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


def ids_key(metric: str) -> str:
    """The key of the engine ids that go with a latency's raw values, one per value: "ttft_ms" ->
    "ttft_request_id". (A sweep point's per-request lists share one list, "request_id"; its gaps have
    "itl_request_id".)"""
    return metric.removesuffix("_ms") + "_request_id"


def burst_metrics(timings: list[RequestTiming], start_ns: int, end_ns: int) -> dict:
    """TTFT/TPOT/ITL/E2E percentiles in ms and throughput over [start, end] for the requests that finished."""
    ok = [t for t in timings if t.ok]
    values: dict[str, list[float]] = {k: [] for k in LATENCIES}
    for t in ok:
        for k, v in t.latencies().items():
            values[k].extend(v)
    return _throughput({k: percentiles(v) for k, v in values.items()}, len(ok), len(timings) - len(ok),
                       sum(t.prompt_tokens for t in ok), sum(t.output_tokens for t in ok), start_ns, end_ns)


def _throughput(latencies: dict, completed: int, failed: int, prompt_tokens: int, output_tokens: int,
                start_ns: int, end_ns: int) -> dict:
    duration_s = max(end_ns - start_ns, 1) / 1e9
    return {**latencies, "completed": completed, "failed": failed, "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens, "duration_s": duration_s,
            "output_tokens_per_s": output_tokens / duration_s, "requests_per_s": completed / duration_s}


class LatencySample:
    """A uniform random sample of at most `size` values (reservoir sampling): percentiles of a long run without
    keeping every token's gap. Exact while fewer than `size` values have come. Each value keeps the id it came
    with (`ids`, aligned with `values`: the engine id of its request)."""

    def __init__(self, size: int, rng: random.Random):
        self.size, self.rng = size, rng
        self.values: list[float] = []
        self.ids: list[str | None] = []
        self.seen = 0

    def add(self, v: float, request_id: str | None = None) -> None:
        self.seen += 1
        if len(self.values) < self.size:
            self.values.append(v)
            self.ids.append(request_id)
        else:
            j = self.rng.randrange(self.seen)
            if j < self.size:
                self.values[j] = v
                self.ids[j] = request_id

    def percentiles(self) -> dict:
        out = percentiles(self.values)
        out["n"] = self.seen            # how many there were, not how many were kept
        return out


class LoadTally:
    """A continuous load's metrics as its requests finish: totals, a sample of each latency for the whole run,
    and the last `window_s` seconds on their own (tokens as they arrive, requests as they finish). Its memory is
    bounded by the sample size and by what arrives in one window. The load's thread writes it while the server's
    threads read it, hence the lock."""

    def __init__(self, window_s: float = 10.0, sample: int = 20_000, seed: int = 0):
        self.window_ns = int(window_s * 1e9)
        rng = random.Random(seed)
        self.samples = {k: LatencySample(sample, rng) for k in LATENCIES}
        self.completed = self.failed = self.cancelled = 0
        self.prompt_tokens = self.output_tokens = 0
        self._tokens: deque[tuple[int, int]] = deque()               # (arrival ns, tokens), this window
        self._finished: deque[tuple[int, float | None, float]] = deque()   # (finish ns, ttft ms, e2e ms)
        self._lock = threading.Lock()

    def token_chunk(self, now_ns: int, k: int) -> None:
        """Tokens streamed now: counted when they arrive, so tokens/s follows a mode switch at once."""
        with self._lock:
            self._tokens.append((now_ns, k))
            self._trim(now_ns)

    def finished(self, t: RequestTiming, cancelled: bool = False) -> None:
        lat = t.latencies() if t.ok and not cancelled else None
        with self._lock:
            if cancelled:
                self.cancelled += 1
            elif lat is None:
                self.failed += 1
            else:
                self.completed += 1
                self.prompt_tokens += t.prompt_tokens
                self.output_tokens += t.output_tokens
                for k, vs in lat.items():
                    for v in vs:
                        self.samples[k].add(v, t.request_id)
                self._finished.append((t.finish_ns, lat["ttft_ms"][0] if lat["ttft_ms"] else None,
                                       lat["e2e_ms"][0]))
                self._trim(t.finish_ns)

    def _trim(self, now_ns: int) -> None:
        cut = now_ns - self.window_ns
        while self._tokens and self._tokens[0][0] < cut:
            self._tokens.popleft()
        while self._finished and self._finished[0][0] < cut:
            self._finished.popleft()

    def recent(self, now_ns: int, start_ns: int) -> dict:
        """The last window (or less, early in the run): rates and median latencies."""
        with self._lock:
            self._trim(now_ns)
            tokens = sum(k for _, k in self._tokens)
            finished = list(self._finished)
        span_s = max(min(now_ns - start_ns, self.window_ns), 1) / 1e9
        return {"window_s": span_s, "completed": len(finished), "output_tokens_per_s": tokens / span_s,
                "requests_per_s": len(finished) / span_s,
                "ttft_ms_p50": percentiles([x for _, x, _ in finished if x is not None])["p50"],
                "e2e_ms_p50": percentiles([e for *_, e in finished])["p50"]}

    def values(self) -> dict:
        """The sampled latencies of the whole run (ms), for CDFs, each list with the engine ids of its values'
        requests beside it (`ids_key`: "ttft_request_id", ...); `n` says how many there were of each."""
        with self._lock:
            out: dict = {k: list(s.values) for k, s in self.samples.items()}
            out.update({ids_key(k): list(s.ids) for k, s in self.samples.items()})
            out["n"] = {k: s.seen for k, s in self.samples.items()}
        return out

    def results(self, start_ns: int, end_ns: int) -> dict:
        """The whole run, shaped like a burst's results."""
        with self._lock:
            return _throughput({k: s.percentiles() for k, s in self.samples.items()}, self.completed, self.failed,
                               self.prompt_tokens, self.output_tokens, start_ns, end_ns)
