"""Tune the Triton decode kernel's launch settings at the engine's shape, over short and long contexts.

    python benchmarks/decode_tuning.py [--out decode_tuning.json]

Llama-3-8B attention (32 query / 8 KV heads, head_dim 128, bf16, block 16), 32 requests, a block table as wide as
a 16384-token context (as the engine builds it), timed as CUDA-graph replays of 16 layers that read disjoint cache
regions (see attention_kernels.DecodeBench). Stage 1 sweeps the tile (block_n, num_stages, num_warps) at the
current split settings; stage 2 sweeps the split settings (num_splits, min_split_keys) for the three best tiles.
Each setting is scored by its mean ratio to the HBM floor over all contexts; the best one is printed last.
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

CONTEXTS = [300, 512, 1024, 2048, 4352, 8448]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(os.environ["OUT"], "decode_tuning.json")
                   if os.environ.get("OUT") else None)
    args = p.parse_args()
    bw = copy_bandwidth()
    benches = {c: DecodeBench([c] * 32, max_len=16384) for c in CONTEXTS}
    default_splits = at.decode_splits(16384, 16, 32, 8, at.sm_count(torch.device("cuda")))
    rows = []

    def score(**kw) -> dict:
        per = {}
        for c, bench in benches.items():
            ms = bench.graph_ms(**kw)
            per[c] = round(ms / (bench.kv_bytes / bw * 1e3), 3)
        row = {**kw, "x_floor": per, "mean_x_floor": round(sum(per.values()) / len(per), 3)}
        rows.append(row)
        print(row, flush=True)
        return row

    base = {"num_splits": default_splits, "min_split_keys": at.MIN_KEYS_PER_SPLIT}
    tiles = []
    for block_n, stages, warps in itertools.product((32, 64, 128), (2, 3), (4, 8)):
        try:
            tiles.append(score(block_n=block_n, num_stages=stages, num_warps=warps, **base))
        except Exception as exc:   # out of shared memory or registers: skip the setting
            print("skipped", block_n, stages, warps, type(exc).__name__)
    tiles.sort(key=lambda r: r["mean_x_floor"])
    for tile in tiles[:3]:
        t = {k: tile[k] for k in ("block_n", "num_stages", "num_warps")}
        for splits, keys in itertools.product((4, default_splits, 16), (128, 256, 512, 1024)):
            score(num_splits=splits, min_split_keys=keys, **t)
    best = min(rows, key=lambda r: r["mean_x_floor"])
    print("default:", next((r for r in rows if r.get("block_n") == at._decode_block_n(torch.bfloat16, 128)
                            and r["num_stages"] == 2 and r["num_warps"] == 4 and r["num_splits"] == default_splits
                            and r["min_split_keys"] == at.MIN_KEYS_PER_SPLIT), None))
    print("best:", best)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "copy_gbps": round(bw / 1e9, 1),
                       "contexts": CONTEXTS, "default_splits": default_splits, "rows": rows, "best": best}, f,
                      indent=1)


if __name__ == "__main__":
    main()
