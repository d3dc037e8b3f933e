"""The Sweep tab's charts, built on the server as Plotly figures (gr.Plot draws them): latency against throughput
for each mode and each foreign report overlaid, with knees and the rate where each mode leaves the SLOs; the
engine's busy % and ms/step with SLO attainment per point; and the latency distributions (CDFs or histograms)
of chosen points or load-test runs. A CDF's points carry the engine id of their request (customdata), when its
values came with ids: the page (assets/js/tail.js) jumps the Gantt to that request's lifetime when one is clicked.

Pure functions of a sweep's status as JSON (app/loadtest/sweep/progress.py) and of raw values, so they are checked
without a browser. A series is {"name", "color", "points", "summary"} (a mode of ours, or a foreign report's).
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..loadtest.client_timing import ids_key

MODE_COLORS = {"sync": "#ea580c", "async": "#2563eb"}      # the page's own (assets/style.css: --bs-sync, --bs-async)
FOREIGN_COLORS = ("#059669", "#7c3aed", "#6b7280", "#b45309", "#db2777")
X_AXES = {"requests_per_s": "throughput (requests/s)", "output_tokens_per_s": "throughput (output tokens/s)"}
CURVE_ROWS = (("ttft_ms", "TTFT (ms)"), ("itl_ms", "ITL (ms)"), ("e2e_ms", "E2E (ms)"))
DIST_ROWS = (("ttft_ms", "TTFT (ms)"), ("itl_ms", "ITL (ms)"), ("tpot_ms", "TPOT (ms)"), ("e2e_ms", "E2E (ms)"))
FONT = {"family": "Inter, ui-sans-serif, system-ui, sans-serif", "size": 11}


def series_of(status: dict | None, imports: list[dict] = ()) -> list[dict]:
    """Our modes (in the order they ran), then every series of each foreign report, each with its colour."""
    out = []
    for mode, curve in ((status or {}).get("modes") or {}).items():
        out.append({"name": mode, "color": MODE_COLORS.get(mode, "#111827"), "points": curve.get("points") or [],
                    "summary": curve.get("summary"), "ours": True})
    n = 0
    for rep in imports:
        for name, curve in (rep.get("modes") or {}).items():
            out.append({"name": name, "color": FOREIGN_COLORS[n % len(FOREIGN_COLORS)],
                        "points": curve.get("points") or [], "summary": None, "ours": False})
            n += 1
    return out


def _load_order(points: list[dict]) -> list[dict]:
    def rank(p):
        if p["kind"] == "synchronous":
            return (0, 0.0)
        if p["kind"] == "throughput":
            return (2, 0.0)
        return (1, p.get("offered_rate") or p.get("concurrency") or 0.0)
    return sorted((p for p in points if p.get("complete", True)), key=rank)


def _what(p: dict) -> str:
    if p.get("offered_rate"):
        return f"{p['kind']} @ {p['offered_rate']:.2f} req/s"
    if p["kind"] == "concurrent" and p.get("concurrency"):
        return f"concurrent x{p['concurrency']}"
    return p["kind"]


def _empty(fig: go.Figure, text: str) -> go.Figure:
    fig.add_annotation(text=text, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                       font={"size": 13, "color": "#6b7280"})
    return fig


def _layout(fig: go.Figure, height: int) -> go.Figure:
    fig.update_layout(height=height, margin={"l": 56, "r": 12, "t": 28, "b": 40}, font=FONT, hovermode="closest",
                      legend={"orientation": "h", "y": -0.06, "yanchor": "top", "font": {"size": 10}},
                      plot_bgcolor="#ffffff", paper_bgcolor="#ffffff")
    fig.update_xaxes(gridcolor="#e5e7eb", zeroline=False)
    fig.update_yaxes(gridcolor="#e5e7eb", zeroline=False)
    return fig


def curves_figure(series: list[dict], slo: dict | None, x_key: str = "requests_per_s") -> go.Figure:
    """Latency (p50 solid, p99 dotted) against throughput, one row per latency, every series overlaid. Knees are
    stars; the SLO is a grey line; where a mode leaves the SLOs is a dashed line in its colour."""
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[t for _, t in CURVE_ROWS])
    if not any(s["points"] for s in series):
        return _layout(_empty(fig, "no sweep yet: start one in the Sweep tab on the left"), 640)
    slo = slo or {}
    for s in series:
        pts = _load_order(s["points"])
        for row, (metric, title) in enumerate(CURVE_ROWS, 1):
            for stat, dash in (("p50", "solid"), ("p99", "dot")):
                xs = [p.get(x_key) for p in pts]
                ys = [(p.get(metric) or {}).get(stat) for p in pts]
                fig.add_trace(go.Scatter(
                    x=xs, y=ys, mode="lines+markers", name=f"{s['name']} {stat}", legendgroup=f"{s['name']} {stat}",
                    showlegend=row == 1, line={"color": s["color"], "dash": dash, "width": 2 if s["ours"] else 1.5},
                    marker={"size": 6, "symbol": "circle" if stat == "p50" else "circle-open"},
                    customdata=[[_what(p), p.get("slo_attainment")] for p in pts],
                    hovertemplate=(f"<b>{s['name']}</b> %{{customdata[0]}}<br>%{{x:,.2f}} {X_AXES[x_key]}<br>"
                                   f"{title.split(' ')[0]} {stat} %{{y:,.1f}} ms<br>"
                                   "SLO attainment %{customdata[1]:.1%}<extra></extra>")), row=row, col=1)
            _knees(fig, s, metric, row, x_key)
        _slo_exit(fig, s, x_key)
    _slo_lines(fig, series, slo, x_key)
    fig.update_yaxes(type="log")
    fig.update_xaxes(title_text=X_AXES[x_key], row=3, col=1)
    return _layout(fig, 720)


def _knees(fig: go.Figure, s: dict, metric: str, row: int, x_key: str) -> None:
    knees = ((s.get("summary") or {}).get("knees") or {}).get(metric) or {}
    for stat, k in knees.items():
        if not k:
            continue
        p = s["points"][k["index"]]
        fig.add_trace(go.Scatter(
            x=[p.get(x_key)], y=[(p.get(metric) or {}).get(stat)], mode="markers", name=f"{s['name']} knee",
            legendgroup=f"{s['name']} knee", showlegend=False,
            marker={"symbol": "star", "size": 14, "color": s["color"], "line": {"color": "#111827", "width": 1}},
            hovertemplate=f"<b>{s['name']} knee</b> ({metric.split('_')[0].upper()} {stat})<br>%{{x:,.2f}}"
                          f"<extra></extra>"), row=row, col=1)


def _slo_lines(fig: go.Figure, series: list[dict], slo: dict, x_key: str) -> None:
    """Each SLO as a grey dashed trace across the curves (a trace, not a shape with a label: on a log axis a
    label's position is read as a power of ten)."""
    xs = [p.get(x_key) for s in series for p in s["points"] if p.get(x_key) is not None]
    if not xs:
        return
    for row, (metric, title) in enumerate(CURVE_ROWS, 1):
        limit = slo.get(metric)
        if not limit:
            continue
        what = f"{title.split(' ')[0]} SLO" + (" (each request's mean gap)" if metric == "itl_ms" else "")
        fig.add_trace(go.Scatter(x=[min(xs), max(xs)], y=[limit, limit], mode="lines", name="SLO",
                                 legendgroup="SLO", showlegend=row == 1,
                                 line={"color": "#9ca3af", "dash": "dash", "width": 1},
                                 hovertemplate=f"{what}: {limit:g} ms<extra></extra>"), row=row, col=1)


def _slo_exit(fig: go.Figure, s: dict, x_key: str) -> None:
    """Where a mode leaves the SLOs: a dashed vertical line in its colour, named in the legend."""
    leaves = (s.get("summary") or {}).get("slo_exit")
    x = s["points"][leaves["index"]].get(x_key) if leaves else None
    if x is None:
        return
    fig.add_vline(x=x, line={"color": s["color"], "dash": "dash", "width": 1.5}, row="all", col=1)
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=f"{s['name']} leaves the SLOs at {x:,.2f}",
                             line={"color": s["color"], "dash": "dash", "width": 1.5}), row=1, col=1)


def engine_figure(series: list[dict], target: float | None, x_key: str = "requests_per_s") -> go.Figure:
    """Per point: event busy % and ms/step (our modes: the engine's own telemetry), SLO attainment (every series)."""
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=["event busy (%)", "ms per step (median)", "SLO attainment"])
    if not any(s["points"] for s in series):
        return _layout(_empty(fig, "no sweep yet"), 520)
    rows = (("busy_pct", 1, "%{y:.1f} %"), ("ms_per_step", 2, "%{y:.2f} ms"), ("slo_attainment", 3, "%{y:.1%}"))
    for s in series:
        pts, shown = _load_order(s["points"]), False
        for key, row, fmt in rows:
            ys = [p.get(key) for p in pts]
            if (not s["ours"] and key != "slo_attainment") or all(y is None for y in ys):
                continue
            fig.add_trace(go.Scatter(
                x=[p.get(x_key) for p in pts], y=ys, mode="lines+markers", name=s["name"],
                legendgroup=s["name"], showlegend=not shown,
                line={"color": s["color"]}, customdata=[_what(p) for p in pts],
                hovertemplate=f"<b>{s['name']}</b> %{{customdata}}<br>%{{x:,.2f}}<br>{fmt}<extra></extra>"),
                row=row, col=1)
            shown = True
    if target:
        fig.add_hline(y=target, line={"color": "#9ca3af", "dash": "dash", "width": 1}, row=3, col=1)
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%", row=3, col=1)
    fig.update_xaxes(title_text=X_AXES[x_key], row=3, col=1)
    return _layout(fig, 560)


CLICK_HINT = "click: show this request's steps"


def value_ids(values: dict, key: str) -> list | None:
    """The engine ids that go with values[key], one per value, or None: the latency's own list (a continuous
    load's, and a sweep point's gaps: ids_key), else, for a per-request latency, the shared `request_id`."""
    ids = values.get(ids_key(key))
    if ids is None and key != "itl_ms":
        ids = values.get("request_id")
    return ids if ids is not None and len(ids) == len(values.get(key) or []) else None


def without_ids(values: dict) -> dict:
    """Values with their ids left out: another server's requests, which no timeline here holds."""
    return {k: v for k, v in values.items() if not k.endswith("request_id")}


def _sorted_with_ids(values: dict, key: str) -> tuple[list[float], list | None]:
    vals, ids = values.get(key) or [], value_ids(values, key)
    pairs = sorted(((v, ids[i] if ids is not None else None) for i, v in enumerate(vals) if v is not None),
                   key=lambda p: p[0])
    return [v for v, _ in pairs], ([i for _, i in pairs] if ids is not None else None)


def distribution_figure(dists: list[dict], kind: str = "cdf") -> go.Figure:
    """TTFT, ITL, TPOT and E2E of each entry ({"name", "color", "values"}) overlaid: CDFs (the hover reads the
    percentile) or histograms (share of values per bin). A CDF point carries its request's engine id as customdata
    (each ITL gap the id of its request) when the values came with ids, and its hover says a click shows it."""
    fig = make_subplots(rows=4, cols=1, vertical_spacing=0.07, subplot_titles=[t for _, t in DIST_ROWS])
    if not any(any((d.get("values") or {}).get(k) for k, _ in DIST_ROWS) for d in dists):
        return _layout(_empty(fig, "no values to draw: pick a sweep point or a load-test run"), 760)
    for row, (key, title) in enumerate(DIST_ROWS, 1):
        for d in dists:
            vals, ids = _sorted_with_ids(d.get("values") or {}, key)
            if not vals:
                continue
            common = {"name": d["name"], "legendgroup": d["name"], "showlegend": row == 1,
                      "marker": {"color": d["color"]}}
            if kind == "hist":
                fig.add_trace(go.Histogram(x=vals, histnorm="percent", opacity=0.55, nbinsx=40, **common,
                                           hovertemplate=f"<b>{d['name']}</b> %{{x}} ms<br>%{{y:.1f}} % of "
                                                         f"values<extra></extra>"), row=row, col=1)
                continue
            n = len(vals)
            which = f" · %{{customdata}}<br><i>{CLICK_HINT}</i>" if ids is not None else ""
            fig.add_trace(go.Scatter(x=vals, y=[100.0 * (i + 1) / n for i in range(n)], mode="lines",
                                     line={"color": d["color"], "width": 2, "shape": "hv"}, customdata=ids, **common,
                                     hovertemplate=f"<b>{d['name']}</b> {title.split(' ')[0]}<br>"
                                                   f"p%{{y:.1f}} = %{{x:,.2f}} ms{which}<extra></extra>"),
                          row=row, col=1)
    if kind == "hist":
        fig.update_layout(barmode="overlay")
        fig.update_yaxes(title_text="% of values")
    else:
        fig.update_yaxes(range=[0, 100.5], tickvals=[0, 25, 50, 75, 90, 99], title_text="percentile")
    return _layout(fig, 880)
