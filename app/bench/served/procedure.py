"""`batchscope bench --workload served`: the order of work and the result.

    python -m batchscope.app.bench --workload served --model llama3-8b-random --device cuda --max-running 64 \
        --requests 240 --prompt-tokens 128:1024 --new-tokens 64:512 --arrival poisson --rate 12 --seed 11 \
        --out served.json

  1. times the copy bandwidth (telemetry's floor uses it), loads one Engine with `--max-running` slots, attaches
     telemetry, and plans the requests from the seed (workload.py): arrival offsets, prompts, output lengths;
  2. with `--baseline transformers`, loads the same weights for transformers' continuous batching;
  3. warms every system up on the plan's first `--max-running` prompts at once (`--warmup-tokens` each, untimed);
  4. runs every system once per repeat, the order reversed on every other repeat: batchscope's modes get the
     plan at its arrival times; transformers takes the same requests (prompts and lengths) all at once, since
     its batch API has no arrival times, so only its total time and throughput are reported;
  5. writes the JSON (`--out`) and each batchscope run's timeline next to it, and prints the table.
"""
from __future__ import annotations

import gc
import math

from batchscope.engine import EngineConfig
from batchscope.engine.config import MODES

from ..floor import measure_bandwidth
from ...engine_flags import engine_config_from
from ..output import TP_BASELINE_SKIPPED, baseline_labels, plan_order, report_head, say, timeline_path, write_json
from .workload import plan_requests, plan_summary, run_mode
from .client_figures import (client_figures, finish_run, latency_from_engine, medians, nvml_mean,
                             timeline_figures)
from ..systems import BatchscopeRunner, TransformersRunner, _progress, nvml_window

SERVED_SCHEMA = "batchscope.bench.served/1"
ALL_AT_ONCE = ("transformers' continuous batching takes the whole list of requests at once (its batch API has no "
               "arrival times): the same prompts and output lengths, submitted together, so only its total time "
               "and throughput are reported, no latencies at the planned arrivals")


def run_served(args) -> dict:
    """The whole served benchmark; `args` settled (options.settle_workload). Returns the result dict."""
    from batchscope.engine.model.loading import resolve_device

    device = resolve_device(args.device)
    show = not args.no_progress
    say(f"measuring copy bandwidth on {device}")
    bandwidth = measure_bandwidth(device, args.bandwidth_mib)
    config = served_engine_config(args)
    say(f"loading {args.model} on {device}")
    bs = BatchscopeRunner(config, not args.no_telemetry, bandwidth["gbps"], show)
    tf = None
    try:
        info = bs.engine.info
        longest = args.prompt_tokens[1] + args.new_tokens[1]
        if longest > info["max_model_len"]:
            raise ValueError(f"the longest prompt plus the most new tokens ({longest}) exceed the model's "
                             f"{info['max_model_len']}")
        plan = plan_requests(args, info["vocab_size"])
        say(f"planned {len(plan)} requests over {plan[-1].offset_s:.1f} s ({args.arrival}, {args.rate:g}/s)")
        labels, skipped = list(args.modes), {}
        if args.baseline == "transformers" and config.tensor_parallel_size > 1:
            skipped["transformers"] = TP_BASELINE_SKIPPED
        elif args.baseline == "transformers":
            say("loading the same weights for transformers' continuous batching (sdpa)")
            tf = TransformersRunner(config, info["max_batch_tokens"], longest, len(plan), show, bs.engine.model)
            labels += baseline_labels(tf, skipped)
            say(f"note: {ALL_AT_ONCE}")
        _warm_up(args, bs, tf, labels, plan)
        order = plan_order(labels, args.repeats)
        runs = []
        for i, (rep, label) in enumerate(order):
            say(f"run {i + 1}/{len(order)}: {label}" + (f" (repeat {rep + 1})" if args.repeats > 1 else ""))
            gc.collect()
            gc.freeze()     # earlier runs' records stay out of the collector's walk (command.py says why)
            runs.append(_timed(args, bs, tf, rep, label, plan))
        return _assemble(args, bandwidth, info, config, plan, runs, skipped, order, tf)
    finally:
        if tf is not None:
            tf.close()
        bs.close()


def served_engine_config(args) -> EngineConfig:
    """`--max-running` slots; the per-step token budget `batchscope serve` uses (adaptive) unless told; KV
    blocks for that many of the longest requests at once (no preemption), unless --num-blocks."""
    block = EngineConfig.block_size
    longest = args.prompt_tokens[1] + args.new_tokens[1]
    running = min(args.max_running, args.requests)
    num_blocks = args.num_blocks or running * (math.ceil(longest / block) + 1)
    return engine_config_from(args, mode=args.modes[0], block_size=block, num_blocks=num_blocks)


def _warm_up(args, bs, tf, labels, plan) -> None:
    """The plan's first --max-running prompts at once, a few tokens each, in every system: prefill chunks and
    decode batches of the run's sizes, untimed."""
    first = plan[:args.max_running]
    warm = min(args.warmup_tokens, min(p.max_new_tokens for p in first))
    say(f"warming up ({len(first)} requests x {warm} new tokens, not timed): {', '.join(labels)}")
    prompts = [p.prompt for p in first]
    for label in labels:
        if label in MODES:
            bs.warm_up(label, prompts, warm)
        else:
            tf.run(label, prompts, warm)


def _timed(args, bs, tf, rep: int, label: str, plan) -> dict:
    name = label if args.repeats == 1 else f"{label}.r{rep + 1}"
    if label in MODES:
        sent, start_ns, end_ns, timeline = run_mode(bs, label, name, plan, _progress, not args.no_stream)
        m = {"system": "batchscope", "mode": label, "arrivals": "planned", **client_figures(sent, start_ns, end_ns)}
        if timeline is not None:
            m.update(timeline_figures(timeline), **nvml_mean(timeline))
        if args.no_stream:
            latency_from_engine(m)
    else:
        if bs.tel is not None:       # the sampler keeps sampling NVML while transformers runs
            bs.tel.start_recording(name)
        t = tf.run_each(label, [p.prompt for p in plan], [p.max_new_tokens for p in plan])
        timeline = None
        if bs.tel is not None:
            bs.tel.stop_recording()
            nv, timeline = nvml_window(bs.tel, name, t["decode_window"])
        m = _transformers_figures(t, len(plan))
        if timeline is not None:
            m.update(nv)
    m.update(label=label, repeat=rep)
    if timeline is not None:
        m["timeline"] = str(write_json(timeline_path(args.out, name), timeline))
    return m


def _transformers_figures(t: dict, requests: int) -> dict:
    wall = t["wall_s"]
    return {"system": "transformers", "mode": t["mode"], "arrivals": "all at once",
            "wall_s": wall, "call_s": t["call_s"], "completed": requests if t["lengths_ok"] else None,
            "output_tokens": t["output_tokens"], "expected_tokens": t["expected_tokens"],
            "output_tokens_per_s": round(t["tokens_per_s"], 2) if t["tokens_per_s"] else None,
            "requests_per_s": round(requests / wall, 3) if wall else None,
            "lengths_ok": t["lengths_ok"], "errors": t["errors"][:5],
            "decode_ms_per_step": t["decode_ms_per_step"], "decode_ms_basis": t["decode_ms_basis"],
            "token_ids": t["token_ids"]}


def _assemble(args, bandwidth, info, config, plan, runs, skipped, order, tf) -> dict:
    reference = runs[0]["token_ids"]
    for m in runs:
        finish_run(m, reference)
    results = {}
    for label in dict.fromkeys(m["label"] for m in runs):
        mine = [m for m in runs if m["label"] == label]
        results[label] = {**medians(mine), "repeats": len(mine), "lengths_ok": all(m["lengths_ok"] for m in mine)}
    return {
        "schema": SERVED_SCHEMA, **report_head(args, info, config, tf),
        "workload": {"kind": "served", "requests": args.requests, "rate": args.rate, "arrival": args.arrival,
                     "burstiness": args.burstiness, "prompt_tokens": list(args.prompt_tokens),
                     "new_tokens": list(args.new_tokens), "seed": args.seed, "max_running": args.max_running,
                     "ignore_eos": True, "greedy": True, "streamed": not args.no_stream,
                     "warmup_requests": min(args.max_running, len(plan)),
                     "warmup_tokens": args.warmup_tokens, "plan": plan_summary(plan),
                     "baseline_arrivals": ALL_AT_ONCE if tf else None},
        "plan": [{"index": p.index, "offset_s": round(p.offset_s, 6), "prompt_tokens": len(p.prompt),
                  "new_tokens": p.max_new_tokens} for p in plan],
        "bandwidth": bandwidth, "telemetry": not args.no_telemetry,
        "order": [label if args.repeats == 1 else f"{label}.r{rep + 1}" for rep, label in order],
        "results": results, "runs": runs, "skipped": skipped, "notes": NOTES,
    }


NOTES = {
    "latency_ms": "client side (latency_basis), from each request's streamed chunks on the bench's reader thread "
                  "(app/loadtest/client_timing.py): TTFT = first chunk - submit, "
                  "TPOT = (last chunk - first) / (tokens - 1), ITL = every gap between tokens (a chunk of k after a "
                  "gap g counts k gaps of g/k), E2E = finish - submit. With --no-stream the engine's own times "
                  "(engine_latency_ms), same definitions",
    "wall_s": "plan time zero (the sender's start) to the last request's finish; output_tokens_per_s and "
              "requests_per_s are over it. transformers: first request created to last finished, all at once",
    "busy": "event-based: union of the steps' compute spans (CUDA events; host launch spans on CPU) from the first "
            "compute start to the last compute end. busy_pct counts every gap as idle; busy_pct_excl_empty_queue "
            "leaves the empty-queue gaps (no request existed) out of the window. idle_ms_by_cause sums "
            "telemetry's per-gap causes over every step but the first",
    "steps.by_kind": "decode = steps with no prefill token, prefill = steps carrying a prefill chunk; ms_per_step "
                     "is a step's compute start to the next one's (empty-queue gaps left out); the idle before a "
                     "step belongs to it",
    "sender_lag_ms": "how late the sender submitted against the plan (it sleeps to each due time)",
    "itl_p99_over_p50": "the ITL tail against its median (issue: within 2x)",
}
