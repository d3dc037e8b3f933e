"""Where a decode step's GPU time goes: torch.profiler over steady decode steps, kernels grouped by kind.

    python benchmarks/decode_profile.py [--model llama3-8b-random] [--requests 32] [--prompt-tokens 256]
        [--mode async] [--steps 30] [--merge-projections 0|1] [--top 25] [--out profile.json]

The engine decodes `--requests` requests at once; once every request is decoding, the profiler records about
`--steps` steps. Kernels are grouped by name into GEMM, attention, norm, rotary, activation, elementwise and
other; per group: time per step and kernel count per step. Also: the step period (first to last kernel over the
window / steps) and the sum of kernel times, whose difference is the time the GPU spent between kernels.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import defaultdict

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from batchscope.engine import Engine, EngineConfig, SamplingParams  # noqa: E402

GROUPS = (   # first match wins; names of cuBLAS/cutlass GEMMs, Triton kernels of engine/, torch's own kernels
    ("gemm", ("gemm", "gemv", "cutlass", "sm90_xmma", "nvjet", "splitkreduce", "splitk")),
    ("attention", ("_decode_", "_prefill_", "attn", "_merge")),
    ("norm", ("rms_norm",)),
    ("rotary", ("rotary",)),
    ("activation", ("silu",)),
    ("sampling", ("argmax", "gumbel", "sample", "topk", "sort", "softmax")),
    ("kv_write", ("index_copy", "indexcopy", "scatter", "write_kv")),
    ("elementwise", ("elementwise", "vectorized", "unrolled")),
)


def group_of(name: str) -> str:
    low = name.lower()
    for group, keys in GROUPS:
        if any(k in low for k in keys):
            return group
    return "other"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama3-8b-random")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--mode", default="async")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--merge-projections", type=int, default=1)
    p.add_argument("--top", type=int, default=25, help="how many kernels, by time, to list by name")
    p.add_argument("--out", default=os.path.join(os.environ["OUT"], "profile.json")
                   if os.environ.get("OUT") else None)
    args = p.parse_args()
    engine = Engine(EngineConfig(model=args.model, device="cuda", mode=args.mode, max_running=args.requests,
                                 max_batch_tokens=8192, merge_projections=bool(args.merge_projections)))
    prompts = [[(7 * i + 13 * j) % 1000 + 10 for j in range(args.prompt_tokens)] for i in range(args.requests)]
    params = SamplingParams(max_new_tokens=args.steps + 64, temperature=0, ignore_eos=True)
    engine.generate(prompts[:2], SamplingParams(max_new_tokens=4, ignore_eos=True))   # warm-up
    worker = threading.Thread(target=engine.generate, args=(prompts, params))
    worker.start()
    start = engine.stats()["steps"]
    while engine.stats()["steps"] < start + 8:      # prefill done, decoding in steady state
        time.sleep(0.005)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        s0 = engine.stats()["steps"]
        while engine.stats()["steps"] < s0 + args.steps:
            time.sleep(0.001)
        s1 = engine.stats()["steps"]
    worker.join()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    steps = s1 - s0
    by_group: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for k in kernels:
        us = k.device_time if hasattr(k, "device_time") else k.cuda_time
        by_group[group_of(k.name)][0] += us
        by_group[group_of(k.name)][1] += 1
        by_name[k.name][0] += us
        by_name[k.name][1] += 1
    span_us = (max(k.time_range.end for k in kernels) - min(k.time_range.start for k in kernels))
    busy_us = sum(v[0] for v in by_group.values())
    result = {
        "model": args.model, "requests": args.requests, "mode": args.mode, "steps": steps,
        "merge_projections": bool(args.merge_projections), "engine_info": engine.info,
        "period_ms": round(span_us / steps / 1e3, 3), "kernel_ms_per_step": round(busy_us / steps / 1e3, 3),
        "kernels_per_step": round(len(kernels) / steps, 1),
        "groups": {g: {"ms_per_step": round(v[0] / steps / 1e3, 3), "kernels_per_step": round(v[1] / steps, 1)}
                   for g, v in sorted(by_group.items(), key=lambda kv: -kv[1][0])},
        "top_kernels": [{"name": n[:160], "us_per_step": round(v[0] / steps, 1),
                         "calls_per_step": round(v[1] / steps, 1)}
                        for n, v in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:args.top]],
    }
    engine.close()
    print(json.dumps({k: v for k, v in result.items() if k != "engine_info"}, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
