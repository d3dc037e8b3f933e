"""Summaries over a window of records, request latency metrics, and A/B comparison.

Formulas (times from request records, all per request, then pooled into percentiles):
  TTFT = first_token_us - arrival_us
  TPOT = (token_us[-1] - first_token_us) / (output_tokens - 1)      for output_tokens > 1 (first token excluded,
                                                                      as vLLM does)
  ITL  = token_us[i] - token_us[i-1] for i >= 1                      (every gap between consecutive tokens)
  E2E  = finish_us - arrival_us
  delivery delay = sent_us[i] - token_us[i]                          (streamed requests: the chunk's write less the
                                                                      token's making, telemetry/delivery.py)
Busy % is event-based: the union of the steps' compute spans inside the window over the window's length (on CPU
the spans are the host launch spans). The per-step floor is (weight bytes + KV bytes of the context) over a
measured bandwidth; it is the fastest a memory-bound decode step could possibly be.
Per mode (`per_mode`), each figure covers that mode's stretches (runs of consecutive steps) while there was work:
from the stretch's first compute start to its last compute end, less the gaps when no request existed
(`empty_queue`), so a pause in the load counts against neither loop. `async_forecast` is telemetry/forecast.py's.
"""
from __future__ import annotations


from .forecast import forecast_async
from .records import span_end, span_start
from .figures import board, stretch_figures
from .stretches import percentiles, stretches, union_length


def request_metrics(req: dict) -> dict:
    """TTFT/TPOT/E2E in ms and the list of ITLs in ms for one request record (None where undefined)."""
    arrival, first, finish = req.get("arrival_us"), req.get("first_token_us"), req.get("finish_us")
    times = req.get("token_us") or []
    n = req.get("output_tokens") or 0
    ms = 1e-3
    ttft = (first - arrival) * ms if first is not None and arrival is not None else None
    tpot = (times[-1] - first) * ms / (n - 1) if n > 1 and times and first is not None else None
    e2e = (finish - arrival) * ms if finish is not None and arrival is not None else None
    itl = [(b - a) * ms for a, b in zip(times, times[1:])]
    delivery = [(s - t) * ms for t, s in zip(times, req.get("sent_us") or ())]
    return {"ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": e2e, "itl_ms": itl, "delivery_ms": delivery}


def _step_time(rec: dict) -> float | None:
    c = rec.get("compute_us")
    return c[0] if c else span_start(rec)


def select_steps(steps, t0_us=None, t1_us=None) -> list:
    """Steps whose compute started (or, without compute, whose first span started) inside [t0, t1)."""
    out = []
    for rec in steps:
        t = _step_time(rec)
        if t is None or (t0_us is not None and t < t0_us) or (t1_us is not None and t >= t1_us):
            continue
        out.append(rec)
    return out


def summarize(steps, requests=(), nvml=(), info: dict | None = None, bandwidth_gbps: float | None = None,
              t0_us: float | None = None, t1_us: float | None = None, rank_steps=()) -> dict:
    """Step, request and NVML metrics over [t0_us, t1_us) (default: the steps' own extent), and the floor.
    With tensor parallelism (`rank_steps`, the other ranks' spans) also busy % per rank and NVML per GPU."""
    steps = select_steps(steps, t0_us, t1_us)
    w0 = t0_us if t0_us is not None else min((span_start(r) for r in steps), default=None)
    w1 = t1_us if t1_us is not None else max((span_end(r) for r in steps), default=None)
    summary = _step_summary(steps, w0, w1)
    summary.update(_inside_summary(steps))
    summary.update(_request_summary(requests, t0_us, t1_us))
    summary.update(_nvml_summary(nvml, w0, w1))
    summary.update(floor(steps, info or {}, bandwidth_gbps, summary["decode_ms_p50"]))
    summary["per_mode"] = per_mode(steps, nvml)
    summary["board"] = board(steps, live=False, nvml=nvml)
    if rank_steps:
        summary["ranks"] = per_rank(steps, rank_steps, nvml, w0, w1)
    summary["async_forecast"] = forecast_async(steps)
    return summary


def per_mode(steps, nvml=()) -> dict:
    """{"sync": figures, "async": figures} (stretch_figures) for the modes the steps ran in; `latest` in each is
    the same figures over that mode's latest stretch only, what the page's scoreboard shows."""
    out = {}
    for mode in ("sync", "async"):
        runs = stretches(steps, mode)
        if runs:
            out[mode] = {**stretch_figures(runs, nvml), "latest": stretch_figures(runs[-1:], nvml)}
    return out


def per_rank(steps, rank_steps, nvml, w0, w1) -> list[dict]:
    """Busy % of every rank's GPU over the window (compute spans from its own events), and its NVML means."""
    dur = (w1 - w0) if w0 is not None and w1 is not None and w1 > w0 else 0.0
    spans = {0: [r["compute_us"] for r in steps if r.get("compute_us")]}
    for r in rank_steps:
        span = r.get("compute_us")
        if span and (w0 is None or span[1] >= w0) and (w1 is None or span[0] <= w1):
            spans.setdefault(r["rank"], []).append(r["compute_us"])
    out = []
    for rank in sorted(spans):
        mine = [s for s in nvml if s.get("rank") == rank and (w0 is None or s["t_us"] >= w0)
                and (w1 is None or s["t_us"] <= w1) and s.get("gpu_util") is not None]
        out.append({"rank": rank, "steps": len(spans[rank]),
                    "busy_pct": round(100.0 * union_length(spans[rank], w0, w1) / dur, 2) if dur else None,
                    "gpu": mine[0].get("gpu") if mine else None,
                    "gpu_util_mean": round(sum(s["gpu_util"] for s in mine) / len(mine), 2) if mine else None})
    return out


def _step_periods(steps) -> tuple[list, list]:
    """Step periods in ms, compute start to the next step's compute start (what "ms/step" means in a
    benchmark): all of them, and those of decode-only steps."""
    periods, decode_periods = [], []
    for prev, cur in zip(steps, steps[1:]):
        if cur["step"] != prev["step"] + 1 or not prev.get("compute_us") or not cur.get("compute_us"):
            continue
        p = (cur["compute_us"][0] - prev["compute_us"][0]) / 1000.0
        periods.append(p)
        if cur["prefill_tokens"] == 0 and cur["decode_tokens"] > 0:
            decode_periods.append(p)
    return periods, decode_periods


def _step_summary(steps, w0, w1) -> dict:
    dur_us = (w1 - w0) if w0 is not None and w1 is not None and w1 > w0 else 0.0
    dur_s = dur_us / 1e6
    compute = [r["compute_us"] for r in steps if r.get("compute_us")]
    busy = union_length(compute, w0, w1) if dur_us else 0.0
    gpu_spans = [s for r in steps if r.get("gpu") for s in r["gpu"].values()]
    bases = sorted({r.get("compute_basis") for r in steps if r.get("compute_us")})
    idle_by_cause: dict[str, float] = {}
    for r in steps:
        for cause, us in (r.get("idle_by_cause_us") or {}).items():
            idle_by_cause[cause] = idle_by_cause.get(cause, 0.0) + us
    modes: dict[str, int] = {}
    for r in steps:
        modes[r["mode"]] = modes.get(r["mode"], 0) + 1
    periods, decode_periods = _step_periods(steps)
    decode_ms = percentiles(decode_periods)
    tokens_out = sum(r.get("tokens_out", 0) for r in steps)
    kv_pct = [100.0 * r["kv_blocks_used"] / r["kv_blocks_total"] for r in steps if r.get("kv_blocks_total")]
    return {
        "t0_us": w0, "t1_us": w1, "duration_s": round(dur_s, 6),
        "steps": len(steps),
        "first_step": steps[0]["step"] if steps else None,
        "last_step": steps[-1]["step"] if steps else None,
        "modes": modes,
        "busy_pct": round(100.0 * busy / dur_us, 2) if dur_us else None,
        "busy_basis": bases[0] if len(bases) == 1 else ("mixed" if bases else None),
        "busy_pct_any_stream": round(100.0 * union_length(gpu_spans, w0, w1) / dur_us, 2)
        if dur_us and gpu_spans else None,
        "idle_us_total": round(sum(idle_by_cause.values()), 1),
        "idle_us_by_cause": {k: round(v, 1) for k, v in sorted(idle_by_cause.items())},
        "tokens_out": tokens_out,
        "prefill_tokens": sum(r["prefill_tokens"] for r in steps),
        "decode_tokens": sum(r["decode_tokens"] for r in steps),
        "tokens_per_s": round(tokens_out / dur_s, 2) if dur_s else None,
        "steps_per_s": round(len(steps) / dur_s, 2) if dur_s else None,
        "step_ms": percentiles(periods),
        "decode_ms_per_step": decode_ms,
        "decode_ms_p50": decode_ms["p50"],
        "compute_ms": percentiles((c[1] - c[0]) / 1000.0 for c in compute),
        "batch_requests_mean": round(sum(r["num_requests"] for r in steps) / len(steps), 2) if steps else None,
        "queue_depth_max": max((r["queue_depth"] for r in steps), default=None),
        "kv_usage_pct_mean": round(sum(kv_pct) / len(kv_pct), 2) if kv_pct else None,
        "kv_usage_pct_max": round(max(kv_pct), 2) if kv_pct else None,
        "errors": sum(1 for r in steps if r.get("error")),
    }


def _inside_summary(steps) -> dict:
    """Steps imported from a profiler trace also know the idle time inside their compute spans (between kernels),
    how much of each kind of gap the host was late for, and collective time: their sums (absent otherwise)."""
    if not any("gpu_idle_inside_us" in r for r in steps):
        return {}
    by_cause: dict[str, float] = {}
    for r in steps:
        for cause, us in (r.get("idle_inside_by_cause_us") or {}).items():
            by_cause[cause] = by_cause.get(cause, 0.0) + us

    def total(key):
        return round(sum(r.get(key) or 0.0 for r in steps), 1)

    return {"idle_inside_us_total": total("gpu_idle_inside_us"),
            "idle_inside_us_by_cause": {k: round(v, 1) for k, v in sorted(by_cause.items())},
            "idle_host_late_us": total("idle_host_late_us"),
            "idle_inside_host_late_us": total("idle_inside_host_late_us"),
            "collective_us": total("collective_us")}


def _request_summary(requests, t0_us, t1_us) -> dict:
    """Latency percentiles of the requests that finished inside [t0_us, t1_us)."""
    finished = [q for q in requests if q.get("finish_us") is not None
                and (t0_us is None or q["finish_us"] >= t0_us) and (t1_us is None or q["finish_us"] < t1_us)]
    metrics = [request_metrics(q) for q in finished]
    reasons: dict[str, int] = {}
    for q in finished:
        reasons[str(q.get("finish_reason"))] = reasons.get(str(q.get("finish_reason")), 0) + 1
    return {
        "requests_finished": len(finished),
        "finish_reasons": reasons,
        "ttft_ms": percentiles(m["ttft_ms"] for m in metrics),
        "tpot_ms": percentiles(m["tpot_ms"] for m in metrics),
        "itl_ms": percentiles(x for m in metrics for x in m["itl_ms"]),
        "delivery_delay_ms": percentiles(x for m in metrics for x in m["delivery_ms"]),
        "requests_streamed": sum(1 for q in finished if q.get("sent_us")),
        "e2e_ms": percentiles(m["e2e_ms"] for m in metrics),
    }


def _nvml_summary(nvml, w0, w1) -> dict:
    """Means of the NVML (or host CPU) samples inside the window [w0, w1]."""
    samples = [s for s in nvml if (w0 is None or s["t_us"] >= w0) and (w1 is None or s["t_us"] <= w1)]

    def mean(key):
        vals = [s[key] for s in samples if s.get(key) is not None]
        return round(sum(vals) / len(vals), 2) if vals else None

    return {
        "nvml_samples": len(samples),
        "gpu_util_mean": mean("gpu_util"),
        "mem_util_mean": mean("mem_util"),
        "power_w_mean": mean("power_w"),
        "sm_clock_mhz_mean": mean("sm_clock_mhz"),
        "cpu_pct_mean": mean("cpu_pct"),
    }


def floor(steps, info: dict, bandwidth_gbps: float | None, decode_ms_p50: float | None) -> dict:
    """The memory-bound floor of a decode step: bytes that must cross HBM over the measured bandwidth.
    Context tokens are taken as the KV blocks in use times the block size (an upper bound by less than one
    block per request)."""
    out = {"bandwidth_gbps": bandwidth_gbps, "floor_bytes_per_step": None, "floor_ms_per_step": None,
           "floor_ratio": None}
    weights, per_token, block = info.get("weight_bytes"), info.get("kv_bytes_per_token"), info.get("block_size")
    decode = [r for r in steps if r["prefill_tokens"] == 0 and r["decode_tokens"] > 0]
    if not bandwidth_gbps or not weights or not decode:
        return out
    ctx = sum(r["kv_blocks_used"] for r in decode) / len(decode) * (block or 0)
    nbytes = weights + (per_token or 0) * ctx
    floor_ms = nbytes / (bandwidth_gbps * 1e9) * 1e3
    out.update(floor_bytes_per_step=int(nbytes), floor_ms_per_step=round(floor_ms, 4),
               floor_ratio=round(decode_ms_p50 / floor_ms, 4) if decode_ms_p50 else None)
    return out


def _flatten(d: dict, prefix: str = "") -> dict:
    flat = {}
    for k, v in d.items():
        if isinstance(v, dict):
            flat.update(_flatten(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            flat[prefix + k] = v
    return flat


def compare(a: dict, b: dict, labels: tuple[str, str] = ("a", "b")) -> dict:
    """Every numeric metric both summaries have (nested ones as dotted keys): {key: {a, b, diff, ratio}}.
    `ratio` is b / a; idle causes present in only one summary count as 0 in the other."""
    fa, fb = _flatten(a), _flatten(b)
    for cause in set(a.get("idle_us_by_cause", {})) | set(b.get("idle_us_by_cause", {})):
        key = f"idle_us_by_cause.{cause}"
        fa.setdefault(key, 0.0)
        fb.setdefault(key, 0.0)
    metrics = {}
    for key in sorted(set(fa) & set(fb)):
        va, vb = fa[key], fb[key]
        metrics[key] = {"a": va, "b": vb, "diff": round(vb - va, 4),
                        "ratio": round(vb / va, 4) if va else None}
    headline = {k: metrics[k] for k in ("busy_pct", "tokens_per_s", "decode_ms_p50", "idle_us_total",
                                        "ttft_ms.p50", "tpot_ms.p50", "gpu_util_mean") if k in metrics}
    return {"labels": list(labels), "modes": [a.get("modes"), b.get("modes")], "headline": headline,
            "metrics": metrics}
