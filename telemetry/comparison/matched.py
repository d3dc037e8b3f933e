"""BASE against NEW, step by step at matched shapes: every figure per bucket, over the common mix of buckets, with
intervals and verdicts (`batchscope.compare/1`, docs/compare.md).

A figure "over the common mix" is its per-step mean in each matched bucket (winsorized), weighted by how many steps
of that bucket the two sides ran on average: the time one mix of steps takes on each side, so a side that ran more
large steps is not called slower for it. A bucket's weight in time is therefore its share of the step time.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import noise
from .context import basis_of, end_to_end, recording_sides, settings_changed, side_info
from .inputs import CompareInputError, Recording
from .shapes import HOST_PHASES, NOT_STEP_TIME, UNKNOWN, key_label, recording_facts, step_figures, step_key

SCHEMA_ID = "batchscope.compare/1"
MIN_BUCKET_STEPS = 5            # a bucket compared needs this many timed steps on each side
MIN_VERDICT_STEPS = 20          # ... and this many for a verdict of its own (a few steps under-state their spread)
MAIN_FIGURES = ("step", "compute")
MIN_MATCHED_SHARE = 0.5         # of each side's step time, for an overall verdict
CANARY_PHASES = ("host.schedule", "host.update")
CANARY_SHARE = 0.6              # a slower model stretches the bookkeeping too (caches), but less than its steps


@dataclass
class SideSteps:
    """One side's timed steps in matched buckets, as arrays (one entry per step)."""
    bucket: np.ndarray
    recording: np.ndarray
    block: np.ndarray
    values: dict = field(default_factory=dict)       # figure -> float array (NaN: unknown for that step)


def compare(base: list[Recording], new: list[Recording], min_effect_pct: float | None = None,
            seed: int = 0) -> dict:
    """The comparison as a `batchscope.compare/1` dict; raises CompareInputError for input that cannot give one."""
    warnings = recording_sides(base, new)
    with_mode = _mode_in_key(base, new)
    rows = {"base": _timed_steps(base, with_mode), "new": _timed_steps(new, with_mode)}
    counts = {side: _count(r) for side, r in rows.items()}
    matched = sorted(k for k in counts["base"] if counts["new"].get(k, 0) >= MIN_BUCKET_STEPS
                     and counts["base"][k] >= MIN_BUCKET_STEPS)
    unmatched = _unmatched(rows, counts, set(matched))
    if not matched:
        error = CompareInputError(_no_common_shapes(counts))
        error.warnings = warnings          # a different model or device may be why: said first
        raise error
    basis = basis_of(base + new)
    runs = min(len(base), len(new))
    m = min_effect_pct / 100.0 if min_effect_pct is not None else noise.min_effect(basis, runs)
    index = {k: i for i, k in enumerate(matched)}
    sides = {side: _arrays(rows[side], index) for side in rows}
    figures = _figure_names(sides)
    mix = np.array([(counts["base"][k] + counts["new"][k]) / 2 for k in matched], dtype=float)
    mix /= mix.sum()
    rng = np.random.default_rng(seed)
    weights = {side: noise.resample_weights(s.recording, s.block, noise.RESAMPLES, rng) for side, s in sides.items()}
    trim = noise.trim_for(basis)
    stats = {name: _figure_stats(name, sides, weights, mix, len(matched), trim) for name in figures}
    base_step = stats["step"]
    results = {name: _figure_result(name, st, base_step, m) for name, st in stats.items()}
    buckets = _buckets(matched, stats, counts, mix, m)
    _add_typical(buckets, matched, rows, {"base": base, "new": new})
    if any(key[1] == UNKNOWN for key in matched):
        warnings.append("the recordings do not say their steps' shapes (an imported trace): their steps are compared "
                        "as one bucket, so a different mix of prefill and decode steps would read as a change")
    machine = _machine_speed(results, basis, runs, m)
    reason = _withhold(results, buckets, machine, _coverage(unmatched), warnings)
    step = results["step"]
    out = {
        "schema": SCHEMA_ID,
        "verdict": step["verdict"],
        "verdict_reason": reason,
        "step_time_ratio": step["ratio"],
        "base": side_info(base, rows["base"], counts["base"], matched),
        "new": side_info(new, rows["new"], counts["new"], matched),
        "warnings": warnings,
        "noise": {"level": noise.LEVEL, "min_effect": m, "min_effect_source": "given" if min_effect_pct is not None
                  else ("several recordings a side: run spread measured" if runs >= 2
                        else "one recording a side: run spread not measured"),
                  "basis": basis, "resamples": noise.RESAMPLES, "block_steps": noise.BLOCK_STEPS,
                  "run_spread": runs >= 2, "min_bucket_steps": MIN_BUCKET_STEPS, "trim": trim,
                  "min_bucket_verdict_steps": MIN_VERDICT_STEPS,
                  "machine_speed_ratio": machine["ratio"] if machine else None},
        "matching": {"keys": ["mode", "decode_batch", "prefill_tokens", "kv_tokens"], "mode_in_key": with_mode,
                     "buckets": len(matched)},
        "figures": results,
        "moved": _moved(results),
        "buckets": buckets,
        "unmatched": unmatched,
        "end_to_end": end_to_end(base, new),
        "settings_changed": settings_changed(base, new),
    }
    return out


def _mode_in_key(base: list[Recording], new: list[Recording]) -> bool:
    """Mode is part of the shape unless each side ran one mode and they differ: then it is the change compared."""
    modes = [{s.get("mode") for r in side for s in r.timeline["steps"]} for side in (base, new)]
    return not (len(modes[0]) == 1 and len(modes[1]) == 1 and modes[0] != modes[1])


def _timed_steps(recordings: list[Recording], with_mode: bool) -> list[tuple]:
    """(recording index, bucket key, figures) for every timed step, in each recording's order."""
    out = []
    for i, rec in enumerate(recordings):
        facts = recording_facts(rec.timeline)
        timed = [(step, figs) for step in rec.timeline["steps"] if (figs := step_figures(step)) is not None]
        blocks = noise.block_ids([_paused_before(step) for step, _ in timed])
        for (step, figs), block in zip(timed, blocks):
            figs["_block"] = int(block)
            figs["_step"] = step.get("step")
            out.append((i, step_key(step, facts, with_mode), figs))
    return out


def _paused_before(step: dict) -> bool:
    """Whether the load paused before this step (no request existed for part of the gap)."""
    return step.get("idle_cause") in NOT_STEP_TIME or any(
        (step.get("idle_by_cause_us") or {}).get(cause) for cause in NOT_STEP_TIME)


def _count(rows: list[tuple]) -> dict:
    counts: dict = {}
    for _, key, _ in rows:
        counts[key] = counts.get(key, 0) + 1
    return counts


def _unmatched(rows: dict, counts: dict, matched: set) -> dict:
    """What was not compared, said: buckets one side never ran, buckets too thin, and their share of step time."""
    out = {"base_only": [], "new_only": [], "too_few_steps": []}
    for key in sorted(set(counts["base"]) | set(counts["new"])):
        if key in matched:
            continue
        nb, nn = counts["base"].get(key, 0), counts["new"].get(key, 0)
        entry = {"bucket": key_label(key), "base_steps": nb, "new_steps": nn}
        out["base_only" if not nn else "new_only" if not nb else "too_few_steps"].append(entry)
    for side in ("base", "new"):
        total = sum(f["step"] for _, _, f in rows[side])
        left = sum(f["step"] for _, k, f in rows[side] if k not in matched)
        out[f"{side}_time_share"] = round(left / total, 4) if total else None
    return out


def _no_common_shapes(counts: dict) -> str:
    if not counts["base"] or not counts["new"]:
        side = "BASE" if not counts["base"] else "NEW"
        return f"{side} has no timed steps (no step with a compute span and the gap before it)"
    shared = set(counts["base"]) & set(counts["new"])
    if shared:
        return (f"no shape has {MIN_BUCKET_STEPS} timed steps on each side ({len(shared)} shapes both ran, each "
                f"too thin): record longer")
    return (f"no shape ran on both sides (BASE {len(counts['base'])} shapes, NEW {len(counts['new'])}): not the "
            f"same workload, or a setting that changes every step's shape")


def _arrays(rows: list[tuple], index: dict) -> SideSteps:
    mine = [(i, index[k], f) for i, k, f in rows if k in index]
    recording = np.array([i for i, _, _ in mine], dtype=np.int64)
    block = np.array([f["_block"] for _, _, f in mine], dtype=np.int64)
    side = SideSteps(bucket=np.array([b for _, b, _ in mine], dtype=np.int64), recording=recording, block=block)
    names = {n for _, _, f in mine for n in f if n != "causes" and not n.startswith("_")}
    names |= {f"cause.{c}" for _, _, f in mine for c in f["causes"]}
    for name in names:
        if name.startswith("cause."):
            vals = [f["causes"].get(name[6:], 0.0) for _, _, f in mine]
        else:
            vals = [f.get(name) for _, _, f in mine]
        raw = np.array([np.nan if v is None else v for v in vals], dtype=float)
        side.values[name] = noise.winsorize(raw, side.bucket)
    return side


def _figure_names(sides: dict) -> list[str]:
    """Figures both sides know for some step: step, compute, idle first, then idle inside, host phases, causes."""
    known = [{n for n, v in s.values.items() if not np.isnan(v).all()} for s in sides.values()]
    both = known[0] & known[1]
    causes = sorted(n for n in known[0] | known[1] if n.startswith("cause."))
    for name in causes:           # a cause one side never had is 0 ms there, not unknown
        for s in sides.values():
            s.values.setdefault(name, np.zeros(s.bucket.size))
    order = ["step", "compute", "idle", "idle_inside"] + [f"host.{p}" for p in HOST_PHASES]
    return [n for n in order if n in both] + causes


def _figure_stats(name: str, sides: dict, weights: dict, mix: np.ndarray, n_buckets: int, trim: float) -> dict:
    """Per side: the point estimate per bucket and over the mix, its resamples, and per recording."""
    out = {}
    for side, s in sides.items():
        values = s.values[name]
        ones = np.ones((1, s.bucket.size), dtype=np.float32)
        point = noise.bucket_means(ones, values, s.bucket, n_buckets, trim)[0]
        resampled = noise.bucket_means(weights[side], values, s.bucket, n_buckets, trim)
        n_rec = int(s.recording.max()) + 1
        per_rec = (s.recording[None, :] == np.arange(n_rec)[:, None]).astype(np.float32)
        by_rec = noise.bucket_means(per_rec, values, s.bucket, n_buckets, trim)
        out[side] = {"point": point, "total": float(noise.mix_total(point[None, :], point, mix)[0]),
                     "resampled": resampled, "totals": noise.mix_total(resampled, point, mix),
                     "recordings": [float(x) for x in noise.mix_total(by_rec, point, mix)]}
    return out


def _figure_result(name: str, st: dict, step_st: dict, m: float) -> dict:
    b, n = st["base"], st["new"]
    base_step = step_st["base"]["total"]
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio_samples = n["totals"] / b["totals"]
    delta_samples = n["totals"] - b["totals"]
    r_low, r_high = noise.quantiles(ratio_samples)
    d_low, d_high = noise.quantiles(delta_samples)
    spread_r = noise.run_spread_ratio(b["recordings"], n["recordings"])
    spread_d = noise.run_spread_delta(b["recordings"], n["recordings"])
    if spread_r and r_low is not None:
        r_low, r_high = min(r_low, spread_r[0]), max(r_high, spread_r[1])
    if spread_d and d_low is not None:
        d_low, d_high = min(d_low, spread_d[0]), max(d_high, spread_d[1])
    ratio = n["total"] / b["total"] if b["total"] > 0 else None
    if ratio is None:
        r_low = r_high = None
    share = [None if x is None else x / base_step for x in (n["total"] - b["total"], d_low, d_high)]
    if name in MAIN_FIGURES:
        verdict = noise.ratio_verdict(r_low, r_high, m, ratio is not None)
    else:
        verdict = noise.share_verdict(share[1], share[2], m, base_step > 0)
    return {"base_ms": _r(b["total"]), "new_ms": _r(n["total"]),
            "ratio": {"value": _r(ratio), "low": _r(r_low), "high": _r(r_high)},
            "delta_ms": {"value": _r(n["total"] - b["total"]), "low": _r(d_low), "high": _r(d_high)},
            "share_of_base_step": {"value": _r(share[0]), "low": _r(share[1]), "high": _r(share[2])},
            "verdict": verdict, "judged_by": "ratio" if name in MAIN_FIGURES else "share_of_base_step",
            "per_recording_ms": {"base": [_r(x) for x in b["recordings"]], "new": [_r(x) for x in n["recordings"]]}}


def _withhold(results: dict, buckets: list, machine: dict | None, coverage: str | None, warnings: list) -> str:
    """Takes verdicts away where the rules say the steps cannot speak (the machine's own speed moved; the matched
    steps hold too little of a run), saying why; returns the overall verdict's reason."""
    if machine is not None:
        warnings.append(machine["said"])
        for fig in [results["step"], results["compute"], *buckets]:
            if fig["verdict"] in ("slower", "faster"):
                fig["verdict"] = "inconclusive"
    if coverage is not None:
        warnings.append(coverage)
        for fig in (results["step"], results["compute"]):
            fig["verdict"] = "inconclusive"
    if coverage or machine:
        return "coverage" if coverage else "machine_speed"
    return "interval" if results["step"]["verdict"] == "inconclusive" else "measured"


def _coverage(unmatched: dict) -> str | None:
    """Matched steps speak for a run only when they hold most of its step time: else no overall verdict."""
    shares = {side: unmatched[f"{side}_time_share"] or 0.0 for side in ("base", "new")}
    side, share = max(shares.items(), key=lambda kv: kv[1])
    if share <= 1 - MIN_MATCHED_SHARE:
        return None
    return (f"{100 * share:.0f}% of {side.upper()}'s step time ran in shapes the other side did not run (or too "
            f"rarely to compare): the matched steps cannot speak for the run, so no overall verdict; the shapes "
            f"not matched and the figures as each side ran them (end to end) show what changed")


def _machine_speed(results: dict, basis: str, runs: int, m: float) -> dict | None:
    """A CPU engine's bookkeeping (schedule and update: plain Python that no model change should touch) as a canary
    of the machine's own speed. With one recording a side, when it moved beyond the minimum effect the same way
    as the step time, and by at least CANARY_SHARE as much (in log terms), the step's change is the machine's (another
    process's load), not the build's: no verdict, said first. Several recordings a side measure this instead."""
    ratios = [results[f]["ratio"]["value"] for f in CANARY_PHASES if f in results]
    step = results["step"]["ratio"]["value"]
    if basis != "host" or runs >= 2 or len(ratios) < len(CANARY_PHASES) or not step or not all(ratios):
        return None
    canary = float(np.exp(np.mean(np.log(ratios))))
    same_way = (canary > 1 + m and step > 1) or (canary < 1 / (1 + m) and step < 1)
    if not same_way or abs(np.log(canary)) < CANARY_SHARE * abs(np.log(step)):
        return None
    return {"ratio": round(canary, 4),
            "said": f"the engine's own bookkeeping (schedule, update), which no model change should touch, ran "
                    f"{canary:.2f}x as long in NEW as in BASE, as the step time did ({step:.2f}x): the machine "
                    f"itself ran at another speed (other processes' load?), so no verdict is drawn from one "
                    f"recording a side; record several a side, alternating, and compare them with --"}


def _moved(results: dict) -> list[dict]:
    """The parts of the step that moved, largest first: idle causes and host phases whose change is not `same`."""
    parts = [(name, r) for name, r in results.items()
             if name not in ("step", "compute") and r["verdict"] in ("slower", "faster")]
    parts.sort(key=lambda nr: -abs(nr[1]["delta_ms"]["value"] or 0.0))
    return [{"figure": name, "delta_ms": r["delta_ms"], "verdict": r["verdict"],
             "grew": (r["delta_ms"]["value"] or 0.0) > 0} for name, r in parts]


def _buckets(matched: list, stats: dict, counts: dict, mix: np.ndarray, m: float) -> list[dict]:
    step = stats["step"]
    bp, np_ = step["base"]["point"], step["new"]["point"]
    time = mix * (bp + np_) / 2
    shares = time / time.sum()
    out = []
    for i, key in enumerate(matched):
        low, high = noise.quantiles(step["new"]["resampled"][:, i] / step["base"]["resampled"][:, i])
        ratio = np_[i] / bp[i] if bp[i] > 0 else None
        out.append({"mode": key[0], "decode_batch": key[1], "prefill_tokens": key[2], "kv_tokens": key[3],
                    "label": key_label(key), "base_steps": counts["base"][key], "new_steps": counts["new"][key],
                    "time_share": _r(shares[i]), "base_step_ms": _r(bp[i]), "new_step_ms": _r(np_[i]),
                    "ratio": {"value": _r(ratio), "low": _r(low), "high": _r(high)},
                    "verdict": noise.ratio_verdict(low, high, m, ratio is not None and min(
                        counts["base"][key], counts["new"][key]) >= MIN_VERDICT_STEPS)})
    return out


def _add_typical(buckets: list[dict], matched: list, rows: dict, recordings: dict) -> None:
    """Each bucket's typical step on each side: the one of median step time (the lower middle of an even count),
    by its recording and step number, so a viewer can open the step the bucket's figures speak for."""
    for bucket, key in zip(buckets, matched):
        bucket["typical"] = {}
        for side, side_rows in rows.items():
            mine = sorted(((f["step"], i, f["_step"]) for i, k, f in side_rows if k == key), key=lambda t: t[:2])
            step_ms, i, number = mine[(len(mine) - 1) // 2]
            bucket["typical"][side] = {"recording": recordings[side][i].name, "recording_index": i,
                                       "step": number, "step_ms": _r(step_ms)}


def _r(x, digits: int = 4):
    return None if x is None or not np.isfinite(x) else round(float(x), digits)
