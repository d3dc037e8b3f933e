"""What async would buy: a forecast, from a sync stretch's own step records, of how long the same steps would take
if the host's work were hidden behind the GPU's.

Three numbers per sync step i, all read from its record and the next one's (docs/forecast.md says why each):
  C[i]  device time: the compute span (`compute_us`, CUDA events).
  H[i]  host time the loop spends per step whatever the GPU does: the host cycle (schedule start to the next
        step's schedule start) minus the time it sat blocked in `wait`, minus any empty-queue gap.
  X[i]  the dependency chain the GPU waited out after i: the measured idle gap before i+1 (D2H copy, wake-up,
        update, telemetry, loop overhead, schedule, fill, launch, H2D), less any empty-queue part.
The async loop builds step i while the device runs i-1, so step i's compute can start once
  - the device is free:                      ce[i-1]
  - the host chain from two steps back is:   ce[i-2] + X[i-2]   (i's inputs need i-2's tokens, consumed and
                                                                 built on while i-1 computes)
  - the host has had time for one step:      cs[i-1] + H[i-1]
  cs[i] = max of the three, ce[i] = cs[i] + C[i].
In the steady state that is max(C, H, (C + X) / 2) per step: GPU-bound when the host does less than the GPU
(the gaps close), host-bound otherwise (async can only hide the smaller of the two). The launch latency between
back-to-back kernels (a few µs on an H200) is not in a sync record and is left out.

Where compute runs on the host (CPU, `compute_basis` "host"), nothing can overlap: the forecast is the
measurement itself, and says so. Pure Python, no engine or app import.
"""
from __future__ import annotations

import statistics

from .stretches import empty_queue_us, percentiles, run_periods, stretches

# What bounds a forecast step, in the order they are tested (ties go to the device: that is the ideal).
BOUNDS = ("gpu", "chain", "host")


def _dur(span) -> float | None:
    return span[1] - span[0] if span and span[0] is not None and span[1] is not None else None


def _device_compute(rec: dict) -> list | None:
    c = rec.get("compute_us")
    return c if c and rec.get("compute_basis") in ("gpu", "gpu_wait") else None


def step_costs(run: list[dict]) -> list[dict]:
    """{step, C, H, X} in µs for each step of one sync stretch that has device compute; H and X need the next
    step, so the stretch's last step (or one whose successor has no device compute) takes the medians."""
    out = []
    for i, rec in enumerate(run):
        c = _device_compute(rec)
        if not c:
            continue
        h = x = None
        nxt = run[i + 1] if i + 1 < len(run) else None
        if nxt is not None and _device_compute(nxt):
            empty = empty_queue_us(nxt)
            sched, sched_next = rec["cpu"].get("schedule"), nxt["cpu"].get("schedule")
            wait = _dur(rec["cpu"].get("wait")) or 0.0
            if sched and sched_next:
                h = max(0.0, sched_next[0] - sched[0] - wait - empty)
            if nxt.get("gpu_idle_before_us") is not None:
                x = max(0.0, nxt["gpu_idle_before_us"] - empty)
        out.append({"step": rec["step"], "C": c[1] - c[0], "H": h, "X": x})
    for key in ("H", "X"):
        known = [s[key] for s in out if s[key] is not None]
        fill = statistics.median(known) if known else 0.0
        for s in out:
            if s[key] is None:
                s[key] = fill
    return out


def simulate(costs: list[dict]) -> list[dict]:
    """The async schedule of the same steps: {step, cs, ce, bound} in µs from the first compute start."""
    sim: list[dict] = []
    for i, s in enumerate(costs):
        if i == 0:
            cs, bound = 0.0, "gpu"
        else:
            cands = [(sim[i - 1]["ce"], "gpu")]
            if i >= 2:
                cands.append((sim[i - 2]["ce"] + costs[i - 2]["X"], "chain"))
            cands.append((sim[i - 1]["cs"] + costs[i - 1]["H"], "host"))
            cs, bound = max(cands, key=lambda t: (t[0], -BOUNDS.index(t[1])))
        sim.append({"step": s["step"], "cs": cs, "ce": cs + s["C"], "bound": bound})
    return sim


def _periods_ms(starts) -> list[float]:
    return [(b - a) / 1000.0 for a, b in zip(starts, starts[1:])]


def forecast_stretch(run: list[dict]) -> dict | None:
    """Measured sync and forecast async ms/step ({n, mean, p50, p90, p99}) for one sync stretch, the speedup
    (measured mean / forecast mean), the time it would save, the forecast busy % and which bound held how
    often. None when the stretch has fewer than three steps with device compute, or no two of them in a row."""
    done = _forecast_run(run)
    return done[0] if done else None


def _forecast_run(run: list[dict]) -> tuple[dict, list, list] | None:
    costs = step_costs(run)
    if len(costs) < 3:
        return None
    measured = [ms for rec, ms in run_periods(run) if _device_compute(rec)]
    if not measured:            # no two steps with device compute in a row (a trace that lost most of its ops)
        return None
    sim = simulate(costs)
    forecast = _periods_ms([s["cs"] for s in sim])
    span_us = sim[-1]["ce"] - sim[0]["cs"]
    bounds = {b: 0 for b in BOUNDS}
    for s in sim[1:]:
        bounds[s["bound"]] += 1
    m_mean, f_mean = statistics.fmean(measured), statistics.fmean(forecast)
    stats = {
        "first_step": run[0]["step"], "last_step": run[-1]["step"], "steps": len(costs),
        "measured_ms_per_step": percentiles(measured),
        "forecast_ms_per_step": percentiles(forecast),
        "speedup": round(m_mean / f_mean, 4) if f_mean else None,
        "saved_ms": round(sum(measured) - sum(forecast), 3),
        "forecast_busy_pct": round(100.0 * sum(s["C"] for s in costs) / span_us, 2) if span_us else None,
        "bound_steps": bounds,
        "compute_ms_p50": round(statistics.median(s["C"] for s in costs) / 1000.0, 3),
        "host_ms_p50": round(statistics.median(s["H"] for s in costs) / 1000.0, 3),
        "chain_ms_p50": round(statistics.median(s["X"] for s in costs) / 1000.0, 3),
    }
    return stats, measured, forecast


def _empty(reason: str | None = None) -> dict:
    return {"applicable": False, "reason": reason, "stretches": [], "steps": 0, "measured_ms_per_step": None,
            "forecast_ms_per_step": None, "speedup": None, "measured_async_ms_per_step": None,
            "forecast_error_pct": None}


def forecast_runs(sync_runs, async_runs) -> dict:
    """The forecast over some sync stretches, pooled, beside the measured async ms/step of some async stretches
    (the scoreboard's: each mode's stretches it covers). Fields as forecast_async's."""
    if not sync_runs:
        return _empty("no sync steps to forecast from")
    if not any(_device_compute(r) for run in sync_runs for r in run):
        return _empty("compute runs on the host here (no device events): the host cannot build the next step "
                      "while it computes this one, so async has nothing to hide")
    if not any(r["cpu"].get("schedule") for run in sync_runs for r in run if _device_compute(r)):
        return _empty("the steps hold no host schedule phase (a trace of another engine's loop): the host's work "
                      "per step is not known, so no forecast is built on it")
    out = _empty()
    measured, forecast = [], []
    for run in sync_runs:
        done = _forecast_run(run)
        if done is not None:
            stats, m, f = done
            measured += m
            forecast += f
            out["stretches"].append(stats)
    if not out["stretches"]:
        out["reason"] = "no sync stretch has three steps with device compute, two of them in a row"
        return out
    m, f = percentiles(measured), percentiles(forecast)
    out.update(applicable=True, steps=sum(s["steps"] for s in out["stretches"]), measured_ms_per_step=m,
               forecast_ms_per_step=f, speedup=round(m["mean"] / f["mean"], 4) if f["mean"] else None)
    a = percentiles(p for run in async_runs for _, p in run_periods(run))
    if a["n"]:
        out["measured_async_ms_per_step"] = a
        out["forecast_error_pct"] = round(100.0 * (f["p50"] - a["p50"]) / a["p50"], 2)
    return out


def forecast_async(steps) -> dict:
    """The forecast over every sync stretch of a timeline's steps, pooled, beside the measured async ms/step of
    the async stretches next to them (the closest measurement of the same load in the other loop; a recording of
    one mode per file has no neighbour: then any async stretch it has).

    {"applicable", "reason", "stretches": [...], "steps", "measured_ms_per_step", "forecast_ms_per_step",
     "speedup", "measured_async_ms_per_step", "forecast_error_pct"}; `forecast_error_pct` is
    100 * (forecast p50 - measured async p50) / measured async p50."""
    runs = stretches(list(steps))
    syncs = [k for k, run in enumerate(runs) if run[0]["mode"] == "sync"]
    near = sorted({j for k in syncs if step_costs(runs[k])[2:] for j in (k - 1, k + 1)
                   if 0 <= j < len(runs) and runs[j][0]["mode"] == "async"})
    async_runs = [runs[j] for j in near] or [r for r in runs if r[0]["mode"] == "async"]
    return forecast_runs([runs[k] for k in syncs], async_runs)
