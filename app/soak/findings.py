"""The soak test's report: what every request came to, the server's state before and after, and the verdict."""
from __future__ import annotations

import collections
import json
import statistics
import time
from dataclasses import asdict, dataclass, field

from .client import ROUTES, Outcome, Plan, flag_outcome, payload
from .viewers import Flipper, Viewer

MAX_FAILURES_KEPT = 50              # detailed examples in the report; the counts cover everything


@dataclass
class SoakRun:
    """Everything a finished run saw, for the report."""
    args: object                    # the command line (argparse.Namespace)
    plans: list[Plan]
    outcomes: list[Outcome]         # one per request that ran (missing ones were never answered)
    wall_s: float
    health: dict                    # GET /api/health before the run
    status_start: dict              # GET /api/status before and after the run
    status_end: dict
    settled: bool                   # the server drained and gave its KV blocks back in time
    flipper: Flipper | None
    viewers: list[Viewer]
    viewer_note: str | None
    samples: list[dict] = field(default_factory=list)      # GET /api/status during the run
    status_errors: list[str] = field(default_factory=list)
    at_end: dict = field(default_factory=dict)             # the last sample, taken before the viewers left


def _ms_stats(xs: list[float]) -> dict:
    """p50/p90/p99 and max of durations in s, as ms."""
    cuts = statistics.quantiles(xs, n=100, method="inclusive") if len(xs) > 1 else xs * 99
    return {"n": len(xs), **{f"p{q}": round(cuts[q - 1] * 1e3, 2) if cuts else None for q in (50, 90, 99)},
            "max": round(max(xs) * 1e3, 2) if xs else None}


def _mark_shared_ids(outcomes: list[Outcome]) -> None:
    """A server id handed to two different requests means answers got crossed or repeated."""
    owners: dict[str, set[int]] = collections.defaultdict(set)
    for o in outcomes:
        if o.server_id:
            owners[o.server_id].add(o.n)
    for sid, ns in owners.items():
        if len(ns) > 1:
            for o in outcomes:
                if o.n in ns:
                    flag_outcome(o, "duplicated", f"server id {sid} also answered requests {sorted(ns - {o.n})[:5]}")


def _canary_mismatches(plans: list[Plan], outcomes: list[Outcome]) -> tuple[int, list[dict]]:
    """Greedy answers to one fixed prompt must agree across modes, batches and preemptions: count the answers
    that differ from the most common one of their group (route family x prompt)."""
    groups: dict[tuple, list[Outcome]] = collections.defaultdict(list)
    for o in outcomes:
        p = plans[o.n]
        if p.canary is not None and o.status == "completed" and not o.wrong_length and o.answer is not None:
            groups[(p.route, p.canary)].append(o)
    bad, examples = 0, []
    for key, group in groups.items():
        counts = collections.Counter(json.dumps(o.answer) for o in group)
        ref, _ = counts.most_common(1)[0]
        for o in group:
            if json.dumps(o.answer) != ref:
                bad += 1
                if len(examples) < 10:
                    examples.append({"n": o.n, "route": o.route, "stream": o.stream, "canary": key[1],
                                     "answer": o.answer, "majority": json.loads(ref)})
    return bad, examples


def report(run: SoakRun) -> dict:
    plans, outcomes, wall = run.plans, run.outcomes, run.wall_s
    _mark_shared_ids(outcomes)
    completed = [o for o in outcomes if o.status == "completed"]
    tokens = sum(o.output_tokens or 0 for o in completed)
    failures = [dict(asdict(o), answer=None) for o in outcomes if o.bad][:MAX_FAILURES_KEPT]
    for f in failures:
        f["payload"] = payload(plans[f["n"]])
    canary_bad, canary_examples = _canary_mismatches(plans, outcomes)
    errors = _errors_by_kind(run)
    result = {
        "tool": "batchscope soak",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(time.time() - wall)),
        "config": {k: v for k, v in vars(run.args).items() if k not in ("token", "func")},
        "server": {k: run.health.get(k) for k in ("model", "device", "mode")},
        "requests": _request_counts(plans, outcomes, canary_bad),
        "errors_total": sum(errors.values()),
        "errors_by_kind": errors,
        "lost_by_kind": _lost_by_kind(plans, outcomes),
        "latency_ms": {"e2e": _ms_stats([o.e2e_s for o in completed if o.e2e_s is not None]),
                       "ttft_stream": _ms_stats([o.ttft_s for o in completed if o.stream and o.ttft_s is not None])},
        "throughput": {"wall_s": round(wall, 2), "requests_per_s": round(len(completed) / wall, 2) if wall else None,
                       "output_tokens": tokens, "output_tokens_per_s": round(tokens / wall, 1) if wall else None},
        "mode_flips": _flips(run),
        "viewers": _viewers(run),
        "server_rss_mb": _rss(run),
        "kv": _kv(run),
        "status_errors": list(run.status_errors)[:10],
        "samples": list(run.samples),
        "failures": failures,
        "canary_mismatch_examples": canary_examples,
    }
    r = result["requests"]
    result["ok"] = not (result["errors_total"] or r["lost"] or r["duplicated"] or r["wrong_length"]
                        or r["canary_mismatches"] or result["kv"]["leak"])
    return result


def _request_counts(plans: list[Plan], outcomes: list[Outcome], canary_bad: int) -> dict:
    by = collections.Counter(o.status for o in outcomes)
    return {
        "planned": len(plans), "sent": sum(o.sent for o in outcomes), "completed": by["completed"],
        "cancelled": by["cancelled"], "errors": by["error"], "lost": by["lost"] + len(plans) - len(outcomes),
        "duplicated": sum(o.duplicated for o in outcomes),
        "wrong_length": sum(o.wrong_length and not o.duplicated for o in outcomes),
        "canary_mismatches": canary_bad, "canaries": sum(1 for p in plans if p.canary is not None),
        "by_route": {f"{r}{'/stream' if s else ''}": sum(1 for o in outcomes if o.route == r and o.stream == s)
                     for r in ROUTES for s in (False, True)},
    }


def _errors_by_kind(run: SoakRun) -> dict:
    errors = dict(collections.Counter(o.kind for o in run.outcomes if o.status == "error"))
    flip_errors = run.flipper.errors if run.flipper else []
    viewer_errors = [v for v in run.viewers if v.error]
    for kind, found in (("mode_flip", flip_errors), ("viewer", viewer_errors), ("status", run.status_errors)):
        if found:
            errors[kind] = len(found)
    return errors


def _lost_by_kind(plans: list[Plan], outcomes: list[Outcome]) -> dict:
    lost = dict(collections.Counter(o.kind for o in outcomes if o.status == "lost"))
    missing = len(plans) - len(outcomes)
    return dict(lost, **({"never_answered": missing} if missing else {}))


def _flips(run: SoakRun) -> dict:
    errors = run.flipper.errors if run.flipper else []
    return {"done": run.flipper.done if run.flipper else 0, "errors": len(errors), "error_examples": errors[:5],
            "every_s": run.args.flip_every}


def _viewers(run: SoakRun) -> dict:
    viewers = run.viewers
    preempted = set().union(*(v.preempted for v in viewers)) if viewers else set()
    stalled = [v for v in viewers if v.stalled]
    hub_start = ((run.status_start.get("telemetry") or {}).get("hub") or {}).get("dropped_frames")
    return {
        "started": len(viewers), "note": run.viewer_note,
        "errors": [f"viewer {v.i}: {v.error}" for v in viewers if v.error][:10],
        "messages_min": min((sum(v.messages.values()) for v in viewers if not v.stalled), default=None),
        "messages_total": sum(sum(v.messages.values()) for v in viewers),
        "dropped_frames_total": sum(v.dropped_frames for v in viewers),
        "catch_ups_total": sum(v.messages.get("catch_up", 0) for v in viewers),
        "hub_queued_bytes_max": max((x["hub_queued_bytes"] for x in run.samples
                                     if isinstance(x.get("hub_queued_bytes"), int)), default=None),
        "mode_changes_seen_max": max((v.modes_seen for v in viewers), default=None),
        "preempted_requests_seen": len(preempted),
        "stalled_viewer": None if not stalled else
        ("disconnected by the server" if stalled[0].closed_by_server else "never read a message"),
        "server_count_at_end": run.at_end.get("viewers"),
        "server_dropped_frames": _delta(run.at_end.get("hub_dropped_frames"), hub_start),
    }


def _rss(run: SoakRun) -> dict:
    rss0, rss1 = run.status_start.get("rss_mb"), run.status_end.get("rss_mb")
    # RSS at half-way: warm-up (allocator pools, bounded rings filling) is over by then, a leak keeps growing
    mid = next((x["rss_mb"] for x in run.samples
                if x.get("rss_mb") is not None and x["done"] >= len(run.plans) / 2), None)
    return {"start": rss0, "end": rss1, "growth": _delta(rss1, rss0), "half_way": mid,
            "growth_second_half": _delta(rss1, mid)}


def _kv(run: SoakRun) -> dict:
    st0, st1 = run.status_start, run.status_end
    return {"blocks_used_start": st0.get("kv_blocks_used"), "blocks_used_end": st1.get("kv_blocks_used"),
            "blocks_total": st1.get("kv_blocks_total"), "queue_end": st1.get("queue"),
            "running_end": st1.get("running"), "inflight_end": st1.get("inflight"), "leak": not run.settled,
            "settle_timeout_s": run.args.settle_timeout}


def _delta(end, start):
    return round(end - start, 1) if isinstance(end, (int, float)) and isinstance(start, (int, float)) else None


def format_report(res: dict) -> str:
    r, lat, thr, rss, kv, v = (res["requests"], res["latency_ms"], res["throughput"], res["server_rss_mb"],
                               res["kv"], res["viewers"])

    def kinds(d: dict) -> str:
        return " (" + ", ".join(f"{k} {n}" for k, n in sorted(d.items())) + ")" if d else ""

    def mb(x) -> str:
        return "n/a" if x is None else f"{x:.1f} MB"

    lines = [
        f"requests   sent {r['sent']}/{r['planned']}, completed {r['completed']}, cancelled {r['cancelled']}",
        f"errors     {res['errors_total']}{kinds(res['errors_by_kind'])}",
        f"lost       {r['lost']}{kinds(res['lost_by_kind'])}",
        f"duplicated {r['duplicated']}   wrong length {r['wrong_length']}   "
        f"canary mismatches {r['canary_mismatches']} (of {r['canaries']} canaries)",
        f"latency    e2e p50 {lat['e2e']['p50']} ms, p99 {lat['e2e']['p99']} ms; "
        f"TTFT (streamed) p50 {lat['ttft_stream']['p50']} ms, p99 {lat['ttft_stream']['p99']} ms",
        f"throughput {thr['requests_per_s']} req/s, {thr['output_tokens_per_s']} output tokens/s "
        f"over {thr['wall_s']} s",
        f"mode flips {res['mode_flips']['done']} (every {res['mode_flips']['every_s']} s, "
        f"{res['mode_flips']['errors']} failed)",
        f"viewers    {v['started']}" + (f" ({v['note']})" if v["note"] else "") +
        (f": min {v['messages_min']} messages per reader, {v['dropped_frames_total']} frames dropped "
         f"({v['catch_ups_total']} catch-ups), the "
         f"stalled one {v['stalled_viewer']}, server counted {v['server_count_at_end']} at the end; "
         f"{v['preempted_requests_seen']} preempted requests seen" if v["started"] else ""),
        f"server RSS start {mb(rss['start'])}, end {mb(rss['end'])}, growth "
        + ("n/a" if rss["growth"] is None else f"{rss['growth']:+.1f} MB")
        + ("" if rss["growth_second_half"] is None else
           f" ({rss['growth_second_half']:+.1f} MB over the second half of the requests)"),
        f"KV blocks  used {kv['blocks_used_start']} at start, {kv['blocks_used_end']} at end "
        f"(of {kv['blocks_total']}); queue {kv['queue_end']}, running {kv['running_end']}: "
        + ("LEAK" if kv["leak"] else "no leak"),
        "result     " + ("OK" if res["ok"] else "FAILED"),
    ]
    for f in res["failures"][:5]:
        lines.append(f"  failure: #{f['n']} {f['route']}{'/stream' if f['stream'] else ''} {f['status']} "
                     f"{f['kind'] or ''} {f['detail'] or ''}")
    return "\n".join(lines)
