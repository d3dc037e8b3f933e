"""A timeline's steps split by kind, and the GPU's idle time over them: what the served workload's figures and
benchmarks/served_idle.py read from a batchscope.timeline/1 file.

A step is "decode" when it carries no prefill token (decode-only) and "prefill" when it carries a prefill chunk
(with or without decodes beside it). The idle gap before a step (`gpu_idle_before_us`, split by cause in
`idle_by_cause_us`) belongs to that step: it is the time the GPU waited for it. A step's period is its compute
start to the next step's compute start, less any empty-queue part of the gap before that next step
(telemetry.stretches.run_periods): how long the step held the pipeline.

The standard library and batchscope.telemetry only.
"""
from __future__ import annotations

from batchscope.telemetry import percentiles
from batchscope.telemetry.stretches import empty_queue_us, run_periods
from batchscope.telemetry.summary import union_length

KINDS = ("decode", "prefill")
HOST_PHASES = ("schedule", "fill", "launch", "wait", "update")     # engine.trace's, in loop order
EMPTY = "empty_queue"


def step_kind(rec: dict) -> str:
    return "prefill" if rec.get("prefill_tokens") else "decode"


def _ms(us: float) -> float:
    return round(us / 1e3, 3)


def by_cause_ms(totals: dict[str, float]) -> dict[str, float]:
    """{cause: µs} -> {cause: ms}, largest first."""
    return {k: _ms(v) for k, v in sorted(totals.items(), key=lambda kv: -kv[1]) if v > 0}


def _add(into: dict[str, float], parts: dict | None) -> None:
    for cause, us in (parts or {}).items():
        into[cause] = into.get(cause, 0.0) + us


def busy_figures(steps: list[dict]) -> dict:
    """Event busy % over the run: the union of the steps' compute spans from the first compute start to the last
    compute end. `busy_pct` counts every idle gap; `busy_pct_excl_empty_queue` leaves out of the window the gaps
    when no request existed (no loop could fill those). Idle by cause sums the gaps before every step but the
    first (whose gap reaches back before the run)."""
    timed = [r for r in steps if r.get("compute_us")]
    if not timed:
        return {"window_s": None, "busy_pct": None, "busy_pct_excl_empty_queue": None, "busy_basis": None,
                "idle_ms_total": None, "idle_ms_host": None, "idle_ms_by_cause": {}}
    lo, hi = timed[0]["compute_us"][0], max(r["compute_us"][1] for r in timed)
    busy = union_length([r["compute_us"] for r in timed], lo, hi)
    causes: dict[str, float] = {}
    for r in timed[1:]:
        _add(causes, r.get("idle_by_cause_us"))
    empty = causes.get(EMPTY, 0.0)
    window, work = hi - lo, hi - lo - empty
    bases = sorted({r.get("compute_basis") for r in timed} - {None})
    return {"window_s": round(window / 1e6, 6),
            "busy_pct": round(100.0 * busy / window, 2) if window > 0 else None,
            "busy_pct_excl_empty_queue": round(100.0 * busy / work, 2) if work > 0 else None,
            "busy_basis": bases[0] if len(bases) == 1 else ("mixed" if bases else None),
            "idle_ms_total": _ms(sum(causes.values())), "idle_ms_host": _ms(sum(causes.values()) - empty),
            "idle_ms_by_cause": by_cause_ms(causes)}


def _phase_ms(rec: dict, phase: str) -> float | None:
    span = (rec.get("cpu") or {}).get(phase)
    return (span[1] - span[0]) / 1e3 if span else None


def kind_figures(steps: list[dict], host_phases: bool = False) -> dict:
    """{"decode": figures, "prefill": figures}: per kind its steps, tokens, periods (ms/step), compute spans, and
    the idle before its steps (total, per gap, by cause). With `host_phases`, also every host phase's duration."""
    periods = {id(rec): ms for rec, ms in run_periods(steps)}
    out = {}
    for kind in KINDS:
        mine = [r for r in steps if step_kind(r) == kind]
        gaps = [r for r in mine if r is not steps[0] and r.get("gpu_idle_before_us") is not None]
        causes: dict[str, float] = {}
        for r in gaps:
            _add(causes, r.get("idle_by_cause_us"))
        host = [max(0.0, r["gpu_idle_before_us"] - empty_queue_us(r)) / 1e3 for r in gaps]
        fig = {"steps": len(mine), "prefill_tokens": sum(r.get("prefill_tokens", 0) for r in mine),
               "decode_tokens": sum(r.get("decode_tokens", 0) for r in mine),
               "ms_per_step": percentiles(periods[id(r)] for r in mine if id(r) in periods),
               "compute_ms": percentiles((r["compute_us"][1] - r["compute_us"][0]) / 1e3
                                         for r in mine if r.get("compute_us")),
               "idle_before_ms_total": _ms(sum(causes.values())),
               "idle_before_ms_host": _ms(sum(causes.values()) - causes.get(EMPTY, 0.0)),
               "host_idle_ms_per_gap": percentiles(host),
               "idle_before_ms_by_cause": by_cause_ms(causes)}
        if host_phases:
            fig["host_ms"] = {p: _phase_totals([_phase_ms(r, p) for r in mine]) for p in HOST_PHASES}
        out[kind] = fig
    return out


def _phase_totals(values: list[float | None]) -> dict:
    vals = [v for v in values if v is not None]
    return {**percentiles(vals), "total_ms": round(sum(vals), 3)}


def transitions(steps: list[dict]) -> dict:
    """Idle between two consecutive steps by the pair of their kinds ("decode->prefill", ...): gaps, host idle
    (empty queue left out) and its causes, so a gap is seen against the step that ran before it too."""
    out: dict[str, dict] = {}
    for prev, cur in zip(steps, steps[1:]):
        if cur.get("gpu_idle_before_us") is None or cur["step"] != prev["step"] + 1:
            continue
        t = out.setdefault(f"{step_kind(prev)}->{step_kind(cur)}", {"gaps": 0, "causes": {}})
        t["gaps"] += 1
        _add(t["causes"], cur.get("idle_by_cause_us"))
    return {k: {"gaps": v["gaps"], "idle_ms_host": _ms(sum(v["causes"].values()) - v["causes"].get(EMPTY, 0.0)),
                "idle_ms_by_cause": by_cause_ms(v["causes"])} for k, v in sorted(out.items())}


def largest_gaps(steps: list[dict], n: int = 10) -> list[dict]:
    """The n largest host-caused gaps (empty queue left out): step, kind, the kind before it, ms, causes."""
    rows = []
    for prev, cur in zip(steps, steps[1:]):
        if cur.get("gpu_idle_before_us") is None:
            continue
        host = cur["gpu_idle_before_us"] - empty_queue_us(cur)
        if host > 0:
            rows.append({"step": cur["step"], "kind": step_kind(cur), "after": step_kind(prev), "ms": _ms(host),
                         "t_us": cur["compute_us"][0] if cur.get("compute_us") else None,
                         "causes_ms": by_cause_ms({k: v for k, v in (cur.get("idle_by_cause_us") or {}).items()
                                                   if k != EMPTY})})
    return sorted(rows, key=lambda r: -r["ms"])[:n]


def launch_lead(steps: list[dict]) -> dict:
    """Per kind of step, how far ahead of the GPU the host launched it: the previous step's compute end minus
    this step's launch end (positive: launched before the GPU was free; negative: the GPU waited that long for the
    launch). Steps after an empty-queue gap are left out. For the late ones, the mean of their own schedule,
    fill and launch spans: the host work that did not fit under the previous step's compute."""
    out: dict[str, dict] = {}
    for kind in KINDS:
        leads, late = [], []
        for prev, cur in zip(steps, steps[1:]):
            launch = (cur.get("cpu") or {}).get("launch")
            if (step_kind(cur) != kind or not launch or not prev.get("compute_us") or empty_queue_us(cur) > 0
                    or cur["step"] != prev["step"] + 1):
                continue
            lead = (prev["compute_us"][1] - launch[1]) / 1e3
            leads.append(lead)
            if lead < 0:
                late.append(cur)
        prep = {p: _mean([_phase_ms(r, p) for r in late]) for p in ("schedule", "fill", "launch")}
        out[kind] = {"lead_ms": percentiles(leads, (1, 10, 50)), "late": len(late),
                     "late_share": round(len(late) / len(leads), 4) if leads else None,
                     "late_prep_ms_mean": prep}
    return out


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return round(sum(vals) / len(vals), 3) if vals else None


def budget_figures(steps: list[dict]) -> dict:
    """The token budgets the steps ran with (StepRecord.budget), by reason: how many steps, the budget's tokens
    (p50, min, max), the tokens the steps carried (p50) and the compute ms (p50, p99) of those that carried
    prefill. Steps recorded before budgets were recorded count under "unknown"."""
    groups: dict[str, list[dict]] = {}
    for rec in steps:
        groups.setdefault((rec.get("budget") or {}).get("reason", "unknown"), []).append(rec)
    out = {}
    for reason, recs in groups.items():
        tokens = [r["budget"]["tokens"] for r in recs if r.get("budget")]
        carried = [r["prefill_tokens"] + r["decode_tokens"] for r in recs]
        prefill_ms = [(r["compute_us"][1] - r["compute_us"][0]) / 1e3 for r in recs
                      if r.get("prefill_tokens") and r.get("compute_us")]
        out[reason] = {"steps": len(recs), "with_prefill": sum(1 for r in recs if r.get("prefill_tokens")),
                       "budget_tokens": {"p50": percentiles(tokens, (50,))["p50"], "min": min(tokens, default=None),
                                         "max": max(tokens, default=None)},
                       "carried_tokens_p50": percentiles(carried, (50,))["p50"],
                       "prefill_step_ms": percentiles(prefill_ms, (50, 99))}
    return out
