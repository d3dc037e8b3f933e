"""The numbers behind docs/budget.md's step-time model and its expected H200 table, from recorded timelines.

    python benchmarks/budget_h200.py replay [TIMELINE ...]   one-step-ahead error of the model over recorded steps
    python benchmarks/budget_h200.py simulate                the budget policy on the issue #42 workloads, step
                                                             times from the H200 fit (no GPU)

Timelines default to benchmarks/results/2026-12-04-h200-budget*/*.async.timeline.json.gz. A step's shape is
rebuilt from its record: `prefill_tokens_by_request` gives each chunk, the tokens a request computed before it its
cached context; the other rows decode one token over everything their request computed so far.
(benchmarks/budget_h200.sh measures the same workloads on a GPU.)
"""
from __future__ import annotations

import glob
import gzip
import json
import os
import random
import statistics
import sys

from batchscope.engine.budget import StepBudget
from batchscope.engine.step_time import StepShape, StepTimeModel
from batchscope.engine.graphs import mixed_buckets

HERE = os.path.dirname(os.path.abspath(__file__))
RECORDED = os.path.join(HERE, "results", "2026-12-04-h200-budget*", "*.async.timeline.json.gz")
TRUTH = (4.35, 0.0141, 0.0194, 0.00302, 0.0417)     # least squares over all 16,472 recorded steps (both modes)


def recorded_steps(path: str) -> list[tuple[StepShape, float]]:
    with gzip.open(path) if path.endswith(".gz") else open(path) as f:
        timeline = json.load(f)
    computed: dict[str, int] = {}
    out = []
    for rec in timeline["steps"]:
        chunks = rec.get("prefill_tokens_by_request") or {}
        rows = kv = tokens = 0
        pairs = 0.0
        for rid in rec["request_ids"]:
            done = computed.get(rid, 0)
            if rid in chunks:
                n = chunks[rid]
                tokens += n
                pairs += n * (done + n / 2)
                computed[rid] = done + n
            else:
                rows += 1
                kv += done + 1
                computed[rid] = done + 1
        if rec.get("compute_us"):
            out.append((StepShape(rows, kv, tokens, pairs), (rec["compute_us"][1] - rec["compute_us"][0]) / 1000))
    return out


def _q(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def replay(paths: list[str]) -> list[dict]:
    out = []
    for path in paths or sorted(glob.glob(RECORDED)):
        model, every, prefill = StepTimeModel(), [], []
        for shape, ms in recorded_steps(path):
            if model.ready:
                err = abs(model.predict(shape) - ms) / ms
                every.append(err)
                if shape.prefill_tokens:
                    prefill.append(err)
            model.observe(shape, ms)
        if not every:
            continue
        name = os.path.relpath(path, HERE) if os.path.abspath(path).startswith(HERE) else os.path.basename(path)
        print(f"{name:<75} steps {len(every):5d}  error median {100 * _q(every, .5):4.1f}% "
              f"p90 {100 * _q(every, .9):4.1f}%  prefill steps median {100 * _q(prefill, .5):4.1f}% "
              f"p90 {100 * _q(prefill, .9):4.1f}%")
        out.append({"timeline": name, "steps": len(every), "error_pct": {"p50": 100 * _q(every, .5),
                    "p90": 100 * _q(every, .9)}, "prefill_steps": len(prefill),
                    "prefill_error_pct": {"p50": 100 * _q(prefill, .5), "p90": 100 * _q(prefill, .9)} if prefill else None})
    return out


def _truth(shape: StepShape) -> float:
    return sum(c * f for c, f in zip(TRUTH, shape.features()))


def simulate_one(reqs: list[dict], fixed: int | None, max_running: int, shapes: bool = True) -> dict:
    """Decodes first, then prompt chunks in admission order, within the policy's budget; time from TRUTH."""
    budget = StepBudget(fixed, fixed or 8192)
    budget.limit_decode_steps(mixed_buckets(fixed or 2048))
    reqs = sorted(({**r, "done": 0, "out": 0, "times": []} for r in reqs), key=lambda r: r["arr"])
    t, queue, running, i, steps = 0.0, [], [], 0, 0
    while i < len(reqs) or queue or running:
        while i < len(reqs) and reqs[i]["arr"] <= t:
            queue.append(reqs[i])
            i += 1
        if not queue and not running:
            t = reqs[i]["arr"]
            continue
        dec = [r for r in running if r["done"] >= r["prompt"]]
        admissible = queue[:max_running - len(running)]
        pre = [r for r in running if r["done"] < r["prompt"]] + admissible
        rows = [(r["done"], r["prompt"] - r["done"]) for r in pre]
        kv = sum(r["done"] for r in dec)
        left = sum(r["new"] - r["out"] for r in dec) / len(dec) if dec else 0.0
        waiting = sum(todo for _c, todo in rows)
        chosen = (budget.choose(len(dec), waiting, left, kv, rows) if shapes
                  else budget.choose(len(dec), waiting, left))
        room, chunks = chosen.tokens - len(dec), []
        for r in pre:
            if room <= 0:
                break
            n = min(room, r["prompt"] - r["done"])
            chunks.append((r, n))
            room -= n
            if r in queue:
                queue.remove(r)
                running.append(r)
        shape = StepShape(len(dec), kv + len(dec), sum(n for _r, n in chunks),
                          sum(n * (r["done"] + n / 2) for r, n in chunks))
        ms = _truth(shape)
        t += ms / 1000
        steps += 1
        budget.observe(shape.decode_rows + shape.prefill_tokens, ms, not chunks, shape if shapes else None)
        for r in dec:
            r["done"] += 1
            r["out"] += 1
            r["times"].append(t)
        for r, n in chunks:
            r["done"] += n
            if r["done"] >= r["prompt"]:
                r["out"] += 1
                r["times"].append(t)
        running = [r for r in running if r["out"] < r["new"]]
    itl = [1000 * (b - a) for r in reqs for a, b in zip(r["times"], r["times"][1:])]
    ttft = [1000 * (r["times"][0] - r["arr"]) for r in reqs]
    return {"wall_s": t - reqs[0]["arr"], "steps": steps, "itl_p50": statistics.median(itl),
            "itl_p99": _q(itl, .99), "ttft_p50": statistics.median(ttft), "ttft_p99": _q(ttft, .99)}


def _served(rate: float, n: int, prompt: tuple[int, int], new: tuple[int, int], seed: int = 11) -> list[dict]:
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append({"arr": t, "prompt": rng.randint(*prompt), "new": rng.randint(*new)})
    return out


def simulate() -> dict:
    prefill = [{"arr": 0.0, "prompt": 4000, "new": 64} for _ in range(32)]
    cases = [("prefill 32 x 4000 x 64", prefill, 32),
             ("served 12/s", _served(12, 240, (128, 1024), (64, 512)), 64),
             ("served 40/s", _served(40, 240, (128, 1024), (64, 512)), 64),
             ("long 2048-8192 at 3/s", _served(3, 40, (2048, 8192), (64, 256)), 64)]
    out: dict = {}
    for title, reqs, running in cases:
        print(title)
        runs = [("adaptive", None, True), ("no shapes", None, False), ("8192", 8192, True), ("256", 256, True)]
        for name, fixed, shapes in runs:
            if fixed == 8192 and not title.startswith("prefill"):
                continue
            r = out.setdefault(title, {})[name] = simulate_one(reqs, fixed, running, shapes)
            print(f"  {name:<10} wall {r['wall_s']:6.2f} s  steps {r['steps']:5d}  ITL p50/p99 {r['itl_p50']:6.2f}/"
                  f"{r['itl_p99']:7.2f} ms  p99/p50 {r['itl_p99'] / r['itl_p50']:5.2f}  TTFT p50/p99 "
                  f"{r['ttft_p50']:7.1f}/{r['ttft_p99']:7.1f} ms")
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    json_out = None
    if "--json" in args:                    # also write the figures printed, for docs/BENCHMARKS.md to cite
        i = args.index("--json")
        json_out, args = args[i + 1], args[:i] + args[i + 2:]
    what = args[0] if args else "simulate"
    if what == "replay":
        result = replay(args[1:])
    elif what == "simulate":
        result = simulate()
    else:
        sys.exit(__doc__)
    if json_out:
        with open(json_out, "w") as f:
            json.dump({"command": " ".join(["python", "benchmarks/budget_h200.py", *sys.argv[1:]]), what: result}, f,
                      indent=1)
