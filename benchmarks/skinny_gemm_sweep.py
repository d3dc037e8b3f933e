"""Decode GEMMs with few rows: engine.skinny_gemm's launch settings against cuBLAS (F.linear), per weight shape.

    python benchmarks/skinny_gemm_sweep.py [--rows 8,32,64] [--budget-s 420] [--out skinny_gemm_sweep.json]

Llama-3-8B's decode GEMMs (merged q/k/v, o, merged gate/up, down, lm_head; bf16), each timed as a CUDA-graph
replay of a chain of distinct weights (32 layers; 4 for lm_head), so every GEMM reads its weight from HBM as in a
real step, and each kernel's tail counts as it does between dependent kernels. Reports microseconds per GEMM and
the weight-read rate against the copy bandwidth, and checks each setting's output against F.linear.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from attention_kernels import copy_bandwidth  # noqa: E402

from batchscope.engine.kernels.skinny_gemm import SkinnyGemm  # noqa: E402

SHAPES = {"qkv": (6144, 4096, 32), "o": (4096, 4096, 32), "gate_up": (28672, 4096, 32),
          "down": (4096, 14336, 32), "lm_head": (128256, 4096, 4)}
TILES = [(16, 256), (32, 128), (32, 256), (64, 128), (64, 256)]     # (BLOCK_N, BLOCK_K)


def graph_us(fn, reps: int = 20) -> float:
    """Median microseconds of one replay of `fn` captured in a CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    times.sort()
    return times[len(times) // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="8,32,64")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--tiles", default=",".join(f"{n}x{k}" for n, k in TILES), help="BLOCK_NxBLOCK_K list")
    p.add_argument("--stages", default="3,5")
    p.add_argument("--warps", default="4")
    p.add_argument("--splits", default="1,2,4")
    p.add_argument("--budget-s", type=float, default=420)
    p.add_argument("--out", default=os.path.join(os.environ["OUT"], "skinny_gemm_sweep.json")
                   if os.environ.get("OUT") else None)
    args = p.parse_args()
    t0 = time.time()
    bw = copy_bandwidth()
    rows_out, summary = [], {}
    for name in args.shapes.split(","):
        n, k, layers = SHAPES[name]
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(layers)]
        floor_us = n * k * 2 / bw * 1e6
        for m in [int(r) for r in args.rows.split(",")]:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = [F.linear(x, w) for w in ws[:1]][0]
            cublas = graph_us(lambda: [F.linear(x, w) for w in ws]) / layers
            best = None
            block_m = max(16, 1 << (m - 1).bit_length())
            tiles = [tuple(int(v) for v in t.split("x")) for t in args.tiles.split(",")]
            for (bn, bk), stages, warps, split in itertools.product(
                    tiles, *([int(v) for v in getattr(args, a).split(",")] for a in ("stages", "warps", "splits"))):
                if time.time() - t0 > args.budget_s:
                    break
                if k % (split * bk) or n % bn or (split > 1 and n // bn >= 264):
                    continue
                try:
                    gs = [SkinnyGemm(w, split, stages, block_m, bn, bk, warps) for w in ws]
                    err = (gs[0](x).float() - ref.float()).abs().max().item()
                    us = graph_us(lambda: [g(x) for g in gs]) / layers
                except Exception as exc:        # out of shared memory: skip the setting
                    print("skipped", name, m, bn, bk, stages, split, type(exc).__name__, str(exc)[:120], flush=True)
                    continue
                row = {"shape": name, "rows": m, "block_n": bn, "block_k": bk, "stages": stages, "warps": warps,
                       "split_k": split,
                       "us": round(us, 2), "x_floor": round(us / floor_us, 3), "cublas_us": round(cublas, 2),
                       "max_abs_err": err}
                rows_out.append(row)
                if best is None or us < best["us"]:
                    best = row
                gs = None          # frees the GPU memory before the next setting
            summary[f"{name}/{m}"] = {"floor_us": round(floor_us, 2), "cublas_us": round(cublas, 2),
                                      "cublas_x_floor": round(cublas / floor_us, 3), "best": best}
            print(name, m, summary[f"{name}/{m}"], flush=True)
        ws = None
        torch.cuda.empty_cache()
    # greedy sampling reads the logits: argmax on the bf16 logits against argmax after a float copy
    logits = torch.randn(256, 128256, device="cuda", dtype=torch.bfloat16)
    argmax = {"bf16_us": graph_us(lambda: logits.argmax(-1)),
              "float_us": graph_us(lambda: logits.float().argmax(-1)),
              "same": bool((logits.argmax(-1) == logits.float().argmax(-1)).all())}
    print("argmax at 256 rows", argmax, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "copy_gbps": round(bw / 1e9, 1), "summary": summary,
                       "argmax_256": argmax, "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
