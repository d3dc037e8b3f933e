"""What one request waited for, read off the timeline's records: the way from a tail request to its steps.

`request_waits(steps, requests, request_id)` finds the request's record and the steps it was part of (each step
lists its `request_ids`; the steps that preempted it list it in `preempted`) and splits its lifetime into spans:
queue (arrival to `scheduled_us`), prefill (its steps up to the one that delivered its first token, and after a
preemption up to the one that delivered the next), decode (the rest) and preempted (from the step that preempted
it being scheduled to the next step it was in being scheduled). Its waits:

- `queue_us`: arrival to `scheduled_us`
- `start_us`: being scheduled to its first step's compute start (that step filled and launched; on a busy device,
  the step before it finishing)
- `others_prefill_us`: the compute time of its steps spent on other requests' prompt tokens, by token share (a
  step's compute time x the others' prompt tokens / the step's tokens), with the tokens and steps it comes from
- `preempted_us`: the preempted spans together
- `gap_us`, `gap_by_cause_us`: the GPU idle before each of its steps after the first (the gaps it sat through
  while it ran; the first step's gap is its own admission), by the cause the step record gives

Each figure is exact from the records or null, with the reason in `unknown`: nothing is estimated. Whose prompt
tokens a step computed is `prefill_tokens_by_request`; a timeline recorded before steps carried it still tells
a step the request decoded in (it had delivered a token since it started or was preempted, so its own share is
one decode token) and a step it ran alone; the others' share of the rest is unknown.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right

from .records import span_end, span_start

SLACK_STEPS = 4                 # steps either side of the request's window: spans are ordered by step, nearly by time
SLOWEST = 10


def request_waits(steps: list, requests: list, request_id: str) -> dict | None:
    """The request's spans, steps and waits (this module's docstring), or None when no record has that id.
    `steps` in step order, as a timeline holds them."""
    req = find_request(requests, request_id)
    if req is None:
        return None
    own, preempting = _steps_of(steps, req)
    tokens = set(req.get("token_us") or ())
    unknown: list[str] = []
    details, preempted = [], []
    state, since_preempt = "prefill", None
    for s in sorted(own + preempting, key=lambda r: r["step"]):
        if request_id not in s["request_ids"]:           # a step that preempted it
            if since_preempt is None:
                since_preempt = _scheduled_at(s)
            state = "prefill"                            # it recomputes its tokens when it comes back
            continue
        detail = _step_detail(s, request_id, state)
        if since_preempt is not None:
            preempted.append([since_preempt, detail["scheduled_us"]])
            since_preempt = None
            detail["resumed"] = True
        details.append(detail)
        if detail["delivered_us"] in tokens:
            state = "decode"
    if since_preempt is not None:
        preempted.append([since_preempt, req.get("finish_us")])
        unknown.append("preempted and not resumed within this timeline")
    spans = _spans(req, details, preempted)
    waits = _waits(req, details, own, preempted, unknown)
    arrival, finish = req.get("arrival_us"), req.get("finish_us")
    first = arrival if arrival is not None else (own[0]["cpu"].get("schedule", [None])[0] if own else None)
    last = finish if finish is not None else (span_end(own[-1]) if own else None)
    if not own:
        unknown.append("its steps are not in this timeline (the live ring keeps the newest steps only)")
    if finish is None:
        unknown.append("still running: its lifetime so far")
    return {"id": request_id, "arrival_us": arrival, "scheduled_us": req.get("scheduled_us"),
            "first_token_us": req.get("first_token_us"), "finish_us": finish,
            "finish_reason": req.get("finish_reason"), "prompt_tokens": req.get("prompt_tokens"),
            "output_tokens": req.get("output_tokens"), "preemptions": req.get("preemptions", 0),
            **request_latencies(req), "lifetime_us": [first, last],
            "modes": sorted({s["mode"] for s in own}), "spans": spans, "steps": details, "waits": waits,
            "unknown": unknown}


def find_request(requests: list, request_id: str) -> dict | None:
    """The request's record: the finished one when a list holds a running copy too."""
    found = None
    for r in requests:
        if r.get("id") == request_id:
            if r.get("finish_us") is not None:
                return r
            found = r
    return found


def request_latencies(req: dict) -> dict:
    """TTFT, E2E and the longest gap between two of its tokens, µs (null where the record cannot say)."""
    arrival, first, finish = req.get("arrival_us"), req.get("first_token_us"), req.get("finish_us")
    times = req.get("token_us") or []
    return {"ttft_us": _less(first, arrival), "e2e_us": _less(finish, arrival),
            "itl_max_us": _less(*max(((b, a) for a, b in zip(times, times[1:])), key=lambda p: p[0] - p[1],
                                     default=(None, None)))}


def slowest_requests(steps: list, requests: list, n: int = SLOWEST) -> list[dict]:
    """The `n` finished requests with the longest E2E, slowest first: id, TTFT, ITL max and E2E in ms, tokens,
    preemptions, how it finished and the modes of its steps (where the timeline still holds them)."""
    done = [r for r in requests if r.get("finish_us") is not None and r.get("arrival_us") is not None]
    done.sort(key=lambda r: r["finish_us"] - r["arrival_us"], reverse=True)
    rows = []
    for r in done[:n]:
        lat = request_latencies(r)
        own, _ = _steps_of(steps, r)
        rows.append({"id": r["id"], "e2e_ms": _ms(lat["e2e_us"]), "ttft_ms": _ms(lat["ttft_us"]),
                     "itl_max_ms": _ms(lat["itl_max_us"]), "prompt_tokens": r.get("prompt_tokens"),
                     "output_tokens": r.get("output_tokens"), "preemptions": r.get("preemptions", 0),
                     "finish_reason": r.get("finish_reason"), "modes": sorted({s["mode"] for s in own})})
    return rows


# ---------------------------------------------------------------------------------------------------- the parts

def _steps_of(steps: list, req: dict) -> tuple[list, list]:
    """The steps the request was in, and those that preempted it, found in its window of the step list."""
    rid = req["id"]
    t0 = next((req.get(k) for k in ("arrival_us", "scheduled_us", "first_token_us") if req.get(k) is not None), None)
    t1 = req.get("finish_us")
    lo = 0 if t0 is None else max(0, bisect_left(steps, t0, key=_start) - SLACK_STEPS)
    hi = len(steps) if t1 is None else min(len(steps), bisect_right(steps, t1, key=_start) + SLACK_STEPS)
    window = steps[lo:hi]
    return ([s for s in window if rid in s["request_ids"]],
            [s for s in window if rid in (s.get("preempted") or ()) and rid not in s["request_ids"]])


def _start(rec: dict) -> float:
    t = span_start(rec)
    return t if t is not None else float("-inf")


def _scheduled_at(s: dict) -> float | None:
    """When the scheduler had planned the step: the end of its schedule span (where `scheduled_us` is taken)."""
    span = s["cpu"].get("schedule")
    return span[1] if span else span_start(s)


def _delivered_at(s: dict) -> float | None:
    """When the step's tokens reached their requests: the time telemetry stamps them with (recorder.py)."""
    cpu = s["cpu"]
    done = cpu.get("update") or cpu.get("wait") or max(cpu.values(), key=lambda v: v[1], default=None)
    return done[1] if done else None


def _step_detail(s: dict, rid: str, state: str) -> dict:
    """What the request did in step `s` and what else the step computed. `state` is what the request's own
    tokens say it was doing (prefill until a step delivered it a token), for steps that do not name it."""
    by_request = s.get("prefill_tokens_by_request")
    prefill = s["prefill_tokens"]
    if by_request is not None:
        phase, own = ("prefill", by_request[rid]) if rid in by_request else ("decode", 0)
    elif prefill == 0:
        phase, own = "decode", 0
    else:
        phase = state
        own = 0 if state == "decode" else (prefill if s["num_requests"] == 1 else None)
    others = None if own is None else prefill - own
    comp = s.get("compute_us")
    total = prefill + s["decode_tokens"]
    if others == 0:
        others_us = 0.0
    elif others is not None and comp and total > 0:
        others_us = round((comp[1] - comp[0]) * others / total, 1)
    else:
        others_us = None
    return {"step": s["step"], "mode": s["mode"], "phase": phase, "compute_us": comp,
            "scheduled_us": _scheduled_at(s), "delivered_us": _delivered_at(s), "tokens": total,
            "own_prefill_tokens": own, "others_prefill_tokens": others, "others_prefill_us": others_us,
            "gap_us": s.get("gpu_idle_before_us"), "gap_by_cause_us": dict(s.get("idle_by_cause_us") or {}),
            "resumed": False}


def _spans(req: dict, details: list, preempted: list) -> list[dict]:
    """Queue, then runs of prefill and decode steps (a preemption ends a run), and the preempted spans: each
    `{phase, t0_us, t1_us, first_step, last_step}`, in time order."""
    out = []
    if req.get("arrival_us") is not None and req.get("scheduled_us") is not None:
        out.append({"phase": "queue", "t0_us": req["arrival_us"], "t1_us": req["scheduled_us"],
                    "first_step": None, "last_step": None})
    run = None
    for d in details:
        if run is None or run["phase"] != d["phase"] or d.get("resumed"):
            if run is not None:
                out.append(run)
            start = d["scheduled_us"]
            if run is not None and run["t1_us"] is not None and start is not None and not d.get("resumed"):
                start = max(start, run["t1_us"])          # async plans the next step before the token comes
            run = {"phase": d["phase"], "t0_us": start, "first_step": d["step"]}
        run.update(last_step=d["step"], t1_us=d["delivered_us"])
    if run is not None:
        out.append(run)
    out += [{"phase": "preempted", "t0_us": a, "t1_us": b, "first_step": None, "last_step": None}
            for a, b in preempted]
    return sorted(out, key=lambda sp: (sp["t0_us"] is None, sp["t0_us"] or 0.0))


def _waits(req: dict, details: list, own: list, preempted: list, unknown: list) -> dict:
    queue = _less(req.get("scheduled_us"), req.get("arrival_us"))
    if req.get("arrival_us") is None:
        unknown.append("queue: it arrived before telemetry was attached")
    elif req.get("scheduled_us") is None:
        unknown.append("queue: the step that took it in is not in this timeline")
    first_compute = own[0].get("compute_us") if own else None
    start = _less(first_compute[0] if first_compute else None, req.get("scheduled_us"))
    if own and start is not None and own[0]["cpu"].get("schedule", [None, None])[1] != req.get("scheduled_us"):
        start = None                                     # its first step is not in this timeline
    known = [d for d in details if d["others_prefill_us"] is not None]
    missing = len(details) - len(known)
    if missing:
        no_split = sum(d["others_prefill_tokens"] is None for d in details)
        unknown.append(f"others' prefill in {missing} of its steps: " + (
            "the recording does not say whose prompt tokens they computed" if no_split
            else "their compute span could not be read"))
    gaps = [d for d in details[1:] if d["gap_us"] is not None]
    by_cause: dict[str, float] = {}
    for d in gaps:
        for cause, us in d["gap_by_cause_us"].items():
            by_cause[cause] = round(by_cause.get(cause, 0.0) + us, 1)
    preempted_us = None
    if preempted and all(a is not None and b is not None for a, b in preempted):
        preempted_us = round(sum(b - a for a, b in preempted), 1)
    elif not preempted:
        preempted_us = 0.0
    if own and len(preempted) != (req.get("preemptions") or 0):
        unknown.append(f"preemptions: {req.get('preemptions') or 0} on its record, {len(preempted)} in these steps")
    return {"queue_us": queue, "start_us": start,
            "others_prefill_us": round(sum(d["others_prefill_us"] for d in known), 1) if known else None,
            "others_prefill_tokens": sum(d["others_prefill_tokens"] or 0 for d in details),
            "others_prefill_steps": sum(1 for d in details if (d["others_prefill_tokens"] or 0) > 0),
            "preempted_us": preempted_us, "preemptions": len(preempted),
            "gap_us": round(sum(d["gap_us"] for d in gaps), 1), "gap_by_cause_us": by_cause,
            "gap_steps": sum(1 for d in gaps if d["gap_us"] > 0)}


def _less(a, b):
    return round(a - b, 1) if a is not None and b is not None else None


def _ms(us):
    return round(us / 1000.0, 3) if us is not None else None
