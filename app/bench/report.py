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
