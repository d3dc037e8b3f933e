"""Where a served run's GPU idle sits, by step kind, and what the host spent on each kind of step: read from
batchscope.timeline/1 files (`batchscope bench --workload served` writes one per mode next to its JSON).

    python benchmarks/served_idle.py out/served_r12.async.timeline.json [more files or folders] [--json out.json]

For every timeline it prints, for decode-only steps and for steps carrying prefill: the host-caused idle before
them (empty queue left out) by cause, the idle by pair of consecutive kinds, each host phase's duration
(schedule, fill, launch, wait, update) and the compute span, how far ahead of the GPU the host launched each kind
(negative: the GPU waited for the launch) with the prep phases of the late ones, and the largest gaps. With --json
the full figures go to a file. The gap before a step belongs to that step: it is the time the GPU waited for it.
On CPU a step's compute is its launch span, so every step reads as launched late there: the lead means something
on a GPU only.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys

from batchscope.app.bench.steps import (HOST_PHASES, KINDS, busy_figures, kind_figures, largest_gaps, launch_lead,
                                        transitions)


def analyse(timeline: dict, gaps: int = 10) -> dict:
    steps = timeline["steps"]
    return {"modes": sorted({r["mode"] for r in steps}), "steps": len(steps), "busy": busy_figures(steps),
            "by_kind": kind_figures(steps, host_phases=True), "transitions": transitions(steps),
            "launch_lead": launch_lead(steps), "largest_gaps": largest_gaps(steps, gaps)}


def _causes(d: dict) -> str:
    """Host causes, largest first; the empty-queue part (no request existed) said apart."""
    host = ", ".join(f"{k} {v:.1f}" for k, v in d.items() if k != "empty_queue") or "none"
    return host + (f" (and {d['empty_queue']:.1f} of empty queue)" if d.get("empty_queue") else "")


def _pair(p: dict, a: str = "p50", b: str = "p99") -> str:
    fmt = lambda v: "-" if v is None else f"{v:.3f}"   # noqa: E731
    return f"{fmt(p.get(a))}/{fmt(p.get(b))}"


def report(name: str, a: dict) -> list[str]:
    b, k = a["busy"], a["by_kind"]
    lines = [f"{name} ({', '.join(a['modes'])}, {a['steps']} steps: "
             + ", ".join(f"{k[x]['steps']} {x}" for x in KINDS) + f"): busy {b['busy_pct']}% "
             f"({b['busy_pct_excl_empty_queue']}% without the empty queue), host idle {b['idle_ms_host']} ms"]
    for kind in KINDS:
        f = k[kind]
        lines.append(f"  idle before {kind} steps: host {f['idle_before_ms_host']} ms over {f['steps']} steps "
                     f"(per gap p50/p99 {_pair(f['host_idle_ms_per_gap'])} ms): {_causes(f['idle_before_ms_by_cause'])}")
    for pair, t in a["transitions"].items():
        lines.append(f"  {pair}: {t['gaps']} gaps, host idle {t['idle_ms_host']} ms: {_causes(t['idle_ms_by_cause'])}")
    lines.append("  ms p50/p99 per step, " + " | ".join(KINDS) + ":")
    for phase in HOST_PHASES:
        lines.append(f"    {phase:<8} " + " | ".join(
            f"{_pair(k[x]['host_ms'][phase])} (total {k[x]['host_ms'][phase]['total_ms']:.0f})" for x in KINDS))
    lines.append("    compute  " + " | ".join(_pair(k[x]["compute_ms"]) for x in KINDS))
    lines.append("    period   " + " | ".join(_pair(k[x]["ms_per_step"]) for x in KINDS))
    for kind, lead in a["launch_lead"].items():
        lines.append(f"  {kind} launched ahead of the GPU, ms p1/p10/p50 {_pair(lead['lead_ms'], 'p1', 'p10')}/"
                     f"{lead['lead_ms']['p50']}; late {lead['late']} ({lead['late_share']}), their prep ms "
                     + ", ".join(f"{p} {v}" for p, v in lead["late_prep_ms_mean"].items()))
    lines.append("  largest gaps: " + "; ".join(
        f"step {g['step']} {g['kind']} after {g['after']} {g['ms']:.2f} ms ({_causes(g['causes_ms'])})"
        for g in a["largest_gaps"][:5]))
    return lines


def timeline_paths(items: list[str]) -> list[str]:
    out = []
    for item in items:
        out += sorted(glob.glob(os.path.join(item, "*.timeline.json"))) if os.path.isdir(item) else [item]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("timelines", nargs="+", help="timeline files, or folders holding *.timeline.json")
    p.add_argument("--json", default=None, help="write every figure here too")
    p.add_argument("--gaps", type=int, default=10, help="largest gaps to keep per timeline")
    args = p.parse_args(argv)
    results = {}
    for path in timeline_paths(args.timelines):
        with open(path) as f:
            timeline = json.load(f)
        if not timeline.get("steps"):
            continue            # a transformers run's timeline: NVML samples only
        name = os.path.basename(path).removesuffix(".timeline.json")
        results[name] = analyse(timeline, args.gaps)
        print("\n".join(report(name, results[name])), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if not results:
        print("no timeline with steps found", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
