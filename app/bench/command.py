"""`batchscope bench`: batchscope's sync and async loops (and transformers' own continuous batching) on one fixed
workload, each set against the memory-bandwidth floor of a decode step.

    python -m batchscope.app.bench --model llama3-8b-random --requests 32 --prompt-tokens 256 --new-tokens 512 \
        --modes sync,async --baseline transformers --out bench.json

What it does, in order (docs/BENCHMARKS.md has the method in full):
  1. times a large device-to-device copy (bytes read + written) -> the copy bandwidth, and a large GEMM -> the
     compute peak the roofline floor uses (in a short burst, and again held after 1.5 s of load: the clock a
     power-limited GPU keeps);
  2. loads one Engine, attaches telemetry, warms every mode up on the real prompts (a few tokens, not timed);
  3. loads the same weights once more for transformers' `generate_batch` (sdpa) and warms each variant up;
  4. runs every system once per repeat, the order reversed on every other repeat, on the same seeded prompts
     (`--prompt-tokens` random ids each, `--new-tokens` greedy tokens with EOS ignored, so lengths are fixed);
  5. writes the JSON (`--out`) and one batchscope.timeline/1 file per run next to it, and prints a table of medians.

`--workload served` (arrivals over time, lengths drawn from ranges) goes to served/procedure.py instead.

Here: the order of work and the result. The options are in flags.py (the engine's own in app/engine_flags.py,
shared with `serve`), the systems it times in systems.py, the floor in floor.py, the printed table and the token
check in summary_table.py. Like them it imports only engine, telemetry, torch, transformers and tqdm, so it runs
where the server's packages (gradio, fastapi, ...) are not installed.
"""
from __future__ import annotations

import argparse
import gc
import math
import random
from pathlib import Path

from batchscope.engine import EngineConfig
from batchscope.engine.config import MODES

from ..engine_flags import engine_budget, engine_config_from
from .floor import measure_bandwidth, workload_floors
from .flags import build_parser, complete, settle_workload
from .output import TP_BASELINE_SKIPPED, baseline_labels, plan_order, report_head, say, timeline_path, write_json
from .summary_table import _digest, _median, disagreeing_runs, format_served_table, format_table
from .systems import METRICS, BatchscopeRunner, TransformersRunner, nvml_window

BENCH_SCHEMA = "batchscope.bench/1"


# ---------------------------------------------------------------------------------------------- the benchmark


def default_max_batch_tokens(requests: int, prompt_tokens: int) -> int:
    """Enough to prefill every prompt in one step (plus decodes), kept within [2048, 8192]."""
    return min(max(2048, requests * (prompt_tokens + 1)), 8192)


def make_prompts(requests: int, prompt_tokens: int, vocab: int, seed: int) -> list[list[int]]:
    """Random token ids, the same for every run of a given seed."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(prompt_tokens)] for _ in range(requests)]


def run_benchmark(args) -> dict:
    args = settle_workload(complete(args))
    if args.workload == "served":       # arrivals over time, mixed lengths: served/procedure.py
        from .served.procedure import run_served
        return run_served(args)
    from batchscope.engine.model.loading import resolve_device

    device = resolve_device(args.device)
    show = not args.no_progress
    say(f"measuring copy bandwidth on {device}")
    bandwidth = measure_bandwidth(device, args.bandwidth_mib)
    say(f"copy bandwidth {bandwidth['gbps']:.1f} GB/s (read + write)")
    per_request = args.prompt_tokens + args.new_tokens
    config = _engine_config(args, per_request)
    say(f"loading {args.model} on {device}")
    bs = BatchscopeRunner(config, not args.no_telemetry, bandwidth["gbps"], show)
    tf = None
    try:
        info = bs.engine.info
        if per_request > info["max_model_len"]:
            raise ValueError(f"prompt + new tokens ({per_request}) exceed the model's {info['max_model_len']}")
        prompts = make_prompts(args.requests, args.prompt_tokens, info["vocab_size"], args.seed)
        say(f"measuring the GEMM peak on {device}")
        floor = workload_floors(bs.engine.model, info, args.requests, args.prompt_tokens, args.new_tokens,
                                bandwidth["gbps"])
        held = floor["gemm_peak"]["held_tflops"]
        say(f"GEMM peak {floor['gemm_peak']['tflops']:.1f} TFLOP/s ({floor['gemm_peak']['dtype']})"
             + (f", {held:.1f} held under sustained load" if held else ""))
        labels = list(args.modes)
        skipped = {}
        if args.baseline == "transformers" and config.tensor_parallel_size > 1:
            skipped["transformers"] = TP_BASELINE_SKIPPED
            say(f"skipping the transformers baseline: {TP_BASELINE_SKIPPED}")
        elif args.baseline == "transformers":
            say("loading the same weights for transformers' generate_batch (sdpa)")
            tf = TransformersRunner(config, info["max_batch_tokens"], per_request, args.requests, show,
                                    bs.engine.model)
            labels += baseline_labels(tf, skipped)
        _warm_up(args, bs, tf, labels, prompts)
        order = plan_order(labels, args.repeats)
        runs = []
        for i, (rep, label) in enumerate(order):
            say(f"run {i + 1}/{len(order)}: {label}" + (f" (repeat {rep + 1})" if args.repeats > 1 else ""))
            # Earlier runs' tokens and timelines stay until the report: out of the collector's walk, so that a
            # full collection during this run does not stall the engine for them (it did, 50-270 ms, at repeats).
            gc.collect()
            gc.freeze()
            runs.append(_timed_run(args, bs, tf, rep, label, prompts, floor))
        result = _assemble(args, bandwidth, floor, info, config, runs, skipped, order, tf)
    finally:
        if tf is not None:
            tf.close()
        bs.close()
    return result


def _engine_config(args, per_request: int) -> EngineConfig:
    """One engine for every batchscope run: room for every request at once, the first mode to start with."""
    block_size = EngineConfig.block_size
    default = default_max_batch_tokens(args.requests, args.prompt_tokens)
    max_batch_tokens = engine_budget(args.max_batch_tokens, default)       # None: the adaptive budget
    num_blocks = args.num_blocks or args.requests * (math.ceil(per_request / block_size) + 1)
    return engine_config_from(args, mode=args.modes[0], block_size=block_size, num_blocks=num_blocks,
                              max_batch_tokens=max_batch_tokens, max_running=args.requests)


def _warm_up(args, bs: BatchscopeRunner, tf: TransformersRunner | None, labels: list[str], prompts) -> None:
    warm = min(args.warmup_tokens, args.new_tokens)
    say(f"warming up ({warm} new tokens per request, not timed): {', '.join(labels)}")
    for label in labels:
        if label in MODES:
            bs.warm_up(label, prompts, warm)
        else:
            tf.run(label, prompts, warm)


def _timed_run(args, bs: BatchscopeRunner, tf: TransformersRunner | None, rep: int, label: str, prompts,
               floor: dict) -> dict:
    """One run's metrics; its timeline (if telemetry is on) is written next to --out."""
    name = label if args.repeats == 1 else f"{label}.r{rep + 1}"
    if label in MODES:
        m, timeline = bs.run(label, name, prompts, args.new_tokens)
    else:
        if bs.tel is not None:       # the sampler keeps sampling NVML while transformers runs
            bs.tel.start_recording(name)
        m = tf.run(label, prompts, args.new_tokens)
        timeline = None
        if bs.tel is not None:
            bs.tel.stop_recording()
            nv, timeline = nvml_window(bs.tel, name, m.pop("decode_window"))
            m.update(nv)
            if args.baseline_profile_steps:
                timeline = _profiled_timeline(args, bs, tf, label, name, prompts, m) or timeline
        else:
            m.pop("decode_window")
    m.update(label=label, repeat=rep, floor_ms_per_step=floor["ms_per_step"],
             roofline_ms_per_step=floor["roofline"]["ms_per_step"],
             roofline_held_ms_per_step=floor["roofline_held"]["ms_per_step"])
    if timeline is not None:
        m["timeline"] = str(write_json(timeline_path(args.out, name), timeline))
    return m


def _profiled_timeline(args, bs: BatchscopeRunner, tf: TransformersRunner, label: str, name: str, prompts,
                       m: dict) -> dict | None:
    """transformers' steps for the run's timeline: a profiled pass over the run's first steps
    (TransformersRunner.profiled_pass), with the NVML samples telemetry took meanwhile moved onto the trace's
    clock. Adds m["profiled"] (the pass: steps, ms/step, what the profiler cost, the trace) and the busy figure
    over its steps; None (the NVML-only timeline stays) where its steps could not be recorded."""
    from .steps import busy_figures

    steps = min(args.baseline_profile_steps, args.new_tokens)
    say(f"{name}: recording its steps: a profiled pass of {steps} new tokens per request")
    recording = f"{name}.profiled"
    bs.tel.start_recording(recording)
    try:
        timeline, facts = tf.profiled_pass(label, prompts, steps, str(_trace_path(args.out, name)))
    finally:
        bs.tel.stop_recording()
    m["profiled"] = facts
    if timeline is None:
        say(f"{name}: its steps are not recorded: {facts['error']}")
        return None
    _add_nvml(timeline, bs.tel.timeline(recording))
    busy = busy_figures(timeline["steps"])
    period = (timeline["summary"].get("step_ms") or {}).get("p50")
    plain = m.get("decode_ms_per_step")
    facts.update(steps=len(timeline["steps"]), ms_per_step_p50=period,
                 # the profiled pass's median step period against the unprofiled run's median decode period
                 profiler_cost_pct=round(100.0 * (period / plain - 1), 1) if period and plain else None)
    m.update(gpu_busy_pct=busy["busy_pct"], busy_basis=busy["busy_basis"],
             busy_window="every step of the profiled pass (the trace does not say which step prefilled)")
    meta = timeline["meta"]
    meta.update(model=args.model, dtype=args.dtype)
    meta["source"]["window"] = {
        "pass": "profiled", "of_run": name, "new_tokens": steps, "requests": len(prompts),
        "note": "the same prompts as the timed run, run again under torch.profiler (with_stack, every thread) for "
                f"{steps} new tokens each: the timed run's first steps; the timed run itself is not profiled"}
    say(f"{name}: {len(timeline['steps'])} steps recorded, busy {busy['busy_pct']}% ({busy['busy_basis']}); "
         f"profiled steps {facts['profiler_cost_pct']}% slower than the run's")
    return timeline


def _add_nvml(timeline: dict, recorded: dict) -> None:
    """The NVML samples of a telemetry recording, onto an imported timeline's clock (both origins are wall-clock
    times), and the summary's NVML figures from them. Left empty where the trace's clock is unknown."""
    from batchscope.telemetry import summarize

    theirs, ours = timeline["meta"].get("origin", {}).get("unix_s"), recorded["meta"]["origin"].get("unix_s")
    if theirs is None or ours is None:
        return
    d = (ours - theirs) * 1e6
    moved = []
    for sample in recorded["nvml"]:
        sample = {**sample, "t_us": round(sample["t_us"] + d, 1)}
        if sample.get("fine"):
            sample["fine"] = [[round(t + d, 1), *rest] for t, *rest in sample["fine"]]
        moved.append(sample)
    timeline["nvml"] = moved
    s = summarize(timeline["steps"], [], moved, rank_steps=timeline.get("rank_steps") or ())
    timeline["summary"].update({k: s.get(k) for k in _NVML_SUMMARY if k in s})


_NVML_SUMMARY = ("gpu_util_mean", "mem_util_mean", "power_w_mean", "sm_clock_mhz_mean", "cpu_pct_mean",
                 "proc_cpu_pct_mean", "nvml_samples")


def _trace_path(out: str, name: str) -> Path:
    out = Path(out)
    return out.with_name(f"{out.stem}.{name}.pt.trace.json.gz")


def _assemble(args, bandwidth, floor, info, config, runs, skipped, order, tf) -> dict:
    """Per-run metrics plus medians per label, floor % and speedups, token agreement, and the set-up."""
    reference = runs[0]["token_ids"]     # the first timed run, for the agreement check
    for m in runs:
        same = sum(a == b for a, b in zip(m["token_ids"], reference))
        m["tokens_agree_with_first_run"] = same / len(reference) if reference else None
        m["tokens_digest"] = _digest(m["token_ids"])
    results = {}
    for label in dict.fromkeys(m["label"] for m in runs):
        mine = [m for m in runs if m["label"] == label]
        med = {k: _median(m.get(k) for m in mine) for k in METRICS if k != "speedup"}
        med.update(system=mine[0]["system"], mode=mine[0]["mode"], repeats=len(mine),
                   lengths_ok=all(m["lengths_ok"] for m in mine))
        if mine[0].get("ranks"):        # tensor parallel: every GPU's busy % and NVML mean, medians
            med["ranks"] = [{"rank": r["rank"], "gpu": r.get("gpu"),
                             **{k: _median(m["ranks"][i].get(k) for m in mine if m.get("ranks"))
                                for k in ("busy_pct", "gpu_util_mean")}}
                            for i, r in enumerate(mine[0]["ranks"])]
        results[label] = med
    for m in list(runs) + list(results.values()):
        ms, fl, roof = m.get("decode_ms_per_step"), m.get("floor_ms_per_step"), m.get("roofline_ms_per_step")
        # % of floor: the share of the bandwidth limit reached (100 = a step as fast as streaming its bytes once)
        m["floor_pct"] = round(100.0 * fl / ms, 2) if ms and fl else None
        m["x_roofline"] = round(ms / roof, 3) if ms and roof else None
        held = m.get("roofline_held_ms_per_step")
        m["x_roofline_held"] = round(ms / held, 3) if ms and held else None
    slowest = max(results, key=lambda k: results[k]["wall_s"])
    for label, med in results.items():
        med["speedup"] = results[slowest]["wall_s"] / med["wall_s"] if med["wall_s"] else None
    for m in runs:
        m["speedup"] = results[slowest]["wall_s"] / m["wall_s"] if m["wall_s"] else None
        m.pop("token_ids")
    return {
        "schema": BENCH_SCHEMA, **report_head(args, info, config, tf),
        "workload": {"requests": args.requests, "prompt_tokens": args.prompt_tokens,
                     "new_tokens": args.new_tokens, "seed": args.seed, "ignore_eos": True, "greedy": True,
                     "warmup_tokens": min(args.warmup_tokens, args.new_tokens)},
        "bandwidth": bandwidth, "floor": floor,
        "telemetry": not args.no_telemetry,
        "order": [label if args.repeats == 1 else f"{label}.r{rep + 1}" for rep, label in order],
        "speedup_vs": slowest,
        "results": results, "runs": runs, "skipped": skipped,
        "notes": {
            "wall_s": "first request's arrival to last request's finish, inside each engine",
            "floor_pct": "floor_ms_per_step / decode_ms_per_step x 100 (100 = at the memory-bandwidth limit)",
            "roofline_ms_per_step": "per op class the larger of bytes / copy bandwidth and FLOPs / GEMM peak, "
                                    "summed, plus the KV read and the all-reduces (floor.roofline has the parts)",
            "roofline_held_ms_per_step": "the same roofline at the GEMM rate the GPU holds after 1.5 s of GEMMs back "
                                         "to back (floor.gemm_peak.held_tflops): a GPU at its power limit clocks "
                                         "down under sustained load; none on CPU",
            "sm_clock_mhz": "NVML SM clock, and power_w the board's power draw, averaged over the decode window",
            "gpu_busy_pct": "union of the decode steps' compute spans (CUDA events; host launch spans on CPU) "
                            "over the decode window; for transformers, of every step of its profiled pass "
                            "(kernels from the trace; compute_batch ranges on CPU), none without it",
            "nvml_util_pct": "NVML utilization: the share of a 1/6-1 s window in which any kernel ran; it cannot "
                             "see sub-millisecond gaps between steps",
        },
    }


def main(args=None) -> int:
    """Entry point for `batchscope bench` (app/cli.py passes its Namespace) and for `python -m batchscope.app.bench`."""
    if args is None or isinstance(args, (list, tuple)):
        args = build_parser().parse_args(args)
    try:
        args = complete(args)
        result = run_benchmark(args)
    except (ValueError, MemoryError, argparse.ArgumentTypeError) as exc:    # ConfigError is a ValueError too
        say(f"error: {exc}")
        return 2
    write_json(Path(args.out), result)
    say(f"wrote {args.out}" + ("" if result["telemetry"] else " (no timelines: telemetry off)"))
    bad = [k for k, m in result["results"].items() if not m["lengths_ok"]]
    print((format_served_table if result["schema"] != BENCH_SCHEMA else format_table)(result), flush=True)
    if bad:
        say(f"outputs of {', '.join(bad)} did not have the requested lengths")
        return 1
    # served: arrival timing sets the batches, and in bf16 a request's tokens depend on what shares its batch,
    # so the modes need not agree there; the table says how far they do
    differ = disagreeing_runs(result) if result["schema"] == BENCH_SCHEMA else []
    if differ:
        say(f"runs {', '.join(differ)} gave other tokens than the first batchscope run (tokens_digest)")
        return 3
    return 0

