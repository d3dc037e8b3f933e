"""Time the GEMMs of a Llama-3-8B decode step at batch 32: separate vs merged projections, cuBLAS vs a Triton
weight-streaming kernel, each against the copy bandwidth.

    python benchmarks/gemm_shapes.py [--rows 32] [--out gemm.json]

A decode step's GEMMs multiply a few rows by each weight, so each is bound by reading its weight once. For every
shape: cuBLAS (torch.nn.functional.linear) and a Triton kernel that gives each program a slice of output
columns over the whole reduction (no split-K), tried over a grid of tile sizes; times are medians of
CUDA-graph replays (triton.testing.do_bench_cudagraph), as decode steps run. Correctness: the Triton result
against cuBLAS (bf16 relative error). JSON to --out (default $OUT/gemm.json when OUT is set).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph

# name -> (N, K) of a weight [N, K]; merged rows concatenate siblings
SHAPES = {
    "q": (4096, 4096), "k": (1024, 4096), "v": (1024, 4096), "qkv": (6144, 4096), "o": (4096, 4096),
    "gate": (14336, 4096), "up": (14336, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
    "lm_head": (128256, 4096),
}


@triton.jit
def _stream_gemm(x, w, y, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(x + rm[:, None] * K + (k0 + rk)[None, :], mask=rm[:, None] < M, other=0.0)
        b = tl.load(w + rn[:, None] * K + (k0 + rk)[None, :], mask=rn[:, None] < N, other=0.0)
        acc += tl.dot(a, tl.trans(b))
    ok = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(y + rm[:, None] * N + rn[None, :], acc.to(y.dtype.element_ty), mask=ok)


def stream_gemm(x, w, block_n, block_k, warps, stages):
    M, K = x.shape
    N = w.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    _stream_gemm[(triton.cdiv(N, block_n),)](x, w, y, M, N, K, BLOCK_M=max(16, triton.next_power_of_2(M)),
                                            BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages)
    return y


def copy_bandwidth() -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = do_bench_cudagraph(lambda: b.copy_(a))
    return 2 * a.numel() / ms / 1e6   # GB/s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--out", default=os.path.join(os.environ["OUT"], "gemm.json") if os.environ.get("OUT") else None)
    args = p.parse_args()
    torch.manual_seed(0)
    bw = copy_bandwidth()
    x = torch.randn(args.rows, 14336, device="cuda", dtype=torch.bfloat16)
    rows = {}
    grid = (list(itertools.product((16, 32, 64, 128), (128, 256), (4,), (3, 5)))
            + list(itertools.product((64, 128), (128, 256), (8,), (4,))))
    for name, (N, K) in SHAPES.items():
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02
        xk = x[:, :K].contiguous()
        ref = F.linear(xk, w)
        floor_us = N * K * 2 / bw / 1e3
        cublas_us = do_bench_cudagraph(lambda: F.linear(xk, w)) * 1e3
        best = None
        for bn, bk, warps, stages in grid:
            if bn * bk * 2 * stages > 200 * 1024 or K % bk:
                continue
            try:
                out = stream_gemm(xk, w, bn, bk, warps, stages)
                err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                us = do_bench_cudagraph(lambda: stream_gemm(xk, w, bn, bk, warps, stages), rep=30) * 1e3
            except Exception as exc:   # out of shared memory and the like: skip the config
                print(f"  {name} {bn}x{bk} w{warps} s{stages}: {type(exc).__name__}")
                continue
            if best is None or us < best["us"]:
                best = {"us": round(us, 2), "block_n": bn, "block_k": bk, "warps": warps, "stages": stages,
                        "rel_err": err}
        rows[name] = {"N": N, "K": K, "floor_us": round(floor_us, 2), "cublas_us": round(cublas_us, 2),
                      "cublas_pct_floor": round(100 * floor_us / cublas_us, 1), "triton": best,
                      "triton_pct_floor": round(100 * floor_us / best["us"], 1) if best else None}
        print(f"{name:8s} N={N:6d} K={K:5d} floor {floor_us:7.1f} us  cuBLAS {cublas_us:7.1f} us "
              f"({rows[name]['cublas_pct_floor']:5.1f}%)  triton {best and best['us']} us "
              f"({rows[name]['triton_pct_floor']}%) {best}", flush=True)
    step = {}
    for label, parts in (("separate", ["q", "k", "v", "o", "gate", "up", "down"]),
                         ("merged", ["qkv", "o", "gate_up", "down"])):
        def total(pick):
            return round((32 * sum(pick(rows[n]) for n in parts) + pick(rows["lm_head"])) / 1e3, 3)
        step[label] = {"cublas_ms": total(lambda r: r["cublas_us"]),
                       "best_ms": total(lambda r: min(r["cublas_us"], r["triton"]["us"]))}
    print("per decode step (32 layers + lm_head):", step)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "rows": args.rows, "copy_gbps": round(bw, 1), "shapes": rows, "step": step}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
