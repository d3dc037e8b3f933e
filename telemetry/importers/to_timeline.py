"""Analysed trace files -> one `batchscope.timeline/1` dict: rank 0's steps as step records, the other devices'
(other ranks' files, or other GPUs of one process) as rank step records, the summary batchscope computes for its
own recordings plus the trace's own figures (led by what the device did: headline.py), and `meta.source` saying
where it all came from, what was inferred and what the trace under-records (coverage.py).
Times are µs from the earliest event of any file, on the first file's clock."""
from __future__ import annotations

import datetime as _dt
import os

import numpy as np

from ..export import build_timeline, created_now
from ..records import mode_record
from ..summary import summarize
from .file_analysis import FileAnalysis
from .coverage import under_recorded
from .recognition import device_name, vendor
from .headline import device_shares, lane_idle, lead_with_device, put_shares, rank_table, unknown_is_none
from .rank_files import clock_shifts
from .steprecords import rank_step_record, step_record
from .kernel_spans import kernel_spans

UNKNOWN_FIELDS = ["request_ids", "kv_blocks_used", "kv_blocks_total", "queue_depth", "running", "carried"]
_PROFILER_FLAGS = ("with_stack", "record_shapes", "profile_memory", "with_flops", "with_modules")


def _iso(unix_us: float | None) -> str | None:
    if unix_us is None or not 1.4e15 < unix_us < 4.1e15:       # 2014 .. 2099: anything else is no wall clock
        return None
    return _dt.datetime.fromtimestamp(unix_us / 1e6, _dt.timezone.utc).isoformat(timespec="milliseconds")


def build(analyses: list[FileAnalysis], ranks: list[int], keep_kernels: bool = False) -> dict:
    order = sorted(range(len(analyses)), key=lambda i: ranks[i])
    analyses, ranks = [analyses[i] for i in order], [ranks[i] for i in order]
    tables = [fa.tables for fa in analyses]
    shifts, clock_notes, skews = clock_shifts(tables, [fa.lanes[0].device for fa in analyses])
    origin = min(t.start_us + s for t, s in zip(tables, shifts) if t.start_us is not None)
    local = [s - origin for s in shifts]                 # file µs -> timeline µs
    ref = analyses[0]
    steps, prev = [], None
    lane = ref.lanes[0]
    for k, (plan, share) in enumerate(zip(ref.plans, device_shares(lane))):
        rec = step_record(plan, ref.modes[k], lane.spans[k], lane.between[k], lane.inside[k], local[0], 0,
                          ref.host_basis, prev)
        steps.append(put_shares(rec, share))
        prev = plan.number
    lanes_meta, rank_steps = _other_lanes(analyses, ranks, local, steps)
    meta = _meta(analyses, ranks, shifts, origin, lanes_meta, clock_notes, skews)
    summary = summarize(steps, rank_steps=rank_steps)
    figures = _device_figures(analyses, local, summary, lanes_meta)
    meta["source"]["notes"] += figures.pop("notes")
    summary.update(figures)
    lead_with_device(summary)
    unknown_is_none(summary, meta["source"]["unknown"])
    rank_table(summary, figures["devices"])
    if not ref.host_basis:
        meta["source"]["under_recorded"] = under_recorded(tables, steps)
    tl = build_timeline(meta, steps, [], [], mode_changes(steps), summary, rank_steps)
    if keep_kernels:
        tl["kernels"] = [kernel_spans(analyses[m["_file"]], m["_lane"], local[m["_file"]], m["rank"])
                         for m in lanes_meta if m["device"] is not None and m["device"] >= 0]
    for m in lanes_meta:
        m.pop("_file"), m.pop("_lane")
    return tl


def _other_lanes(analyses, ranks, local, steps) -> tuple[list, list]:
    """Every device lane as {rank, file, device, ...}, and the rank step records of all but rank 0's."""
    lanes_meta, rank_steps, out_rank = [], [], 0
    ref_spans = [(r["compute_us"], r["step"]) for r in steps if r.get("compute_us")]
    for f, fa in enumerate(analyses):
        for j, lane in enumerate(fa.lanes):
            lanes_meta.append({"rank": out_rank, "file": os.path.basename(fa.tables.path), "file_rank": ranks[f],
                               "device": lane.device if lane.device >= 0 else None,
                               "gpu": device_name(fa.tables, lane.device), "_file": f, "_lane": j})
            if out_rank > 0:
                rank_steps += _rank_steps(fa, lane, out_rank, local[f], f == 0, ref_spans)
            out_rank += 1
    rank_steps.sort(key=lambda r: (r["step"], r["rank"]))
    return lanes_meta, rank_steps


def _rank_steps(fa: FileAnalysis, lane, rank: int, shift: float, same_file: bool, ref_spans: list) -> list:
    """Another device's part of each step: by plan (same file), else by overlap in time with rank 0's steps."""
    out: dict[int, dict] = {}
    starts = np.array([s[0][0] for s in ref_spans]) if ref_spans else np.zeros(0)
    for k, (plan, share) in enumerate(zip(fa.plans, device_shares(lane))):
        sp = lane.spans[k]
        if sp is None or sp.compute is None:
            continue
        rec = put_shares(rank_step_record(plan.number, rank, fa.modes[k], sp, lane.between[k], lane.inside[k],
                                          shift), share)
        if not same_file:
            number = _overlapping_step(rec["compute_us"], ref_spans, starts)
            if number is None:
                continue
            rec["step"] = number
        if rec["step"] in out:                      # two of its steps fall in one of rank 0's: one span
            _merge_into(rec, out[rec["step"]])
            old = out[rec["step"]]["compute_us"]
            rec["compute_us"] = rec["gpu"]["compute"] = [min(old[0], rec["compute_us"][0]),
                                                         max(old[1], rec["compute_us"][1])]
        out[rec["step"]] = rec
    return list(out.values())


def _merge_into(rec: dict, old: dict) -> None:
    """Two of a rank's steps in one of rank 0's (before `rec`'s span is widened): the earlier one's counts and
    idle stretches count too, and the gap between the two is idle inside the merged step, where it was."""
    gap, start = rec.get("gpu_idle_before_us"), rec["compute_us"][0]
    if gap:
        rec.setdefault("idle_inside_stretches", []).insert(0, [round(start - gap, 1), start,
                                                               rec.get("idle_cause") or "host_other"])
        rec["gpu_idle_inside_us"] = round(rec.get("gpu_idle_inside_us", 0.0) + gap, 1)
        inside = rec.setdefault("idle_inside_by_cause_us", {})
        for cause, us in (rec.get("idle_by_cause_us") or {}).items():
            inside[cause] = round(inside.get(cause, 0.0) + us, 1)
    for key in ("gpu_idle_before_us", "idle_cause", "idle_by_cause_us"):      # the merged step's gap: the first's
        rec[key] = old.get(key)
    for key in ("device_ops_us", "device_ops_before_us", "collective_us", "gpu_idle_inside_us"):
        if key in old or key in rec:
            rec[key] = round(old.get(key, 0.0) + rec.get(key, 0.0), 1)
    for key in ("idle_inside_by_cause_us", "idle_inside_spread_us"):
        both = dict(old.get(key) or {})
        for cause, us in (rec.get(key) or {}).items():
            both[cause] = round(both.get(cause, 0.0) + us, 1)
        if both:
            rec[key] = both
    rec["idle_inside_stretches"] = old.get("idle_inside_stretches", []) + rec.get("idle_inside_stretches", [])


def _overlapping_step(span, ref_spans, starts) -> int | None:
    if not len(starts):
        return None
    k = int(np.searchsorted(starts, span[1], side="right"))
    best, best_overlap = None, 0.0
    for i in range(max(0, k - 3), k):
        (s, e), number = ref_spans[i]
        overlap = min(e, span[1]) - max(s, span[0])
        if overlap > best_overlap:
            best, best_overlap = number, overlap
    return best


def mode_changes(steps: list) -> list:
    return [mode_record(b["compute_us"][0] if b.get("compute_us") else 0.0, b["step"], a["mode"], b["mode"])
            for a, b in zip(steps, steps[1:]) if a["mode"] != b["mode"]]


def _device_figures(analyses, local, summary, lanes_meta) -> dict:
    """Each device's busy time as the union of its ops (kernels, copies, memsets, all streams) over the summary's
    window (headline.py makes rank 0's `busy_pct`, the steps' compute-span figure kept beside it), its idle by
    cause and collective time; for rank 0 the device's idle time outside every step's gap and compute span, so
    the idle figures add up, and a note of the ops outside the steps' window."""
    t0, t1 = summary.get("t0_us"), summary.get("t1_us")
    devices: list = []
    if t0 is None or t1 is None or t1 <= t0:
        return {"devices": devices, "notes": []}
    notes: list[str] = []
    for m in lanes_meta:
        fa = analyses[m["_file"]]
        lane = fa.lanes[m["_lane"]]
        if lane.busy is None:
            continue
        lo, hi = t0 - local[m["_file"]], t1 - local[m["_file"]]
        busy = lane.busy.busy_us(lo, hi)
        fig = {"rank": m["rank"], "device": m["device"], "busy_pct_device_ops": round(100.0 * busy / (hi - lo), 2),
               "busy_us": round(busy, 1), "ops": int(len(lane.busy.rows)),
               "collective_us": round(sum(sp.collective_us for sp in lane.spans if sp is not None), 1),
               **lane_idle(lane)}
        if m["rank"] == 0:
            in_steps = sum(g.idle_us for g in lane.between + lane.inside if g is not None)
            fig["idle_in_steps_us"] = round(in_steps, 1)
            fig["idle_outside_steps_us"] = round(max(0.0, hi - lo - busy - in_steps), 1)
            notes = _outside_window(lane.busy, lo, hi, busy)
        devices.append(fig)
    out = {"devices": devices, "notes": notes if devices else []}
    if devices and devices[0]["rank"] == 0:
        out["busy_pct_device_ops"] = devices[0]["busy_pct_device_ops"]
        out["device_idle_outside_steps_us"] = devices[0]["idle_outside_steps_us"]
    return out


def _outside_window(busy, lo: float, hi: float, inside_us: float) -> list[str]:
    """A note when the device ran ops before the first step or after the last: they are in no figure, and a
    reading over the whole trace would differ by that much."""
    before, after = busy.busy_us(-np.inf, lo), busy.busy_us(hi, np.inf)
    if before + after < 1.0 or busy.lo is None:
        return []
    whole = 100.0 * (inside_us + before + after) / (max(busy.hi, hi) - min(busy.lo, lo))
    return [f"the device ran ops before the first step ({before / 1e3:.2f} ms) or after the last "
            f"({after / 1e3:.2f} ms), outside the steps' window: they are in no figure (over the whole trace, "
            f"first op to last, the device was busy {whole:.1f}%)"]


def _meta(analyses, ranks, shifts, origin, lanes_meta, clock_notes, skews) -> dict:
    ref = analyses[0]
    t = ref.tables
    kinds = {vendor(fa.tables) for fa in analyses}
    chip = kinds.pop() if len(kinds) == 1 else "mixed"
    device = "cpu" if ref.host_basis else {"nvidia": "cuda", "amd": "rocm"}.get(chip, chip)
    notes = [n for fa in analyses for n in fa.notes] + clock_notes
    inferred = sorted({i for fa in analyses for i in fa.inferred})
    unknown = list(UNKNOWN_FIELDS)
    if all(p.prefill is None and p.decode is None for p in ref.plans):
        unknown += ["prefill_tokens", "decode_tokens"]
    if all(p.requests is None for p in ref.plans):
        unknown += ["num_requests", "tokens_out"]
    else:
        inferred.append("tokens_out (one token per request per step)")
    files = [{"name": os.path.basename(fa.tables.path), "path": os.path.abspath(fa.tables.path), "rank": r,
              "bytes": os.path.getsize(fa.tables.path), "events": fa.tables.events,
              "trace_start": _iso(fa.tables.start_us + s) if fa.tables.abs_offset_us() is not None else None}
             for fa, r, s in zip(analyses, ranks, shifts)]
    known_clock = t.abs_offset_us() is not None
    source = {"tool": t.header.get("batchscope_tool", "torch.profiler (Kineto)"),
              "format": t.header.get("batchscope_format", "chrome-trace-json"), "engine": ref.engine,
              "engine_evidence": ref.engine_evidence, "vendor": chip, "files": files,
              "trace_start": _iso(origin) if known_clock else None, "steps_from": ref.steps_from,
              "inferred": inferred, "unknown": unknown, "notes": notes, "clock": skews,
              "profiler": {k: bool(t.header.get(k)) for k in _PROFILER_FLAGS if k in t.header}}
    return {"model": None, "device": device, "gpu": lanes_meta[0]["gpu"] if lanes_meta else None, "dtype": None,
            "config": {}, "created": created_now(), "recording": None,
            "info": {"ranks": [{k: v for k, v in m.items() if not k.startswith("_")} for m in lanes_meta]},
            "origin": {"unix_s": round(origin / 1e6, 6)} if known_clock else {},
            "source": source}
