"""Times moe_triton's fused expert GEMMs against transformers' grouped_mm and batched_mm experts at
Qwen3-30B-A3B decode shapes (32 tokens, top-8 of 128 experts, hidden 2048, expert width 768, bf16), inside CUDA
graphs, with the bytes floor of the experts the routing touches.

    python3 benchmarks/moe_kernel.py --out moe_kernel.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics

import torch

from batchscope.engine.kernels import moe as moe_triton


class Experts(torch.nn.Module):
    def __init__(self, e, h, i, dtype):
        super().__init__()
        self.gate_up_proj = torch.nn.Parameter(torch.randn(e, 2 * i, h, device="cuda", dtype=dtype) * 0.02)
        self.down_proj = torch.nn.Parameter(torch.randn(e, h, i, device="cuda", dtype=dtype) * 0.02)
        self.act_fn = torch.nn.SiLU()
        self.num_experts = e
        self.has_gate, self.is_concatenated, self.is_transposed = True, True, False
        self.has_bias, self.has_post_expert_norm, self._is_expert_parallel = False, False, False

    def _apply_gate(self, gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up


def graph_ms(fn, reps: int = 50) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for _ in range(10):
                fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 10)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--block-n", default="32,64,128")
    p.add_argument("--block-k", default="128")
    p.add_argument("--warps", default="4,8")
    p.add_argument("--stages", default="3")
    p.add_argument("--out", default="moe_kernel.json")
    args = p.parse_args()
    from transformers.integrations.moe import batched_mm_experts_forward, grouped_mm_experts_forward

    E, H, I, K, T = 128, 2048, 768, 8, args.tokens  # noqa: E741  (experts, hidden, intermediate: the MoE papers' letters)
    dtype = torch.bfloat16
    layers = [Experts(E, H, I, dtype) for _ in range(4)]      # several layers: weights not cached in L2
    x = torch.randn(T, H, device="cuda", dtype=dtype)
    scores = torch.rand(T, E, device="cuda")
    w, idx = scores.topk(K, dim=-1)
    w = (w / w.sum(-1, keepdim=True)).to(dtype)
    touched = idx.unique().numel()
    per_expert = (2 * I * H + H * I) * 2
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    bw = 2 * src.numel() / (graph_ms(lambda: dst.copy_(src), 10) / 1e3) / 1e9
    floor_ms = touched * per_expert / bw / 1e9 * 1e3
    ref = grouped_mm_experts_forward(layers[0], x, idx, w)
    out = {"tokens": T, "experts_touched": touched, "bandwidth_gbps": bw, "floor_ms_per_layer": floor_ms,
           "variants": {}}
    for name, fn in (("grouped_mm", grouped_mm_experts_forward), ("batched_mm", batched_mm_experts_forward)):
        out["variants"][name] = graph_ms(lambda: [fn(m, x, idx, w) for m in layers]) / len(layers)
    ints = lambda text: [int(v) for v in text.split(",")]  # noqa: E731
    for bn, bk, nw, ns in itertools.product(ints(args.block_n), ints(args.block_k), ints(args.warps),
                                            ints(args.stages)):
        tile = {"block_n": bn, "block_k": bk, "num_warps": nw, "num_stages": ns}
        moe_triton.TILE.update(tile)
        try:
            got = moe_triton.fused_experts_forward(layers[0], x, idx, w)
            err = (got.float() - ref.float()).abs().max().item()
            ms = graph_ms(lambda: [moe_triton.fused_experts_forward(m, x, idx, w) for m in layers]) / len(layers)
            out["variants"][f"fused n{bn} k{bk} w{nw} s{ns}"] = ms
            out.setdefault("max_abs_err", {})[f"n{bn} k{bk} w{nw} s{ns}"] = err
        except Exception as exc:
            out["variants"][f"fused n{bn} k{bk} w{nw} s{ns}"] = f"{type(exc).__name__}: {exc}"[:200]
    fused = {k: v for k, v in out["variants"].items() if k.startswith("fused") and isinstance(v, float)}
    if fused:
        best = min(fused, key=fused.get)
        bn, bk, nw, ns = (int(part[1:]) for part in best.split()[1:])
        out["best_tile"] = {"block_n": bn, "block_k": bk, "num_warps": nw, "num_stages": ns}
    for k, v in sorted(out["variants"].items(), key=lambda kv: kv[1] if isinstance(kv[1], float) else 1e9):
        print(f"{k:28s} {v if isinstance(v, str) else f'{v * 1e3:8.1f} us/layer  {floor_ms / v * 100:5.1f}% of floor'}")
    print(f"floor {floor_ms * 1e3:.1f} us/layer ({touched} experts touched, {bw:.0f} GB/s)")
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
