"""The figures a what-if reports, from step and request records in the timeline's shape: the same function for
the recording, the prediction and the measurement, so the three are comparable by construction.

  output_tokens_per_s   output tokens / (last finish - first arrival)
  ttft/itl/tpot/e2e_ms  summary.py's per-request formulas, pooled, {p50, p90, p99}
  busy_pct              device compute time / (last compute end - first compute start - empty-queue gaps)
  step_ms               step period percentiles (compute start to the next one's), empty-queue gaps left out
  idle_ms_by_cause      the steps' idle gaps by cause, summed; preemptions: the requests' preemptions, summed
"""
from __future__ import annotations

from ..stretches import percentiles
from ..summary import request_metrics

LATENCIES = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")
HEADLINE = ("output_tokens_per_s",) + LATENCIES + ("busy_pct", "step_ms")    # predicted with an interval


def _pcts(values) -> dict:
    p = percentiles(values)
    return {"p50": p["p50"], "p90": p["p90"], "p99": p["p99"]}


def figures(steps: list[dict], requests: list[dict]) -> dict:
    done = [r for r in requests if r.get("finish_us") is not None and r.get("arrival_us") is not None]
    metrics = [request_metrics(r) for r in done]
    out: dict = {"requests": len(done), "output_tokens": sum(int(r.get("output_tokens") or 0) for r in done)}
    span_us = (max(r["finish_us"] for r in done) - min(r["arrival_us"] for r in done)) if done else 0.0
    out["duration_s"] = round(span_us / 1e6, 6) if span_us > 0 else None
    out["output_tokens_per_s"] = round(out["output_tokens"] / (span_us / 1e6), 3) if span_us > 0 else None
    for name in LATENCIES:
        vals = ([x for m in metrics for x in m["itl_ms"]] if name == "itl_ms" else [m[name] for m in metrics])
        out[name] = _pcts(vals)
    timed = [s for s in steps if s.get("compute_us")]
    out["busy_pct"] = _busy(timed)
    out["step_ms"] = _pcts(_periods(timed))
    idle: dict[str, float] = {}
    for s in timed[1:]:
        for cause, us in (s.get("idle_by_cause_us") or {}).items():
            idle[cause] = idle.get(cause, 0.0) + us / 1000.0
    out["idle_ms_by_cause"] = {k: round(v, 3) for k, v in sorted(idle.items())}
    out["preemptions"] = sum(int(r.get("preemptions") or 0) for r in done)
    out["steps"] = len(timed)
    return out


def _empty(step: dict) -> float:
    return float((step.get("idle_by_cause_us") or {}).get("empty_queue", 0.0))


def _busy(steps: list[dict]) -> float | None:
    if len(steps) < 2:
        return None
    span = steps[-1]["compute_us"][1] - steps[0]["compute_us"][0] - sum(_empty(s) for s in steps[1:])
    compute = sum(s["compute_us"][1] - s["compute_us"][0] for s in steps)
    return round(min(100.0, 100.0 * compute / span), 2) if span > 0 else None


def _periods(steps: list[dict]) -> list[float]:
    return [(b["compute_us"][0] - a["compute_us"][0] - _empty(b)) / 1000.0 for a, b in zip(steps, steps[1:])]


def error_pct(predicted: dict, measured: dict) -> dict:
    """100 x (predicted - measured) / measured for every headline figure both know (None where either does not)."""
    out: dict = {}
    for name in HEADLINE:
        p, m = predicted.get(name), measured.get(name)
        if isinstance(p, dict):
            out[name] = {q: _err(p.get(q), (m or {}).get(q)) for q in ("p50", "p90", "p99")}
        else:
            out[name] = _err(p, m)
    return out


def _err(p, m):
    if p is None or m is None or not m:
        return None
    return round(100.0 * (p - m) / m, 2)
