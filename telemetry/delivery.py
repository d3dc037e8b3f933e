"""When each streamed token reached its client: the server's chunk write times, joined with the engine's token
times.

The engine stamps a token when the update span that delivered it ends (`token_us`); the server stamps the moment
it wrote the chunk carrying it (`sent_us`, same clock); an in-process A/B/burst run's sender
(app/loadtest/sender.py) stamps each token's arrival at it instead, being that run's client. Their difference is
the delivery delay: the server's event loop, detokenising and JSON between a sampled token and the wire, measured
instead of guessed.

The two stamps come from different threads in either order: the server hands a request's write times over once its
stream has ended (`sent`, any thread), the recorder hands over the request record when it learns the request
finished (`finished`, the engine thread). Whichever comes second joins them, under one lock: the record's
`sent_us` (a key every request record has from the start, null until then, so that a reader serialising the record
meanwhile never sees it change size) and the delay histogram that /metrics exposes.

A chunk written while the update span that made its token was still running (the server's thread can take the GIL
inside it) counts as written at that span's end: the token time is the span's end, so the delay reads 0 there.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from .totals import Histogram

# delivery delays run from tens of µs (an idle server) to the tenths of a second a busy event loop adds
DELIVERY_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5)
MAX_WAITING = 4096          # write times of requests whose finish the recorder has not seen yet
MAX_RECENT = 4096           # finished records whose write times may still come


class Deliveries:
    def __init__(self, to_us: Callable[[int], float]):
        self.to_us = to_us
        self.delay = Histogram(DELIVERY_BUCKETS)
        self.joined = 0                 # streamed requests whose write times are in their records
        self.dropped = 0                # write times of requests never seen finishing (forgotten past the caps)
        self._waiting: OrderedDict[str, list] = OrderedDict()
        self._recent: OrderedDict[str, dict] = OrderedDict()
        self._lock = threading.Lock()

    def sent(self, request_id: str, times_ns: list[int]) -> None:
        """Any thread: when each of the request's tokens was written to its client (perf_counter ns, one per
        token written, in order)."""
        with self._lock:
            rec = self._recent.pop(request_id, None)
            if rec is not None:
                self._join(rec, times_ns)
                return
            self._waiting[request_id] = times_ns
            while len(self._waiting) > MAX_WAITING:
                self._waiting.popitem(last=False)
                self.dropped += 1

    def finished(self, rec: dict) -> None:
        """The engine thread: a request record just finished (before others read it as finished)."""
        with self._lock:
            times = self._waiting.pop(rec["id"], None)
            if times is not None:
                self._join(rec, times)
                return
            self._recent[rec["id"]] = rec
            while len(self._recent) > MAX_RECENT:
                self._recent.popitem(last=False)

    def _join(self, rec: dict, times_ns: list[int]) -> None:
        made = rec.get("token_us") or []
        if rec.get("output_tokens_engine") is not None:     # recorded from mid-request: the times do not align
            self.dropped += 1
            return
        sent = [max(self.to_us(t), m) for t, m in zip(times_ns, made)]
        for t, m in zip(sent, made):
            self.delay.observe((t - m) / 1e6)
        rec["sent_us"] = sent
        self.joined += 1
