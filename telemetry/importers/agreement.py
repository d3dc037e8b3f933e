"""How well a timeline imported from a profiler trace agrees with batchscope's own recording of the same steps.

Steps are matched by number (batchscope's ranges carry it). The two timelines have different clocks (the
profiler's, the engine's `perf_counter`), so only lengths are compared, never positions:
  - per step, the compute span's length and the gap before it, within `tol_us`;
  - busy % on one definition for both: the union of the matched steps' compute spans over their own extent
    (first compute start to last compute end), on each timeline's clock;
  - idle causes: of batchscope's own idle time between matched steps, the share the import names the same
    (per step and cause, the smaller of the two figures, summed), its `empty_queue` parts left out (no request
    existed: nothing a trace can know). batchscope's `telemetry` (its observer callback, which runs outside the
    engine's ranges) shows in the import as `host_other`: it counts as a mismatch.
Per mode, the idle inside steps that CUDA events cannot see (the import's `gpu_idle_inside_us`).
"""
from __future__ import annotations

from ..summary import union_length

TOL_US = 20.0


def _busy_pct(steps: list) -> float | None:
    spans = [s["compute_us"] for s in steps if s.get("compute_us")]
    if not spans:
        return None
    lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
    return round(100.0 * union_length(spans, lo, hi) / (hi - lo), 3) if hi > lo else None


def _within(pairs: list, tol: float) -> dict:
    diffs = sorted(abs(a - b) for a, b in pairs)
    if not diffs:
        return {"n": 0, "within_pct": None, "p50_us": None, "p95_us": None, "max_us": None}
    pick = lambda q: round(diffs[min(len(diffs) - 1, int(q * (len(diffs) - 1) + 0.5))], 2)   # noqa: E731
    return {"n": len(diffs), "within_pct": round(100.0 * sum(d <= tol for d in diffs) / len(diffs), 2),
            "p50_us": pick(0.5), "p95_us": pick(0.95), "max_us": round(diffs[-1], 2)}


def _cause_match(pairs: list) -> dict:
    own_total = matched = empty = 0.0
    confusion: dict[str, dict[str, float]] = {}
    for imp, own in pairs:
        a, b = imp.get("idle_by_cause_us") or {}, dict(own.get("idle_by_cause_us") or {})
        empty += b.pop("empty_queue", 0.0)          # no request existed: nothing a trace can know, left out
        own_total += sum(b.values())
        for cause, us in b.items():
            matched += min(us, a.get(cause, 0.0))
            rest = us - a.get(cause, 0.0)
            if rest > 0:
                others = {c: v for c, v in a.items() if c != cause and v > b.get(c, 0.0)}
                if others:
                    top = max(others, key=others.get)
                    row = confusion.setdefault(cause, {})
                    row[top] = round(row.get(top, 0.0) + rest, 1)
    return {"own_idle_us": round(own_total, 1), "matched_us": round(matched, 1), "empty_queue_us": round(empty, 1),
            "matched_pct": round(100.0 * matched / own_total, 2) if own_total else None,
            "mismatched_as": confusion}


def compare_steps(imported: dict, own: dict, tol_us: float = TOL_US) -> dict:
    """Agreement of two timelines of the same run (dicts), overall and per mode."""
    mine = {s["step"]: s for s in own["steps"]}
    pairs = [(s, mine[s["step"]]) for s in imported["steps"] if s["step"] in mine]
    out = {"steps_imported": len(imported["steps"]), "steps_own": len(own["steps"]), "steps_matched": len(pairs)}
    out.update(_figures(pairs, tol_us))
    out["per_mode"] = {mode: _figures([p for p in pairs if p[1]["mode"] == mode], tol_us)
                       for mode in ("sync", "async") if any(p[1]["mode"] == mode for p in pairs)}
    return out


def _figures(pairs: list, tol_us: float) -> dict:
    spans = [(a["compute_us"][1] - a["compute_us"][0], b["compute_us"][1] - b["compute_us"][0])
             for a, b in pairs if a.get("compute_us") and b.get("compute_us")]
    gaps = [(a["gpu_idle_before_us"], b["gpu_idle_before_us"]) for a, b in pairs
            if a.get("gpu_idle_before_us") is not None and b.get("gpu_idle_before_us") is not None]
    busy_imp, busy_own = _busy_pct([a for a, _ in pairs]), _busy_pct([b for _, b in pairs])
    inside = [a.get("gpu_idle_inside_us") or 0.0 for a, _ in pairs]
    by_cause: dict[str, float] = {}
    for a, _ in pairs:
        for cause, us in (a.get("idle_inside_by_cause_us") or {}).items():
            by_cause[cause] = by_cause.get(cause, 0.0) + us
    with_gap = [(a, b) for a, b in pairs
                if a.get("gpu_idle_before_us") is not None and b.get("gpu_idle_before_us") is not None]
    return {
        "compute_span": _within(spans, tol_us), "gap_before": _within(gaps, tol_us),
        "busy_pct": {"imported": busy_imp, "own": busy_own,
                     "diff": round(busy_imp - busy_own, 3) if busy_imp is not None and busy_own is not None
                     else None},
        "causes": _cause_match(with_gap),
        "idle_inside_us": {"total": round(sum(inside), 1),
                           "per_step": round(sum(inside) / len(inside), 1) if inside else None,
                           "by_cause": {k: round(v, 1) for k, v in sorted(by_cause.items(), key=lambda kv: -kv[1])}},
    }
