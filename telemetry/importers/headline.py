"""What an imported timeline leads with: what the device did. The union of every device op (kernels, copies,
memsets, all streams) over the steps' window is `summary.busy_pct`, `busy_basis` "device_ops" says so, and the
steps' compute spans (batchscope's own definition, which counts launch gaps inside a step as busy) keep their
figure as `busy_pct_steps`. Each step carries its share of the device's busy time (`device_ops_before_us`,
`device_ops_us`) so that any stretch of steps, and the page's busy chart, reads the same figure. Each rank gets
its busy, collective time, idle by cause and host lateness, and the rank that held the others back is named
with the evidence. Figures the trace does not hold are None, never 0 (docs/import.md)."""
from __future__ import annotations

DEVICE_BASIS = "device_ops"
# a straggler: the rank whose host was late the most, when the others waited in collectives this much longer
STRAGGLER_MIN_US = 50.0
STRAGGLER_RATIO = 1.5
# summary keys that mean nothing when the trace lacks the field they are made of
_UNKNOWN_SUMMARY = {"num_requests": ("batch_requests_mean",), "queue_depth": ("queue_depth_max",),
                    "kv_blocks_used": ("kv_usage_pct_mean", "kv_usage_pct_max"),
                    "tokens_out": ("tokens_out", "tokens_per_s"),
                    "prefill_tokens": ("prefill_tokens",), "decode_tokens": ("decode_tokens",)}
_UNKNOWN_MODE = {"tokens_out": ("tokens_out", "tokens_per_s", "decode_tokens_per_s")}


def device_shares(lane) -> list[tuple[float | None, float | None]]:
    """Per step (plan index) of one device lane: its busy µs in the gap before its compute span and in its own
    part of the span (from where the steps before it ended). The parts tile the steps' window without overlap,
    so the shares of any run of steps add up to the device's busy time over that run."""
    out: list[tuple[float | None, float | None]] = []
    prev_end = None
    for sp in lane.spans:
        if lane.busy is None or sp is None or sp.compute is None:
            out.append((None, None))
            continue
        c0, c1 = sp.compute
        before = None if prev_end is None else (lane.busy.busy_us(prev_end, c0) if c0 > prev_end else 0.0)
        lo = c0 if prev_end is None else max(c0, prev_end)
        out.append((before, lane.busy.busy_us(lo, max(c1, lo))))
        prev_end = c1 if prev_end is None else max(prev_end, c1)
    return out


def put_shares(rec: dict, share: tuple[float | None, float | None]) -> dict:
    before, own = share
    if own is not None:
        rec["device_ops_us"] = round(own, 1)
        if before is not None:
            rec["device_ops_before_us"] = round(before, 1)
    return rec


def lead_with_device(summary: dict) -> None:
    """busy_pct becomes the device's own figure where the trace has device ops; the steps' figure stays beside."""
    if summary.get("busy_pct_device_ops") is None:
        return
    summary["busy_pct_steps"], summary["busy_basis_steps"] = summary.get("busy_pct"), summary.get("busy_basis")
    summary["busy_pct"], summary["busy_basis"] = summary["busy_pct_device_ops"], DEVICE_BASIS


def unknown_is_none(summary: dict, unknown: list[str]) -> None:
    """Figures made of a field the trace does not hold read None (the page shows "not in the trace"), not 0."""
    for field in unknown:
        for key in _UNKNOWN_SUMMARY.get(field, ()):
            if key in summary:
                summary[key] = None
        for key in _UNKNOWN_MODE.get(field, ()):
            for part in [*summary.get("per_mode", {}).values(), *summary.get("board", {}).get("modes", {}).values()]:
                for fig in (part, part.get("latest") or {}):
                    if key in fig:
                        fig[key] = None
    summary["unknown"] = list(unknown)


def lane_idle(lane) -> dict:
    """One device lane's idle time between and inside steps by cause, and how much of it the host was late for."""
    by_cause: dict[str, float] = {}
    late = between = inside = 0.0
    for gaps, inner in ((lane.between, False), (lane.inside, True)):
        for g in gaps:
            if g is None:
                continue
            late += g.host_late_us
            if inner:
                inside += g.total_us
            else:
                between += g.total_us
            for cause, us in g.causes.items():
                by_cause[cause] = by_cause.get(cause, 0.0) + us
    return {"idle_between_us": round(between, 1), "idle_inside_us": round(inside, 1),
            "idle_us_by_cause": {k: round(v, 1) for k, v in sorted(by_cause.items(), key=lambda kv: -kv[1])},
            "host_late_us": round(late, 1)}


def rank_table(summary: dict, devices: list[dict]) -> None:
    """summary.ranks with each rank's device figures (busy by device ops, the steps' figure beside it, collective
    time, idle by cause), and summary.straggler: which rank held the others back, and the evidence."""
    by_rank = {r["rank"]: r for r in summary.get("ranks", [])}
    rows = []
    for dev in devices:
        row = dict(by_rank.get(dev["rank"], {"rank": dev["rank"]}))
        row["busy_pct_steps"] = row.get("busy_pct")
        row.update(busy_pct=dev["busy_pct_device_ops"], busy_basis=DEVICE_BASIS, device=dev["device"],
                   collective_us=dev["collective_us"], **{k: dev[k] for k in ("idle_between_us", "idle_inside_us",
                                                                              "idle_us_by_cause", "host_late_us")})
        rows.append(row)
    if len(rows) < 2:
        return
    summary["ranks"] = rows
    summary["straggler"] = straggler(rows)


def straggler(rows: list[dict]) -> dict:
    """The rank whose host launched late while the others waited inside the collectives: the one with the most
    host-late idle, named only when every other rank spent clearly longer in collectives than it did (they
    waited for it). Else {"rank": None, "reason": ...}."""
    late = max(rows, key=lambda r: r["host_late_us"])
    others = [r for r in rows if r is not late]
    waited = min(r["collective_us"] for r in others)
    mine = late["collective_us"]
    if waited - mine < STRAGGLER_MIN_US or waited < STRAGGLER_RATIO * max(mine, 1.0):
        return {"rank": None, "reason": f"no rank held the others back: the ranks' collective time is "
                                        f"{_span([r['collective_us'] for r in rows])}, their host lateness "
                                        f"{_span([r['host_late_us'] for r in rows])}"}
    who = "the other" if len(others) == 1 else "the others"
    return {"rank": late["rank"], "host_late_us": late["host_late_us"], "collective_us": mine,
            "others_collective_us": [r["collective_us"] for r in others],
            "evidence": f"rank {late['rank']}'s host launched late for {_ms(late['host_late_us'])} ({who} "
                        f"{_span([r['host_late_us'] for r in others])}) and it spent {_ms(mine)} in collectives "
                        f"while {who} waited {_span([r['collective_us'] for r in others])} in them for it"}


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return _ms(lo) if _ms(lo) == _ms(hi) else f"{_ms(lo)}-{_ms(hi)}"


def _ms(us: float) -> str:
    return f"{us / 1e3:.2f} ms" if us >= 100 else f"{us:.0f} µs"
