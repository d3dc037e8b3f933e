"""The figures BENCHMARKS (o) gives for the clock epoch and the start kernel, from committed recordings, into one JSON.

    python benchmarks/clock_figures.py --json benchmarks/results/2026-12-02-h200-start-kernel/clock_figures.json

- async gaps between consecutive steps (compute start minus the previous compute end) on the served load, before
  and with the epoch: how many are negative (a step "starting" before the one before it ended) and percentiles;
- where the profiler's delay sits in a sync decode step: H2D end -> compute start and compute end -> D2H start,
  in batchscope's own timeline and in the imported trace of the same steps;
- the imported (kernel) spans of sync and async decode steps of equal batch (sync_event_offset's method);
- with the start kernel: the trace's gap after it (what a profiled graph launch holds back), and, on the build
  before the clock change, the steps whose gap missed by more than 20 µs and the host's wake-ups after the copy.
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from batchscope.app.server.replay import read_timeline_file  # noqa: E402
from sync_event_offset import offset, spans_by_batch  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SERVED = {"before": RESULTS / "2026-12-02-h200-served" / "s12.async.timeline.json.gz",
          "epoch": RESULTS / "2026-12-02-h200-clock-epoch" / "s12.async.timeline.json.gz",
          "start_kernel": RESULTS / "2026-12-02-h200-start-kernel" / "s12.async.timeline.json.gz"}
BEFORE = RESULTS / "2026-12-02-h200-start-kernel" / "before-clock-change"
TRUTH = {"before": RESULTS / "2026-12-02-h200-import-truth", "epoch": RESULTS / "2026-12-02-h200-clock-epoch",
         "start_kernel": RESULTS / "2026-12-02-h200-start-kernel" / "gt_seed0"}


def pct(values: list[float], q: float) -> float:
    return round(values[min(len(values) - 1, int(q * len(values)))], 1)


def async_gaps(path: Path) -> dict:
    steps = read_timeline_file(path)["steps"]
    by = {s["step"]: s for s in steps}
    gaps = sorted(s["compute_us"][0] - by[s["step"] - 1]["compute_us"][1] for s in steps
                  if s["mode"] == "async" and s.get("compute_us") and (p := by.get(s["step"] - 1))
                  and p["mode"] == "async" and p.get("compute_us"))
    return {"gaps": len(gaps), "negative_pct": round(100 * sum(g < -1 for g in gaps) / len(gaps), 2),
            **{f"p{int(q * 100)}_us": pct(gaps, q) for q in (0.01, 0.05, 0.5, 0.95, 0.99)}}


def sync_edges(folder: Path) -> dict:
    """Per sync decode step, the H2D end -> compute start and compute end -> D2H start, ours and the trace's."""
    own = {s["step"]: s for s in read_timeline_file(folder / "sync.timeline.json.gz")["steps"]}
    rows = {"own_head_us": [], "trace_head_us": [], "own_tail_us": [], "trace_tail_us": []}
    for s in read_timeline_file(folder / "sync.imported.timeline.json.gz")["steps"]:
        o, g = own.get(s["step"]), s.get("gpu") or {}
        og = (o or {}).get("gpu") or {}
        if s["prefill_tokens"] or not all(k in g and k in og for k in ("h2d", "compute", "d2h")):
            continue
        rows["own_head_us"].append(og["compute"][0] - og["h2d"][1])
        rows["trace_head_us"].append(g["compute"][0] - g["h2d"][1])
        rows["own_tail_us"].append(og["d2h"][0] - og["compute"][1])
        rows["trace_tail_us"].append(g["d2h"][0] - g["compute"][1])
    out = {"steps": len(rows["own_head_us"])}
    for k, v in rows.items():
        v.sort()
        out[k] = {"p5": pct(v, 0.05), "p50": round(statistics.median(v), 1), "p95": pct(v, 0.95)} if v else None
    return out


def after_start_kernel(trace: Path) -> dict:
    """The trace's gap between a step's start kernel (a one-element int fill) and the kernel after it."""
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    gaps = sorted(b["ts"] - a["ts"] - a["dur"] for a, b in zip(kernels, kernels[1:]) if "FillFunctor<int>" in a["name"])
    return {"steps": len(gaps), "p5_us": pct(gaps, 0.05), "p50_us": round(statistics.median(gaps), 1),
            "p95_us": pct(gaps, 0.95)}


def gap_misses(folder: Path, mode: str, tol_us: float = 20.0) -> dict:
    """Steps whose gap before them differs from the import's by more than tol_us (ours minus the import's), the
    largest own-minus-import idle per step, and the longest the host woke after the copy's end (wait end - D2H
    end) on those steps (in sync: the wake-up; in async the host often waits on other work first)."""
    own = {s["step"]: s for s in read_timeline_file(folder / f"{mode}.timeline.json.gz")["steps"]}
    misses, worst, wakes = {}, None, []
    for s in read_timeline_file(folder / f"{mode}.imported.timeline.json.gz")["steps"]:
        o = own.get(s["step"])
        if not o or s.get("gpu_idle_before_us") is None or o.get("gpu_idle_before_us") is None:
            continue
        diff = round(o["gpu_idle_before_us"] - s["gpu_idle_before_us"], 1)
        if abs(diff) > tol_us:
            misses[s["step"]] = diff
        if worst is None or diff > worst[1]:
            worst = (s["step"], diff)
        if o.get("gpu", {}).get("d2h") and o["cpu"].get("wait"):
            wakes.append(o["cpu"]["wait"][1] - o["gpu"]["d2h"][1])
    return {"misses_us": misses, "largest_own_minus_import_us": worst,
            "wake_after_copy_us_max": round(max(wakes), 1) if wakes else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, required=True)
    a = p.parse_args(argv)
    res = {"served_async_gaps": {k: async_gaps(v) for k, v in SERVED.items()},
           "sync_decode_edges": {k: sync_edges(v) for k, v in TRUTH.items()},
           "imported_spans_sync_minus_async": {
               k: {kk: vv for kk, vv in offset(spans_by_batch(v / "sync.imported.timeline.json.gz"),
                                               spans_by_batch(v / "async.imported.timeline.json.gz")).items()
                   if kk != "rows"} for k, v in TRUTH.items()},
           "start_kernel": {f"{m}_gap_after_it": after_start_kernel(TRUTH["start_kernel"] / f"{m}.pt.trace.json.gz")
                            for m in ("sync", "async")},
           "before_clock_change": {"seed0_async": gap_misses(BEFORE / "seed0", "async"),
                                   "seed1_sync": gap_misses(BEFORE / "seed1", "sync")}}
    a.json.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
