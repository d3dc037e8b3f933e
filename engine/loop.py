"""The two loops, side by side. Same parts (build, launch, consume), different order.

sync, the seesaw:     build N -> launch N -> consume N (the host waits; the GPU idles while it builds N+1)
async, the overlap:   build N+1 -> launch N+1 -> consume N (the host builds while the GPU computes N)

Each returns when another mode is requested (or the engine closes), with nothing in flight: the async loop
drains its last step first, so a switch loses and repeats nothing.
"""
from __future__ import annotations

from .core import EngineCore


def run_sync(core: EngineCore) -> None:
    while core.keep_running("sync"):
        step = core.build("sync")
        if step is None:
            core.idle()
            continue
        core.launch(step)
        core.consume(step)                      # the host blocks here, with nothing else queued


def run_async(core: EngineCore) -> None:
    in_flight = None
    while core.keep_running("async") or in_flight is not None:
        step = core.build("async", in_flight) if core.keep_running("async") else None
        if step is not None:
            core.launch(step)
        if in_flight is not None:
            core.consume(in_flight)             # the host blocks here, with the next step already queued
        elif step is None:
            core.idle()
        in_flight = step


LOOPS = {"sync": run_sync, "async": run_async}
