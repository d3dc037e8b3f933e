"""Which part of telemetry costs sync-mode throughput? One engine, one workload, telemetry's parts switched on one
at a time in rotating order (each round starts one variant later, so a drift over the minute cancels out).

    python benchmarks/telemetry_overhead_probe.py --rounds 6          # llama3-8b-random on cuda, sync

In sync mode every microsecond the host spends between two steps is GPU idle time, so this is where a cost shows.
Each variant's change is measured against the "off" run of the same round; the medians over rounds are reported,
with the host time per step of each engine phase (the engine's own methods, timed in every variant alike):
build (schedule + fill), launch (the runner's part, without observers), observers (the deferred sync traces
delivered after a launch, hidden behind the device), wait, update, trace (building and queueing the step trace).

Variants: off (no telemetry); on (all of it); bare_observer (the engine builds and delivers step traces to an
observer that does nothing); recorder_only (the observer and recorder, with the sampler and hub threads stopped);
no_sampler (everything but the NVML/psutil sampler); sampler_no_psutil / sampler_no_nvml (the sampler without its
host CPU reads / without its NVML reads); on_worker (the observer's work handed to another thread, the engine
thread only enqueues: safe here only because sync traces are delivered a whole step before their events are
reused); on_gc_off / off_gc_off (Python's cyclic garbage collector paused during the run). The NVML calls the
sampler makes are timed first, on the idle GPU.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batchscope.engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from batchscope.telemetry import Telemetry  # noqa: E402

VARIANTS = ("off", "on", "bare_observer", "recorder_only", "no_sampler", "sampler_no_psutil", "sampler_no_nvml",
            "on_worker", "on_gc_off", "off_gc_off")
PHASES = ("build", "launch", "observers", "wait", "update", "trace")


class PhaseClock:
    """Accumulates host time per engine phase by wrapping the engine's own methods (instance attributes)."""

    def __init__(self, engine: Engine):
        core, runner = engine._core, engine.runner
        self.core, self.ns = core, dict.fromkeys(PHASES, 0)
        for obj, method, phase in ((core, "build", "build"), (runner, "launch", "launch"),
                                   (core, "flush_traces", "observers"), (runner, "wait", "wait"),
                                   (core, "_update", "update"), (core, "_trace", "trace")):
            setattr(obj, method, self._timed(getattr(obj, method), phase))

    def _timed(self, fn, phase: str):
        def timed(*args, **kwargs):
            t = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.ns[phase] += time.perf_counter_ns() - t
        return timed

    def reset(self) -> int:
        self.ns = dict.fromkeys(PHASES, 0)
        return self.core.step_counter

    def per_step_us(self, first_step: int) -> dict:
        steps = max(1, self.core.step_counter - first_step)
        return {p: round(v / steps / 1000, 1) for p, v in self.ns.items()}


class ObserverWorker:
    """Telemetry's observer on its own thread: the engine thread only appends to a queue."""

    def __init__(self, engine: Engine, tel: Telemetry):
        self.engine, self.tel, self.queue = engine, tel, queue.SimpleQueue()
        engine.remove_observer(tel._observer)
        self.enqueue = self.queue.put
        engine.add_observer(self.enqueue)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (event := self.queue.get()) is not None:
            self.tel._observe(event)

    def close(self) -> None:
        self.engine.remove_observer(self.enqueue)
        self.queue.put(None)
        self.thread.join()


def run_once(engine: Engine, prompts: list, new_tokens: int) -> float:
    """Decode tokens/s from the requests' own engine-side times (no observer needed)."""
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True))
    first = max(o.first_token_ns for o in outs)
    last = max(o.finish_ns for o in outs)
    return (sum(len(o.token_ids) for o in outs) - len(outs)) / ((last - first) / 1e9)


def run_variant(engine: Engine, variant: str, prompts: list, new_tokens: int) -> float:
    tel = bare = worker = None
    if variant not in ("off", "off_gc_off", "bare_observer"):
        tel = Telemetry(engine)
        if variant == "on_worker":
            worker = ObserverWorker(engine, tel)
        elif variant == "sampler_no_psutil":
            tel.sampler._proc = None
        elif variant == "sampler_no_nvml":
            tel.sampler.nvml = False
        elif variant in ("recorder_only", "no_sampler"):
            tel.sampler.close()
            if variant == "recorder_only":
                tel.hub.close()
    elif variant == "bare_observer":
        bare = lambda event: None     # noqa: E731
        engine.add_observer(bare)
    paused = variant.endswith("gc_off")
    if paused:
        gc.collect()
        gc.disable()
    try:
        return run_once(engine, prompts, new_tokens)
    finally:
        if paused:
            gc.enable()
        if worker is not None:
            worker.close()
        if tel is not None:
            tel.close()
        if bare is not None:
            engine.remove_observer(bare)


def nvml_call_timings(device: str, n: int = 200) -> dict:
    """Median and worst µs of each call the sampler makes."""
    import psutil

    from batchscope.telemetry.nvml import Sampler
    sampler = Sampler(lambda sample: None, lambda: 0.0, device, use_nvml=device.startswith("cuda"))
    calls = {"sample_once": sampler.sample_once, "psutil.cpu_percent": lambda: psutil.cpu_percent(None)}
    if sampler.nvml:
        import pynvml
        h = sampler._handle
        calls.update({
            "GetUtilizationRates": lambda: pynvml.nvmlDeviceGetUtilizationRates(h),
            "GetMemoryInfo": lambda: pynvml.nvmlDeviceGetMemoryInfo(h),
            "GetPowerUsage": lambda: pynvml.nvmlDeviceGetPowerUsage(h),
            "GetClockInfo": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "driver samples": sampler._driver_samples})
    out = {}
    for name, fn in calls.items():
        times = []
        for _ in range(n):
            t = time.perf_counter_ns()
            fn()
            times.append(time.perf_counter_ns() - t)
        out[name] = {"p50": round(float(np.median(times)) / 1000, 1), "max": round(max(times) / 1000, 1)}
        print(f"{name:<22} p50 {out[name]['p50']} us, max {out[name]['max']} us", file=sys.stderr)
    sampler.close()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama3-8b-random")
    p.add_argument("--device", default="cuda")
    p.add_argument("--mode", default="sync")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=384)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", default=None, help="JSON output (default: $OUT/telemetry_probe.json, else ./out)")
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    if "off" not in variants or any(v not in VARIANTS for v in variants):
        p.error(f"variants must include 'off' and come from {', '.join(VARIANTS)}")

    timings = nvml_call_timings(args.device)
    engine = Engine(EngineConfig(model=args.model, device=args.device, mode=args.mode, max_running=args.requests,
                                 num_blocks=4096, max_batch_tokens=4096, seed=0))
    clock = PhaseClock(engine)
    rng = np.random.default_rng(0)
    vocab = engine.info["vocab_size"]
    prompts = [rng.integers(0, vocab, args.prompt_tokens).tolist() for _ in range(args.requests)]
    run_once(engine, prompts, 16)                      # warm-up
    rounds = []
    for r in range(args.rounds):
        row = {}
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            first = clock.reset()
            tok_s = run_variant(engine, v, prompts, args.new_tokens)
            row[v] = {"tok_s": round(tok_s, 1), "host_us_per_step": clock.per_step_us(first)}
            print(f"round {r} {v:<17} {tok_s:8.1f} decode tok/s  {row[v]['host_us_per_step']}", file=sys.stderr,
                  flush=True)
        rounds.append(row)
    engine.close()

    result = {"schema": "batchscope.telemetry_probe/1", "command": " ".join(sys.argv), "args": vars(args),
              "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "nvml_call_us": timings, "rounds": rounds,
              "variants": {}}
    for v in variants:
        changes = [100.0 * (row[v]["tok_s"] - row["off"]["tok_s"]) / row["off"]["tok_s"] for row in rounds]
        host = {ph: round(float(np.median([row[v]["host_us_per_step"][ph] for row in rounds])), 1) for ph in PHASES}
        result["variants"][v] = {"change_vs_off_pct": round(float(np.median(changes)), 3),
                                 "changes_pct": [round(c, 3) for c in changes],
                                 "tok_s": round(float(np.median([row[v]["tok_s"] for row in rounds])), 1),
                                 "host_us_per_step": host}
        print(f"{v:<17} change vs off {result['variants'][v]['change_vs_off_pct']:+.2f}% "
              f"({result['variants'][v]['tok_s']} tok/s) host us/step {host}")
    out = Path(args.out or Path(os.environ.get("OUT") or "out") / "telemetry_probe.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
