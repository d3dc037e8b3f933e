"""The point shape other tools' reports are read into (reports.py, guidellm.py): latency summaries of raw
values, points with every figure present or None, the raw values kept for CDFs, attainment and goodput under our
SLO, and the error a report that is not what it claims raises."""
from __future__ import annotations

import math

from batchscope.telemetry import percentiles

from ..sweep.curves import MAX_VALUES, meets_slo
from ..sweep.spec import SLO


class ReportError(ValueError):
    """The report is not what it claims to be (a 400 on upload, a CLI error)."""


def latency(values) -> dict:
    """{p50, p90, p99, mean, n} of raw values (ms), as our own points have them."""
    p = percentiles([v for v in values if v is not None and not _nan(v)])
    return {"p50": p["p50"], "p90": p["p90"], "p99": p["p99"], "mean": p["mean"], "n": p["n"]}


def _nan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


def empty_latency() -> dict:
    return {"p50": None, "p90": None, "p99": None, "mean": None, "n": 0}


def capped(values: list) -> list:
    """At most MAX_VALUES of them, evenly strided (reports are already samples; no need for a random one)."""
    if len(values) <= MAX_VALUES:
        return values
    step = len(values) / MAX_VALUES
    return [values[int(i * step)] for i in range(MAX_VALUES)]


def per_request_figures(per: list[dict], duration_s: float | None, slo: SLO | None) -> dict:
    """Attainment and goodput from per-request {ttft_ms, tpot_ms, e2e_ms}, with our SLO; {} without either."""
    if not per or slo is None:
        return {}
    good = sum(meets_slo(r, slo) for r in per)
    return {"slo_attainment": good / len(per),
            "goodput_rps": good / duration_s if duration_s else None}


def point(series: str, index: int, **fields) -> dict:
    base = {"index": index, "mode": series, "kind": "constant", "offered_rate": None, "concurrency": None,
            "complete": True, "requests_per_s": None, "output_tokens_per_s": None, "slo_attainment": None,
            "goodput_rps": None}
    base.update(fields)
    for k in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        base.setdefault(k, empty_latency())
    return base


def distributions(per: list[dict], itl: list[float]) -> dict:
    out = {k: capped([r.get(k) for r in per]) for k in ("ttft_ms", "tpot_ms", "e2e_ms")}
    out["itl_ms"] = capped(itl)
    out["n"] = {"ttft_ms": len(per), "tpot_ms": len(per), "e2e_ms": len(per), "itl_ms": len(itl)}
    return out
