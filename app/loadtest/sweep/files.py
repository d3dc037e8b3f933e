"""A sweep as a file: `batchscope.sweep/1` JSON (docs/sweep.md, docs/sweep.schema.json) and CSV, one row per
point. Pure functions of a sweep's status (as JSON) and the raw values behind its points, so that the server's
export routes and `batchscope sweep` write the same thing.
"""
from __future__ import annotations

import csv
import io
import time

from batchscope import __version__

from .spec import SCHEMA

LATENCY_COLUMNS = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")
STAT_COLUMNS = ("p50", "p90", "p99")
POINT_COLUMNS = ("index", "kind", "offered_rate", "concurrency", "complete", "duration_s", "sent", "completed",
                 "failed", "cancelled", "skipped", "requests_per_s", "output_tokens_per_s")
TAIL_COLUMNS = ("slo_attainment", "goodput_rps", "busy_pct", "ms_per_step")


def document(status: dict, values: dict[str, list[dict]], meta: dict, created: float) -> dict:
    """The export of a sweep: its status (SweepStatus as JSON) with the raw values of each point beside its
    points (`distributions`, aligned with `points`), what it ran on, and when."""
    modes = {}
    for mode, curve in status["modes"].items():
        modes[mode] = {"points": curve["points"], "summary": curve.get("summary"),
                       "distributions": list(values.get(mode, []))}
    return {"schema": SCHEMA, "id": status["id"],
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created)),
            "state": status["state"], "stop_reason": status["stop_reason"], "error": status["error"],
            "meta": {**meta, "batchscope": __version__}, "spec": status["spec"], "slo": status["slo"],
            "slo_derived": status.get("slo_derived"), "modes": modes}


def _row(source: str, series: str, p: dict) -> list:
    row = [source, series, *(p.get(k) for k in POINT_COLUMNS)]
    for k in LATENCY_COLUMNS:
        stats = p.get(k) or {}
        row.extend(stats.get(s) for s in STAT_COLUMNS)
    row.extend(p.get(k) for k in TAIL_COLUMNS)
    return ["" if v is None else v for v in row]


def to_csv(doc: dict) -> str:
    """One row per point, the sweep's own first (source "batchscope"), then those of foreign reports it carries
    (source: the tool); the series is the mode (or a foreign report's series name)."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["source", "series", *POINT_COLUMNS, *(f"{k}_{s}" for k in LATENCY_COLUMNS for s in STAT_COLUMNS),
                *TAIL_COLUMNS])
    for mode, curve in doc.get("modes", {}).items():
        for p in curve.get("points", []):
            w.writerow(_row("batchscope", mode, p))
    for rep in doc.get("foreign", []):
        for series, curve in rep.get("modes", {}).items():
            for p in curve.get("points", []):
                w.writerow(_row(rep.get("label") or rep.get("tool") or "foreign", series, p))
    return out.getvalue()
