"""Build the recordings a CPU page offers (assets/examples/): H200 runs from benchmarks/results/, one file each, and
their index (assets/examples/index.json).

A benchmark records each mode in a run of its own: such a pair is joined into one timeline (the async run placed
one second after the sync run ends, its steps numbered on), so the scoreboard compares the two loops on the same
workload. The join adds no mode switch (nobody switched: they were two runs) and says so in meta.source. The
summary is computed afresh over the joined steps.

    python benchmarks/ship_examples.py            # writes assets/examples/*.timeline.json and index.json
"""
from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

from batchscope.telemetry import summarize
from batchscope.telemetry.export import shift_records

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks/results"
GAP_US = 1e6

# (file name, title, what it shows, sources: one switched recording, or a sync run and an async run to join)
EXAMPLES = [
    ("h200-demo.timeline.json", "Llama-3-8B shapes on an H200, switched live",
     "48 requests; switched async -> sync -> async while it ran: the seesaw opens and closes",
     ["2026-11-29-h200/demo.timeline.json"]),
    ("h200-moe.timeline.json", "Qwen3-30B-A3B shapes (MoE) on an H200, sync then async",
     "32 requests x 256 prompt x 512 new tokens, the same workload in each loop (two runs, joined)",
     ["2026-12-01-h200-moe/bench_moe.sync.timeline.json", "2026-12-01-h200-moe/bench_moe.async.timeline.json"]),
    ("h200x2-70b-tp2.timeline.json", "Llama-3-70B shapes over two H200s (tensor parallel), sync then async",
     "32 requests x 256 prompt x 512 new tokens, both GPUs' lanes (two runs, joined)",
     ["2026-11-30-h200x2-tp/bench_tp_llama3-70b_tp2.sync.timeline.json",
      "2026-11-30-h200x2-tp/bench_tp_llama3-70b_tp2.async.timeline.json"]),
    ("h200-256-power.timeline.json", "Llama-3-8B shapes, 256 requests at the H200's power limit, sync then async",
     "256 requests x 256 prompt x 192 new tokens: async 99.9% busy at a lower SM clock (the board at 690 W), "
     "sync 73% (two runs, joined)",
     ["2026-12-02-h200-s256/s256.sync.timeline.json.gz", "2026-12-02-h200-s256/s256.async.timeline.json.gz"]),
]


def _read(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())


def _end_us(tl: dict) -> float:
    return max(max(s[1] for s in (r.get("cpu") or {}).values()) if r.get("cpu") else r["compute_us"][1]
               for r in tl["steps"])


def join(first: dict, second: dict, sources: list[str]) -> dict:
    """`second` placed after `first` on one clock, its steps numbered after first's, no switch added."""
    shift = _end_us(first) + GAP_US - min(r["compute_us"][0] for r in second["steps"])
    moved = shift_records({k: second.get(k, []) for k in ("steps", "requests", "nvml", "mode_changes", "rank_steps")},
                          shift)
    offset = first["steps"][-1]["step"] + 1
    for rec in moved["steps"] + moved["rank_steps"]:
        rec["step"] += offset
    for rec in moved["steps"]:
        for key in ("built_during_step", "consumed_at_launch"):
            if rec.get(key) is not None:
                rec[key] += offset
    for req in moved["requests"]:
        req["id"] = "b:" + req["id"]
    for rec in moved["steps"]:
        rec["request_ids"] = ["b:" + i for i in rec.get("request_ids", [])]
    out = {k: first.get(k, []) + moved[k] for k in ("steps", "requests", "nvml", "mode_changes", "rank_steps")}
    meta = dict(first["meta"])
    meta["source"] = {"joined": sources, "note": "two benchmark runs on the same workload, one per mode, recorded "
                      "separately and placed one after the other; no live switch between them"}
    timeline = {"schema": first["schema"], "meta": meta, **out}
    if not out["rank_steps"]:
        del timeline["rank_steps"]
    timeline["summary"] = summarize(out["steps"], out["requests"], out["nvml"], meta.get("info") or {},
                                    rank_steps=out["rank_steps"])
    return timeline


def build(out_dir: Path) -> list[dict]:
    index = []
    for name, title, text, sources in EXAMPLES:
        parts = [_read(RESULTS / s) for s in sources]
        tl = parts[0] if len(parts) == 1 else join(parts[0], parts[1], sources)
        if len(parts) == 1 and "board" not in tl.get("summary", {}):
            tl["summary"] = summarize(tl["steps"], tl["requests"], tl["nvml"], tl["meta"].get("info") or {})
        (out_dir / name).write_text(json.dumps(tl, separators=(",", ":")))
        index.append({"file": name, "title": title, "text": text, "steps": len(tl["steps"]),
                      "model": tl["meta"].get("model"), "gpu": tl["meta"].get("gpu")})
    (out_dir / "index.json").write_text(json.dumps(index, indent=1))
    return index


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "assets/examples"))
    for row in build(Path(ap.parse_args().out)):
        print(row["file"], row["steps"], "steps:", row["title"])
