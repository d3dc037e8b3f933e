"""Other tools' load-test reports read into a sweep's point shape, so that their curves and CDFs can be drawn over
ours: GuideLLM JSON reports (guidellm.py: the 0.3, 0.4, 0.5-0.6 and 0.7-0.8 layouts), `vllm bench serve`
results (one JSON object, JSON lines of `--append-result` runs, or `vllm bench sweep`'s summary.json list), and
batchscope.sweep/1 files (another server's sweep).

`read_report(text_or_obj, slo=None)` -> {"tool", "format", "label", "notes", "modes": {series: {"points": [...],
"distributions": [...]}}}, each point a SweepPoint's fields (missing figures None). With an SLO, attainment and
goodput are computed from the report's per-request values where it has them (GuideLLM's request list, vLLM's
`--save-detailed` lists); otherwise from what the report says itself (vLLM's `request_goodput`, under the SLOs it
was run with) or None. A report that is not what it claims raises ReportError saying where.
"""
from __future__ import annotations

import json
import math
import re

from pydantic import ValidationError

from .guidellm import read_guidellm
from .shape import ReportError, distributions, latency, per_request_figures, point
from ..refusals import validation_reason
from ..sweep.spec import SCHEMA, SLO
from ..sweep.progress import SweepPoint

__all__ = ["ReportError", "read_report", "parse_json", "latency", "per_request_figures"]

VLLM_NEEDS = ("request_throughput", "duration", "completed")
VLLM_METRICS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2el": "e2e_ms"}
VLLM_PERCENTILE = re.compile(r"^p([0-9.]+)_(ttft|tpot|itl|e2el)_ms$")


def parse_json(data) -> object:
    """A report's JSON: a parsed object as it is, else text or bytes holding one JSON document or JSON lines."""
    if not isinstance(data, (str, bytes, bytearray)):
        return data
    text = data.decode("utf-8", "replace") if isinstance(data, (bytes, bytearray)) else data
    if not text.strip():
        raise ReportError("the report is empty")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg != "Extra data":
            raise ReportError(f"not JSON: {e}") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ReportError(f"line {n} is not JSON (JSON lines expected): {e}") from None
    return {"__json_lines__": rows}


def read_report(data, slo: SLO | None = None) -> dict:
    """Any report this module knows, told apart by its shape (see the module docstring); its points checked
    against the SweepPoint model, so that a figure of the wrong type is named, not drawn."""
    report = _read(parse_json(data), slo)
    for series, curve in report["modes"].items():
        for i, p in enumerate(curve["points"]):
            try:
                curve["points"][i] = SweepPoint.model_validate(p).model_dump(mode="json")
            except ValidationError as e:
                raise ReportError(f"{report['format']}: point {i} of {series!r}: {validation_reason(e)}") from None
    return report


def _read(obj, slo: SLO | None) -> dict:

    if isinstance(obj, dict) and "__json_lines__" in obj:
        return read_vllm(obj["__json_lines__"], slo, "vllm bench serve JSON lines (--append-result)")
    if isinstance(obj, list):
        return read_vllm(obj, slo, "vllm bench sweep summary (a list of results)")
    if not isinstance(obj, dict):
        raise ReportError(f"a report is a JSON object (or a list of results), not {type(obj).__name__}")
    if str(obj.get("schema", "")).startswith("batchscope.sweep/"):
        return read_batchscope(obj)
    if "benchmarks" in obj:
        return read_guidellm(obj, slo)
    if any(k in obj for k in VLLM_NEEDS):
        return read_vllm([obj], slo, "vllm bench serve result")
    keys = ", ".join(sorted(obj)[:8]) or "none"
    raise ReportError("not a GuideLLM report (no 'benchmarks'), a vllm bench serve result (no 'request_throughput') "
                      f"or a {SCHEMA} file (no 'schema'); its top-level keys: {keys}")


# ------------------------------------------------------------------------------------------- batchscope

def read_batchscope(obj: dict) -> dict:
    if obj.get("schema") != SCHEMA:
        raise ReportError(f"schema {obj.get('schema')!r}: this reader knows {SCHEMA}")
    modes = obj.get("modes")
    if not isinstance(modes, dict) or not all(isinstance(c, dict) and isinstance(c.get("points"), list)
                                              for c in modes.values()):
        raise ReportError(f"a {SCHEMA} file needs modes.<mode>.points lists")
    meta = obj.get("meta") or {}
    label = " ".join(str(x) for x in (meta.get("model"), meta.get("gpu") or meta.get("device")) if x) or "batchscope"
    return {"tool": "batchscope", "format": SCHEMA, "label": label, "notes": [],
            "modes": {m: {"points": c["points"], "distributions": c.get("distributions") or []}
                      for m, c in modes.items()}}


# ------------------------------------------------------------------------------------------------- vLLM

def read_vllm(rows: list, slo: SLO | None, fmt: str) -> dict:
    if not rows:
        raise ReportError(f"{fmt}: no results in it")
    points, dists, notes = [], [], []
    for n, row in enumerate(rows):
        where = f"{fmt}, result {n + 1}"
        if not isinstance(row, dict):
            raise ReportError(f"{where}: a result is a JSON object, not {type(row).__name__}")
        missing = [k for k in VLLM_NEEDS if k not in row]
        if missing:
            raise ReportError(f"{where}: a vllm bench serve result has {', '.join(VLLM_NEEDS)}; missing "
                              f"{', '.join(missing)}")
    first = rows[0] if isinstance(rows[0], dict) else {}
    label = first.get("label") or f"vllm bench serve · {first.get('model_id') or first.get('backend') or '?'}"
    for n, row in enumerate(rows):
        p, d, note = _vllm_point(row, n, slo, f"{fmt}, result {n + 1}", label)
        points.append(p)
        dists.append(d)
        if note and note not in notes:
            notes.append(note)
    return {"tool": "vllm bench serve", "format": fmt, "label": label, "notes": notes,
            "modes": {label: {"points": points, "distributions": dists}}}


def _vllm_rate(row: dict, where: str) -> tuple[str, float | None, int | None]:
    rate, conc = row.get("request_rate"), row.get("max_concurrency")
    if isinstance(rate, str) and rate.lower() in ("inf", "infinity"):
        rate = math.inf
    if rate is not None and not isinstance(rate, (int, float)):
        raise ReportError(f"{where}: request_rate {rate!r} is neither a number nor \"inf\"")
    if rate is None or math.isinf(rate):
        if conc:
            return ("synchronous" if conc == 1 else "concurrent"), None, conc
        return "throughput", None, None
    return ("poisson" if row.get("burstiness", 1.0) == 1.0 else "gamma"), float(rate), conc


def _vllm_latency(row: dict, metric: str) -> dict:
    found = {f"p{m.group(1)}": row[k] for k in row if (m := VLLM_PERCENTILE.match(k)) and m.group(2) == metric}
    return {"p50": found.get("p50", row.get(f"median_{metric}_ms")), "p90": found.get("p90"),
            "p99": found.get("p99"), "mean": row.get(f"mean_{metric}_ms"), "n": row.get("completed") or 0}


def _vllm_per_request(row: dict) -> tuple[list[dict], list[float]]:
    """Per-request values (ms) where the result kept them: ttfts and itls with --save-detailed, latencies always."""
    lat, ttfts, outs = row.get("latencies") or [], row.get("ttfts") or [], row.get("output_lens") or []
    itls = row.get("itls") or []
    per = []
    for i, e2e in enumerate(lat):
        r = {"e2e_ms": e2e * 1e3 if e2e is not None else None, "ttft_ms": None, "tpot_ms": None}
        if i < len(ttfts) and ttfts[i] is not None:
            r["ttft_ms"] = ttfts[i] * 1e3
            if i < len(outs) and outs[i] and outs[i] > 1 and e2e is not None:
                r["tpot_ms"] = (e2e - ttfts[i]) * 1e3 / (outs[i] - 1)
        per.append(r)
    gaps = [g * 1e3 for req in itls if isinstance(req, list) for g in req if g is not None]
    return per, gaps


def _vllm_point(row: dict, n: int, slo: SLO | None, where: str, series: str) -> tuple[dict, dict, str | None]:
    kind, rate, conc = _vllm_rate(row, where)
    lats = {ours: _vllm_latency(row, theirs) for theirs, ours in VLLM_METRICS.items()}
    per, gaps = _vllm_per_request(row)
    if lats["e2e_ms"]["p50"] is None and per:          # e2el not among --percentile-metrics: from `latencies`
        lats["e2e_ms"] = latency(r["e2e_ms"] for r in per)
    duration = row.get("duration")
    figures = per_request_figures([r for r in per if r["ttft_ms"] is not None], duration, slo)
    note = None
    if not figures and row.get("request_goodput") is not None:
        tput = row.get("request_throughput") or 0
        figures = {"goodput_rps": row["request_goodput"],
                   "slo_attainment": row["request_goodput"] / tput if tput else None}
        note = "attainment and goodput as the report gives them (its own --goodput SLOs, not ours)"
    elif not figures and slo is not None:
        note = "no per-request TTFT in the result (run with --save-detailed): no SLO attainment"
    completed, failed = row.get("completed"), row.get("failed")
    p = point(series, n, kind=kind, offered_rate=rate, concurrency=conc, duration_s=duration,
              sent=(completed or 0) + (failed or 0), completed=completed, failed=failed,
              requests_per_s=row.get("request_throughput"), output_tokens_per_s=row.get("output_throughput"),
              prompt_tokens=row.get("total_input_tokens"), output_tokens=row.get("total_output_tokens"),
              **lats, **figures)
    return p, distributions(per, gaps), note
