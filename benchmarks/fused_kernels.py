"""Check and time batchscope's fused RMSNorm and rotary kernels (engine/kernels/rms_norm.py, rotary.py) against transformers' eager code.

    python benchmarks/fused_kernels.py [--out results.json]

1. Correctness on fresh random inputs: RMSNorm for Llama-3-8B hidden rows [32, 4096] (and a prefill-sized
   [4096, 4096]), Qwen3 q/k head norms [1, 32, 32, 128] / [1, 32, 8, 128], in bf16, fp16 and fp32 (largest ulp
   distance to the eager module; bf16/fp16 pass at <= 2 ulps on < 1% of the values: the normalized
   value can flip by 1 ulp where the fp32 sum of squares is ordered differently, 2 ulps after the weight);
   rotary for Llama-3-8B decode (q [1, 32, 32, 128], k [1, 8, 32, 128], the transposed layout transformers hands
   over) and a 2048-token prefill (pass: identical bits). One PASS/FAIL line each.
2. Timing, medians: triton.testing.do_bench (each call launched from the host, as in an eager prefill step) and
   do_bench_cudagraph (many calls replayed from one CUDA graph, as in batchscope's decode steps), eager vs fused.
3. A table, and JSON of everything to --out (default $OUT/fused.json when OUT is set).
Exit status 1 if any check fails.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import triton  # noqa: E402
from triton.testing import do_bench, do_bench_cudagraph  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402

from batchscope.engine.kernels import rms_norm as rms, rotary as rot  # noqa: E402

DEV = "cuda"
eager_rotary = modeling_llama.apply_rotary_pos_emb   # read before anything could patch it


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    int_ty, sign = {2: (torch.int16, 0x7FFF), 4: (torch.int32, 0x7FFFFFFF)}[a.element_size()]

    def ordered(t):
        bits = t.contiguous().view(int_ty).long()
        return torch.where(bits < 0, -(bits & sign), bits)
    return (ordered(a) - ordered(b)).abs()


def make_norm(n: int, dtype: torch.dtype, eps: float = 1e-5) -> LlamaRMSNorm:
    norm = LlamaRMSNorm(n, eps=eps)
    norm.weight.data = 1 + 0.3 * torch.randn(n)
    return norm.to(DEV, dtype).requires_grad_(False)


def rotary_inputs(Hq: int, Hk: int, T: int, D: int, dtype: torch.dtype, seed: int = 0):
    """q, k as transformers makes them (projection viewed [1, T, H, D], transposed) and bf16 cos/sin tables."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    q = torch.randn(1, T, Hq, D, generator=gen, device=DEV).to(dtype).transpose(1, 2)
    k = torch.randn(1, T, Hk, D, generator=gen, device=DEV).to(dtype).transpose(1, 2)
    pos = torch.randint(0, 8192, (1, T), generator=gen, device=DEV).float()
    freqs = pos[..., None] * (500000.0 ** (-torch.arange(0, D, 2, device=DEV).float() / D))
    emb = torch.cat((freqs, freqs), dim=-1)
    return q, k, emb.cos().to(dtype), emb.sin().to(dtype)


def check_norms(results: list[dict]) -> None:
    gen = torch.Generator(device=DEV).manual_seed(1)
    for label, shape in (("llama3-8b hidden", (32, 4096)), ("prefill hidden", (4096, 4096)),
                         ("qwen3 q_norm", (1, 32, 32, 128)), ("qwen3 k_norm", (1, 32, 8, 128))):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            norm = make_norm(shape[-1], dtype)
            x = (2 * torch.randn(shape, generator=gen, device=DEV)).to(dtype)
            with torch.inference_mode():
                ref = LlamaRMSNorm.forward(norm, x)
                out = rms.rms_norm(x, norm.weight, norm.variance_epsilon)
            if out is None:
                results.append(dict(check=f"rms_norm {label} {list(shape)} {dtype}", ok=False, detail="declined"))
                continue
            dist = ulp_distance(out, ref)
            worst, frac = dist.max().item(), (dist > 0).float().mean().item()
            ok = out.dtype == ref.dtype and (worst <= 2 and frac < 0.01 if out.element_size() == 2 else worst <= 8)
            results.append(dict(check=f"rms_norm {label} {list(shape)} {str(dtype)[6:]}", ok=ok,
                                detail=f"max {worst} ulp, {100 * frac:.3f}% differ"))


def check_rotary(results: list[dict]) -> None:
    for label, (Hq, Hk, T, D) in (("llama3-8b decode b32", (32, 8, 32, 128)),
                                  ("llama3-8b prefill 2048", (32, 8, 2048, 128)),
                                  ("qwen3-0.6b decode b32", (16, 8, 32, 128))):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            q, k, cos, sin = rotary_inputs(Hq, Hk, T, D, dtype, seed=T + Hq)
            with torch.inference_mode():
                ref = eager_rotary(q, k, cos, sin)
                out = rot.apply_rotary(q, k, cos, sin)
            if out is None:
                results.append(dict(check=f"rotary {label} {dtype}", ok=False, detail="declined"))
                continue
            worst = max(ulp_distance(o, r).max().item() for o, r in zip(out, ref))
            same_layout = all(o.stride() == r.stride() for o, r in zip(out, ref))
            results.append(dict(check=f"rotary {label} {str(dtype)[6:]}", ok=worst == 0 and same_layout,
                                detail=f"max {worst} ulp, layout {'same' if same_layout else 'DIFFERENT'}"))


def check_graph_and_syncs(results: list[dict]) -> None:
    norm = make_norm(4096, torch.bfloat16)
    x = torch.randn(32, 4096, device=DEV).to(torch.bfloat16)
    q, k, cos, sin = rotary_inputs(32, 8, 32, 128, torch.bfloat16)
    rms.rms_norm(x, norm.weight, 1e-5)
    rot.apply_rotary(q, k, cos, sin)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        rms.rms_norm(x, norm.weight, 1e-5)
        rot.apply_rotary(q, k, cos, sin)
        no_sync = True
    except RuntimeError:
        no_sync = False
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = rms.rms_norm(x, norm.weight, 1e-5)
        q_out, _ = rot.apply_rotary(q, k, cos, sin)
    ok = no_sync
    for seed in (2, 3):
        gen = torch.Generator(device=DEV).manual_seed(seed)
        x.copy_(torch.randn(x.shape, generator=gen, device=DEV))
        q.copy_(torch.randn(q.shape, generator=gen, device=DEV))
        graph.replay()
        torch.cuda.synchronize()
        ok &= ulp_distance(y, LlamaRMSNorm.forward(norm, x)).max().item() <= 2
        ok &= torch.equal(q_out, eager_rotary(q, k, cos, sin)[0])
    results.append(dict(check="cuda graph replay with new inputs, no host sync", ok=bool(ok),
                        detail="" if no_sync else "host sync seen"))


def time_pair(label: str, eager, fused_fn) -> dict:
    row = dict(case=label)
    with torch.inference_mode():
        for name, fn in (("eager", eager), ("fused", fused_fn)):
            row[f"{name}_launch_us"] = 1000 * do_bench(fn, warmup=25, rep=100, return_mode="median")
            row[f"{name}_graph_us"] = 1000 * do_bench_cudagraph(fn, rep=20, return_mode="median")
    return row


def timings() -> list[dict]:
    rows = []
    for label, shape in (("rms_norm [32,4096] bf16", (32, 4096)), ("rms_norm q_norm [1,32,32,128] bf16",
                                                                     (1, 32, 32, 128))):
        norm = make_norm(shape[-1], torch.bfloat16)
        x = torch.randn(shape, device=DEV).to(torch.bfloat16)
        rows.append(time_pair(label, lambda n=norm, x=x: LlamaRMSNorm.forward(n, x),
                              lambda n=norm, x=x: rms.rms_norm(x, n.weight, n.variance_epsilon)))
    for label, (Hq, Hk, T) in (("rotary q[1,32,32,128] k[1,8,32,128] bf16", (32, 8, 32)),
                               ("rotary prefill T=2048 bf16", (32, 8, 2048))):
        q, k, cos, sin = rotary_inputs(Hq, Hk, T, 128, torch.bfloat16)
        rows.append(time_pair(label, lambda q=q, k=k, c=cos, s=sin: eager_rotary(q, k, c, s),
                              lambda q=q, k=k, c=cos, s=sin: rot.apply_rotary(q, k, c, s)))
    # per decode step of Llama-3-8B: 65 norms (2 per layer + the final one) and 32 rotaries, in-graph times
    norm_row, rot_row = rows[0], rows[2]
    rows.append({"case": "llama3-8b step: 65 norms + 32 rotary (graph)",
                 **{f"{name}_graph_us": 65 * norm_row[f"{name}_graph_us"] + 32 * rot_row[f"{name}_graph_us"]
                    for name in ("eager", "fused")}})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ["OUT"], "fused.json") if os.environ.get("OUT")
                    else None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    t0 = time.time()
    checks: list[dict] = []
    check_norms(checks)
    check_rotary(checks)
    check_graph_and_syncs(checks)
    for c in checks:
        print(f"{'PASS' if c['ok'] else 'FAIL'}  {c['check']:<48} {c['detail']}")
    rows = timings()
    print(f"\n{'case':<46} {'eager launch':>12} {'fused launch':>12} {'eager graph':>11} {'fused graph':>11}"
          f" {'speedup (graph)':>15}   (us, medians)")
    for r in rows:
        cells = [r.get(k) for k in ("eager_launch_us", "fused_launch_us", "eager_graph_us", "fused_graph_us")]
        text = " ".join(f"{c:>12.2f}" if c is not None else f"{'':>12}" for c in cells)
        speed = r["eager_graph_us"] / r["fused_graph_us"]
        print(f"{r['case']:<46} {text} {speed:>14.1f}x")
    result = dict(date=time.strftime("%Y-%m-%d %H:%M:%S"), gpu=torch.cuda.get_device_name(),
                  torch=torch.__version__, triton=triton.__version__, checks=checks, timings=rows,
                  seconds=round(time.time() - t0, 1))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        print(f"\nwrote {args.out}")
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
