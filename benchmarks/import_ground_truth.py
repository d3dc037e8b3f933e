"""The trace importer against ground truth: batchscope's engine records the same steps twice, once with its own
CUDA-event telemetry and once under torch.profiler (`Engine.profile`), in sync and then in async; the trace is
imported and the two timelines compared step by step (telemetry/importers/agreement.py).

    python benchmarks/import_ground_truth.py                 # H200: llama3-8b-random on cuda, bf16 (~3 min)
    python benchmarks/import_ground_truth.py --dry           # tiny-random on CPU: checks the plumbing

Criteria (per mode): the compute span and the gap before each step agree within 20 µs for at least 95% of the
steps; busy % (the union of compute spans over their extent, one definition for both) within 1 point; the
import names at least 90% of batchscope's own idle time between steps by the same cause. Reported beside them:
the idle inside steps that CUDA events cannot see, per mode and cause.

The workload mixes prefill into decoding: requests arrive in waves (a third at the start, the rest as the
window runs), with prompt and output lengths drawn from ranges. Output under --out (default $OUT, else
./out/import_ground_truth): import_ground_truth.json (every number and verdict), and per mode the trace
({mode}.pt.trace.json.gz), batchscope's own timeline ({mode}.timeline.json.gz) and the imported one
({mode}.imported.timeline.json.gz).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batchscope.engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from batchscope.telemetry import Telemetry  # noqa: E402
from batchscope.telemetry.importers import import_trace  # noqa: E402
from batchscope.telemetry.importers.agreement import compare_steps  # noqa: E402

SPAN_WITHIN_PCT, GAP_WITHIN_PCT, BUSY_POINTS, CAUSES_PCT = 95.0, 95.0, 1.0, 90.0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry", action="store_true", help="tiny-random on CPU, a small workload: the plumbing only")
    p.add_argument("--model", default=None, help="default llama3-8b-random (tiny-random with --dry)")
    p.add_argument("--device", default=None, help="default cuda (cpu with --dry)")
    p.add_argument("--modes", default="sync,async")
    p.add_argument("--steps", type=int, default=None, help="steps in each profiler window (default 160; 10 dry)")
    p.add_argument("--requests", type=int, default=None, help="per mode (default 32; 4 dry)")
    p.add_argument("--prompt-tokens", default=None, help="min,max (default 64,512; 4,24 dry)")
    p.add_argument("--new-tokens", default=None, help="min,max (default 48,160; 6,12 dry)")
    p.add_argument("--num-blocks", type=int, default=4096)
    p.add_argument("--max-batch-tokens", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.environ.get("OUT") or "out/import_ground_truth")
    a = p.parse_args(argv)
    dry = a.dry
    a.model = a.model or ("tiny-random" if dry else "llama3-8b-random")
    a.device = a.device or ("cpu" if dry else "cuda")
    a.steps = a.steps or (10 if dry else 160)
    a.requests = a.requests or (4 if dry else 32)
    a.prompt_tokens = tuple(int(x) for x in (a.prompt_tokens or ("4,24" if dry else "64,512")).split(","))
    a.new_tokens = tuple(int(x) for x in (a.new_tokens or ("6,12" if dry else "48,160")).split(","))
    return a


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def workload(args, mode_index: int) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(args.seed * 1000 + mode_index)
    out = []
    for _ in range(args.requests):
        prompt = [rng.randrange(3, 1000) for _ in range(rng.randint(*args.prompt_tokens))]
        out.append((prompt, SamplingParams(max_new_tokens=rng.randint(*args.new_tokens), ignore_eos=True)))
    return out


def submit_in_waves(eng: Engine, requests: list, window_steps: int) -> list:
    """A third of the requests at once, the rest in two waves while the window runs (prefill mixed into decode).
    Returns the handles, filled in as the waves go out."""
    first = max(1, len(requests) // 3)
    waves = [requests[:first], requests[first:2 * first], requests[2 * first:]]
    start = eng.stats()["steps"]
    handles = [eng.submit(p, sp) for p, sp in waves[0]]

    def later():
        for k, wave in enumerate(waves[1:], start=1):
            target = start + k * max(2, window_steps // 4)
            while eng.stats()["steps"] < target:
                time.sleep(0.0005)
            handles.extend(eng.submit(p, sp) for p, sp in wave)

    thread = threading.Thread(target=later, daemon=True)
    thread.start()
    return handles, thread


def write_gz(path: Path, obj) -> None:
    path.write_bytes(gzip.compress(json.dumps(obj, separators=(",", ":")).encode()))


def run_mode(eng: Engine, tel: Telemetry, args, mode: str, index: int, out: Path) -> dict:
    log(f"{mode}: {args.requests} requests, a {args.steps}-step profiler window")
    eng.set_mode(mode)
    trace_path = out / f"{mode}.pt.trace.json.gz"
    tel.start_recording(mode)
    capture = eng.profile(args.steps, str(trace_path))
    handles, waves = submit_in_waves(eng, workload(args, index), args.steps)
    waves.join()
    for h in handles:
        h.result()
    while capture.state in ("pending", "running"):         # a workload shorter than the window: keep stepping
        eng.generate([[1, 2, 3, 4]], SamplingParams(max_new_tokens=4, ignore_eos=True))
    if not capture.wait(600) or capture.state != "done":
        raise RuntimeError(f"the profiler window did not finish: {capture.as_dict()}")
    tel.stop_recording()
    own = json.loads(json.dumps(tel.timeline(mode)))
    write_gz(out / f"{mode}.timeline.json.gz", own)
    t0 = time.perf_counter()
    imported = import_trace(str(trace_path))
    import_s = time.perf_counter() - t0
    write_gz(out / f"{mode}.imported.timeline.json.gz", imported)
    agree = compare_steps(imported, own)
    log(f"{mode}: window steps {capture.first_step}..{capture.last_step}, trace {trace_path.stat().st_size:,} B, "
        f"imported in {import_s:.2f} s")
    return {"mode": mode, "capture": capture.as_dict(), "trace_bytes": trace_path.stat().st_size,
            "import_s": round(import_s, 3), "agreement": agree, "verdicts": verdicts(agree, mode)}


def verdicts(agree: dict, mode: str) -> dict:
    fig = agree["per_mode"].get(mode) or agree
    busy = fig["busy_pct"]["diff"]
    return {
        "compute_span_within_20us": _ok(fig["compute_span"]["within_pct"], SPAN_WITHIN_PCT),
        "gap_within_20us": _ok(fig["gap_before"]["within_pct"], GAP_WITHIN_PCT),
        "busy_pct_within_1_point": None if busy is None else abs(busy) <= BUSY_POINTS,
        "causes_match_90pct": _ok(fig["causes"]["matched_pct"], CAUSES_PCT),
    }


def _ok(value, floor) -> bool | None:
    return None if value is None else value >= floor


def report(results: list[dict]) -> None:
    for r in results:
        fig = r["agreement"]["per_mode"].get(r["mode"]) or r["agreement"]
        print(f"\n== {r['mode']}: {r['agreement']['steps_matched']} steps matched")
        print(f"  compute span within 20 µs: {fig['compute_span']['within_pct']}% (p95 {fig['compute_span']['p95_us']} µs)")
        print(f"  gap before within 20 µs:   {fig['gap_before']['within_pct']}% (p95 {fig['gap_before']['p95_us']} µs)")
        print(f"  busy %: imported {fig['busy_pct']['imported']}, own {fig['busy_pct']['own']}")
        print(f"  causes matched: {fig['causes']['matched_pct']}% of {fig['causes']['own_idle_us']} µs; "
              f"mismatched as {fig['causes']['mismatched_as']}")
        print(f"  idle inside steps (events cannot see it): {fig['idle_inside_us']['total']} µs, "
              f"{fig['idle_inside_us']['per_step']} µs/step, by cause {fig['idle_inside_us']['by_cause']}")
        print(f"  verdicts: {r['verdicts']}")


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dtype = "float32" if args.device == "cpu" else "bfloat16"
    log(f"loading {args.model} on {args.device} ({dtype})")
    eng = Engine(EngineConfig(model=args.model, device=args.device, dtype=dtype, mode="sync",
                              num_blocks=args.num_blocks, max_batch_tokens=args.max_batch_tokens,
                              max_running=max(32, args.requests), seed=args.seed))
    tel = Telemetry(eng, nvml_hz=0 if args.device == "cpu" else 20)
    try:
        for mode in args.modes.split(","):                  # warm-up: the first run in a process is slower
            eng.set_mode(mode)
            eng.generate([[5, 6, 7, 8] * 4] * 4, SamplingParams(max_new_tokens=8, ignore_eos=True))
        results = [run_mode(eng, tel, args, mode, i, out) for i, mode in enumerate(args.modes.split(","))]
    finally:
        tel.close()
        eng.close()
    doc = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "model": args.model,
           "device": args.device, "criteria": {"compute_span_within_pct": SPAN_WITHIN_PCT,
                                               "gap_within_pct": GAP_WITHIN_PCT, "busy_points": BUSY_POINTS,
                                               "causes_pct": CAUSES_PCT, "tolerance_us": 20.0},
           "runs": results}
    (out / "import_ground_truth.json").write_text(json.dumps(doc, indent=1))
    report(results)
    log(f"wrote {out}/import_ground_truth.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
