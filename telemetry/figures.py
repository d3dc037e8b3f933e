"""The figures a viewer reads first, computed once, here, from completed step records: the header's live counters
(`recent`), each mode's figures (`stretch_figures`), and the scoreboard that sets sync against async (`board`).
The page only draws them; the timeline summary of a recording holds the same board.

Only completed steps count: a record exists once its step was consumed, so the step in flight is never half in a
window. The header's window ends at the newest completed step while requests run (a step of 400 ms leaves the
last wall-clock second empty half the time), at the present once none do (an idle engine reads 0).

The comparison is honest by construction:
- both ratios (ms/step and decode tokens/s) come from one set of steps: decode-only steps (no prefill chunk
  sways them) of batch sizes both modes ran, as many of each size from each mode (the newest ones);
- the first `WARMUP_STEPS` steps of every stretch are left out (the async pipeline fills, a switch drains, an
  A/B's warm-up runs) and listed as warm-up bands for the Gantt;
- no ratio is given before `MIN_STEPS` matched steps per mode;
- every ratio carries a 90% interval from the steps' own spread (the median's standard error, 0.93 x IQR /
  sqrt(n), for ms/step; the mean's for tokens/s), and the verdict is "within noise" when the interval holds 1 or
  the difference is under `PRACTICAL` (2%): a difference a room cannot see is not reported as one;
- the board names a winner only across switches between the modes (alternations.py): the ratio at each switch,
  with an interval over them, must exclude 1 too ("not enough alternations" until there are MIN_SWITCHES), and
  never where compute runs on the host ("no winner here"). The steps' own verdict stays as `step_verdict` (an
  A/B of one burst is one switch by design and reads that).
"""
from __future__ import annotations

import math
import statistics

from .alternations import MAX_SWITCHES, MIN_PAIR_STEPS, MIN_SWITCHES, host_compute, switch_interval
from .forecast import forecast_runs
from .stretches import empty_queue_us, percentiles, run_periods, stretches, union_length

BUSY_US = 2e6            # the header's busy % covers the newest 2 s of completed work...
TOKENS_US = 5e6          # ...and its tokens/s the newest 5 s
WARMUP_STEPS = 3         # the first steps of every stretch: the pipeline fills, a switch drains
MIN_STEPS = 20           # matched decode steps per mode before any ratio shows
PRACTICAL = 0.02         # a ratio within 2% of 1 is "within noise" whatever its interval says
LIVE_WINDOW_US = 15e6    # live, each mode's figures cover the newest 15 s of its latest stretch...
MAX_BOARD_STEPS = 1000   # ...and at most its newest 1000 steps (millisecond steps: the board stays cheap)
Z90 = 1.645
DEVICE_BASIS = "device_ops"   # busy from the union of a trace's device ops (an imported trace's steps)


def _tokens(rec: dict) -> int:
    tok = rec.get("tokens_out")
    return tok if tok is not None else rec.get("decode_tokens", 0)


# ------------------------------------------------------------------------------------------------- the header
def recent(steps, now_us: float, running: int | None) -> dict:
    """The header's figures (the "stats" messages): busy % over the newest BUSY_US of completed work, output
    tokens/s over the newest TOKENS_US (long enough that one prefill step of a slow device does not swing it).
    Each window ends at the newest completed step while requests run, at `now_us` once none do, and starts no
    earlier than the work did (the first step after the last gap in which no request existed)."""
    done = [r for r in steps if r.get("compute_us")]
    if not done:
        unknown = None if running else 0.0
        return {"busy_pct": unknown, "tokens_per_s": unknown, "window_us": None, "window_end_us": now_us,
                "window_steps": 0}
    end = max(r["compute_us"][1] for r in done[-8:]) if running else now_us
    busy, width, n = _window(done, end, BUSY_US, lambda inside, lo: union_length([r["compute_us"] for r in inside],
                                                                                lo, end))
    tokens, t_width, _ = _window(done, end, TOKENS_US,
                                 lambda inside, lo: sum(_tokens(r) for r in inside if r["compute_us"][1] <= end))
    return {"busy_pct": round(100.0 * busy / width, 2) if width > 0 else None,
            "tokens_per_s": round(tokens / (t_width / 1e6), 2) if t_width > 0 else None,
            "window_us": round(width, 1), "window_end_us": end, "window_steps": n}


def _window(done: list[dict], end: float, width_us: float, measure) -> tuple[float, float, int]:
    """(measure(steps, lo), end - lo, steps) over the completed steps reaching into [end - width_us, end]."""
    lo = end - width_us
    inside = []
    for r in reversed(done):
        if r["compute_us"][1] <= lo:
            break
        if r["compute_us"][0] < end:
            inside.append(r)
        if empty_queue_us(r) > 0:             # the work began at this step: nothing before it was waiting
            lo = max(lo, r["compute_us"][0])
            break
    else:
        lo = max(lo, done[0]["compute_us"][0])
    return (measure(inside, lo) if end > lo else 0.0), end - lo, len(inside)


# ------------------------------------------------------------------------------------------- one mode's figures
def stretch_figures(runs, nvml=()) -> dict:
    """One mode's figures over its stretches (each a list of consecutive steps of that mode):
    busy % and tokens/s over the working time; decode tokens/s, the tokens of steps without prefill over their
    own periods (steady decoding, whatever the arrivals did); for an imported trace's steps busy % is the device's
    (their `device_ops_us` shares, basis "device_ops") and the compute spans' figure is `busy_pct_steps`;
    ms/step (run_periods, p50 as `ms_per_step`); GPU idle per step (the gap before each step but a stretch's first,
    whose gap spans the switch; empty-queue parts excluded) split by cause, and NVML (or host CPU) means over the
    stretches' windows."""
    work_us = busy_us = span_busy_us = decode_ms = 0.0
    periods, idle, windows, steps, device_runs = [], [], [], 0, 0
    by_cause: dict[str, float] = {}
    tokens = decode_tok = 0
    for run in runs:
        spans = [r["compute_us"] for r in run if r.get("compute_us")]
        steps += len(run)
        tokens += sum(_tokens(r) for r in run)
        if not spans:
            continue
        lo, hi = spans[0][0], max(c[1] for c in spans)
        windows.append((lo, hi))
        work_us += max(0.0, hi - lo - sum(empty_queue_us(r) for r in run[1:]))
        steps_busy = union_length(spans, lo, hi)
        span_busy_us += steps_busy
        device = _device_ops_us(run)
        busy_us += steps_busy if device is None else min(device, hi - lo)
        device_runs += device is not None
        for rec, ms in run_periods(run):
            periods.append(ms)
            if rec["prefill_tokens"] == 0:
                decode_ms += ms
                decode_tok += _tokens(rec)
        for r in run[1:]:
            if r.get("gpu_idle_before_us") is None:
                continue
            idle.append(max(0.0, r["gpu_idle_before_us"] - empty_queue_us(r)))
            for cause, us in (r.get("idle_by_cause_us") or {}).items():
                if cause != "empty_queue":
                    by_cause[cause] = by_cause.get(cause, 0.0) + us
    samples = [x for x in nvml if any(lo <= x["t_us"] <= hi for lo, hi in windows)]

    def mean(key):
        vals = [x[key] for x in samples if x.get(key) is not None]
        return round(sum(vals) / len(vals), 2) if vals else None

    bases = sorted({r.get("compute_basis") for run in runs for r in run if r.get("compute_us")})
    if device_runs:                       # an imported trace's stretches: busy is the device's own
        bases = [DEVICE_BASIS if device_runs == len(windows) else "mixed"]
    ms = percentiles(periods)
    return {
        "steps": steps, "stretches": len(runs),
        "first_step": runs[0][0]["step"] if runs else None, "last_step": runs[-1][-1]["step"] if runs else None,
        "ranges": [[run[0]["step"], run[-1]["step"]] for run in runs],
        "work_s": round(work_us / 1e6, 6),
        "busy_pct": round(100.0 * busy_us / work_us, 2) if work_us else None,
        "busy_basis": bases[0] if len(bases) == 1 else ("mixed" if bases else None),
        **({"busy_pct_steps": round(100.0 * span_busy_us / work_us, 2) if work_us else None} if device_runs else {}),
        "tokens_out": tokens,
        "tokens_per_s": round(tokens / (work_us / 1e6), 2) if work_us else None,
        "decode_tokens_per_s": round(decode_tok / (decode_ms / 1e3), 2) if decode_ms else None,
        "ms_per_step": ms["p50"], "step_ms": ms,
        "idle_us_per_step": round(sum(idle) / len(idle), 1) if idle else None,
        "idle_us_by_cause": {k: round(v, 1) for k, v in sorted(by_cause.items(), key=lambda kv: -kv[1])},
        "gpu_util_mean": mean("gpu_util"), "cpu_pct_mean": mean("cpu_pct"),
    }


def _device_ops_us(run) -> float | None:
    """The device's busy time (union of its ops) over one stretch, from an imported trace's per-step shares (the
    first step's own part, then each step's gap and part); None where the steps do not carry them."""
    done = [r for r in run if r.get("compute_us")]
    if not done or any("device_ops_us" not in r for r in done):
        return None
    return done[0]["device_ops_us"] + sum(r["device_ops_us"] + (r.get("device_ops_before_us") or 0.0)
                                          for r in done[1:])


# ------------------------------------------------------------------------------------------------ the board
def _cut_warmup(runs) -> tuple[list, list]:
    """Runs without their first WARMUP_STEPS steps (a run no longer than that is all warm-up), and the bands."""
    kept, bands = [], []
    for run in runs:
        head = run[:WARMUP_STEPS]
        bands.append({"mode": run[0]["mode"], "first_step": head[0]["step"], "last_step": head[-1]["step"],
                      "t0_us": (head[0].get("compute_us") or [None])[0],
                      "t1_us": (head[-1].get("compute_us") or [None, None])[1]})
        if len(run) > WARMUP_STEPS:
            kept.append(run[WARMUP_STEPS:])
    return kept, bands


def _newest(run: list[dict], window_us: float) -> list[dict]:
    end = next((r["compute_us"][1] for r in reversed(run) if r.get("compute_us")), None)
    if end is None:
        return run
    return [r for r in run if r.get("compute_us") and r["compute_us"][0] >= end - window_us]


def mode_runs(steps, live: bool, window_us: float = LIVE_WINDOW_US) -> dict:
    """Each mode's stretches the board covers: live, the newest `window_us` of that mode's latest stretch (so a
    switch shows within seconds); for a recording, every stretch of that mode. `steps` in step order (live, a
    deque: it is walked from its newest end and only as far as needed)."""
    if live:
        return _latest_runs(steps, window_us)
    out = {"sync": [], "async": []}
    for run in stretches(steps):
        if run[0]["mode"] in out:
            out[run[0]["mode"]].append(run)
    return out


def _latest_runs(steps, window_us: float) -> dict:
    out: dict[str, list] = {"sync": [], "async": []}
    run: list[dict] = []
    for rec in reversed(steps):
        if run and (rec["mode"] != run[-1]["mode"] or rec["step"] != run[-1]["step"] - 1):
            _keep(out, run, window_us)
            run = []
            if out["sync"] and out["async"]:
                break
        run.append(rec)
    if run:
        _keep(out, run, window_us)
    return out


def _keep(out: dict, newest_first: list[dict], window_us: float) -> None:
    mode = newest_first[0]["mode"]
    if mode in out and not out[mode]:
        out[mode] = [_newest(newest_first[::-1], window_us)]


def _switches(steps, live: bool, window_us: float) -> list[float]:
    """The ratio at each switch the board can see: live, between the newest MAX_SWITCHES + 1 stretches (each its
    newest `window_us`); for a recording, every switch."""
    if live:
        newest: list[list[dict]] = []
        run: list[dict] = []
        for rec in reversed(steps):
            if run and (rec["mode"] != run[-1]["mode"] or rec["step"] != run[-1]["step"] - 1):
                newest.append(_newest(run[::-1], window_us)[-MAX_BOARD_STEPS:])
                run = []
                if len(newest) > MAX_SWITCHES:
                    break
            run.append(rec)
        if run and len(newest) <= MAX_SWITCHES:
            newest.append(_newest(run[::-1], window_us)[-MAX_BOARD_STEPS:])
        runs = newest[::-1]
    else:
        runs = stretches(steps)
    return switch_ratios(_cut_warmup(runs)[0])


def _decode_periods(runs) -> list[tuple[int, float, int]]:
    """(batch size, ms, decode tokens) of every decode-only step with a period."""
    return [(rec["num_requests"], ms, _tokens(rec)) for run in runs for rec, ms in run_periods(run)
            if rec["prefill_tokens"] == 0 and rec["decode_tokens"] > 0 and ms > 0]


def _matched(sync: list, asyn: list) -> tuple[list, list]:
    """As many steps of each batch size from each mode (the newest), for the sizes both ran."""
    def by_size(rows):
        out: dict[int, list] = {}
        for row in rows:
            out.setdefault(row[0], []).append(row)
        return out
    s, a = by_size(sync), by_size(asyn)
    ms, ma = [], []
    for size in sorted(set(s) & set(a)):
        n = min(len(s[size]), len(a[size]))
        ms += s[size][-n:]
        ma += a[size][-n:]
    return ms, ma


def _median_spread(values: list[float]) -> tuple[float, float]:
    """The median and its relative standard error, from the IQR (1.2533 sigma / sqrt(n), sigma ~ IQR / 1.349), which
    a few outliers (a collector pause, a slow wake-up) do not inflate."""
    med = statistics.median(values)
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [med, med, med]
    return med, 0.929 * (q[2] - q[0]) / (med * math.sqrt(len(values))) if med else 0.0


def _mean_spread(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return mean, sd / (mean * math.sqrt(len(values))) if mean else 0.0


def _ratio(x: float, ex: float, y: float, ey: float) -> dict:
    """x / y with a 90% interval from the two relative errors (on the log scale)."""
    r = x / y
    half = Z90 * math.sqrt(ex * ex + ey * ey)
    return {"ratio": round(r, 4), "ci": [round(r * math.exp(-half), 4), round(r * math.exp(half), 4)]}


def switch_ratios(runs_in_order) -> list[float]:
    """sync / async ms per step at each switch between the modes: the medians of the two stretches either side of
    it, on matched decode steps (warm-up already cut), where each side has MIN_PAIR_STEPS of them."""
    ratios = []
    for a, b in zip(runs_in_order, runs_in_order[1:]):
        if a[0]["mode"] == b[0]["mode"] or {a[0]["mode"], b[0]["mode"]} != {"sync", "async"}:
            continue
        s, y = (a, b) if a[0]["mode"] == "sync" else (b, a)
        ms, ma = _matched(_decode_periods([s]), _decode_periods([y]))
        if len(ms) >= MIN_PAIR_STEPS:
            ratios.append(statistics.median(r[1] for r in ms) / statistics.median(r[1] for r in ma))
    return ratios


def compare(sync_runs, async_runs, switches: list[float] | None = None, on_host: bool = False) -> dict:
    """Async against sync on matched decode steps: ms/step (sync / async: above 1 is async faster) and decode
    tokens/s (async / sync), each with its interval, and one verdict. With `switches` (the ratio at each switch,
    switch_ratios) the verdict also needs their interval to exclude 1; `on_host`: no winner at all."""
    out = _compare_steps(sync_runs, async_runs)
    out["step_verdict"], out["step_reason"] = out["verdict"], out.get("reason")
    if switches is None or out["ms_per_step"] is None:
        return out
    out["switches"] = alt = switch_interval(switches)
    if on_host:
        out["verdict"], out["reason"] = "no winner here", (
            "compute runs on the host: async has nothing to hide here, so a difference is the machine's, "
            "not the mode's")
    elif alt["n"] < MIN_SWITCHES or alt["ci"] is None:
        out["verdict"], out["reason"] = "not enough alternations", (
            f"{alt['n']} of {MIN_SWITCHES} switches between the modes with {MIN_PAIR_STEPS}+ matched steps a side: "
            "the steps of one stretch cannot tell the mode from load that changed between stretches")
    elif out["verdict"] in ("async faster", "async slower") and alt["ci"][0] <= 1.0 <= alt["ci"][1]:
        lo, hi = alt["ci"]
        out["verdict"], out["reason"] = "within noise", (
            f"over {alt['n']} switches the 90% interval {lo:.2f}-{hi:.2f}x holds 1")
    elif out["verdict"] in ("async faster", "async slower"):
        lo, hi = alt["ci"]
        out["reason"] += f"; over {alt['n']} switches {lo:.2f}-{hi:.2f}x"
    return out


def _compare_steps(sync_runs, async_runs) -> dict:
    s_rows, a_rows = _matched(_decode_periods(sync_runs), _decode_periods(async_runs))
    out = {"basis": "decode steps of batch sizes both modes ran, as many of each size from each",
           "n": {"sync": len(s_rows), "async": len(a_rows)}, "min_steps": MIN_STEPS,
           "batch_sizes": sorted({r[0] for r in s_rows}), "ms_per_step": None, "tokens_per_s": None,
           "verdict": "not enough steps", "speedup": None}
    if len(s_rows) < MIN_STEPS or len(a_rows) < MIN_STEPS:
        have = min(len(s_rows), len(a_rows))
        out["reason"] = f"{have} of {MIN_STEPS} matched decode steps per mode so far"
        return out
    s_med, s_err = _median_spread([r[1] for r in s_rows])
    a_med, a_err = _median_spread([r[1] for r in a_rows])
    ms = _ratio(s_med, s_err, a_med, a_err)
    ms.update({"sync": round(s_med, 4), "async": round(a_med, 4)})
    tps_s = sum(r[2] for r in s_rows) / (sum(r[1] for r in s_rows) / 1e3)
    tps_a = sum(r[2] for r in a_rows) / (sum(r[1] for r in a_rows) / 1e3)
    _, s_merr = _mean_spread([r[1] for r in s_rows])
    _, a_merr = _mean_spread([r[1] for r in a_rows])
    tps = _ratio(tps_a, a_merr, tps_s, s_merr)
    tps.update({"sync": round(tps_s, 2), "async": round(tps_a, 2)})
    out.update(ms_per_step=ms, tokens_per_s=tps, speedup=ms["ratio"])
    lo, hi = ms["ci"]
    if lo <= 1.0 <= hi or abs(ms["ratio"] - 1.0) < PRACTICAL:
        out["verdict"], out["reason"] = "within noise", (
            f"the 90% interval {lo:.2f}-{hi:.2f}x holds 1" if lo <= 1.0 <= hi
            else f"{abs(ms['ratio'] - 1) * 100:.1f}% apart, under {PRACTICAL * 100:.0f}%")
    else:
        out["verdict"] = "async faster" if ms["ratio"] > 1 else "async slower"
        out["reason"] = f"90% interval {lo:.2f}-{hi:.2f}x"
    return out


def board(steps, live: bool, nvml=(), window_us: float = LIVE_WINDOW_US, cache: dict | None = None) -> dict:
    """The scoreboard: each mode's figures (warm-up left out), the comparison and the async forecast. `cache`
    (a dict the caller keeps) holds each mode's part by the steps it covered, so the live board recomputes only
    the mode that is running: the other's stretch is over and its figures cannot change."""
    runs = mode_runs(steps, live, window_us)
    warmup: list = []
    kept, modes = {}, {}
    for mode, rs in runs.items():
        rs = [r[-MAX_BOARD_STEPS:] for r in rs if r] if live else [r for r in rs if r]
        key = (mode, tuple((r[0]["step"], r[-1]["step"]) for r in rs))
        part = cache.get(key) if cache is not None else None
        if part is None:
            cut, bands = _cut_warmup(rs)
            fig = stretch_figures(cut, nvml)
            fig["warmup_steps"] = sum(min(len(r), WARMUP_STEPS) for r in rs)
            part = (cut, bands, fig)
            if cache is not None:
                for k in [k for k in cache if k[0] == mode]:
                    del cache[k]
                cache[key] = part
        kept[mode], bands, modes[mode] = part
        warmup += bands
    return {"scope": "live" if live else "recording",
            "window_s": window_us / 1e6 if live else None,
            "warmup_steps_per_stretch": WARMUP_STEPS,
            "modes": modes, "compare": compare(kept["sync"], kept["async"], _switches(steps, live, window_us),
                                               host_compute(kept["sync"] + kept["async"])),
            "forecast": forecast_runs(kept["sync"], kept["async"]),
            "warmup": sorted(warmup, key=lambda b: b["first_step"])}
