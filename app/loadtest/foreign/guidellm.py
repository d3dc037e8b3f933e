"""GuideLLM JSON reports read into a sweep's point shape (reports.py says what for; shape.py the shape).

Four layouts, told apart by their top-level keys:
    0.2-0.3  {"benchmarks"}                                   strategy at benchmarks[].args.strategy
    0.4      {"args", "benchmarks"}                           strategy at benchmarks[].config.strategy
    0.5-0.6  {"metadata": {"version": 1}, "args", "benchmarks"}
    0.7-0.8  {"metadata": {"version": 2}, "config", "benchmarks", ...}
Each benchmark's `metrics` hold status breakdowns ({successful, errored, incomplete, total}) of distribution
summaries (mean, median, count, percentiles {p50, p90, p99, ...}); an empty one has count 0.
What maps to what: TTFT is time_to_first_token_ms; ITL is inter_token_latency_ms, each request's mean gap between
tokens after the first, weighted by its tokens (ours is every gap); our TPOT is that same per-request mean, so it
comes from the request list (GuideLLM's own time_per_output_token_ms counts the first token too and is not used);
E2E is request_latency (seconds there). Throughput: requests_per_second.successful.mean and
output_tokens_per_second.total.mean, what GuideLLM's console shows.
"""
from __future__ import annotations

from .shape import ReportError, distributions, empty_latency, latency, per_request_figures, point
from ..sweep.spec import SLO

KINDS = {"synchronous": "synchronous", "throughput": "throughput", "concurrent": "concurrent",
         "constant": "constant", "poisson": "poisson", "async": "constant"}
NOTE_ITL = ("itl_ms is GuideLLM's inter_token_latency_ms: each request's mean gap, weighted by its tokens "
            "(batchscope's is every gap); tpot_ms is the same per-request mean, from the request list")


def layout(obj: dict) -> tuple[str, str]:
    """(layout name, where the strategy lives) for a report, or ReportError if it claims one it does not have."""
    meta = obj.get("metadata")
    if meta is not None:
        version = meta.get("version") if isinstance(meta, dict) else None
        if version == 2:
            if not isinstance(obj.get("config"), dict):
                raise ReportError("GuideLLM report: metadata.version 2 (GuideLLM 0.7-0.8) but no 'config' object")
            return f"GuideLLM {meta.get('guidellm_version') or '0.7+'} report (metadata.version 2)", "config"
        if version == 1:
            if not isinstance(obj.get("args"), dict):
                raise ReportError("GuideLLM report: metadata.version 1 (GuideLLM 0.5-0.6) but no 'args' object")
            return f"GuideLLM {meta.get('guidellm_version') or '0.5-0.6'} report (metadata.version 1)", "config"
        raise ReportError(f"GuideLLM report: metadata.version {version!r} is not one this reader knows (1 or 2)")
    if "args" in obj:
        return "GuideLLM 0.4 report", "config"
    return "GuideLLM 0.2-0.3 report", "args"


def read_guidellm(obj: dict, slo: SLO | None) -> dict:
    fmt, holder = layout(obj)
    benchmarks = obj.get("benchmarks")
    if not isinstance(benchmarks, list) or not benchmarks:
        raise ReportError(f"{fmt}: 'benchmarks' must be a non-empty list")
    label = _label(obj, benchmarks, fmt)
    points, dists = [], []
    for i, b in enumerate(benchmarks):
        where = f"{fmt}, benchmarks[{i}]"
        if not isinstance(b, dict):
            raise ReportError(f"{where} is not an object")
        p, d = _point(b, i, holder, where, label, slo)
        points.append(p)
        dists.append(d)
    return {"tool": "guidellm", "format": fmt, "label": label, "notes": [NOTE_ITL],
            "modes": {label: {"points": points, "distributions": dists}}}


def _label(obj: dict, benchmarks: list, fmt: str) -> str:
    version = (obj.get("metadata") or {}).get("guidellm_version") if isinstance(obj.get("metadata"), dict) else None
    first = benchmarks[0] if isinstance(benchmarks[0], dict) else {}
    backend = (first.get("config") or {}).get("backend") if isinstance(first.get("config"), dict) else None
    model = backend.get("model") if isinstance(backend, dict) else None
    name = f"GuideLLM {version}" if version else fmt.split(" report")[0]
    return f"{name} · {model}" if model else name


def _strategy(b: dict, holder: str, where: str) -> dict:
    s = (b.get(holder) or {}).get("strategy") if isinstance(b.get(holder), dict) else None
    if not isinstance(s, dict) or "type_" not in s:
        raise ReportError(f"{where}: no {holder}.strategy with a type_")
    return s


def _kind(s: dict, where: str) -> tuple[str, float | None, int | None]:
    kind = KINDS.get(s["type_"])
    if kind is None:
        raise ReportError(f"{where}: strategy type {s['type_']!r} is not one GuideLLM writes ({', '.join(KINDS)})")
    rate = s.get("rate") if kind in ("constant", "poisson") else None
    if kind == "synchronous":
        conc = 1
    elif kind == "concurrent":
        conc = s.get("streams")
    else:
        conc = s.get("max_concurrency")
    return kind, (float(rate) if isinstance(rate, (int, float)) and rate > 0 else None), conc


def _summary(metrics: dict, name: str, status: str = "successful") -> dict | None:
    d = metrics.get(name)
    if not isinstance(d, dict):
        return None
    s = d.get(status)
    return s if isinstance(s, dict) and s.get("count") else None


def _dist(metrics: dict, name: str, scale: float = 1.0) -> dict:
    s = _summary(metrics, name)
    if s is None:
        return empty_latency()
    pct = s.get("percentiles") or {}

    def at(key, fallback=None):
        v = pct.get(key, fallback)
        return v * scale if isinstance(v, (int, float)) else None
    return {"p50": at("p50", s.get("median")), "p90": at("p90"), "p99": at("p99"),
            "mean": s["mean"] * scale if isinstance(s.get("mean"), (int, float)) else None, "n": s.get("count") or 0}


def _requests(b: dict) -> list[dict]:
    """The successful requests' TTFT, mean gap (our TPOT) and E2E in ms, where the report kept them."""
    reqs = b.get("requests")
    rows = reqs.get("successful") if isinstance(reqs, dict) else None
    per = []
    for r in rows if isinstance(rows, list) else []:
        if not isinstance(r, dict):
            continue
        e2e = r.get("request_latency")
        per.append({"ttft_ms": r.get("time_to_first_token_ms"), "tpot_ms": r.get("inter_token_latency_ms"),
                    "e2e_ms": e2e * 1e3 if isinstance(e2e, (int, float)) else None})
    return per


def _totals(b: dict, metrics: dict) -> dict:
    t = metrics.get("request_totals") if isinstance(metrics.get("request_totals"), dict) else b.get("request_totals")
    if not isinstance(t, dict):
        return {}
    return {"completed": t.get("successful"), "failed": t.get("errored"), "cancelled": t.get("incomplete"),
            "sent": t.get("total")}


def _point(b: dict, i: int, holder: str, where: str, series: str, slo: SLO | None) -> tuple[dict, dict]:
    kind, rate, conc = _kind(_strategy(b, holder, where), where)
    metrics = b.get("metrics")
    if not isinstance(metrics, dict) or "requests_per_second" not in metrics:
        raise ReportError(f"{where}: no metrics.requests_per_second (is this a GuideLLM benchmark?)")
    rps = _summary(metrics, "requests_per_second")
    out = _summary(metrics, "output_tokens_per_second", "total")
    per = _requests(b)
    duration = b.get("duration") if isinstance(b.get("duration"), (int, float)) else None
    tpot = latency(r["tpot_ms"] for r in per) if per else empty_latency()
    p = point(series, i, kind=kind, offered_rate=rate, concurrency=conc, duration_s=duration,
              requests_per_s=rps["mean"] if rps else 0.0, output_tokens_per_s=out["mean"] if out else 0.0,
              ttft_ms=_dist(metrics, "time_to_first_token_ms"), itl_ms=_dist(metrics, "inter_token_latency_ms"),
              tpot_ms=tpot, e2e_ms=_dist(metrics, "request_latency", 1e3), **_totals(b, metrics),
              **per_request_figures(per, duration, slo))
    return p, distributions(per, [])
