"""A sweep point's figures from its requests' client-side timings, and what a whole curve says: its knee and the
rates that meet the SLOs.

Per point: throughput over the point's window (its first send to its last answer, as `vllm bench serve` counts
duration), TTFT/ITL/TPOT/E2E percentiles, SLO attainment (the share of the point's requests that met every SLO;
failed requests, arrivals that could not be sent and requests still running at the drain bound count as misses,
requests cancelled by a stop are left out)
and goodput (the requests that met every SLO, per second of the window). The raw values behind the percentiles
are kept apart (`point_values`), for the CDFs.

The knee of a curve: points in the order of the load they were offered (synchronous, rising rates, throughput),
throughput x (requests/s) and latency y each scaled to 0-1 over the curve; the knee is the point with the largest
x - y, the one that reaches furthest into the throughput range for the least of the latency range (the Kneedle
rule, Satopaa et al. 2011, for a rising convex curve). A curve that does not turn up (its highest latency under
KNEE_MIN_RISE times its lowest, or x - y nowhere above KNEE_MIN_GAP) has no knee.
"""
from __future__ import annotations

import random

from batchscope.telemetry import percentiles

from ..client_timing import LATENCIES, RequestTiming
from .spec import SLO

STATS = ("p50", "p90", "p99")
MAX_VALUES = 5000           # raw values kept per latency per point (a seeded uniform sample beyond that)
KNEE_MIN_RISE = 1.5
KNEE_MIN_GAP = 0.05
CURVE_METRICS = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")

__all__ = ["request_latency", "meets_slo", "point_figures", "point_values", "knee", "curve_summary", "STATS",
           "CURVE_METRICS", "none_met_why"]


def request_latency(t: RequestTiming) -> dict[str, float | None]:
    """One finished request's TTFT, TPOT (mean gap after the first token) and E2E in ms (None where undefined)."""
    lat = t.latencies()
    return {k: (lat[k][0] if lat[k] else None) for k in ("ttft_ms", "tpot_ms", "e2e_ms")}


def meets_slo(lat: dict[str, float | None], slo: SLO) -> bool:
    """Every SLO met. A request of one token has no gap after its first: the ITL SLO cannot fail it (vLLM's
    goodput counts its TPOT as 0 the same way). A request without a first token fails a TTFT SLO."""
    checks = (("ttft_ms", slo.ttft_ms), ("tpot_ms", slo.itl_ms), ("e2e_ms", slo.e2e_ms))
    for key, limit in checks:
        if limit is None:
            continue
        v = lat.get(key)
        if v is None:
            if key == "tpot_ms":
                continue
            return False
        if v > limit:
            return False
    return True


def _stats(values: list[float]) -> dict:
    p = percentiles(values)
    return {"p50": p["p50"], "p90": p["p90"], "p99": p["p99"], "mean": p["mean"], "n": p["n"]}


def point_figures(timings: list[RequestTiming], start_ns: int, end_ns: int, slo: SLO, cancelled: int = 0,
                  skipped: int = 0, cut: int = 0) -> dict:
    """The point's figures over [start_ns, end_ns]. `timings` are the requests that ended by themselves
    (finished or failed); `cancelled` were cancelled, `cut` of them because they were still running at the drain
    bound (those count as SLO misses, the others ended at a stop and are left out); `skipped` arrivals were never
    sent (misses too)."""
    ok = [t for t in timings if t.ok]
    values: dict[str, list[float]] = {k: [] for k in LATENCIES}
    good = 0
    for t in ok:
        for k, vs in t.latencies().items():
            values[k].extend(vs)
        good += meets_slo(request_latency(t), slo)
    duration_s = max(end_ns - start_ns, 1) / 1e9
    judged = len(timings) + skipped + cut
    out_tokens = sum(t.output_tokens for t in ok)
    return {"duration_s": round(duration_s, 6), "sent": len(timings) + cancelled, "completed": len(ok),
            "failed": len(timings) - len(ok), "cancelled": cancelled, "skipped": skipped,
            "prompt_tokens": sum(t.prompt_tokens for t in ok), "output_tokens": out_tokens,
            "requests_per_s": len(ok) / duration_s, "output_tokens_per_s": out_tokens / duration_s,
            **{k: _stats(values[k]) for k in CURVE_METRICS},
            "slo_attainment": good / judged if judged else None, "goodput_rps": good / duration_s}


def point_values(timings: list[RequestTiming], seed: int = 0, cap: int = MAX_VALUES) -> dict:
    """The raw values behind a point's percentiles, for CDFs and histograms: per finished request its TTFT, TPOT,
    E2E and engine id (`request_id`: its record in the timeline), lists aligned by request in the order the
    requests were sent, and every gap between tokens (ITL) with the engine id of the request it belongs to
    (`itl_request_id`, aligned with `itl_ms`). Beyond `cap` requests (or gaps) a seeded uniform sample of `cap` is
    kept, in order, the per-request lists sampled together and each gap with its id; `n` says how many there
    were."""
    ok = [t for t in sorted(timings, key=lambda t: t.sent_ns) if t.ok]
    rng = random.Random(seed)
    if len(ok) > cap:
        ok_kept = [ok[i] for i in sorted(rng.sample(range(len(ok)), cap))]
    else:
        ok_kept = ok
    per = [request_latency(t) for t in ok_kept]
    out: dict = {k: [_round(p[k]) for p in per] for k in ("ttft_ms", "tpot_ms", "e2e_ms")}
    out["request_id"] = [t.request_id for t in ok_kept]
    gaps = [(v, t.request_id) for t in ok for v in t.latencies()["itl_ms"]]
    out["n"] = {"ttft_ms": len(ok), "tpot_ms": len(ok), "e2e_ms": len(ok), "itl_ms": len(gaps)}
    if len(gaps) > cap:
        gaps = [gaps[i] for i in sorted(rng.sample(range(len(gaps)), cap))]
    out["itl_ms"] = [_round(v) for v, _ in gaps]
    out["itl_request_id"] = [rid for _, rid in gaps]
    return out


def _round(v: float | None) -> float | None:
    return round(v, 4) if v is not None else None


def _scaled(vals: list[float]) -> list[float]:
    lo, hi = min(vals), max(vals)
    return [(v - lo) / (hi - lo) if hi > lo else 0.0 for v in vals]


def knee(points: list[dict], metric: str, stat: str = "p50") -> int | None:
    """The index (into `points`) of the curve's knee by the rule in this module's docstring, or None."""
    usable = [(i, p["requests_per_s"], (p.get(metric) or {}).get(stat)) for i, p in enumerate(points)
              if p.get("complete", True)]
    usable = [(i, x, y) for i, x, y in usable if x is not None and y is not None]
    if len(usable) < 3:
        return None
    ys = [y for *_, y in usable]
    if max(ys) < KNEE_MIN_RISE * max(min(ys), 1e-9):
        return None
    gaps = [xn - yn for xn, yn in zip(_scaled([x for _, x, _ in usable]), _scaled(ys))]
    best = max(range(len(usable)), key=gaps.__getitem__)
    return usable[best][0] if gaps[best] > KNEE_MIN_GAP else None


def _rate(points: list[dict], i: int | None) -> dict | None:
    if i is None:
        return None
    p = points[i]
    return {"index": i, "kind": p["kind"], "offered_rate": p["offered_rate"], "requests_per_s": p["requests_per_s"],
            "output_tokens_per_s": p["output_tokens_per_s"], "slo_attainment": p["slo_attainment"]}


def curve_summary(points: list[dict], target: float, slo: SLO | None = None) -> dict:
    """One mode's curve: the knee of each latency (p50 and p99), the highest throughput whose point met the SLO
    target (`slo_max`), and the first point, in load order, that fell below it (`slo_exit`: where the mode leaves
    the SLOs); when no point met it, why (`slo_none_why`, from the lowest load's figures). Points are in the order
    they ran: synchronous, throughput, then the rising rates."""
    order = sorted(range(len(points)), key=lambda i: _load_rank(points[i]))
    ranked = [points[i] for i in order]
    knees = {}
    for metric in CURVE_METRICS:
        knees[metric] = {}
        for stat in ("p50", "p99"):
            k = knee(ranked, metric, stat)
            knees[metric][stat] = _rate(ranked, k) if k is not None else None
            if knees[metric][stat] is not None:
                knees[metric][stat]["index"] = order[k]
    complete = [i for i in order if points[i].get("complete", True) and points[i]["slo_attainment"] is not None]
    meeting = [i for i in complete if points[i]["slo_attainment"] >= target]
    best = max(meeting, key=lambda i: points[i]["requests_per_s"]) if meeting else None
    exit_ = next((i for i in complete if points[i]["slo_attainment"] < target), None)
    why = none_met_why(points[complete[0]], slo or SLO(target=target), target) if complete and not meeting else None
    return {"knees": knees, "slo_target": target, "slo_max": _rate(points, best), "slo_exit": _rate(points, exit_),
            "slo_none_why": why}


SLO_CHECKS = (("ttft_ms", "ttft_ms", "TTFT"), ("itl_ms", "tpot_ms", "ITL"), ("e2e_ms", "e2e_ms", "E2E"))


def none_met_why(lowest: dict, slo: SLO, target: float) -> str:
    """Why no rate met the SLOs, in words, from the lowest load's point (if that one misses, every rate does):
    "no rate met ITL p99 ≤ 50 ms: the lowest load's ITL p99 was 180 ms (0: synchronous)". Where its p99s are
    all within the SLOs, its attainment fell short some other way (a slower 1% in between, or failed, skipped or
    cut requests)."""
    over = []
    for key, field, name in SLO_CHECKS:
        limit, p99 = getattr(slo, key), (lowest.get(field) or {}).get("p99")
        if limit is not None and p99 is not None and p99 > limit:
            over.append((name, limit, p99))
    where = f"the lowest load ({lowest['index']}: {lowest['kind']})"
    if over:
        asked = " and ".join(f"{n} p99 ≤ {limit:g} ms" for n, limit, _ in over)
        was = ", ".join(f"{n} p99 {p99:,.0f} ms" for n, _, p99 in over)
        return f"no rate met {asked}: {where} had {was}"
    att = lowest.get("slo_attainment") or 0.0
    return (f"no rate had {target:.0%} of its requests meet the SLOs: {where} had {att:.0%} "
            f"(failed, skipped and cut requests count as misses)")


def _load_rank(p: dict) -> tuple:
    """Synchronous first, then offered rates rising, throughput last: the load each point offered."""
    if p["kind"] == "synchronous":
        return (0, 0.0)
    if p["kind"] == "throughput":
        return (2, 0.0)
    return (1, p["offered_rate"] or 0.0)
