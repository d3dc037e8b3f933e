"""What another setting would do to a recorded load: per loop, the recording's own figures, the prediction under
the new settings with an interval, and the model replaying the recording unchanged (its error on what it was
fitted on). The result is `batchscope.whatif/1` (docs/whatif.md)."""
from __future__ import annotations

import random
import statistics

from ..forecast import forecast_async
from .measures import HEADLINE, error_pct, figures
from .new_load import LOAD_KEYS, reshape
from .model import StepModel, build
from .recording import Recording
from .settings import KEYS, apply, max_model_len
from .simulate import VirtualEngine

SCHEMA_ID = "batchscope.whatif/1"
RUNS = 3                # simulations per prediction, each drawing its own step-time residuals


def predict(rec: Recording, settings: dict, runs: int = RUNS) -> dict:
    config = apply(rec, settings)
    base = apply(rec, {})
    model = build(rec)
    rate = float(settings.get("rate", 1.0))
    modes = [settings["mode"]] if "mode" in settings else list(rec.segments)
    out = {"schema": SCHEMA_ID, "recording": _about(rec), "settings": _settings(base, config, rate, settings),
           "modes": {}, "model": model.as_dict(), "notes": _notes(rec, model, settings)}
    for mode in modes:
        seg = rec.segments.get(mode) or next(iter(rec.segments.values()))
        recorded = {"mode": seg.mode, **figures(seg.steps, seg.requests)}
        load = reshape(seg.load, settings)
        unchanged = mode == seg.mode and config == base and rate == 1.0 and load is seg.load
        # the replay only measures the model's error on its own recording: one run does (a long load: seconds)
        replayed = _simulate(model, base, seg.mode, seg.load, 1.0, rec, runs if unchanged else 1)
        predicted = replayed if unchanged else _simulate(model, config, mode, load, rate, rec, runs)
        replay_error = error_pct(replayed, recorded)
        if predicted is replayed:
            predicted = dict(replayed)
        predicted["interval"] = _widened(predicted, replay_error)
        entry = {"recorded": recorded, "predicted": predicted, "replayed": {**replayed, "error_pct": replay_error}}
        if seg.mode == "sync" and mode == "async":
            entry["forecast"] = _forecast_check(seg.steps, predicted)
        out["modes"][mode] = entry
    return out


def _simulate(model: StepModel, config, mode: str, load, rate: float, rec: Recording, runs: int) -> dict:
    """The median of `runs` simulations per figure, with their range as the interval."""
    results = [VirtualEngine(model, config, mode, load, rate, max_model_len(rec), random.Random(seed)).run()
               for seed in range(runs)]
    each = [figures(r.steps, r.requests) for r in results]
    point = _combine(each, statistics.median)
    point["mode"] = mode
    point["interval"] = {"low": _combine(each, min, HEADLINE), "high": _combine(each, max, HEADLINE),
                         "runs": runs}
    first = results[0]
    point["extrapolated"] = {"steps": first.extrapolated_steps,
                             "share_pct": round(100.0 * first.extrapolated_steps / max(1, len(first.steps)), 2),
                             "beyond_recorded": first.extrapolated_why}
    point["unfinished_requests"] = first.unfinished
    point["budgets"] = _budgets(first.steps)
    return point


def _widened(point: dict, replay_error: dict) -> dict:
    """The runs' range, widened by the model's own error on the recording (each figure by its replay error):
    the spread of the step times and the model's bias on what it was fitted on, together."""
    interval = {"low": {}, "high": {}, "runs": point["interval"]["runs"],
                "basis": "min/max over the runs, widened by the replay error of each figure"}
    for name in HEADLINE:
        p, err = point.get(name), replay_error.get(name)
        for side, how in (("low", min), ("high", max)):
            drawn = point["interval"][side].get(name)
            if isinstance(p, dict):
                interval[side][name] = {q: _band(p.get(q), (drawn or {}).get(q), (err or {}).get(q), how)
                                        for q in ("p50", "p90", "p99")}
            else:
                interval[side][name] = _band(p, drawn, err, how)
    return interval


def _band(p, drawn, err, how):
    if p is None:
        return None
    # every figure is a rate, a time or a share: a replay error past 100% widens the low side down to zero, not below
    edge = max(0.0, p * (1 - abs(err) / 100.0)) if how is min else p * (1 + abs(err) / 100.0)
    values = [v for v in (drawn, edge if err is not None else None, p) if v is not None]
    return round(how(values), 3)


def _combine(each: list[dict], how, names=None) -> dict:
    out: dict = {}
    for name in names or each[0].keys():
        vals = [e.get(name) for e in each]
        if all(isinstance(v, dict) for v in vals):
            keys = {k for v in vals for k in v}
            out[name] = {k: _pick([v.get(k) for v in vals], how) for k in sorted(keys)}
        else:
            out[name] = _pick(vals, how)
    return out


def _pick(vals, how):
    known = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not known:
        return None
    return round(how(known), 3)


def _budgets(steps: list[dict]) -> dict:
    """How many simulated steps ran with each budget reason, and their token budgets' median."""
    out: dict = {}
    for s in steps:
        b = s.get("budget") or {}
        out.setdefault(b.get("reason"), []).append(b.get("tokens") or 0)
    return {str(k): {"steps": len(v), "tokens_p50": statistics.median(v)} for k, v in out.items()}


def _forecast_check(steps: list[dict], predicted: dict) -> dict:
    """telemetry/forecast.py's sync->async forecast of the same steps, beside this prediction's step period."""
    fc = forecast_async(steps)
    mine = (predicted.get("step_ms") or {}).get("p50")
    theirs = (fc.get("forecast_ms_per_step") or {}).get("p50") if fc.get("applicable") else None
    return {"applicable": fc.get("applicable"), "reason": fc.get("reason"),
            "forecast_ms_per_step_p50": theirs, "predicted_ms_per_step_p50": mine,
            "difference_pct": round(100.0 * (mine - theirs) / theirs, 2) if mine and theirs else None}


def _about(rec: Recording) -> dict:
    return {"file": rec.name, "model": rec.info.get("model") or rec.config.model,
            "device": rec.info.get("device") or rec.config.device, "modes": list(rec.segments),
            "requests": sum(len(s.load) for s in rec.segments.values()), "left_out_requests": rec.left_out}


def _settings(base, config, rate: float, asked: dict) -> dict:
    def pick(c) -> dict:
        return {k: getattr(c, k) for k in KEYS if hasattr(c, k) and k != "mode"}

    recorded = {**pick(base), "rate": 1.0}
    whatif = {**pick(config), "rate": rate}
    for key in ("mode",) + LOAD_KEYS:
        if key in asked:
            whatif[key] = asked[key]
    return {"asked": dict(asked), "recorded": recorded, "whatif": whatif}


def _notes(rec: Recording, model: StepModel, settings: dict) -> list[str]:
    notes = []
    if model.basis == "host":
        notes.append("the recording computed on the CPU: a step runs inside its launch, so neither loop overlaps "
                     "host and compute, and mixed_graphs changes nothing")
    for mode, src in model.host_from.items():
        if src != mode:
            notes.append(f"no {mode} steps recorded: {mode}'s host phases are the {src} loop's, its loop gaps "
                         f"moved as docs/whatif.md says (extrapolated)")
    if any(k in settings for k in LOAD_KEYS):
        notes.append("a new load (" + ", ".join(k for k in LOAD_KEYS if k in settings) + "): the recorded figures "
                     "are the recorded load's, the prediction is the new one's")
    if rec.left_out:
        notes.append(f"{rec.left_out} recorded request(s) left out of the load: unfinished or without output")
    if model.basis == "gpu" and not model.device.seen_max.get("eager") and settings.get("mixed_graphs") is False:
        notes.append("the recording ran no eager step: the cost of eager steps is extrapolated from graphed ones")
    return notes

