"""Stretches of steps and the arithmetic the figures, the summary and the forecast build on: runs of consecutive
steps of one mode, the period of each step in a run (pauses in the load left out), percentiles, and the length a
set of spans covers."""
from __future__ import annotations

import statistics


def percentiles(values, qs=(50, 90, 99)) -> dict:
    """{"n", "mean", "p50", ...} for whole percents `qs` in 1..99, interpolated between ranks (numpy's default);
    None values when there is no data."""
    vals = [v for v in values if v is not None]
    out = {"n": len(vals), "mean": round(statistics.fmean(vals), 3) if vals else None}
    # statistics.quantiles wants two points at least; one point is every percentile of itself
    cuts = statistics.quantiles(vals, n=100, method="inclusive") if len(vals) > 1 else vals * 99
    for q in qs:
        out[f"p{q}"] = round(cuts[q - 1], 3) if cuts else None
    return out


def stretches(steps, mode: str | None = None) -> list[list[dict]]:
    """Runs of consecutive steps (step numbers without a hole) of one mode, in order; only `mode`'s if given."""
    runs: list[list[dict]] = []
    for rec in steps:
        last = runs[-1] if runs else None
        if last and last[-1]["mode"] == rec["mode"] and rec["step"] == last[-1]["step"] + 1:
            last.append(rec)
        else:
            runs.append([rec])
    return [r for r in runs if mode is None or r[0]["mode"] == mode]


def empty_queue_us(rec: dict) -> float:
    """The part of the gap before a step when no request existed at all: no loop could have filled it."""
    return float((rec.get("idle_by_cause_us") or {}).get("empty_queue", 0.0))


def run_periods(run: list[dict]) -> list[tuple[dict, float]]:
    """(step, ms) for each step of a stretch but its last: compute start to the next step's compute start, less
    any empty-queue gap before that next step (what "ms/step" means in a benchmark, pauses in the load left out)."""
    return [(a, (b["compute_us"][0] - a["compute_us"][0] - empty_queue_us(b)) / 1000.0)
            for a, b in zip(run, run[1:]) if a.get("compute_us") and b.get("compute_us")]


def union_length(intervals, lo: float, hi: float) -> float:
    """Total length covered by the intervals, clipped to [lo, hi]."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals):
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total
