"""Cut a window of steps out of a Kineto / torch.profiler trace, for a test fixture a few hundred KB in size.

    python benchmarks/trace_window.py IN.pt.trace.json.gz OUT.pt.trace.json.gz \
        --marker _generation_loop_body --first 20 --last 26

The window runs from the start of the `--first`-th event whose name holds `--marker` (counted from 0, in time
order) to the end of the `--last`-th. Every event that overlaps it is kept as it was recorded (an enclosing
Python function too, unclipped), and so is every metadata event and the file's header (device properties,
base time); flow arrows are kept when their own timestamp lies inside. The result is what a profiler window of
those steps would have written, which `batchscope import` reads like any other trace.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path


def read(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def window(trace: dict, marker: str, first: int, last: int) -> tuple[dict, float, float]:
    events = trace["traceEvents"]
    marks = sorted((e for e in events if e.get("ph") == "X" and marker in str(e.get("name", ""))),
                   key=lambda e: float(e["ts"]))
    if not 0 <= first <= last < len(marks):
        raise SystemExit(f"--first {first} --last {last}: the trace has {len(marks)} events named *{marker}*")
    t0, t1 = float(marks[first]["ts"]), float(marks[last]["ts"]) + float(marks[last].get("dur", 0))

    def inside(e: dict) -> bool:
        if e.get("ph") == "M" or "ts" not in e:
            return True
        ts = float(e["ts"])
        return ts <= t1 and ts + float(e.get("dur", 0) or 0) >= t0

    out = {k: v for k, v in trace.items() if k != "traceEvents"}
    out["traceEvents"] = [e for e in events if inside(e)]
    return out, t0, t1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--marker", required=True, help="a substring of the step marker's name")
    p.add_argument("--first", type=int, required=True)
    p.add_argument("--last", type=int, required=True)
    a = p.parse_args(argv)
    trace = read(a.trace)
    cut, t0, t1 = window(trace, a.marker, a.first, a.last)
    a.out.write_bytes(gzip.compress(json.dumps(cut, separators=(",", ":")).encode(), 9, mtime=0))
    print(f"{a.out}: {len(cut['traceEvents'])} of {len(trace['traceEvents'])} events, "
          f"{(t1 - t0) / 1e3:.1f} ms, {a.out.stat().st_size / 1e3:.0f} kB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
