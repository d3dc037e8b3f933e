"""Where a what-if's error at saturation comes from: the simulated steps against the measured ones, one load.

    python benchmarks/whatif_steps.py RECORDING MEASURED KEY=VALUE... [--json FILE]

Runs the prediction's virtual engine once (seed 0) on RECORDING with the settings, and sets its steps beside the
MEASURED run's (a timeline of the same load with those settings): step count, mean decode rows, prompt tokens,
mean device ms per step, steps carrying a chunk, KV blocks, requests and queue depth a step, preemptions.
docs/whatif.md quotes it for the H200's 40 req/s rows and the CPU's preemption case."""
from __future__ import annotations

import json
import random
import statistics
import sys

from batchscope.telemetry.whatif import open_recording, parse
from batchscope.telemetry.whatif.model import build
from batchscope.telemetry.whatif.recording import read_file
from batchscope.telemetry.whatif.settings import apply, max_model_len
from batchscope.telemetry.whatif.simulate import VirtualEngine


def step_stats(steps: list[dict]) -> dict:
    timed = [s for s in steps if s.get("compute_us")]
    return {"steps": len(steps), "decode_rows_mean": round(statistics.mean(s["decode_tokens"] for s in steps), 2),
            "prefill_tokens": sum(s["prefill_tokens"] for s in steps),
            "device_ms_mean": round(statistics.mean((s["compute_us"][1] - s["compute_us"][0]) / 1000 for s in timed), 3),
            "steps_with_prefill": sum(1 for s in steps if s["prefill_tokens"]),
            "kv_blocks_mean": round(statistics.mean(s["kv_blocks_used"] for s in steps), 2),
            "requests_mean": round(statistics.mean(s["num_requests"] for s in steps), 2),
            "queue_depth_mean": round(statistics.mean(s["queue_depth"] for s in steps), 2),
            "preemptions": sum(len(s.get("preempted") or []) for s in steps)}


def main(argv: list[str]) -> dict:
    json_out = None
    if "--json" in argv:
        i = argv.index("--json")
        json_out, argv = argv[i + 1], argv[:i] + argv[i + 2:]
    recording, measured, *pairs = argv
    rec, settings = open_recording(recording), parse(pairs)
    mode = settings.get("mode", next(iter(rec.segments)))
    engine = VirtualEngine(build(rec), apply(rec, settings), mode, rec.segments[next(iter(rec.segments))].load,
                           float(settings.get("rate", 1.0)), max_model_len(rec), random.Random(0))
    real = [s for s in read_file(measured)["steps"] if s["mode"] == mode]
    out = {"command": " ".join(["python", "benchmarks/whatif_steps.py", *sys.argv[1:]]), "settings": pairs,
           "simulated": step_stats(engine.run().steps), "measured": step_stats(real)}
    print(json.dumps(out, indent=1))
    if json_out:
        with open(json_out, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
