"""One served run's figures, and their medians over repeats.

Client side (what a server's user would see; app/loadtest/client_timing.py's definitions, the ones POST /api/ab
reports): TTFT, TPOT, ITL and E2E percentiles from each request's streamed chunks, output tokens/s and requests/s
over the plan's time zero to the last finish, the ITL tail ratio (p99 / p50), and how late the sender was against
the plan. Engine side, from the run's timeline (steps.py): event busy % with and without the empty-queue idle,
idle by cause, and the steps split by kind.

The standard library, batchscope.telemetry and app/loadtest's metrics only.
"""
from __future__ import annotations

import statistics

from batchscope.telemetry import percentiles
from batchscope.telemetry.summary import request_metrics

from ...loadtest.client_timing import LATENCIES, burst_metrics
from ..summary_table import _digest
from .workload import requests_digest
from ..steps import budget_figures, busy_figures, kind_figures, step_kind


def client_figures(sent: list, start_ns: int, end_ns: int) -> dict:
    m = burst_metrics([s.timing for s in sent], start_ns, end_ns)
    latency = {k: m[k] for k in LATENCIES}
    itl = latency["itl_ms"]
    lengths = [len(s.output.token_ids) if s.output is not None else None for s in sent]
    planned = [s.plan.max_new_tokens for s in sent]
    return {
        "wall_s": round(m["duration_s"], 6), "completed": m["completed"], "failed": m["failed"],
        "output_tokens": m["output_tokens"], "expected_tokens": sum(planned),
        "output_tokens_per_s": round(m["output_tokens_per_s"], 2), "requests_per_s": round(m["requests_per_s"], 3),
        "lengths_ok": lengths == planned and m["failed"] == 0,
        "finish_reasons": _count(s.timing.finish_reason for s in sent),
        "errors": sorted({s.error for s in sent if s.error})[:5],
        "latency_ms": {k.removesuffix("_ms"): v for k, v in latency.items()}, "latency_basis": "client",
        "itl_p99_over_p50": round(itl["p99"] / itl["p50"], 3) if itl["p50"] and itl["p99"] is not None else None,
        "sender_lag_ms": _lag(sent),
        # what was sent, as sent: (offset, prompt ids, length), for the same-requests check across runs
        "submitted": {"requests": len(sent), "digest": _submitted_digest(sent),
                      "prompt_tokens": [len(s.prompt) for s in sent], "new_tokens": planned},
        "output_lengths": lengths,
        "token_ids": [s.output.token_ids if s.output is not None else None for s in sent],
    }


def _submitted_digest(sent: list) -> str:
    return requests_digest([(s.plan.offset_s, s.prompt, s.max_new_tokens) for s in sent])


def _lag(sent: list) -> dict:
    lags = [s.lag_ms for s in sent]
    p = percentiles(lags)
    return {"p50": p["p50"], "p99": p["p99"], "max": round(max(lags), 3) if lags else None}


def timeline_figures(timeline: dict) -> dict:
    """Busy %, idle by cause and the step split from one run's timeline (its steps, one mode, in order)."""
    steps = timeline["steps"]
    kinds = kind_figures(steps)
    rec = (timeline.get("meta") or {}).get("recording") or {}
    return {"busy": busy_figures(steps),
            "steps": {"total": len(steps), "modes": _count(r["mode"] for r in steps),
                      "by_kind": kinds, "kinds_sum": sum(k["steps"] for k in kinds.values()),
                      "first_kind": step_kind(steps[0]) if steps else None},
            "budget": budget_figures(steps),
            "engine_latency_ms": engine_latency(timeline),
            "recording": {"full": rec.get("full"), "truncated": rec.get("truncated"),
                          "dropped": rec.get("dropped")}}


def engine_latency(timeline: dict) -> dict:
    """TTFT/TPOT/ITL/E2E percentiles from the engine's own times (telemetry's request records: arrival at submit,
    each token when the host learned it), the same definitions as the client's."""
    ms = [request_metrics(q) for q in timeline["requests"] if q.get("finish_us") is not None]
    return {"ttft": percentiles(m["ttft_ms"] for m in ms), "tpot": percentiles(m["tpot_ms"] for m in ms),
            "itl": percentiles(x for m in ms for x in m["itl_ms"]), "e2e": percentiles(m["e2e_ms"] for m in ms)}


def latency_from_engine(m: dict) -> dict:
    """A run sent without streaming has no client-side token times: its latencies are the engine's."""
    lat = m["latency_ms"] = m["engine_latency_ms"]
    p50, p99 = lat["itl"]["p50"], lat["itl"]["p99"]
    m["itl_p99_over_p50"] = round(p99 / p50, 3) if p50 and p99 is not None else None
    m["latency_basis"] = "engine"
    return m


def nvml_mean(timeline: dict) -> dict:
    s = timeline.get("summary") or {}
    return {"nvml_util_pct": s.get("gpu_util_mean"), "sm_clock_mhz": s.get("sm_clock_mhz_mean"),
            "power_w": s.get("power_w_mean"), "host_cpu_pct": s.get("cpu_pct_mean")}


def finish_run(m: dict, reference: list | None) -> dict:
    """Token fingerprint and agreement with the first timed run (request by request, in plan order); the token
    lists themselves leave the record."""
    tokens = m.pop("token_ids")
    m["tokens_digest"] = _digest(tokens)
    if reference is not None:
        same = sum(a == b for a, b in zip(tokens, reference))
        m["tokens_agree_with_first_run"] = same / len(reference) if reference else None
    return m


def medians(runs: list[dict], missing_is_zero: bool = False) -> dict:
    """The runs' figures with every number replaced by its median over the runs, dicts merged key by key; other
    values are the first run's. Inside an idle-by-cause dict a cause missing from a run counts as 0 there."""
    out = {}
    for k in dict.fromkeys(k for r in runs for k in r):
        vals = [r.get(k) for r in runs]
        v0 = next((v for v in vals if v is not None), None)
        if isinstance(v0, dict):
            causes = "by_cause" in k
            out[k] = medians([v if isinstance(v, dict) else {} for v in vals], causes)
            if causes:
                out[k] = dict(sorted(out[k].items(), key=lambda kv: -(kv[1] or 0)))
        elif isinstance(v0, (int, float)) and not isinstance(v0, bool):
            nums = [0 if v is None and missing_is_zero else v for v in vals]
            nums = [x for x in nums if isinstance(x, (int, float))]
            out[k] = round(statistics.median(nums), 6) if nums else None
        else:
            out[k] = v0
    return out


def _count(items) -> dict:
    out: dict = {}
    for x in items:
        out[str(x)] = out.get(str(x), 0) + 1
    return out
