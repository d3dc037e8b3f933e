"""transformers' continuous batching under torch.profiler, imported beside batchscope on the same workload: the
seesaw of the published async-batching study, every idle gap named.

    python benchmarks/transformers_traces.py               # H200: Llama-3-8B shapes, 32 x 256 prompt x 48 new (~4 min)
    python benchmarks/transformers_traces.py --dry         # tiny-random on CPU: the plumbing (transformers' sync loop)

For each of use_async_batching off and on (on needs CUDA), the recipe that makes transformers' steps visible:
  1. the model from batchscope's preset (`llama3-8b-random`: Llama-3-8B shapes, random bf16 weights), attention
     "sdpa"; `eos_token_id=-1` so every request makes exactly --new-tokens; the options in a
     ContinuousBatchingConfig (options passed to generate_batch directly are ignored);
  2. the manager started (its generation thread exists) and warmed up BEFORE the profiler starts: torch.profiler
     records Python stacks (with_stack) only of threads that existed when it started, and the loop's steps are
     only visible as its Python function `_generation_loop_body`; `profile_all_threads=True`
     (torch._C._profiler._ExperimentalConfig) records that thread's CPU ops;
  3. the requests added, their results collected, the profiler stopped, the trace exported and imported.
The same prompts then run on batchscope's engine, sync and async, under `Engine.profile` (its own ranges name
its phases). Each run is also timed once without the profiler, for what profiling costs.
Output under --out (default $OUT, else ./out/transformers_traces): the traces (*.pt.trace.json.gz), the imported
timelines (*.imported.timeline.json.gz) and transformers_traces.json, the comparison.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import gzip
import inspect
import json
import math
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from batchscope.engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from batchscope.telemetry.importers import NoDeviceActivityError, import_trace  # noqa: E402
from batchscope.telemetry.importers.markers import find_markers  # noqa: E402
from batchscope.telemetry.importers.reading import read_trace  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry", action="store_true", help="tiny-random on CPU, 4 short requests")
    p.add_argument("--model", default=None, help="a batchscope preset (default llama3-8b-random; dry tiny-random)")
    p.add_argument("--requests", type=int, default=None, help="default 32 (4 dry)")
    p.add_argument("--prompt-tokens", type=int, default=None, help="default 256 (16 dry)")
    p.add_argument("--new-tokens", type=int, default=None, help="default 48 (8 dry)")
    p.add_argument("--max-batch-tokens", type=int, default=None, help="default 8192 (256 dry)")
    p.add_argument("--no-stack", action="store_true",
                   help="profile transformers without Python stacks: far less overhead, but its steps are inferred")
    p.add_argument("--skip-batchscope", action="store_true")
    p.add_argument("--out", default=os.environ.get("OUT") or "out/transformers_traces")
    a = p.parse_args(argv)
    a.model = a.model or ("tiny-random" if a.dry else "llama3-8b-random")
    a.device = "cpu" if a.dry else "cuda"
    a.dtype = "float32" if a.dry else "bfloat16"
    a.requests = a.requests or (4 if a.dry else 32)
    a.prompt_tokens = a.prompt_tokens or (16 if a.dry else 256)
    a.new_tokens = a.new_tokens or (8 if a.dry else 48)
    a.max_batch_tokens = a.max_batch_tokens or (256 if a.dry else 8192)
    return a


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def prompts(args) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, 1000) for _ in range(args.prompt_tokens)] for _ in range(args.requests)]


def profiler(with_stack: bool):
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    extra = {}
    try:
        extra["experimental_config"] = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    except (AttributeError, TypeError):
        log("this torch has no profile_all_threads: the generation thread's CPU ops will be missing")
    return profile(activities=acts, with_stack=with_stack, record_shapes=False, **extra)


def _kwargs(fn, wanted: dict) -> dict:
    params = inspect.signature(fn).parameters
    return {k: v for k, v in wanted.items() if k in params}


def _finished(result) -> bool:
    if hasattr(result, "is_finished"):
        return bool(result.is_finished())
    return "FINISHED" in str(getattr(result, "status", "")).upper()


class TransformersCB:
    """One transformers model, run through a persistent continuous-batching manager per variant."""

    def __init__(self, args):
        import transformers
        from transformers import ContinuousBatchingConfig, GenerationConfig

        from batchscope.engine.model.loading import load_model

        self.args, self.version = args, transformers.__version__
        self.model = load_model(EngineConfig(model=args.model, device=args.device, dtype=args.dtype), "sdpa").model
        self.gen = GenerationConfig(max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=-1,
                                    pad_token_id=0)
        fields = {f.name: f for f in dataclasses.fields(ContinuousBatchingConfig)}
        size = next((fields[n].default for n in ("page_size", "block_size")
                     if n in fields and isinstance(fields[n].default, int)), 256)
        blocks = args.requests * (math.ceil((args.prompt_tokens + args.new_tokens) / size) + 2)
        self._config = lambda use_async: ContinuousBatchingConfig(**{k: v for k, v in {
            "num_blocks": blocks, "max_batch_tokens": args.max_batch_tokens, "use_cuda_graph": args.device == "cuda",
            "use_async_batching": use_async, "auto_switch_to_flash": False}.items() if k in fields})
        self.has_async = "use_async_batching" in fields

    def _manager(self, use_async: bool):
        init = self.model.init_continuous_batching
        manager = init(**_kwargs(init, {"generation_config": self.gen,
                                        "continuous_batching_config": self._config(use_async)}))
        if hasattr(manager, "warmup"):
            try:
                manager.warmup()                # captures its CUDA graphs before anything is timed
            except TypeError as exc:
                log(f"manager.warmup() not called ({exc}): graphs are captured by the warm-up requests")
        manager.start()
        self._collect(manager, manager.add_requests(inputs=[[5, 6, 7, 8] * 4] * 2, max_new_tokens=4))
        return manager

    @staticmethod
    def _collect(manager, ids) -> None:
        want, done = set(ids), set()
        while done != want:
            result = manager.get_result(timeout=1)
            if result is None:
                if not manager.is_running():
                    raise RuntimeError("transformers' generation thread stopped")
                continue
            if _finished(result):
                done.add(result.request_id)

    def run(self, use_async: bool, inputs, trace: Path | None, with_stack: bool) -> float:
        """Wall seconds of the requests (from adding them to the last result), profiled when `trace` is given."""
        manager = self._manager(use_async)
        prof = profiler(with_stack) if trace is not None else None
        try:
            if prof is not None:
                prof.start()
            t0 = time.perf_counter()
            self._collect(manager, manager.add_requests(inputs=inputs, max_new_tokens=self.args.new_tokens))
            wall = time.perf_counter() - t0
            if prof is not None:
                prof.stop()
        finally:
            manager.stop(block=True)
        if prof is not None:
            prof.export_chrome_trace(str(trace))
        return wall

    def close(self) -> None:
        self.model = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def figures(tl: dict, wall_s: float, wall_unprofiled_s: float | None, trace: Path, import_s: float) -> dict:
    s = tl["summary"]
    steps = [x for x in tl["steps"] if x.get("compute_us")]
    gaps = [x["gpu_idle_before_us"] for x in steps if x.get("gpu_idle_before_us") is not None]
    inside = [x.get("gpu_idle_inside_us") or 0.0 for x in steps]
    top = lambda d: dict(sorted(d.items(), key=lambda kv: -kv[1])[:6])   # noqa: E731
    return {"steps": len(tl["steps"]), "steps_from": tl["meta"]["source"]["steps_from"],
            "ms_per_step_p50": s["step_ms"]["p50"], "busy_pct": s["busy_pct"],
            "busy_pct_device_ops": s.get("busy_pct_device_ops"),
            "idle_before_us_per_step": round(sum(gaps) / len(gaps), 1) if gaps else None,
            "idle_inside_us_per_step": round(sum(inside) / len(inside), 1) if inside else None,
            "idle_before_by_cause_us": top(s["idle_us_by_cause"]),
            "idle_inside_by_cause_us": top(s.get("idle_inside_us_by_cause") or {}),
            "wall_s_profiled": round(wall_s, 3), "wall_s_unprofiled": wall_unprofiled_s and round(wall_unprofiled_s, 3),
            "profiler_cost_pct": round(100 * (wall_s / wall_unprofiled_s - 1), 1) if wall_unprofiled_s else None,
            "trace_bytes": trace.stat().st_size, "import_s": round(import_s, 2)}


def markers_in(trace: Path) -> dict:
    """The step markers the trace holds: the check that the recipe made transformers' loop visible."""
    kind, found = find_markers(read_trace(str(trace)))
    return {"kind": kind, "count": len(found)}


def imported(trace: Path, out: Path) -> tuple[dict | None, float]:
    t0 = time.perf_counter()
    try:
        tl = import_trace(str(trace))
    except NoDeviceActivityError as exc:          # a CPU run (--dry): the plumbing, but no device to measure
        log(str(exc))
        return None, time.perf_counter() - t0
    dt = time.perf_counter() - t0
    name = trace.name.replace(".pt.trace.json.gz", ".imported.timeline.json.gz")
    (out / name).write_bytes(gzip.compress(json.dumps(tl, separators=(",", ":")).encode()))
    return tl, dt


def run_transformers(args, inputs, out: Path) -> dict:
    tf = TransformersCB(args)
    results = {}
    try:
        for use_async in (False, True):
            label = f"transformers-{'async' if use_async else 'sync'}"
            if use_async and (not tf.has_async or args.device != "cuda"):
                log(f"{label}: skipped (needs use_async_batching and a CUDA device)")
                continue
            log(f"{label}: unprofiled run")
            plain = tf.run(use_async, inputs, None, False)
            trace = out / f"{label}.pt.trace.json.gz"
            log(f"{label}: profiled run ({'no Python stacks' if args.no_stack else 'with_stack'})")
            wall = tf.run(use_async, inputs, trace, not args.no_stack)
            tl, dt = imported(trace, out)
            results[label] = {"markers": markers_in(trace), "wall_s_profiled": round(wall, 3),
                              "wall_s_unprofiled": round(plain, 3), "trace_bytes": trace.stat().st_size}
            if tl is not None:
                results[label].update(figures(tl, wall, plain, trace, dt))
                log(f"{label}: {results[label]['steps']} steps, busy {results[label]['busy_pct']}%")
            log(f"{label}: step markers {results[label]['markers']}")
    finally:
        tf.close()
    return {"version": tf.version, "runs": results}


def finish_window(eng: Engine, capture) -> None:
    """Steps until the profiler window has all it asked for (a run can take fewer steps than estimated), then
    wait for the trace to be written."""
    while capture.state in ("pending", "running"):
        eng.generate([[1, 2, 3, 4]], SamplingParams(max_new_tokens=4, ignore_eos=True))
    capture.wait(600)


def run_batchscope(args, inputs, out: Path) -> dict:
    eng = Engine(EngineConfig(model=args.model, device=args.device, dtype=args.dtype, mode="sync",
                              max_batch_tokens=args.max_batch_tokens, max_running=max(32, args.requests)))
    params = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True)
    results = {}
    try:
        for mode in ("sync", "async"):
            eng.set_mode(mode)
            eng.generate(inputs[:2], SamplingParams(max_new_tokens=4, ignore_eos=True))     # warm-up
            t0 = time.perf_counter()
            eng.generate(inputs, params)
            plain = time.perf_counter() - t0
            trace = out / f"batchscope-{mode}.pt.trace.json.gz"
            steps = args.new_tokens + math.ceil(args.requests * args.prompt_tokens / args.max_batch_tokens) + 2
            capture = eng.profile(min(steps, 1000), str(trace))
            t0 = time.perf_counter()
            eng.generate(inputs, params)
            wall = time.perf_counter() - t0
            finish_window(eng, capture)
            if capture.state != "done":
                raise RuntimeError(f"profiler window: {capture.as_dict()}")
            tl, dt = imported(trace, out)
            results[f"batchscope-{mode}"] = {"markers": markers_in(trace)}
            if tl is not None:
                results[f"batchscope-{mode}"].update(figures(tl, wall, plain, trace, dt))
                log(f"batchscope-{mode}: {len(tl['steps'])} steps, busy {tl['summary']['busy_pct']}%")
    finally:
        eng.close()
    return {"runs": results}


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    inputs = prompts(args)
    log(f"{args.model} on {args.device}: {args.requests} x {args.prompt_tokens} prompt x {args.new_tokens} new")
    doc = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(["python", *sys.argv]), "model": args.model,
           "device": args.device, "workload": {"requests": args.requests, "prompt_tokens": args.prompt_tokens,
                                               "new_tokens": args.new_tokens}}
    doc["transformers"] = run_transformers(args, inputs, out)
    if not args.skip_batchscope:
        doc["batchscope"] = run_batchscope(args, inputs, out)
    (out / "transformers_traces.json").write_text(json.dumps(doc, indent=1))
    for system in ("transformers", "batchscope"):
        for label, fig in (doc.get(system) or {}).get("runs", {}).items():
            if "steps" not in fig:
                print(f"{label:22s} step markers {fig['markers']} (no device activity to import)")
                continue
            print(f"{label:22s} {fig['steps']:5d} steps  {fig['ms_per_step_p50']} ms/step  busy {fig['busy_pct']}% "
                  f"(device ops {fig['busy_pct_device_ops']}%)  idle/step before {fig['idle_before_us_per_step']} µs "
                  f"inside {fig['idle_inside_us_per_step']} µs  profiler +{fig['profiler_cost_pct']}%")
            print(f"{'':22s} before: {fig['idle_before_by_cause_us']}")
            print(f"{'':22s} inside: {fig['idle_inside_by_cause_us']}")
    log(f"wrote {out}/transformers_traces.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
