"""Python's cyclic garbage collector, seen as host spans: when it runs, every Python thread stops.

A collection holds the GIL from start to end, whichever thread triggered it: the engine thread stops scheduling,
filling and launching, and in an idle gap that follows the instants of a collection belong to it ("gc"), not to
the host phase that happened to be running. The engine freezes its start-up objects out of the collector's walk
(engine/engine.py), so what is left to see are the collections over what serving itself keeps alive.
"""
from __future__ import annotations

import gc
import time
from collections import deque


class CollectorPauses:
    """Records (start_ns, end_ns, generation) of every collection while installed (perf_counter_ns, the engine's
    clock). The callback runs on whichever thread collects: it only appends, which is atomic."""

    def __init__(self, history: int = 512):
        self._pauses: deque = deque(maxlen=history)
        self._started = 0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        now = time.perf_counter_ns()
        if phase == "start":
            self._started = now
        elif self._started:
            self._pauses.append((self._started, now, info.get("generation")))
            self._started = 0

    def take(self) -> list[tuple[int, int, int]]:
        """The pauses recorded since the last call, oldest first."""
        out = []
        while self._pauses:
            out.append(self._pauses.popleft())
        return out

    def close(self) -> None:
        try:
            gc.callbacks.remove(self._callback)
        except ValueError:
            pass
