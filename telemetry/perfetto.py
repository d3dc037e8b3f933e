"""A batchscope timeline as a Chrome Trace Event file, for Perfetto (ui.perfetto.dev) or chrome://tracing.

Tracks (each a pid/tid pair, all named with "M" events):
  pid 1 host      tid 1 engine thread: schedule/fill/launch/wait/update spans, mode switches as instants
  pid 2 GPU       tid 1 H2D stream, tid 2 compute stream, tid 3 D2H stream, tid 4 compute idle (gap + cause);
                  on CPU only tid 2 (the launch span standing in for compute) and tid 4
  pid 3 requests  one lane per concurrent request: arrival -> finish, with arrival -> first token nested inside
  pid 4 metrics   counters: batch size, tokens, KV usage, queue depth, tokens/s, NVML utilization, power, CPU %
  pid 10+r        tensor parallel: rank r's streams (r >= 1), tid 1-3 as for pid 2 (pid 2 is rank 0's GPU)
  pid 100+r       a timeline imported from a profiler trace with its kernels: rank r's device ops, one track per
                  stream, and a track of its idle stretches named by cause
Spans of one track never partially overlap: the host thread and each stream run one thing at a time, and any
clock jitter that would make two touch is clipped. Times are quantised to 1/8 µs, which is exact in binary, so
`ts + dur` of one event equals the `ts` of the next exactly. Files are capped by event count (oldest steps go
first) to stay far below the 256 MB browsers can open.
"""
from __future__ import annotations

from collections import deque

from .records import GPU_PHASES, HOST_PHASES

HOST, GPU, REQUESTS, METRICS = 1, 2, 3, 4
RANK_PID = 10                  # + rank, for ranks >= 1
KERNELS_PID = 100              # + rank: an imported trace's device ops
_KERNEL_IDLE_TID = 1_000_000   # above any stream id
_STREAM_TID = {"h2d": 1, "compute": 2, "d2h": 3}
_IDLE_TID = 4
_EVENTS_PER_STEP = 16          # a generous estimate used for the cap


def _q(t: float) -> float:
    return round(t * 8) / 8


class _Trace:
    def __init__(self):
        self.tracks: dict[tuple[int, int], list] = {}
        self.names: dict[tuple[int, int], str] = {}
        self.procs: dict[int, str] = {}
        self.other: list = []
        self.clipped = 0

    def track(self, pid: int, tid: int, name: str) -> list:
        self.names.setdefault((pid, tid), name)
        return self.tracks.setdefault((pid, tid), [])

    def span(self, pid, tid, name, s, e, cat, args=None) -> None:
        qs, qe = _q(s), _q(e)
        ev = {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": qs, "dur": qe - qs}
        if args:
            ev["args"] = args
        self.tracks[(pid, tid)].append(ev)

    def disjoint(self, key) -> list:
        """Sort a track and clip away overlaps (and empty spans) so no two of its events partially overlap."""
        out, last_end = [], None
        for ev in sorted(self.tracks[key], key=lambda e: (e["ts"], -e["dur"])):
            if last_end is not None and ev["ts"] < last_end:
                end = ev["ts"] + ev["dur"]
                self.clipped += 1
                if end <= last_end:
                    continue
                ev["ts"], ev["dur"] = last_end, end - last_end
            if ev["dur"] <= 0:
                continue
            out.append(ev)
            last_end = ev["ts"] + ev["dur"]
        return out


def _rolling_rate(steps: list, window_us: float = 1e6) -> list:
    """Output tokens delivered over the trailing second, at each step's end (None for a step without spans)."""
    out, total, window = [], 0, deque()
    for rec in steps:
        ends = [s[1] for s in rec["cpu"].values()]
        if not ends:
            out.append(None)
            continue
        t, n = max(ends), rec.get("tokens_out", 0)
        window.append((t, n))
        total += n
        while window[0][0] < t - window_us:
            total -= window.popleft()[1]
        out.append(round(total / (window_us / 1e6), 1))
    return out


def to_perfetto(timeline: dict, max_events: int = 2_000_000, max_request_lanes: int = 128) -> dict:
    """Chrome Trace Event JSON (as a dict) of a batchscope.timeline/1 dict."""
    meta = timeline.get("meta", {})
    steps, nvml, truncated, t_from = _capped(timeline, max_events)
    tr = _open_tracks(meta, steps)
    counters = tr.track(METRICS, 1, "counters")
    for rec, rate in zip(steps, _rolling_rate(steps)):
        _step_events(tr, counters, rec, rate)
    _rank_events(tr, meta, timeline.get("rank_steps") or [], t_from)
    kernels_dropped = _kernel_events(tr, timeline.get("kernels") or [], t_from, max_events // 2)
    for s in nvml:
        _nvml_counters(counters, s)
    for mc in timeline.get("mode_changes", []):
        tr.other.append({"ph": "i", "s": "g", "name": f"mode {mc['from']} -> {mc['to']}", "cat": "mode",
                         "ts": _q(mc["t_us"]), "pid": HOST, "tid": 1, "args": {"step": mc["step"]}})
    _request_lanes(tr, timeline.get("requests", []), t_from, max_request_lanes)
    events = []
    for key in tr.tracks:
        # counters and request lanes may overlap by design; the host thread and the streams may not
        events.extend(tr.tracks[key] if key == (METRICS, 1) or key[0] == REQUESTS else tr.disjoint(key))
    events.extend(tr.other)
    return {"traceEvents": _names(tr, events) + events, "displayTimeUnit": "ms",
            "otherData": {"schema": timeline.get("schema"), "model": meta.get("model"),
                          "device": meta.get("device"), "gpu": meta.get("gpu"),
                          "truncated_steps": truncated, "clipped_events": tr.clipped,
                          "truncated_device_ops": kernels_dropped}}


def _capped(timeline: dict, max_events: int) -> tuple[list, list, int, float | None]:
    """The newest steps that fit the event budget, the NVML samples from the first kept step on, how many steps
    were dropped, and the time the kept part starts (None when nothing was dropped)."""
    steps = timeline.get("steps", [])
    nvml = timeline.get("nvml", [])
    budget = max(max_events - 3 * len(nvml) - 2 * len(timeline.get("requests", [])), 1000)
    keep = max(budget // _EVENTS_PER_STEP, 1)
    truncated = max(len(steps) - keep, 0)
    steps = steps[truncated:]
    t_from = None
    if truncated and steps:
        t_from = min(s[0] for s in steps[0]["cpu"].values()) if steps[0]["cpu"] else None
        nvml = [s for s in nvml if t_from is None or s["t_us"] >= t_from]
    return steps, nvml, truncated, t_from


def _open_tracks(meta: dict, steps: list) -> _Trace:
    """Name the processes and the host and GPU tracks, in the order viewers list them."""
    tr = _Trace()
    on_gpu = any(rec.get("gpu") for rec in steps)
    tr.procs[HOST] = "host"
    tr.procs[GPU] = f"GPU {meta.get('gpu') or ''}".strip() if on_gpu else "compute (host launch span, no GPU)"
    tr.procs[REQUESTS] = "requests"
    tr.procs[METRICS] = "metrics"
    tr.track(HOST, 1, "engine thread")
    if on_gpu:
        for phase in GPU_PHASES:
            tr.track(GPU, _STREAM_TID[phase], f"{phase.upper() if phase != 'compute' else 'compute'} stream")
    else:
        tr.track(GPU, _STREAM_TID["compute"], "compute (host proxy)")
    tr.track(GPU, _IDLE_TID, "compute idle (cause)")
    return tr


def _step_events(tr: _Trace, counters: list, rec: dict, rate: float | None) -> None:
    """One step: its host spans, its GPU spans (or the host launch span standing in for compute), the idle gap
    before it, and its counters."""
    n = rec["step"]
    for phase in HOST_PHASES:
        span = rec["cpu"].get(phase)
        if span:
            tr.span(HOST, 1, f"{phase} {n}", span[0], span[1], "host", {"step": n})
    info = {"step": n, "mode": rec["mode"], "requests": rec["num_requests"],
            "prefill_tokens": rec["prefill_tokens"], "decode_tokens": rec["decode_tokens"]}
    if rec.get("gpu"):
        for phase, span in rec["gpu"].items():
            tr.span(GPU, _STREAM_TID[phase], f"{phase} {n}", span[0], span[1], "gpu",
                    info if phase == "compute" else {"step": n})
    elif rec.get("compute_us"):
        c = rec["compute_us"]
        tr.span(GPU, _STREAM_TID["compute"], f"compute {n}", c[0], c[1], "compute-proxy", info)
    idle, comp = rec.get("gpu_idle_before_us"), rec.get("compute_us")
    if idle and comp:
        tr.span(GPU, _IDLE_TID, f"idle: {rec.get('idle_cause')}", comp[0] - idle, comp[0], "idle",
                {"step": n, **(rec.get("idle_by_cause_us") or {})})
    start = comp or next(iter(rec["cpu"].values()), None)
    if start is None:                # a step that failed before any span: nothing to place
        return
    t = _q(start[0])
    counters.append(_counter("batch requests", t, {"requests": rec["num_requests"]}))
    counters.append(_counter("batch tokens", t, {"prefill": rec["prefill_tokens"], "decode": rec["decode_tokens"]}))
    if rec.get("kv_blocks_total"):
        counters.append(_counter("KV usage %", t,
                                 {"kv": round(100.0 * rec["kv_blocks_used"] / rec["kv_blocks_total"], 2)}))
    counters.append(_counter("queue depth", t, {"waiting": rec["queue_depth"]}))
    if rate is not None:
        counters.append(_counter("tokens/s", t, {"tokens_per_s": rate}))


def _rank_events(tr: _Trace, meta: dict, rank_steps: list, t_from: float | None) -> None:
    """Tensor parallel: each other rank's streams as a process of their own, named by rank and device."""
    devices = {r.get("rank"): r.get("device") for r in (meta.get("info") or {}).get("ranks") or []}
    if rank_steps:
        tr.procs[GPU] = f"rank 0 {tr.procs[GPU]}"
    for rec in rank_steps:
        rank, n = rec["rank"], rec["step"]
        pid = RANK_PID + rank
        if pid not in tr.procs:
            tr.procs[pid] = f"rank {rank} {devices.get(rank) or ''}".strip()
        for phase, span in rec["gpu"].items():
            if span is None or (t_from is not None and span[1] < t_from):
                continue
            tr.track(pid, _STREAM_TID[phase], f"{phase.upper() if phase != 'compute' else 'compute'} stream")
            tr.span(pid, _STREAM_TID[phase], f"{phase} {n}", span[0], span[1], "gpu",
                    {"step": n, "rank": rank, "mode": rec.get("mode")})


def _kernel_events(tr: _Trace, lanes: list, t_from: float | None, budget: int) -> int:
    """Imported device ops (one track per stream) and named idle stretches; the newest `budget` in all. Returns
    how many were left out."""
    total = sum(len(lane["ops"]) + len(lane["idle"]) for lane in lanes)
    keep_from = t_from
    if total > budget:
        starts = sorted((row[0] for lane in lanes for key in ("ops", "idle") for row in lane[key]), reverse=True)
        keep_from = max(keep_from or starts[budget - 1], starts[budget - 1])
    dropped = 0
    for lane in lanes:
        pid = KERNELS_PID + lane["rank"]
        tr.procs[pid] = f"rank {lane['rank']} device {lane['device']}: ops from the trace"
        for s, e, stream, name, kind, step in lane["ops"]:
            if keep_from is not None and s < keep_from:
                dropped += 1
                continue
            tr.track(pid, stream, f"stream {stream}")
            tr.span(pid, stream, lane["names"][name], s, e, "device_op", {"kind": lane["kinds"][kind], "step": step})
        for s, e, cause, step, inside in lane["idle"]:
            if keep_from is not None and s < keep_from:
                dropped += 1
                continue
            tr.track(pid, _KERNEL_IDLE_TID, "idle (cause)")
            tr.span(pid, _KERNEL_IDLE_TID, f"idle: {lane['causes'][cause]}", s, e, "device_idle",
                    {"step": step, "where": "inside the step" if inside else "before the step"})
    return dropped


def _nvml_counters(counters: list, s: dict) -> None:
    t = _q(s["t_us"])
    util = {k: s[f"{k}_util"] for k in ("gpu", "mem") if s.get(f"{k}_util") is not None}
    if util and s.get("gpu") is not None and s.get("rank") is not None:
        counters.append(_counter(f"NVML utilization % (rank {s['rank']}, GPU {s['gpu']})", t, util))
    elif util:
        counters.append(_counter("NVML utilization %", t, util))
    if s.get("power_w") is not None:
        counters.append(_counter("power W", t, {"power": s["power_w"]}))
    if s.get("cpu_pct") is not None:
        counters.append(_counter("host CPU %", t, {"cpu": s["cpu_pct"]}))


def _names(tr: _Trace, events: list) -> list:
    """The "M" events naming (and ordering) every process and thread that has events."""
    used = {(e["pid"], e["tid"]) for e in events}
    names = []
    for pid in sorted({p for p, _ in used}):
        first = min(t for p, t in used if p == pid)
        names.append({"ph": "M", "name": "process_name", "pid": pid, "tid": first, "args": {"name": tr.procs[pid]}})
        names.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": first, "args": {"sort_index": pid}})
    for pid, tid in sorted(used):
        names.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                      "args": {"name": tr.names[(pid, tid)]}})
    return names


def _counter(name: str, ts: float, values: dict) -> dict:
    return {"ph": "C", "name": name, "pid": METRICS, "tid": 1, "ts": ts, "args": values}


def _request_lanes(tr: _Trace, requests: list, t_from: float | None, max_lanes: int) -> None:
    """Each finished request on the first lane free at its arrival; TTFT nested inside its lifetime."""
    lane_ends: list[float] = []
    done = [r for r in requests if r.get("arrival_us") is not None and r.get("finish_us") is not None
            and (t_from is None or r["finish_us"] >= t_from)]
    for req in sorted(done, key=lambda r: r["arrival_us"]):
        a, f = _q(req["arrival_us"]), _q(req["finish_us"])
        if f <= a:
            continue
        lane = next((i for i, end in enumerate(lane_ends) if end <= a), None)
        if lane is None:
            if len(lane_ends) >= max_lanes:
                continue
            lane = len(lane_ends)
            lane_ends.append(f)
        lane_ends[lane] = f
        tid = lane + 1
        tr.track(REQUESTS, tid, f"lane {tid}")
        args = {"id": req["id"], "prompt_tokens": req.get("prompt_tokens"), "output_tokens": req["output_tokens"],
                "finish_reason": req.get("finish_reason")}
        tr.span(REQUESTS, tid, f"request {req['id']}", a, f, "request", args)
        first = req.get("first_token_us")
        if first is not None and a < _q(first) <= f:
            tr.span(REQUESTS, tid, "to first token", a, first, "request")
