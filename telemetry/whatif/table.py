"""The what-if's terminal table: per loop, each figure recorded, predicted (with its interval) and, after
--verify, measured with the prediction's error."""
from __future__ import annotations

from .measures import LATENCIES

ROWS = [("output tokens/s", "output_tokens_per_s", None)] + [
    (f"{name[:-3].upper()} {q} ms", name, q) for name in LATENCIES for q in ("p50", "p90", "p99")] + [
    ("busy %", "busy_pct", None), ("step p50 ms", "step_ms", "p50"), ("preemptions", "preemptions", None)]


def _get(figs: dict | None, name: str, q: str | None):
    if not figs:
        return None
    v = figs.get(name)
    return v.get(q) if isinstance(v, dict) and q else (None if isinstance(v, dict) else v)


def _fmt(v) -> str:
    if v is None:
        return "unknown"
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    return f"{v:.1f}" if abs(v) >= 100 else f"{v:.3g}" if abs(v) < 10 else f"{v:.2f}"


def text_lines(result: dict) -> list[str]:
    s = result["settings"]
    changed = (", ".join(f"{k}={_setting(v)}" for k, v in s["asked"].items())
               or "nothing (the model replays the recording)")
    lines = [f"what if {changed}: {result['recording']['file']} ({result['recording']['model']} on "
             f"{result['recording']['device']}, {result['recording']['requests']} requests)"]
    for mode, entry in result["modes"].items():
        rec, pred, meas = entry["recorded"], entry["predicted"], entry.get("measured")
        lines.append("")
        lines.append(f"{mode} loop (recorded in {rec['mode']}; the model replays the recording within "
                     f"{_replay_error(entry)} on throughput)")
        head = f"  {'figure':<16}{'recorded':>11}{'predicted':>11}  {'interval':<19}"
        lines.append(head + (f"{'measured':>10}{'error':>9}" if meas else ""))
        low, high = pred["interval"]["low"], pred["interval"]["high"]
        for label, name, q in ROWS:
            p = _get(pred, name, q)
            lo, hi = _get(low, name, q), _get(high, name, q)
            band = f"{_fmt(lo)}-{_fmt(hi)}" if lo is not None and hi is not None else ""
            row = f"  {label:<16}{_fmt(_get(rec, name, q)):>11}{_fmt(p):>11}  {band:<19}"
            if meas:
                err = _get(entry.get("error_pct"), name, q)
                row += f"{_fmt(_get(meas, name, q)):>10}{(f'{err:+.1f}%' if err is not None else 'unknown'):>9}"
            lines.append(row)
        idle = pred.get("idle_ms_by_cause") or {}
        if idle:
            top = sorted(idle.items(), key=lambda kv: -kv[1])[:4]
            lines.append("  predicted idle: " + ", ".join(f"{k} {v:.1f} ms" for k, v in top))
        ex = pred.get("extrapolated") or {}
        if ex.get("steps"):
            lines.append(f"  extrapolated: {ex['steps']} steps ({ex['share_pct']}%) beyond the recorded shapes "
                         f"({', '.join(ex['beyond_recorded'])})")
        if pred.get("unfinished_requests"):
            lines.append(f"  {pred['unfinished_requests']} request(s) never finished in the prediction")
        fc = entry.get("forecast")
        if fc and fc.get("difference_pct") is not None:
            lines.append(f"  forecast.py's async ms/step p50 {fc['forecast_ms_per_step_p50']}, this prediction's "
                         f"{fc['predicted_ms_per_step_p50']} ({fc['difference_pct']:+.1f}%)")
    lines += [f"note: {n}" for n in result.get("notes") or []]
    return lines


def _replay_error(entry: dict) -> str:
    err = (entry.get("replayed") or {}).get("error_pct", {}).get("output_tokens_per_s")
    return "unknown" if err is None else f"{err:+.1f}%"


def _setting(value) -> str:
    if isinstance(value, (list, tuple)):
        return ":".join(str(v) for v in value)
    if value is None:
        return "adaptive"
    return str(value)
