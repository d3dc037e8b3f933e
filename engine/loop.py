"""The two loops, side by side. Same parts (build, launch, consume, flush_traces), different order.

sync, the seesaw:     build N -> launch N -> flush N-1 -> consume N   (the GPU idles while the host builds N+1)
async, the overlap:   build N+1 -> launch N+1 -> consume N -> flush N (the host builds while the GPU computes N)

`flush_traces` hands consumed steps' traces to the observers. Both loops call it only once the next step is
launched, so the observers run while the GPU computes instead of widening the gap before a launch: sync holds
step N's trace back over its build and launch of N+1, async gets that for free. No part asks which loop called
it; a failed step's trace alone is delivered at once.

Each loop returns when another mode is requested (or the engine closes), with nothing in flight: the async loop
drains its last step first, so a switch loses and repeats nothing.

Every place the host blocks on the device (in runner.py, graphs.py and, for tensor parallel, parallel/; on CPU
none of them blocks):
  1. consume -> runner.wait: the D2H event of the step consumed. The one wait per step in steady state, in
     both loops: sync with nothing queued behind it, async with the next step already launched.
  2. build -> runner.prepare -> runner.wait_slot_free: the H2D event of the slot's previous step (two back),
     the write-after-read guard. Returns at once in both loops (that step was consumed, D2H after H2D,
     before this build); it is there for the hazard, not for the loops.
  3. start-up -> StepGraphs.capture_all (graphs.py): every step graph (slot x shape x sampling path) is
     captured before the first request, each capture synchronising the device; a greedy decode capture that
     fails makes StepGraphs.disable synchronise once more (a sampling path that fails runs eagerly alone, and
     so do mixed steps whose capture fails).
     Serving never captures. Then runner.measure_start_kernel times the step's start kernel once and
     synchronises the compute stream. Tensor parallel start-up syncs too: the first all-reduce of the process group
     (parallel.ranks.init_group) and the all-reduce timing (parallel.sharding.measure_allreduce).
  4. a step out of device memory -> core.fail -> runner.free_cached_memory: empty_cache syncs (error path).
  5. close: no wait of its own; the async loop consumes its in-flight step first (wait 1).
Not ours to remove: a model whose eager forward syncs (a float32 MoE's expert dispatch) does so in eager
(prefill) steps; decode graphs cannot hold a sync. Observers read only events already complete (trace.py).
"""
from __future__ import annotations

from .core import EngineCore


def run_sync(core: EngineCore) -> None:
    while core.keep_running("sync"):
        step = core.build("sync")
        if step is None:
            core.idle()                         # delivers the last step's trace, then sleeps
            continue
        core.launch(step)
        core.flush_traces()                     # the previous step's trace, while this one computes
        core.consume(step)                      # the host blocks here, with nothing else queued


def run_async(core: EngineCore) -> None:
    in_flight = None
    while core.keep_running("async") or in_flight is not None:
        step = core.build("async", in_flight) if core.keep_running("async") else None
        if step is not None:
            core.launch(step)
        if in_flight is not None:
            core.consume(in_flight)             # the host blocks here, with the next step already queued
            core.flush_traces()                 # its trace, while the next step computes
        elif step is None:
            core.idle()
        in_flight = step


LOOPS = {"sync": run_sync, "async": run_async}
