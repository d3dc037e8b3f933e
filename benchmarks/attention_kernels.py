"""Check and time batchscope's Triton paged-attention kernels on a CUDA GPU.

    python benchmarks/attention_kernels.py [--out results.json] [--quick]

1. Correctness: the Triton kernels against the torch reference (engine/attention.py) on fresh random inputs for
   many shapes (GQA 1/4/8, head_dim 64/128, block 16/32, sliding window, bf16/fp16/fp32), a CUDA-graph replay with
   changing lengths and tables, and a no-host-sync check. One PASS/FAIL line each.
2. Decode timing, B=32, H=32, KVH=8, D=128, block 16, bf16, contexts 512/2048/4352/8448 (+ a mixed-length batch):
   triton.testing.do_bench medians (eager, L2 flushed between runs) and CUDA-graph replay of several layers in a
   row (each with its own cache region so nothing is served from L2). Reported as GB/s of K/V read, % of the
   measured device copy bandwidth, and the ratio to the HBM floor (KV bytes / copy bandwidth). A split-count
   sweep and a small tile sweep show what the defaults leave on the table.
3. Prefill timing: 32 x 256-token prompts, and 32 x 256-token chunks on top of 1792 cached tokens.
4. JSON of everything to --out (default $OUT/attention.json when OUT is set). A short table prints last.
Exit status 1 if any check fails.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from batchscope.engine.kernels import paged_attention as at  # noqa: E402
from batchscope.engine.model.attention import AttentionMetadata, paged_attention_torch  # noqa: E402

TOL = {torch.float32: 1e-3, torch.bfloat16: 1e-2, torch.float16: 1e-2}
DEV = "cuda"


# ---------------------------------------------------------------------------------------------------- inputs
def make_meta(tables: torch.Tensor, seq_lens: list[int], query_lens: list[int], block_size: int,
              k_cache: torch.Tensor, v_cache: torch.Tensor) -> AttentionMetadata:
    qsl = [0]
    for n in query_lens:
        qsl.append(qsl[-1] + n)
    tables_host = tables.cpu()
    slots = [int(tables_host[b, p // block_size]) * block_size + p % block_size
             for b, (n, ctx) in enumerate(zip(query_lens, seq_lens)) for p in range(ctx - n, ctx)]
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEV),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=DEV),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEV),
        block_tables=tables.to(DEV, torch.int32),
        query_start_host=qsl, seq_lens_host=list(seq_lens), max_query_len=max(query_lens),
        max_seq_len=max(seq_lens), kv_caches=[(k_cache, v_cache)], backend="triton")


def random_case(seq_lens, query_lens, heads, kv_heads, head_dim, block_size, dtype, seed, table_width=None):
    """Random paged cache, shuffled non-contiguous tables (unused entries point at real blocks), q as the
    transpose of [1, H, T, D] that transformers hands over."""
    gen = torch.Generator().manual_seed(seed)
    n_blocks = [-(-s // block_size) for s in seq_lens]
    width = table_width or max(n_blocks) + 2
    num_blocks = sum(n_blocks) + 8
    order = torch.randperm(num_blocks, generator=gen)
    tables = torch.randint(0, num_blocks, (len(seq_lens), width), generator=gen, dtype=torch.int32)
    used = 0
    for b, n in enumerate(n_blocks):
        tables[b, :n] = order[used:used + n]
        used += n
    dgen = torch.Generator(device=DEV).manual_seed(seed)   # big tensors: drawn on the device, fast
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=dgen, device=DEV).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=dgen, device=DEV).to(dtype)
    total = sum(query_lens)
    q = torch.randn(1, heads, total, head_dim, generator=dgen, device=DEV).to(dtype)[0].transpose(0, 1)
    return q, k_cache, v_cache, make_meta(tables, seq_lens, query_lens, block_size, k_cache, v_cache)


def rel_err(out, ref) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def reference(q, k_cache, v_cache, meta, scale, window=None):
    return paged_attention_torch(q.float(), k_cache.float(), v_cache.float(), meta, scale, window)


# ---------------------------------------------------------------------------------------------------- checks
CHECKS = [  # (dtype, group, kv_heads, head_dim, block_size, window)
    (torch.bfloat16, 1, 8, 128, 16, None), (torch.bfloat16, 4, 8, 128, 16, None),
    (torch.bfloat16, 8, 4, 128, 16, None), (torch.bfloat16, 4, 8, 64, 16, None),
    (torch.bfloat16, 8, 2, 64, 32, None), (torch.bfloat16, 4, 8, 128, 32, None),
    (torch.bfloat16, 3, 3, 64, 16, None), (torch.bfloat16, 4, 8, 128, 16, 1000),
    (torch.bfloat16, 8, 2, 64, 16, 257), (torch.float16, 4, 8, 128, 16, None),
    (torch.float32, 1, 8, 128, 16, None), (torch.float32, 4, 8, 64, 32, None),
    (torch.float32, 8, 4, 128, 16, 300),
]
QUICK_CHECKS = CHECKS[1:2] + CHECKS[4:5] + CHECKS[7:8] + CHECKS[11:12]


# Decode tile variants timed at the shortest and longest context: (block_n, num_stages, num_warps).
# The default is (64, 3, 4).
TILE_SWEEP = [(32, 3, 4), (64, 2, 4), (64, 3, 4), (64, 4, 4), (64, 3, 2), (64, 3, 8), (128, 2, 4), (128, 3, 8)]


def run_checks(cases, results) -> bool:
    ok_all = True

    def report(name, err, tol):
        nonlocal ok_all
        ok = math.isfinite(err) and err < tol
        ok_all &= ok
        print(f"{'PASS' if ok else 'FAIL'}  {name:<62} rel_err={err:.2e} (tol {tol:.0e})", flush=True)
        results.append({"name": name, "rel_err": err, "tol": tol, "pass": ok})

    for i, (dtype, group, kvh, d, bs, window) in enumerate(cases):
        tag = f"{str(dtype).split('.')[-1]} G={group} KVH={kvh} D={d} bs={bs} win={window}"
        scale = d ** -0.5
        gen = torch.Generator().manual_seed(100 + i)
        lens = torch.randint(1, 4000, (13,), generator=gen).tolist() + [1, bs, 4 * bs + 1]
        q, kc, vc, meta = random_case(lens, [1] * len(lens), group * kvh, kvh, d, bs, dtype, seed=200 + i)
        ref = reference(q, kc, vc, meta, scale, window)
        report(f"decode  {tag}", rel_err(at.paged_attention_triton(q, kc, vc, meta, scale, window), ref),
               TOL[dtype])
        if i == 1:  # the fused single-split path and an odd split count, on the benchmark's shape
            for splits in (1, 7):
                out = at.paged_decode(q, kc, vc, meta, scale, window, num_splits=splits)
                report(f"decode  {tag} splits={splits}", rel_err(out, ref), TOL[dtype])
        # Whole prompts, chunks continuing cached context, decode rows mixed in, lengths off block boundaries.
        lens = [700, 1500, 33, 900, 2000, 17, 4100, 64]
        qlens = [700, 256, 1, 1, 513, 17, 1, 40]
        q, kc, vc, meta = random_case(lens, qlens, group * kvh, kvh, d, bs, dtype, seed=300 + i)
        out = at.paged_attention_triton(q, kc, vc, meta, scale, window)
        report(f"prefill {tag}", rel_err(out, reference(q, kc, vc, meta, scale, window)), TOL[dtype])
    return ok_all


def check_graph_and_sync(results) -> bool:
    """Capture decode once, then change lengths, tables and queries in place and replay; then run both paths
    with torch's sync debug mode set to error."""
    heads, kvh, d, bs, batch = 32, 8, 128, 16, 8
    q, kc, vc, meta = random_case([300] * batch, [1] * batch, heads, kvh, d, bs, torch.bfloat16, seed=400)
    at.paged_decode(q, kc, vc, meta, 0.1)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = at.paged_decode(q, kc, vc, meta, 0.1)
    gen = torch.Generator().manual_seed(401)
    ok_all = True
    for lens in ([1, 17, 300, 16, 250, 3, 120, 299], [64, 2, 5, 299, 31, 200, 90, 1]):
        meta.block_tables.copy_(torch.randint(0, kc.shape[0], tuple(meta.block_tables.shape), generator=gen,
                                              dtype=torch.int32))
        meta.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        q.copy_(torch.randn(q.shape, generator=gen).to(q.dtype))
        meta.seq_lens_host = lens
        graph.replay()
        torch.cuda.synchronize()
        err = rel_err(out, reference(q, kc, vc, meta, 0.1))
        ok = err < TOL[torch.bfloat16]
        ok_all &= ok
        print(f"{'PASS' if ok else 'FAIL'}  {'decode CUDA-graph replay, lens ' + str(lens):<62} rel_err={err:.2e}",
              flush=True)
        results.append({"name": f"graph replay {lens}", "rel_err": err, "pass": ok})
    qp, kcp, vcp, metap = random_case([100, 2000, 7], [100, 64, 1], heads, kvh, d, bs, torch.bfloat16, seed=402)
    at.paged_attention_triton(qp, kcp, vcp, metap, 0.1, 64)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        at.paged_decode(q, kc, vc, meta, 0.1)
        at.paged_attention_triton(qp, kcp, vcp, metap, 0.1, 64)
        sync_ok, why = True, ""
    except RuntimeError as exc:
        sync_ok, why = False, str(exc).splitlines()[0]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    print(f"{'PASS' if sync_ok else 'FAIL'}  no host synchronisation in decode or prefill {why}", flush=True)
    results.append({"name": "no host sync", "pass": sync_ok, "error": why})
    return ok_all and sync_ok


# ---------------------------------------------------------------------------------------------------- timing
def copy_bandwidth() -> float:
    """Bytes/s of a large device-to-device copy, counting read + write (the floor's denominator)."""
    n = 2 << 30
    src = torch.empty(n, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    return 2 * n / (ms * 1e-3)


class DecodeBench:
    """B requests at one context (or given lengths) over `layers` disjoint regions of one paged pool, so that a
    graph of several layers in a row reads its K/V from HBM, as a real model forward does."""

    def __init__(self, seq_lens, heads=32, kv_heads=8, head_dim=128, block_size=16, max_len=8448,
                 dtype=torch.bfloat16, pool_bytes=4 << 30, seed=0):
        self.seq_lens, self.heads, self.kvh, self.d, self.bs = seq_lens, heads, kv_heads, head_dim, block_size
        B = len(seq_lens)
        width = -(-max_len // block_size)          # the table spans the longest allowed context, as in the engine
        need = sum(-(-s // block_size) for s in seq_lens)
        block_bytes = 2 * block_size * kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()
        self.layers = max(1, min(16, pool_bytes // (need * block_bytes)))
        num_blocks = need * self.layers
        gen = torch.Generator().manual_seed(seed)
        dgen = torch.Generator(device=DEV).manual_seed(seed)
        self.k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=dgen, device=DEV, dtype=dtype)
        self.v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=dgen, device=DEV, dtype=dtype)
        order = torch.randperm(num_blocks, generator=gen)
        self.metas, used = [], 0
        for _ in range(self.layers):
            tables = torch.zeros(B, width, dtype=torch.int32)
            for b, s in enumerate(seq_lens):
                n = -(-s // block_size)
                tables[b, :n] = order[used:used + n]
                used += n
            self.metas.append(make_meta(tables, seq_lens, [1] * B, block_size, self.k, self.v))
        self.q = torch.randn(1, heads, B, head_dim, generator=dgen, device=DEV, dtype=dtype)[0].transpose(0, 1)
        self.scale = head_dim ** -0.5
        self.kv_bytes = sum(seq_lens) * block_bytes // block_size   # K and V actually read per layer

    def run(self, meta, **kw):
        return at.paged_decode(self.q, self.k, self.v, meta, self.scale, **kw)

    def eager_ms(self, **kw) -> float:
        return do_bench(lambda: self.run(self.metas[0], **kw), warmup=25, rep=100, return_mode="median")

    def graph_ms(self, **kw) -> float:
        """Per-layer time of a graph that runs every layer once (L2 flushed between replays)."""
        for meta in self.metas:
            self.run(meta, **kw)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for meta in self.metas:
                self.run(meta, **kw)
        ms = do_bench(graph.replay, warmup=10, rep=100, return_mode="median")
        del graph
        return ms / self.layers


def sdpa_decode_ms(ctx, B=32, heads=32, kvh=8, d=128, dtype=torch.bfloat16) -> float:
    """Plain PyTorch on a contiguous cache (no paging): the design notes' comparison point."""
    k = torch.randn(B, kvh, ctx, d, device=DEV, dtype=dtype)
    v = torch.randn_like(k)
    q = torch.randn(B, heads, 1, d, device=DEV, dtype=dtype)
    return do_bench(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), warmup=25, rep=100,
                    return_mode="median")


def prefill_ms(prompt, cached, B=32, heads=32, kvh=8, d=128, bs=16, dtype=torch.bfloat16):
    lens = [cached + prompt] * B
    q, kc, vc, meta = random_case(lens, [prompt] * B, heads, kvh, d, bs, dtype, seed=500)
    scale = d ** -0.5
    ms = do_bench(lambda: at.paged_attention_triton(q, kc, vc, meta, scale), warmup=25, rep=100,
                  return_mode="median")
    # Causal FLOPs: each query attends to its own prefix (QK^T and PV, 2 FLOPs per multiply-add).
    pairs = sum(cached + i + 1 for i in range(prompt)) * B
    flops = 4 * pairs * heads * d
    qd = torch.randn(B, heads, prompt, d, device=DEV, dtype=dtype)
    kd = torch.randn(B, kvh, prompt, d, device=DEV, dtype=dtype)
    sdpa = None
    if cached == 0:
        sdpa = do_bench(lambda: F.scaled_dot_product_attention(qd, kd, kd, is_causal=True, enable_gqa=True),
                        warmup=25, rep=100, return_mode="median")
    return ms, flops / (ms * 1e-3) / 1e12, sdpa


# ---------------------------------------------------------------------------------------------------- main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_out = os.path.join(os.environ["OUT"], "attention.json") if os.environ.get("OUT") else None
    parser.add_argument("--out", default=default_out, help="where to write the JSON results")
    parser.add_argument("--quick", action="store_true", help="fewer correctness shapes, no sweeps")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check or time here (the CPU tests run the kernels in the interpreter)")
        return 2

    t_start = time.time()
    props = torch.cuda.get_device_properties(0)
    res = {"gpu": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
           "triton": triton.__version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "checks": [],
           "decode": [], "decode_splits_sweep": [], "decode_min_keys_sweep": [], "decode_tile_sweep": [],
           "prefill": [],
           "defaults": {"programs_per_sm": at.PROGRAMS_PER_SM, "min_keys_per_split": at.MIN_KEYS_PER_SPLIT,
                        "decode_block_n": at._decode_block_n(torch.bfloat16, 128), "decode_num_stages": 3,
                        "decode_num_warps": 4}}
    print(f"# {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, triton {triton.__version__}")

    print("\n## correctness vs the torch reference")
    ok = run_checks(QUICK_CHECKS if args.quick else CHECKS, res["checks"])
    ok &= check_graph_and_sync(res["checks"])
    res["checks_seconds"] = round(time.time() - t_start, 1)

    print("\n## device copy bandwidth")
    bw = copy_bandwidth()
    res["copy_bandwidth_GBps"] = bw / 1e9
    print(f"copy (read+write): {bw / 1e9:.0f} GB/s")

    print("\n## decode, B=32 H=32 KVH=8 D=128 block 16 bf16, table width 8448 tokens")
    gen = torch.Generator().manual_seed(7)
    cases = [(str(c), [c] * 32) for c in (512, 2048, 4352, 8448)]
    cases.append(("mixed 1..8448", torch.randint(1, 8449, (32,), generator=gen).tolist()))
    for label, lens in cases:
        bench = DecodeBench(lens)
        auto = at.decode_splits(8448, 16, 32, 8, props.multi_processor_count)
        eager, graphed = bench.eager_ms(), bench.graph_ms()
        floor_ms = bench.kv_bytes / bw * 1e3
        row = {"context": label, "kv_bytes": bench.kv_bytes, "splits": auto, "layers_in_graph": bench.layers,
               "eager_ms": eager, "graph_ms": graphed, "floor_ms": floor_ms,
               "graph_GBps": bench.kv_bytes / (graphed * 1e-3) / 1e9,
               "graph_pct_of_copy_bw": 100 * floor_ms / graphed, "graph_x_floor": graphed / floor_ms,
               "eager_x_floor": eager / floor_ms}
        if label != "mixed 1..8448":
            row["sdpa_contiguous_ms"] = sdpa_decode_ms(int(label))
        res["decode"].append(row)
        print(f"ctx {label:>13}: eager {eager * 1e3:7.1f} us  graph {graphed * 1e3:7.1f} us  "
              f"floor {floor_ms * 1e3:7.1f} us  {row['graph_GBps']:6.0f} GB/s = {row['graph_pct_of_copy_bw']:4.0f}% "
              f"of copy bw  ({row['graph_x_floor']:.2f}x floor, splits {auto})"
              + (f"  sdpa-contiguous {row['sdpa_contiguous_ms'] * 1e3:.1f} us" if "sdpa_contiguous_ms" in row else ""),
              flush=True)
        if not args.quick:
            for splits in (1, 2, 4, 8, 16, 32):
                ms = bench.graph_ms(num_splits=splits)
                res["decode_splits_sweep"].append({"context": label, "splits": splits, "graph_ms": ms,
                                                   "graph_x_floor": ms / floor_ms})
            best = min((r for r in res["decode_splits_sweep"] if r["context"] == label),
                       key=lambda r: r["graph_ms"])
            print(f"    best splits {best['splits']}: {best['graph_ms'] * 1e3:.1f} us "
                  f"({best['graph_x_floor']:.2f}x floor)")
            if label in ("512", "2048"):
                for keys in (64, 128, 512):
                    ms = bench.graph_ms(min_split_keys=keys)
                    res["decode_min_keys_sweep"].append({"context": label, "min_split_keys": keys, "graph_ms": ms,
                                                         "graph_x_floor": ms / floor_ms})
                    print(f"    min keys per split {keys}: {ms * 1e3:.1f} us ({ms / floor_ms:.2f}x floor)")
            if label in ("512", "8448"):
                for block_n, stages, warps in TILE_SWEEP:
                    try:
                        ms = bench.graph_ms(block_n=block_n, num_stages=stages, num_warps=warps)
                    except Exception as exc:  # e.g. out of shared memory for the biggest tiles
                        print(f"    block_n {block_n} stages {stages} warps {warps}: {type(exc).__name__}")
                        continue
                    res["decode_tile_sweep"].append({"context": label, "block_n": block_n, "num_stages": stages,
                                                     "num_warps": warps, "graph_ms": ms,
                                                     "graph_x_floor": ms / floor_ms})
                best = min((r for r in res["decode_tile_sweep"] if r["context"] == label),
                           key=lambda r: r["graph_ms"])
                print(f"    best tile: block_n {best['block_n']} stages {best['num_stages']} "
                      f"warps {best['num_warps']}: {best['graph_ms'] * 1e3:.1f} us "
                      f"({best['graph_x_floor']:.2f}x floor)")
        del bench
        torch.cuda.empty_cache()

    print("\n## prefill, 32 requests, H=32 KVH=8 D=128 block 16 bf16")
    for prompt, cached in ((256, 0), (256, 1792)):
        ms, tflops, sdpa = prefill_ms(prompt, cached)
        res["prefill"].append({"requests": 32, "new_tokens": prompt, "cached_tokens": cached, "ms": ms,
                               "TFLOPs": tflops, "sdpa_dense_causal_ms": sdpa})
        print(f"32 x {prompt} new on {cached} cached: {ms * 1e3:.1f} us, {tflops:.0f} TFLOP/s"
              + (f"  (dense SDPA causal, no paging: {sdpa * 1e3:.1f} us)" if sdpa else ""), flush=True)

    res["all_checks_pass"] = bool(ok)
    res["seconds"] = round(time.time() - t_start, 1)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    print("\n## summary")
    print(f"checks: {sum(c['pass'] for c in res['checks'])}/{len(res['checks'])} pass;  copy bw {bw / 1e9:.0f} GB/s")
    print(f"{'decode ctx':>14} {'graph us':>9} {'floor us':>9} {'x floor':>8} {'% copy bw':>10} {'eager us':>9}")
    for r in res["decode"]:
        print(f"{r['context']:>14} {r['graph_ms'] * 1e3:9.1f} {r['floor_ms'] * 1e3:9.1f} {r['graph_x_floor']:8.2f} "
              f"{r['graph_pct_of_copy_bw']:10.0f} {r['eager_ms'] * 1e3:9.1f}")
    for r in res["prefill"]:
        print(f"prefill 32x{r['new_tokens']} (+{r['cached_tokens']} cached): {r['ms'] * 1e3:.1f} us, "
              f"{r['TFLOPs']:.0f} TFLOP/s")
    print(f"total {res['seconds']} s" + (f"; results in {args.out}" if args.out else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
