"""The Sweep tab's two charts for a saved sweep, as Plotly figures built in Python, for benchmarks/sweep_figure.py
(a sweep run on a box without a browser, drawn later as an HTML page and a PNG): latency against throughput for
each mode with knees, SLO lines and the rate where each mode leaves the SLOs; the engine's busy % and ms/step with
SLO attainment per point. The page itself draws these charts with Plotly.js (assets/js/sweep_figures.js), and its
colours are read from the page's one table of them, assets/js/palette.js.

Pure functions of a sweep's status as JSON (app/loadtest/sweep/progress.py). A series is {"name", "color",
"points", "summary"} (a mode of ours, or a foreign report's).
"""
from __future__ import annotations

import re
from importlib import resources

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .page_html import busy_label


def _palette() -> tuple[dict[str, str], tuple[str, ...]]:
    """MODE_COLOR and FOREIGN_COLORS as assets/js/palette.js writes them."""
    text = (resources.files("batchscope.assets") / "js" / "palette.js").read_text(encoding="utf-8")
    modes = re.search(r"export const MODE_COLOR = \{([^}]*)\}", text).group(1)
    foreign = re.search(r"export const FOREIGN_COLORS = \[([^\]]*)\]", text).group(1)
    return dict(re.findall(r'(\w+): "(#[0-9a-fA-F]{6})"', modes)), tuple(re.findall(r'"(#[0-9a-fA-F]{6})"', foreign))


MODE_COLORS, FOREIGN_COLORS = _palette()
X_AXES = {"requests_per_s": "throughput (requests/s)", "output_tokens_per_s": "throughput (output tokens/s)"}
CURVE_ROWS = (("ttft_ms", "TTFT (ms)"), ("itl_ms", "ITL (ms)"), ("e2e_ms", "E2E (ms)"))
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
    """Per point: busy % and ms/step (our modes: the engine's own telemetry), SLO attainment (every series)."""
    basis = next((p.get("busy_basis") for s in series for p in s["points"] if p.get("busy_basis")), None)
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=[busy_label(basis) + " %", "ms per step (median)", "SLO attainment"])
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
