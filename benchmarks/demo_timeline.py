"""Record a demo timeline on a GPU: a load of requests with the mode switched live (async -> sync -> async).

The file it writes opens with `batchscope replay FILE`, which is how the README's GPU screenshot is made.
    python3 benchmarks/demo_timeline.py --out demo.timeline.json
    python3 benchmarks/demo_timeline.py --model llama3-405b-random -tp 8 --phase-s 20 --out demo_405b.timeline.json
"""
from __future__ import annotations

import argparse
import json
import random
import time

from batchscope.engine import Engine, EngineConfig, SamplingParams
from batchscope.telemetry import Telemetry


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-8b-random")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--phase-s", type=float, default=1.5, help="seconds in each mode")
    ap.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    ap.add_argument("--out", default="demo.timeline.json")
    args = ap.parse_args()

    engine = Engine(EngineConfig(model=args.model, device=args.device, mode="async", max_running=32,
                                 max_batch_tokens=2048, num_blocks=8192 if args.device != "cpu" else 512,
                                 tensor_parallel_size=args.tensor_parallel_size))
    tel = Telemetry(engine)
    rng = random.Random(0)
    vocab = engine.info["vocab_size"]
    engine.generate([[1, 2, 3]] * 4, SamplingParams(max_new_tokens=4))          # warm-up, not recorded
    tel.start_recording("demo")
    handles = []

    def arrive(n: int) -> None:
        for _ in range(n):
            prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(64, 512))]
            handles.append(engine.submit(prompt, SamplingParams(max_new_tokens=rng.randint(256, 1024),
                                                                ignore_eos=True), stream=False))
    arrive(args.requests // 2)
    for mode in ("async", "sync", "async"):
        engine.set_mode(mode)
        end = time.monotonic() + args.phase_s
        while time.monotonic() < end:       # a trickle of arrivals keeps prefill in the picture
            arrive(1)
            time.sleep(args.phase_s / 8)
    for h in handles:
        h.cancel()
    for h in handles:
        h.result(timeout=120)
    tel.stop_recording()
    timeline = tel.timeline("demo")
    with open(args.out, "w") as f:
        json.dump(timeline, f)
    s = timeline["summary"]
    print(f"wrote {args.out}: {len(timeline['steps'])} steps, busy {s.get('busy_pct')}%, "
          f"{len(timeline['mode_changes'])} mode changes")
    tel.close()
    engine.close()


if __name__ == "__main__":
    from batchscope.engine.parallel.ranks import leave
    main()
    leave(0)
