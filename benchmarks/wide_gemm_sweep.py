"""Decode GEMMs with many rows (64-256): cuBLAS's choices against a Triton stream-K GEMM, per weight shape.

    python benchmarks/wide_gemm_sweep.py [--rows 128,256] [--shapes qkv,o,gate_up,down,lm_head]
        [--budget-s 400] [--out wide_gemm_sweep.json]

At 256 rows Llama-3-8B's decode GEMMs are compute-bound, and cuBLAS runs the merged gate/up at about 560 TFLOP/s
against a measured 760-790 peak: its 256 x 128 tiles make 224 tiles, 1.7 waves on 132 SMs. A stream-K GEMM gives
each of P persistent programs an equal run of (tile, K-block) iterations; tiles split between programs are summed
by the last one to finish, in program order (so results repeat). Timed like benchmarks/skinny_gemm_sweep.py: a
CUDA-graph replay of a chain of distinct weights (32 layers; 4 for the lm_head). Variants per shape: F.linear
(cuBLAS), F.linear with cuBLASLt preferred, gate and up as two GEMMs, and the Triton kernel over tiles, stages and
program counts (P = the tile count is the plain data-parallel GEMM).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from skinny_gemm_sweep import SHAPES, graph_us  # noqa: E402


@triton.jit
def _streamk_kernel(x, w, out, partial, counters, M, N, K, stride_xm, stride_om,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PROGRAMS: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BM)
    ipt = K // BK
    total = tiles_m * (N // BN) * ipt
    start = pid * total // PROGRAMS
    end = (pid + 1) * total // PROGRAMS
    it = start
    while it < end:
        tile = it // ipt
        k0 = it % ipt
        k1 = tl.minimum(ipt, k0 + end - it)
        tm = tile % tiles_m
        tn = tile // tiles_m
        rm = tm * BM + tl.arange(0, BM)
        rn = tn * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        x_ptrs = x + rm[:, None] * stride_xm + (k0 * BK + rk)[None, :]
        w_ptrs = w + rn.to(tl.int64)[None, :] * K + (k0 * BK + rk)[:, None]
        row_ok = rm[:, None] < M
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for _ in range(k0, k1):
            a = tl.load(x_ptrs, mask=row_ok, other=0.0)
            b = tl.load(w_ptrs)
            acc = tl.dot(a, b, acc)
            x_ptrs += BK
            w_ptrs += BK
        out_ptrs = out + rm[:, None] * stride_om + rn[None, :]
        if (k0 == 0) & (k1 == ipt):
            tl.store(out_ptrs, acc.to(out.dtype.element_ty), mask=row_ok)
        else:
            # Programs first_p..last_p share this tile; each left its part in slot 2p (its first segment) or 2p + 1.
            first_p = ((tile * ipt + 1) * PROGRAMS - 1) // total
            last_p = ((tile + 1) * ipt * PROGRAMS - 1) // total
            cell = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
            slot = 2 * pid + tl.where(it == start, 0, 1)
            tl.store(partial + slot.to(tl.int64) * (BM * BN) + cell, acc)
            tl.debug_barrier()
            done = tl.atomic_add(counters + tile, 1, sem="acq_rel")
            if done == last_p - first_p:
                sum_ = tl.zeros([BM, BN], dtype=tl.float32)
                for q in range(first_p, last_p + 1):
                    q_slot = 2 * q + tl.where((q * total // PROGRAMS) // ipt == tile, 0, 1)
                    sum_ += tl.load(partial + q_slot.to(tl.int64) * (BM * BN) + cell, cache_modifier=".cg")
                tl.store(out_ptrs, sum_.to(out.dtype.element_ty), mask=row_ok)
                tl.store(counters + tile, 0)
        it += k1 - k0


class StreamK:
    def __init__(self, weight, bm, bn, bk, warps, stages, programs, scratch=None):
        """`scratch`: (partials, tile counters) shared by GEMMs that run one after another."""
        self.weight, self.bm, self.bn, self.bk, self.warps, self.stages = weight, bm, bn, bk, warps, stages
        self.programs = programs
        self.partial, self.counters = scratch or (
            torch.empty(2 * max(programs, 1) * bm * bn, dtype=torch.float32, device=weight.device),
            torch.zeros(1 << 14, dtype=torch.int32, device=weight.device))

    def __call__(self, x, out):
        m, k = x.shape
        n = self.weight.shape[0]
        total = triton.cdiv(m, self.bm) * (n // self.bn) * (k // self.bk)
        programs = min(self.programs, total)
        _streamk_kernel[(programs,)](x, self.weight, out, self.partial, self.counters, m, n, k, x.stride(0),
                                     out.stride(0), BM=self.bm, BN=self.bn, BK=self.bk, PROGRAMS=programs,
                                     num_warps=self.warps, num_stages=self.stages)
        return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="256,128")
    p.add_argument("--shapes", default="gate_up,down,qkv,o,lm_head")
    p.add_argument("--budget-s", type=float, default=400)
    p.add_argument("--out", default="wide_gemm_sweep.json")
    args = p.parse_args()
    t_start = time.time()
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    tiles = [(256, 128, 64, 8, 3), (128, 256, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4),
             (256, 128, 64, 8, 4)]
    results = []
    for name in args.shapes.split(","):
        n, k, layers = SHAPES[name]
        gen = torch.Generator(device=dev).manual_seed(0)
        weights = [torch.randn(n, k, generator=gen, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(layers)]
        for rows in (int(r) for r in args.rows.split(",")):
            if time.time() - t_start > args.budget_s:
                break
            x = torch.randn(rows, k, generator=gen, device=dev, dtype=torch.bfloat16)
            ref = F.linear(x.float(), weights[0].float())
            outs = [torch.empty(rows, n, device=dev, dtype=torch.bfloat16) for _ in weights]
            flops = 2 * rows * n * k

            def record(variant, us, err=None):
                r = {"shape": name, "rows": rows, "variant": variant, "us": round(us, 2),
                     "tflops": round(flops / us / 1e6, 1), "rel_err": err}
                results.append(r)
                print(json.dumps(r), flush=True)

            record("cublas", graph_us(lambda: [torch.matmul(x, w.t(), out=o) for w, o in zip(weights, outs)])
                   / layers)
            torch.backends.cuda.preferred_blas_library("cublaslt")
            try:
                record("cublaslt", graph_us(lambda: [torch.matmul(x, w.t(), out=o) for w, o in zip(weights, outs)])
                       / layers)
            finally:
                torch.backends.cuda.preferred_blas_library("cublas")
            if name == "gate_up":
                halves = [(w[: n // 2], w[n // 2:]) for w in weights]
                record("cublas_two", graph_us(lambda: [(torch.matmul(x, g.t(), out=o[:, : n // 2]),
                                                        torch.matmul(x, u.t(), out=o[:, n // 2:]))
                                                       for (g, u), o in zip(halves, outs)]) / layers)
            for bm, bn, bk, warps, stages in tiles:
                n_tiles = triton.cdiv(rows, bm) * (n // bn)
                for programs in sorted({n_tiles, sms, 2 * sms}):
                    if time.time() - t_start > args.budget_s:
                        break
                    if programs > n_tiles * (k // bk):
                        continue
                    first = StreamK(weights[0], bm, bn, bk, warps, stages, programs)
                    gemms = [first] + [StreamK(w, bm, bn, bk, warps, stages, programs, (first.partial, first.counters))
                                       for w in weights[1:]]
                    variant = f"triton_{bm}x{bn}x{bk}_w{warps}_s{stages}_p{programs}"
                    try:
                        got = gemms[0](x, outs[0]).float()
                        got2 = gemms[0](x, outs[0]).float()
                        err = ((got - ref).abs().max() / ref.abs().max()).item()
                        if not torch.equal(got, got2):
                            err = float("nan")
                        us = graph_us(lambda: [g(x, o) for g, o in zip(gemms, outs)]) / layers
                    except Exception as e:  # noqa: BLE001 - a config that does not compile is reported, not fatal
                        print(variant, "failed:", str(e)[:200], flush=True)
                        continue
                    record(variant, us, round(err, 5))
                    gemms = None
        weights = None
        torch.cuda.empty_cache()
    best = {}
    for r in results:
        key = (r["shape"], r["rows"])
        if r["variant"] == "cublas":
            best.setdefault(key, {})["cublas"] = r["us"]
        elif r["variant"].startswith("triton") and (r["rel_err"] or 1) < 1e-2:
            b = best.setdefault(key, {})
            if r["us"] < b.get("triton_us", 1e9):
                b["triton_us"], b["triton"] = r["us"], r["variant"]
    summary = [{"shape": s, "rows": m, **v} for (s, m), v in best.items()]
    for s in summary:
        print("best", json.dumps(s))
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "triton": triton.__version__,
                   "sms": sms, "results": results, "best": summary}, f, indent=1)


if __name__ == "__main__":
    main()
