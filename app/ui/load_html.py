"""The HTML of the Load test tab that load_tab.py shows while runs go on: a continuous load's status, an A/B's
progress, and the A/B table that says, per metric, which way is better and whether async won.

Pure functions of typed results (app/loadtest/statuses.py), like page_html.py, so they are checked without a
browser.
"""
from __future__ import annotations

import html
from typing import Any, Callable

from ..loadtest.statuses import ABStatus, BurstResults, LoadStatus
from .page_html import busy_label, error_html, number_text, progress_html, results_html

SAME_WITHIN = 0.02          # ratios within 2% of 1 read "about the same": run-to-run noise, not a verdict
# the delivery delay is a fraction of a millisecond on a quiet server: a change smaller than this is the host's
# scheduling jitter, however large its ratio (0.6 vs 0.8 ms is not "x1.33 worse")
DELIVERY_SAME_WITHIN_MS = 1.0

STOP_REASONS = {"stopped": "stopped on request", "duration": "reached its time bound",
                "max_requests": "sent its request bound", "shutdown": "the server is shutting down",
                "error": "failed"}


def _clock(seconds: float) -> str:
    s = max(0, int(round(seconds)))
    return f"{s // 60}:{s % 60:02d}"


# ------------------------------------------------------------------------------------------- continuous load

def load_kind_text(st: LoadStatus) -> str:
    spec = st.spec
    if spec.kind == "concurrency":
        return f"{spec.concurrency} requests kept in flight"
    gaps = "Poisson arrivals" if spec.arrival == "poisson" else "evenly spaced"
    return f"{spec.rate:g} requests/s, {gaps}"


def load_html(st: LoadStatus) -> str:
    """A continuous load as it runs (what it sends, the last seconds' rates, the switches it went through) and,
    once it has ended, why and its whole-run results."""
    e = html.escape
    running = st.state == "running"
    if running:
        head = (f'<b class="bs-load-state" data-state="running">running</b> {_clock(st.elapsed_s)} · '
                f'stops by itself in {_clock(st.remaining_s)} or after {st.spec.max_requests:,} requests')
    else:
        why = STOP_REASONS.get(st.stop_reason or "", st.stop_reason or "ended")
        head = (f'<b class="bs-load-state" data-state="{e(st.stop_reason or "done")}">{e(why)}</b> '
                f'after {_clock(st.elapsed_s)}')
    r = st.recent
    rows = [("mode now", e(st.mode or "–")),
            ("sent · completed", f"{st.sent:,} · {st.completed:,}"),
            ("in flight", f"{st.in_flight:,}"),
            (f"output tokens/s <small>last {r.window_s:.0f} s</small>", number_text(r.output_tokens_per_s)),
            (f"requests/s <small>last {r.window_s:.0f} s</small>", number_text(r.requests_per_s, 2)),
            (f"TTFT p50 ms <small>last {r.window_s:.0f} s</small>", number_text(r.ttft_ms_p50)),
            (f"E2E p50 ms <small>last {r.window_s:.0f} s</small>", number_text(r.e2e_ms_p50))]
    for label, n in (("failed", st.failed), ("cancelled at the stop", st.cancelled),
                     ("arrivals skipped (too many in flight)", st.skipped)):
        if n:
            rows.append((label, f"{n:,}"))
    body = "".join(f"<tr><th>{label}</th><td>{value}</td></tr>" for label, value in rows)
    switches = ""
    if st.mode_changes:
        items = ", ".join(f"→ {e(c.mode)} at {c.t_s:.1f} s" for c in st.mode_changes[-8:])
        more = f" (and {len(st.mode_changes) - 8} before)" if len(st.mode_changes) > 8 else ""
        switches = f'<div class="bs-load-switches">switches while it ran: {items}{more}</div>'
    error = error_html(f"load {st.id}: {st.error}") if st.error else ""
    whole = ""
    if not running and st.results is not None and st.results.completed:
        whole = '<div class="bs-load-sub">whole run</div>' + results_html(st.results, table_id="bs-load-results")
    return (f'<div id="bs-load-info" class="bs-load" data-state="{e(st.state)}">'
            f'<div class="bs-load-head">{head}</div>'
            f'<div class="bs-load-kind">{e(load_kind_text(st))} · load {e(st.id)}</div>{error}'
            f'<table class="bs-table bs-load-table"><tbody>{body}</tbody></table>{switches}{whole}</div>')


# ------------------------------------------------------------------------------------------------------- A/B

def ab_progress_html(st: ABStatus) -> str:
    """Progress of the half that runs, counted in that half's requests (each half sends the whole burst)."""
    if st.state == "running":
        if st.phase is None:
            label = f"A/B {st.id}: warming up"
        else:
            label = f"A/B {st.id}: {st.phase} half ({1 if st.phase == 'sync' else 2} of 2)"
        return progress_html(st.half_done, st.requests_per_half, label)
    if st.error:
        return error_html(f"A/B {st.id} failed: {st.error}")
    return progress_html(st.half_done, st.requests_per_half, f"A/B {st.id}: done, each half")


# (label, unit, read, digits): one row of the A/B table
Row = tuple[str, str, Callable[[BurstResults], Any], int, float]     # label, unit, read, digits, same within


def _latency(key: str, q: str) -> Callable[[BurstResults], Any]:
    return lambda r: getattr(getattr(r, key), q)


def _telemetry(key: str) -> Callable[[BurstResults], Any]:
    return lambda r: (r.telemetry or {}).get(key)


def _delivery(q: str) -> Callable[[BurstResults], Any]:
    """The delivery delay (the server's share of ITL): None, shown as unknown, where nothing was streamed."""
    return lambda r: ((r.telemetry or {}).get("delivery_delay_ms") or {}).get(q)


def ab_groups(res: BurstResults | None) -> list[tuple[str, str | None, list[Row]]]:
    """The A/B table's rows in groups that share which way is better: (heading, "lower"/"higher"/None, rows)."""
    nvml = (res is not None and (res.telemetry or {}).get("gpu_util_mean") is not None)
    return [
        ("time: lower is better ↓", "lower", [
            *((f"{label} {q}", "ms", _latency(key, q), 1, 0.0)
              for label, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("E2E", "e2e_ms"))
              for q in ("p50", "p99")),
            *((f"delivery delay {q}", "ms", _delivery(q), 2, DELIVERY_SAME_WITHIN_MS) for q in ("p50", "p99")),
            ("wall time", "s", lambda r: r.duration_s, 2, 0.0)]),
        ("throughput and busy: higher is better ↑", "higher", [
            ("output tokens/s", "", lambda r: r.output_tokens_per_s, 1, 0.0),
            ("requests/s", "", lambda r: r.requests_per_s, 2, 0.0),
            (busy_label(((res.telemetry if res else None) or {}).get("busy_basis")), "%", lambda r: r.busy_pct, 1,
             0.0)]),
        # utilization explains a result rather than being one: no verdict on it
        ("context: no better or worse", None, [
            ("NVML util, mean" if nvml else "host CPU, mean", "%",
             _telemetry("gpu_util_mean" if nvml else "cpu_pct_mean"), 1, 0.0)]),
    ]


def verdict(sync: Any, async_: Any, better: str | None, same_within: float = 0.0) -> tuple[str, str]:
    """(css class, text) for async against sync: the ratio, an arrow for which way it moved, and whether that
    is better or worse for this metric; "same" within 2% or within `same_within` in the metric's own unit."""
    try:
        s, a = float(sync), float(async_)
    except (TypeError, ValueError):
        return "bs-none", "–"
    if s == 0:
        return "bs-none", "–"
    ratio = a / s
    if abs(ratio - 1) < SAME_WITHIN or abs(a - s) < same_within:
        return "bs-same", f"×{ratio:.2f} ≈ same"
    arrow = "▲" if ratio > 1 else "▼"
    if better is None:
        return "bs-same", f"×{ratio:.2f} {arrow}"
    good = (ratio < 1) == (better == "lower")
    return ("bs-better", f"×{ratio:.2f} {arrow} better") if good else ("bs-worse", f"×{ratio:.2f} {arrow} worse")


def ab_compare_html(ab: ABStatus) -> str:
    """Sync and async results of the same burst side by side, in groups that say which way is better; the
    async/sync ratio of each row is coloured and worded by whether async did better or worse there."""
    s, a = ab.sync, ab.async_
    if s is None and a is None:
        return ""
    e = html.escape
    body = []
    for heading, better, rows in ab_groups(s or a):
        cells = []
        for label, unit, read, digits, same_within in rows:
            vs, va = (read(s) if s else None), (read(a) if a else None)
            if vs is None and va is None:
                continue
            cls, text = verdict(vs, va, better, same_within)
            cells.append(f'<tr><th>{e(label)} <small>{e(unit)}</small></th><td>{number_text(vs, digits)}</td>'
                         f'<td>{number_text(va, digits)}</td><td class="bs-verdict {cls}">{text}</td></tr>')
        if cells:
            body.append(f'<tr class="bs-ab-group" data-better="{better or "none"}"><th colspan="4">{e(heading)}'
                        f'</th></tr>' + "".join(cells))
    head = ""
    if ab.speedup is not None:
        cls, _ = verdict(1.0, ab.speedup, "higher")
        head = (f'<div class="bs-speedup">async speedup '
                f'<b id="bs-ab-speedup" class="{cls}">{number_text(ab.speedup, 2)}×</b>'
                f'<span>output tokens/s, same burst and seed; above 1 means async was faster</span></div>')
    invalid = ""
    if not ab.valid:
        when = ", ".join(f"→ {e(c.mode)} during the {e(c.phase or '?')} half" for c in ab.mode_changes)
        invalid = (f'<div id="bs-ab-invalid" class="bs-err" role="alert">Not a fair comparison: the mode changed '
                   f'while it ran ({when}).</div>')
    return (f'{invalid}{head}<table id="bs-ab-results" class="bs-table bs-ab"><thead><tr><th></th>'
            f'<th class="sync">sync</th><th class="async">async</th><th>async ÷ sync</th></tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>'
            f'<div class="bs-ab-legend"><span class="bs-better">better</span> or <span class="bs-worse">worse</span>'
            f' for that metric; the arrow is the way it moved (▲ up, ▼ down), ≈ within {SAME_WITHIN:.0%}</div>')
