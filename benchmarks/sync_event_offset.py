"""How far a sync step's start event runs ahead of its first kernel, from two recordings of the same engine.

    python benchmarks/sync_event_offset.py SYNC.timeline.json[.gz] ASYNC.timeline.json[.gz] [--json OUT]

In async the device is still busy with the step before when a step's start event is recorded, so the event
completes when that work ends and the step's kernels follow at once: its compute span is the kernels'. In sync the
device is idle, so the event completes as soon as it is recorded, and the span also holds the time the launch
takes to reach the device. Decode-only steps of one batch size run the same graph in both modes, so the median
difference of their compute spans, batch size by batch size, is that head start. Under a profiler it is the
profiled launch (docs/BENCHMARKS.md (o)); on recordings without one it is what batchscope's sync figures carry.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batchscope.app.server.replay import read_timeline_file  # noqa: E402

MIN_STEPS = 3          # per batch size and mode


def spans_by_batch(path: Path) -> dict[int, list[float]]:
    tl = read_timeline_file(path)
    out = defaultdict(list)
    for s in tl["steps"]:
        c = (s.get("gpu") or {}).get("compute")
        if c and not s.get("prefill_tokens") and s.get("decode_tokens"):
            out[s["num_requests"]].append(c[1] - c[0])
    return out


def offset(sync: dict, asyn: dict) -> dict:
    rows = []
    for n in sorted(set(sync) & set(asyn)):
        if len(sync[n]) >= MIN_STEPS and len(asyn[n]) >= MIN_STEPS:
            s, a = statistics.median(sync[n]), statistics.median(asyn[n])
            rows.append({"requests": n, "sync_us": round(s, 1), "async_us": round(a, 1), "diff_us": round(s - a, 1),
                         "steps": [len(sync[n]), len(asyn[n])]})
    diffs = [r["diff_us"] for r in rows]
    return {"batch_sizes": len(rows), "median_diff_us": round(statistics.median(diffs), 1) if diffs else None,
            "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sync", type=Path)
    p.add_argument("async_", metavar="async", type=Path)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    res = {"sync": str(a.sync), "async": str(a.async_), **offset(spans_by_batch(a.sync), spans_by_batch(a.async_))}
    if res["median_diff_us"] is None:
        print("no batch size ran decode-only in both recordings (at least 3 steps each)")
        return 1
    print(f"{res['batch_sizes']} batch sizes; sync's decode compute span minus async's, median {res['median_diff_us']} µs")
    for r in res["rows"]:
        print(f"  {r['requests']:4d} requests  sync {r['sync_us']:9.1f}  async {r['async_us']:9.1f}  "
              f"diff {r['diff_us']:7.1f} µs  ({r['steps'][0]} / {r['steps'][1]} steps)")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
