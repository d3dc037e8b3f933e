"""The body of a "catch_up" message: what a live viewer that skipped frames needs to stay right.

A viewer that fell behind skips to the newest frames (hub.py) instead of reading a stale backlog. What it must not
lose is what the page keeps as state: the latest state of every request (a request whose "finished" went by in a
lost frame would read as running for good), and the mode switches. Those come from the recorder, which holds
them anyway, so a slow viewer costs no memory of its own: every request that finished since the last frame the
viewer read, every request still running, every switch since then, and the newest steps (the live edge, with
their NVML samples and other ranks' spans). The steps between the last one it read and the first one sent are
a gap, named in `gap`: the page draws nothing there rather than a line across it.

Any record published after the viewer's last frame was stamped has a time at or after that stamp (a record's time
is taken before it is published), so `since_us` loses nothing; a few records may come twice, which the page
takes as it takes hello's overlap with the stream (the latest state wins, steps it has are skipped).
"""
from __future__ import annotations

from .hub import request_view
from .records import span_end, span_start

CATCH_UP_STEPS_S = 2.0          # the newest steps sent again: this much of the live edge
CATCH_UP_MAX_STEPS = 1000
CATCH_UP_MAX_REQUESTS = 2000    # as many as the page keeps


def catch_up(recorder, now_us: float, since_us: float, after_step: int | None) -> dict:
    """What changed since `since_us` (session µs) for a viewer whose newest step is `after_step` (None: none)."""
    steps = _newest_steps(list(recorder.steps), now_us, after_step)
    first = steps[0]["step"] if steps else None
    last_known = recorder.last_step
    gap = None
    if after_step is not None and last_known is not None:
        upto = (first - 1) if first is not None else last_known
        if upto > after_step:
            gap = {"first_step": after_step + 1, "last_step": upto, "steps": upto - after_step}
    edge_us = span_start(steps[0]) if steps else now_us - CATCH_UP_STEPS_S * 1e6
    finished = []
    for req in reversed(list(recorder.requests)):
        if (req["finish_us"] or now_us) < since_us or len(finished) >= CATCH_UP_MAX_REQUESTS:
            break
        finished.append(req)
    running = recorder.active_requests()[-CATCH_UP_MAX_REQUESTS:]
    requests = [request_view(r) for r in finished[::-1]] + [request_view(r) for r in running]
    ranks = [r for r in list(recorder.rank_steps)[-8 * len(steps):] if r["step"] >= first] if steps else []
    return {"t_us": now_us, "since_us": since_us, "gap": gap, "steps": steps, "rank_steps": ranks,
            "nvml": [s for s in list(recorder.nvml)[-4000:] if s["t_us"] >= max(since_us, edge_us or now_us)],
            "mode_changes": [m for m in list(recorder.mode_changes) if m["t_us"] >= since_us],
            "requests": requests[-CATCH_UP_MAX_REQUESTS:]}


def _newest_steps(steps: list, now_us: float, after_step: int | None) -> list:
    """The steps after `after_step` that ended within CATCH_UP_STEPS_S of now, at most CATCH_UP_MAX_STEPS."""
    out = []
    for rec in reversed(steps[-CATCH_UP_MAX_STEPS:]):
        if after_step is not None and rec["step"] <= after_step:
            break
        if (span_end(rec) or now_us) < now_us - CATCH_UP_STEPS_S * 1e6:
            break
        out.append(rec)
    out.reverse()
    return out
