"""The proof of `batchscope compare` on a GPU: A/A pairs raise no false alarm, real changes are found and sized.

    python benchmarks/compare_h200.py record OUT [SECONDS]   # on the GPU machine: the bench runs, gzipped
    python benchmarks/compare_h200.py analyse OUT RESULTS   # anywhere: every comparison, one JSON per question

Recorded (llama3-8b-random, one process per bench command, as a user would run them):
- uniform: 32 requests x 256 prompt x 128 new, sync and async, 5 repeats each, alternating (bench's own order);
- served: 120 Poisson arrivals at 12/s, prompts 128-1024, 64-256 new, async, at budget 256 and at 512 (fixed),
  and at 256 with the mixed-step graphs off (--no-mixed-graphs).
Compared: every pair of repeats of one mode (A/A, 10 per mode), sync vs async (one a side, and 5 a side with
the run spread), budget 256 vs 512, mixed graphs on vs off.
"""
from __future__ import annotations

import gzip
import itertools
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

BENCH = [sys.executable, "-m", "batchscope.app.bench", "--model", "llama3-8b-random", "--device", "cuda",
         "--no-progress"]
UNIFORM = ["--requests", "32", "--prompt-tokens", "256", "--new-tokens", "128", "--modes", "sync,async",
           "--repeats", "5"]
SERVED = ["--workload", "served", "--requests", "120", "--prompt-tokens", "128:1024", "--new-tokens", "64:256",
          "--arrival", "poisson", "--rate", "12", "--seed", "11", "--max-running", "64", "--modes", "async"]
RUNS = {"uniform": UNIFORM,
        "b256": SERVED + ["--max-batch-tokens", "256"],
        "b512": SERVED + ["--max-batch-tokens", "512"],
        "b256_nomixed": SERVED + ["--max-batch-tokens", "256", "--no-mixed-graphs"]}


def record(out: Path, seconds: float) -> None:
    """The runs in order of importance, each given what is left of `seconds` (a lease is short)."""
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + seconds
    for name, args in RUNS.items():
        left = deadline - time.monotonic()
        if left < 30:
            print(f"{name}: skipped, {left:.0f} s left", flush=True)
            continue
        result = out / f"{name}.json"
        start = time.monotonic()
        with open(out / f"{name}.log", "w") as log:
            try:
                rc = subprocess.call(BENCH + args + ["--out", str(result)], stdout=log, stderr=subprocess.STDOUT,
                                     timeout=left)
            except subprocess.TimeoutExpired:
                rc = "timed out"
        print(f"{name}: exit {rc} after {time.monotonic() - start:.0f} s", flush=True)
        for timeline in out.glob(f"{name}.*.timeline.json"):
            with open(timeline, "rb") as src, gzip.open(f"{timeline}.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            timeline.unlink()


def analyse(runs: Path, results: Path) -> None:
    from batchscope.telemetry.comparison import compare, open_recordings

    def side(spec: str) -> list:
        return open_recordings(str(runs / spec))

    def summary(result: dict) -> dict:
        return {"verdict": result["verdict"], "step_time_ratio": result["step_time_ratio"],
                "compute_ratio": result["figures"]["compute"]["ratio"],
                "idle_delta_ms": result["figures"].get("idle", {}).get("delta_ms"),
                "matched_steps": [result["base"]["matched_steps"], result["new"]["matched_steps"]],
                "unmatched_time_share": [result["unmatched"]["base_time_share"], result["unmatched"]["new_time_share"]],
                "moved": [m["figure"] for m in result["moved"]], "min_effect": result["noise"]["min_effect"]}

    results.mkdir(parents=True, exist_ok=True)
    aa = []
    for mode in ("sync", "async"):
        repeats = side(f"uniform.json#{mode}")
        for i, j in itertools.combinations(range(len(repeats)), 2):
            aa.append({"mode": mode, "pair": [i + 1, j + 1], **summary(compare([repeats[i]], [repeats[j]]))})
    verdicts = [p["verdict"] for p in aa]
    _write(results / "aa_pairs.json", {"pairs": aa, "false_alarms": sum(v in ("slower", "faster") for v in verdicts),
                                       "verdicts": {v: verdicts.count(v) for v in sorted(set(verdicts))}})
    sync, asyn = side("uniform.json#sync"), side("uniform.json#async")
    changes = {"sync_vs_async_one_a_side": compare(sync[:1], asyn[:1]),
               "sync_vs_async_five_a_side": compare(sync, asyn),
               "budget_256_vs_512": compare(side("b256.json"), side("b512.json")),
               "mixed_graphs_on_vs_off": compare(side("b256.json"), side("b256_nomixed.json"))}
    for name, result in changes.items():
        _write(results / f"{name}.json", result)
    _write(results / "summary.json", {"aa": {"pairs": len(aa), "false_alarms": sum(v in ("slower", "faster")
                                                                                for v in verdicts)},
                                      **{name: summary(r) for name, r in changes.items()}})


def _write(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "record":
        record(Path(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else 600.0)
    elif len(sys.argv) >= 4 and sys.argv[1] == "analyse":
        analyse(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(__doc__)
