"""What surrounds the step comparison: whether the two sides can be compared at all, what each side is, the
settings that differ, and the end-to-end figures (which depend on the batch mix, so they get no verdict)."""
from __future__ import annotations

import statistics

from .inputs import CompareInputError, Recording
from .shapes import step_figures

E2E_NOTE = ("end-to-end figures depend on the batch mix (arrivals, lengths, how many requests shared a step): "
            "shown for context, without a verdict; the step figures above are compared at matched shapes")
E2E_LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
E2E_PERCENTILES = ("p50", "p90", "p99")
CONFIG_IGNORED = ("created", "model", "device")


def recording_sides(base: list[Recording], new: list[Recording]) -> list[str]:
    """Refuses what cannot be compared (empty recordings, a profiler trace against batchscope's own telemetry);
    returns warnings for what can be but differs underneath (model, hardware)."""
    for rec in base + new:
        if not any(s.get("compute_us") for s in rec.timeline.get("steps") or []):
            what = "no steps" if not rec.timeline.get("steps") else "no step with a compute span"
            raise CompareInputError(f"{rec.name}: an empty recording ({what}): nothing to compare")
    kinds = {r.kind for r in base + new}
    if len(kinds) > 1:
        traces = [r.name for r in base + new if r.kind == "trace"]
        raise CompareInputError(
            f"a profiler trace ({traces[0]}) and batchscope's own recordings mixed: a trace times steps by its "
            f"device ops, batchscope by CUDA events, so their step times differ by method; import a trace of "
            f"both sides (or record both) and compare those")
    warnings = []
    for what, read in (("model", _model), ("hardware", _hardware)):
        values = [sorted({read(r) for r in side} - {None}) for side in (base, new)]
        if values[0] and values[1] and values[0] != values[1]:
            warnings.append(f"different {what}: BASE {', '.join(values[0])}, NEW {', '.join(values[1])} "
                            f"(compared anyway: the step figures say which ran faster, not why)")
    return warnings


def _model(rec: Recording) -> str | None:
    return (rec.timeline.get("meta") or {}).get("model")


def _hardware(rec: Recording) -> str | None:
    meta = rec.timeline.get("meta") or {}
    if meta.get("gpu"):
        return meta["gpu"]
    device = str(meta.get("device") or "")
    return "cpu" if device.startswith("cpu") else (device or None)


def basis_of(recordings: list[Recording]) -> str:
    """`host` when any recording timed its compute on the host (a CPU engine), else `gpu`."""
    bases = {s.get("compute_basis") for r in recordings for s in r.timeline["steps"] if s.get("compute_us")}
    return "host" if "host" in bases else "gpu"


def side_info(recordings: list[Recording], rows: list[tuple], counts: dict, matched: list) -> dict:
    matched_set = set(matched)
    metas = [r.timeline.get("meta") or {} for r in recordings]
    return {"recordings": [r.name for r in recordings], "kind": recordings[0].kind,
            "model": sorted({m.get("model") for m in metas if m.get("model")}),
            "hardware": sorted({h for h in (_hardware(r) for r in recordings) if h}),
            "engine": sorted({(m.get("source") or {}).get("engine", "batchscope") for m in metas}),
            "modes": sorted({s.get("mode") for r in recordings for s in r.timeline["steps"]}),
            "steps": sum(len(r.timeline["steps"]) for r in recordings),
            "timed_steps": len(rows),
            "matched_steps": sum(n for k, n in counts.items() if k in matched_set)}


def settings_changed(base: list[Recording], new: list[Recording]) -> dict:
    """Engine settings (meta.config) that differ between the sides: the change under test, usually."""
    cfg = [_config(side) for side in (base, new)]
    out = {}
    for key in sorted(set(cfg[0]) | set(cfg[1])):
        if key in CONFIG_IGNORED:
            continue
        if cfg[0].get(key) != cfg[1].get(key):
            out[key] = [cfg[0].get(key), cfg[1].get(key)]
    return out


def _config(side: list[Recording]) -> dict:
    """The settings every recording of a side shares (a setting that differs within a side is not the change)."""
    configs = [(r.timeline.get("meta") or {}).get("config") or {} for r in side]
    first = configs[0]
    return {k: v for k, v in first.items() if all(c.get(k) == v for c in configs[1:])}


def end_to_end(base: list[Recording], new: list[Recording]) -> dict:
    """Output tokens/s and request latency percentiles: the median over each side's recordings, and NEW/BASE."""
    out = {"note": E2E_NOTE}
    rows = {"tokens_per_s": [_e2e(side, lambda s: s.get("tokens_per_s")) for side in (base, new)]}
    for lat in E2E_LATENCIES:
        for p in E2E_PERCENTILES:
            rows[f"{lat}.{p}"] = [_e2e(side, lambda s, lat=lat, p=p: (s.get(lat) or {}).get(p)) for side in (base, new)]
    rows["step_ms_as_run"] = [_as_run(side, per_token=False) for side in (base, new)]
    rows["device_ms_per_output_token"] = [_as_run(side, per_token=True) for side in (base, new)]
    for name, (b, n) in rows.items():
        if b is not None and n is not None:
            out[name] = {"base": round(b, 3), "new": round(n, 3), "ratio": round(n / b, 4) if b else None}
    return out


def _as_run(side: list[Recording], per_token: bool) -> float | None:
    """Device step time over each side's own mix of steps (every timed step), per step or per output token: what
    a change of the mix (a larger budget, fewer and larger steps) did, beside the matched comparison."""
    values = []
    for rec in side:
        timed = [(step_figures(s), s.get("tokens_out") or 0) for s in rec.timeline["steps"]]
        timed = [(f["step"], tokens) for f, tokens in timed if f is not None]
        total, tokens = sum(t for t, _ in timed), sum(k for _, k in timed)
        if per_token and tokens:
            values.append(total / tokens)
        elif not per_token and timed:
            values.append(total / len(timed))
    return statistics.median(values) if len(values) == len(side) else None


def _e2e(side: list[Recording], read) -> float | None:
    values = []
    for rec in side:
        summary = rec.timeline.get("summary") or {}
        v = read(summary) if isinstance(summary, dict) else None
        if isinstance(v, (int, float)) and v > 0:
            values.append(float(v))
    return statistics.median(values) if len(values) == len(side) else None
