"""The HTML of the Sweep tab that sweep_tab.py shows: a sweep's progress, what each mode's curve says (the highest
rate meeting the SLOs, where it leaves them, its knees) with the downloads, what an imported report held, and the
empty element each chart is drawn into, whose data-* attributes say what to draw (assets/js/sweep.js reads them).

Pure functions of a sweep's status as JSON (app/loadtest/sweep/progress.py), like load_html.py, so they are checked
without a browser.
"""
from __future__ import annotations

import html
import json

from .page_html import error_html, number_text

KIND_TEXT = {"synchronous": "synchronous", "throughput": "throughput", "constant": "constant rate",
             "poisson": "Poisson rate", "concurrent": "concurrent", "gamma": "gamma rate"}


def point_text(p: dict | None) -> str:
    """"3: constant rate @ 12.50 req/s" for a point or a picked point."""
    if not p:
        return "–"
    rate = f" @ {p['offered_rate']:.2f} req/s" if p.get("offered_rate") else ""
    return f"{p['index']}: {KIND_TEXT.get(p['kind'], p['kind'])}{rate}"


def sweep_progress_html(st: dict) -> str:
    e = html.escape
    done, total = st["points_done"], st["points_total"]
    pct = 100.0 * done / total if total else 0.0
    cur = st.get("current")
    if st["state"] == "running":
        if cur:
            where = (f"{e(cur['mode'])} · {e(point_text(cur))} · {cur['sent']} sent, {cur['finished']} finished, "
                     f"{cur['in_flight']} in flight" + (" · draining" if cur["draining"] else
                                                        f" · {cur['elapsed_s']:.0f} s"))
        else:
            where = "warming up"
        label = f"sweep {e(st['id'])}: {where}"
    elif st["state"] == "error":
        return error_html(f"sweep {st['id']} failed: {st.get('error')}")
    else:
        how = "stopped on request" if st.get("stop_reason") == "stopped" else (
            "stopped: the server is shutting down" if st.get("stop_reason") == "shutdown" else "done")
        label = f"sweep {e(st['id'])}: {how} after {st['elapsed_s']:.0f} s"
    return (f'<div id="bs-sweep-info" class="bs-progress-wrap" data-state="{e(st["state"])}" '
            f'data-stop="{e(st.get("stop_reason") or "")}"><div class="bs-progress"><div style="width:{pct:.1f}%">'
            f'</div></div><span class="bs-progress-label">{label} · {done}/{total} points</span></div>')


def _achieved(pick: dict | None) -> str:
    """What the server did at a point: its achieved request rate."""
    return "–" if not pick else f"{number_text(pick['requests_per_s'], 2)} req/s"


def _offered(pick: dict | None) -> str:
    """What the point asked of it: its offered rate, or how it loaded the server where it had none."""
    if not pick:
        return "–"
    if pick.get("offered_rate"):
        return f"{pick['offered_rate']:.2f} req/s"
    return {"synchronous": "one at a time", "throughput": "all in flight"}.get(pick["kind"], "–")


def _point(pick: dict | None) -> str:
    """Which point: its index and kind, "2: constant rate"."""
    return "–" if not pick else f"{e_(str(pick['index']))}: {e_(KIND_TEXT.get(pick['kind'], pick['kind']))}"


def e_(text: str) -> str:
    return html.escape(text)


def sweep_summary_html(st: dict) -> str:
    """Per mode: up to which rate it meets the SLOs, where it leaves them, its knees; then the downloads."""
    modes = {m: c.get("summary") or {} for m, c in (st.get("modes") or {}).items() if c.get("points")}
    if not modes:
        return ""
    slo = st.get("slo") or {}
    target = slo.get("target", 0.99)
    # per mode two columns: the rate the server achieved and the rate the point offered, never mixed in one cell
    rows = [(f"meets the SLOs (≥ {target:.0%}) up to", lambda s: s.get("slo_max")),
            ("leaves them at", lambda s: s.get("slo_exit")),
            ("TTFT p99 knee", lambda s: ((s.get("knees") or {}).get("ttft_ms") or {}).get("p99")),
            ("ITL p99 knee", lambda s: ((s.get("knees") or {}).get("itl_ms") or {}).get("p99")),
            ("E2E p99 knee", lambda s: ((s.get("knees") or {}).get("e2e_ms") or {}).get("p99"))]
    # per mode three columns: which point, the rate it offered and the rate the server achieved, never one cell
    head = "".join(f'<th class="{e_(m)}" colspan="3">{e_(m)}</th>' for m in modes)
    sub = "<th>point</th><th>offered</th><th>achieved</th>" * len(modes)

    def cells(label: str, pick: dict | None, s: dict) -> str:
        if pick is None and label == "leaves them at":
            return '<td colspan="3">not within the sweep</td>'
        if pick is None and s.get("slo_none_why") and label.startswith("meets"):
            return f'<td colspan="3" class="bs-sweep-why">{e_(s["slo_none_why"])}</td>'
        return f"<td>{_point(pick)}</td><td>{_offered(pick)}</td><td>{_achieved(pick)}</td>"

    body = "".join(f"<tr><th>{label}</th>" + "".join(cells(label, read(s), s) for s in modes.values()) + "</tr>"
                   for label, read in rows)
    top = "".join(_top(c.get("points") or []) for c in st["modes"].values() if c.get("points"))
    body += f"<tr><th>throughput run</th>{top}</tr>"
    limits = ", ".join(f"{k.split('_')[0].upper()} ≤ {v:g} ms" for k, v in slo.items() if k != "target" and v)
    limits += derived_text(st.get("slo_derived"))
    sid = e_(st["id"])
    links = (f'<div class="bs-sweep-downloads">download <a id="bs-sweep-json" href="/api/sweep/{sid}.json?download=1"'
             f' download>JSON</a> · <a id="bs-sweep-csv" href="/api/sweep/{sid}.csv?download=1" download>CSV</a>'
             f' <small>(batchscope.sweep/1; the charts have their own PNG button)</small></div>')
    return (f'<table id="bs-sweep-table" class="bs-table bs-ab"><thead><tr><th></th>{head}</tr>'
            f'<tr class="bs-sweep-sub"><th></th>{sub}</tr></thead>'
            f'<tbody>{body}</tbody></table><div class="bs-ab-legend">SLOs: {e_(limits or "none")} '
            f'(ITL against each request\'s mean gap)</div>{links}')


def derived_text(derived: dict | None) -> str:
    """" (TTFT and ITL from the synchronous run in sync: 3x and 2x its p99 of 37 and 18 ms)", or "" when the
    caller set them."""
    keys = [k for k in ("ttft_ms", "itl_ms") if (derived or {}).get(k, {}).get("from_p99_ms") is not None]
    if not keys:
        return ""
    names = " and ".join(k.split("_")[0].upper() for k in keys)
    factors = " and ".join(f"{derived[k]['factor']:g}x" for k in keys)
    p99s = " and ".join(f"{derived[k]['from_p99_ms']:,.1f}" for k in keys)
    return f" ({names} from the synchronous run in {derived.get('mode')}: {factors} its p99 of {p99s} ms)"


def _top(points: list[dict]) -> str:
    """The throughput run's three cells: its point, "all in flight", what it achieved (requests and tokens)."""
    p = next((p for p in points if p["kind"] == "throughput"), None)
    if p is None:
        return '<td colspan="3">–</td>'
    return (f"<td>{_point(p)}</td><td>{_offered(p)}</td><td>{number_text(p['requests_per_s'], 2)} req/s · "
            f"{number_text(p['output_tokens_per_s'])} tok/s</td>")


def import_html(report: dict) -> str:
    series = ", ".join(f"{e_(name)} ({len(c['points'])} points)" for name, c in report["modes"].items())
    notes = "".join(f"<li>{e_(n)}</li>" for n in report.get("notes") or [])
    return (f'<div id="bs-sweep-imported" class="bs-load-kind">overlaid: <b>{e_(report["format"])}</b>: {series}'
            f'{"<ul>" + notes + "</ul>" if notes else ""}</div>')


def chart_html(fig: str, **asked) -> str:
    """The element the page draws chart `fig` ("curves", "engine" or "dist") into: what it asks for as data-*
    attributes (assets/js/sweep.js lists them); a list is comma-separated, except a run's values, which are JSON."""
    attrs = [f'data-fig="{e_(fig)}"']
    for key, value in asked.items():
        if value is None or value == []:
            continue
        if key == "values":
            text = json.dumps(value, separators=(",", ":"))
        elif isinstance(value, (list, tuple)):
            text = ",".join(str(v) for v in value)
        else:
            text = str(value)
        attrs.append(f'data-{key}="{html.escape(text, quote=True)}"')
    return f'<div class="bs-sweep-fig" {" ".join(attrs)}></div>'
