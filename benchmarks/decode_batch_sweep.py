"""The decode kernel's launch settings over batch sizes and contexts: every combination, each scored against
the HBM floor of the K/V it reads.

    python benchmarks/decode_batch_sweep.py [--requests 32,256] [--contexts 300,512,1024,4352]
        [--block-n 32,64,128] [--stages 2,3] [--warps 4,8] [--splits auto,1,2] [--label current]
        [--out decode_batch_sweep.json]

Llama-3-8B attention (32 query / 8 KV heads, head_dim 128, bf16, block 16), timed as CUDA-graph replays of
layers that read disjoint cache regions (attention_kernels.DecodeBench). `auto` is the engine's own split count
for that batch (attention_triton.decode_splits). Prints, per batch size, the engine's settings and the best
combination with their ratios to the floor.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from attention_kernels import DecodeBench, copy_bandwidth  # noqa: E402

from batchscope.engine.kernels import paged_attention as at  # noqa: E402


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=ints, default=[32, 256])
    p.add_argument("--contexts", type=ints, default=[300, 512, 1024, 4352])
    p.add_argument("--block-n", type=ints, default=[32, 64, 128])
    p.add_argument("--stages", type=ints, default=[2, 3])
    p.add_argument("--warps", type=ints, default=[4, 8])
    p.add_argument("--splits", default="auto,1,2")
    p.add_argument("--label", default="current", help="names this kernel version in the JSON")
    p.add_argument("--out", default=os.path.join(os.environ["OUT"], "decode_batch_sweep.json")
                   if os.environ.get("OUT") else None)
    args = p.parse_args()
    bw = copy_bandwidth()
    sms = at.sm_count(torch.device("cuda"))
    rows, summary = [], {}
    for batch in args.requests:
        auto = at.decode_splits(16384, 16, batch, 8, sms)
        engine_tile = dict(zip(("block_n", "num_stages", "num_warps"),
                               at.decode_tile(torch.bfloat16, 128, auto * batch * 8, sms)))
        splits = sorted({auto if s == "auto" else int(s) for s in args.splits.split(",")})
        benches = {c: DecodeBench([c] * batch, max_len=16384) for c in args.contexts}
        scored = []
        for block_n, stages, warps, n_splits in itertools.product(args.block_n, args.stages, args.warps, splits):
            kw = {"block_n": block_n, "num_stages": stages, "num_warps": warps, "num_splits": n_splits}
            try:
                per = {c: round(b.graph_ms(**kw) / (b.kv_bytes / bw * 1e3), 3) for c, b in benches.items()}
            except Exception as exc:   # out of shared memory or registers: skip the setting
                print("skipped", kw, type(exc).__name__, flush=True)
                continue
            row = {"requests": batch, **kw, "x_floor": per, "mean_x_floor": round(sum(per.values()) / len(per), 3)}
            scored.append(row)
            print(row, flush=True)
        rows += scored
        engine = next((r for r in scored if r["num_splits"] == auto
                       and all(r[k] == v for k, v in engine_tile.items())), None)
        best = min(scored, key=lambda r: r["mean_x_floor"])
        summary[batch] = {"engine": engine, "best": best}
        print(f"requests {batch}: engine {engine}\n  best {best}", flush=True)
        del benches
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "label": args.label, "copy_gbps": round(bw / 1e9, 1),
                       "contexts": args.contexts, "rows": rows, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
