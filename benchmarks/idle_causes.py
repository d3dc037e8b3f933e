"""Idle time by cause over bench timelines: total microseconds and number of gaps per cause, and the gaps in which
Python's garbage collector held the engine for over a millisecond.

    python benchmarks/idle_causes.py DIR > idle_causes.json      # every *.timeline.json in DIR
"""
from __future__ import annotations

import collections
import glob
import json
import sys


def summarize(path: str) -> dict:
    with open(path) as f:
        timeline = json.load(f)
    total, gaps, gc_over_1ms = collections.Counter(), collections.Counter(), []
    for rec in timeline["steps"]:
        parts = rec.get("idle_by_cause_us") or {}
        for cause, us in parts.items():
            total[cause] += us
            gaps[cause] += 1
        if parts.get("gc", 0) > 1000:
            gc_over_1ms.append([rec["step"], parts["gc"]])
    return {"idle_us_by_cause": {k: round(v, 1) for k, v in total.items()}, "gaps_with_cause": dict(gaps),
            "gc_over_1ms": gc_over_1ms}


if __name__ == "__main__":
    print(json.dumps({p.split("/")[-1]: summarize(p) for p in sorted(glob.glob(sys.argv[1] + "/*.timeline.json"))},
                     indent=1))
