"""What `batchscope bench` prints and checks once every run is done: the table of medians, each run's token
fingerprint, and the runs whose tokens differ from the first batchscope run. The standard library only.
"""
from __future__ import annotations

import hashlib
import json
import statistics

COLUMNS = (("run", None, "s"), ("wall s", "wall_s", ".2f"), ("out tok/s", "tokens_per_s", ".1f"),
           ("ms/step", "decode_ms_per_step", ".2f"), ("floor ms", "floor_ms_per_step", ".2f"),
           ("% of floor", "floor_pct", ".1f"), ("roofline ms", "roofline_ms_per_step", ".2f"),
           ("x roofline", "x_roofline", ".2f"), ("x held roofline", "x_roofline_held", ".2f"),
           ("GPU busy %", "gpu_busy_pct", ".1f"), ("NVML util %", "nvml_util_pct", ".1f"),
           ("SM MHz", "sm_clock_mhz", ".0f"), ("speedup", "speedup", ".2f"))


def format_table(result: dict) -> str:
    rows = [[h for h, _, _ in COLUMNS]]
    for label, med in result["results"].items():
        name = label if med.get("lengths_ok", True) else f"{label} (LENGTHS WRONG)"
        rows.append([name] + [("-" if med.get(k) is None else format(med[k], f)) for _, k, f in COLUMNS[1:]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    w = result["workload"]
    repeats = max(m["repeats"] for m in result["results"].values())
    head = (f"{result['engine_info']['model']} on {result['gpu_name'] or result['device']}: {w['requests']} requests"
            f" x {w['prompt_tokens']} prompt + {w['new_tokens']} new tokens; copy bandwidth "
            f"{result['bandwidth']['gbps']:.1f} GB/s; medians of {repeats} run(s); speedup vs {result['speedup_vs']}")
    tail = [f"skipped {k}: {v}" for k, v in result["skipped"].items()]
    if not result["telemetry"]:
        tail.append("telemetry off: batchscope's ms/step, busy % and NVML are not measured")
    return "\n".join([head, ""] + lines + ([""] + tail if tail else []))


# the served workload's table: (header, path into a run's figures, format); "/" joins two figures in one cell
SERVED_COLUMNS = (("run", None, "s"), ("busy %", "busy.busy_pct", ".1f"),
                  ("busy % w/o empty", "busy.busy_pct_excl_empty_queue", ".1f"),
                  ("host idle ms", "busy.idle_ms_host", ".0f"),
                  ("TTFT p50/p99 ms", "latency_ms.ttft.p50/latency_ms.ttft.p99", ".0f"),
                  ("TPOT p50 ms", "latency_ms.tpot.p50", ".1f"),
                  ("ITL p50/p99 ms", "latency_ms.itl.p50/latency_ms.itl.p99", ".1f"),
                  ("p99/p50", "itl_p99_over_p50", ".1f"), ("E2E p50 s", "latency_ms.e2e.p50", ".2f"),
                  ("out tok/s", "output_tokens_per_s", ".0f"), ("req/s", "requests_per_s", ".2f"),
                  ("wall s", "wall_s", ".1f"),
                  ("decode steps", "steps.by_kind.decode.steps", ".0f"),
                  ("decode ms p50/p99", "steps.by_kind.decode.ms_per_step.p50/steps.by_kind.decode.ms_per_step.p99",
                   ".1f"),
                  ("prefill steps", "steps.by_kind.prefill.steps", ".0f"),
                  ("prefill ms p50/p99",
                   "steps.by_kind.prefill.ms_per_step.p50/steps.by_kind.prefill.ms_per_step.p99", ".1f"))


def _at(d: dict, path: str):
    for k in path.split("."):
        d = d.get(k) if isinstance(d, dict) else None
    return d


def _cell(med: dict, path: str, f: str) -> str:
    vals = [_at(med, p) for p in path.split("/")]
    if all(v is None for v in vals):
        return "-"
    if path.startswith("latency_ms.e2e"):
        vals = [v / 1e3 if v is not None else None for v in vals]
    return "/".join("-" if v is None else format(v, f) for v in vals)


def format_served_table(result: dict) -> str:
    """The served workload's medians per run, one row each; idle by cause below, largest first."""
    rows = [[h for h, _, _ in SERVED_COLUMNS]]
    for label, med in result["results"].items():
        name = label + (" (all at once)" if med.get("arrivals") == "all at once" else "")
        name += "" if med.get("lengths_ok", True) else " (LENGTHS WRONG)"
        rows.append([name] + [_cell(med, k, f) for _, k, f in SERVED_COLUMNS[1:]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(SERVED_COLUMNS))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    w = result["workload"]
    repeats = max(m["repeats"] for m in result["results"].values())
    arrival = w["arrival"] + (f" (burstiness {w['burstiness']:g})" if w["arrival"] == "gamma" else "")
    head = (f"{result['engine_info']['model']} on {result['gpu_name'] or result['device']}: served workload, "
            f"{w['requests']} requests, {arrival} arrivals at {w['rate']:g}/s (seed {w['seed']}), prompts "
            f"{_range(w['prompt_tokens'])} and {_range(w['new_tokens'])} new tokens (EOS ignored), max running "
            f"{w['max_running']}; medians of {repeats} run(s)")
    idle = [f"  {label}: " + (", ".join(f"{k.replace('_', ' ')} {v:.0f}" for k, v in
                                        med["busy"]["idle_ms_by_cause"].items()) or "none")
            for label, med in result["results"].items() if (med.get("busy") or {}).get("idle_ms_by_cause")
            is not None]
    tail = ([""] + ["idle by cause, ms (largest first):"] + idle) if idle else []
    agree = [f"{label} {med['tokens_agree_with_first_run']:.2f}" for label, med in result["results"].items()
             if med.get("tokens_agree_with_first_run") is not None]
    if agree:
        tail += ["", "requests whose tokens equal the first run's: " + ", ".join(agree)
                 + " (in bf16 a request's tokens depend on what shares its batch, which arrival timing sets)"]
    if w.get("streamed") is False:
        tail += ["", "sent without streaming (--no-stream): latencies are the engine's own token times"]
    if w.get("baseline_arrivals"):
        tail += ["", f"note: {w['baseline_arrivals']}"]
    tail += [f"skipped {k}: {v}" for k, v in result["skipped"].items()]
    if not result["telemetry"]:
        tail.append("telemetry off: busy %, idle and the step split are not measured")
    return "\n".join([head, ""] + lines + tail)


def _range(r) -> str:
    return f"{r[0]}" if r[0] == r[1] else f"{r[0]}-{r[1]}"


def _median(values):
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _digest(token_ids: list[list[int]]) -> str:
    """One short fingerprint of every output token of a run, in request order."""
    return hashlib.sha256(json.dumps(token_ids, separators=(",", ":")).encode()).hexdigest()[:16]


def disagreeing_runs(result: dict) -> list[str]:
    """batchscope's own runs that gave other tokens than its first: the same prompts, greedy, must give the same
    tokens run after run and mode after mode."""
    ours = [r for r in result["runs"] if r["system"] == "batchscope"]
    return [f"{r['label']}#{r['repeat']}" for r in ours if r["tokens_digest"] != ours[0]["tokens_digest"]]
