"""The floor a decode step is set against: the copy bandwidth this device reaches, measured at bench start, and
the bytes a decode step of the workload must stream (weights once, plus every request's KV).

Imports only torch, so `python -m batchscope.app.bench` runs where the server's packages are not installed.
"""
from __future__ import annotations

import statistics
import time
from functools import partial

import torch


def measure_bandwidth(device: torch.device, mib: int | None = None, trials: int = 5) -> dict:
    """Copy bandwidth in GB/s (1e9 B/s), counting bytes read plus bytes written: the rate a memory-bound decode
    step can at best stream its weights and KV. CUDA: a same-dtype contiguous copy (a device-to-device memcpy)
    timed with CUDA events. CPU: the same copy timed with the host clock. The median of `trials` is reported."""
    cuda = device.type == "cuda"
    nbytes = (mib or (1024 if cuda else 128)) * 2**20
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):                   # first touches page in memory and warm the copy engine
        dst.copy_(src)
    ms = _median_ms(partial(dst.copy_, src), 10 if cuda else 3, trials, cuda)
    del src, dst
    if cuda:
        torch.cuda.empty_cache()
    moved = 2 * nbytes
    return {"gbps": round(moved / (ms * 1e-3) / 1e9, 2), "bytes_moved": moved, "ms_per_copy": round(ms, 4),
            "trials": trials, "method": "cuda events, device-to-device copy" if cuda else "host clock, tensor copy"}


def decode_floor(info: dict, requests: int, prompt_tokens: int, new_tokens: int, gbps: float) -> dict:
    """The fastest a decode step of this workload could run if it only had to stream its bytes once: weights
    (minus the embedding table) plus every request's KV, over the copy bandwidth. Lengths are fixed, so the mean
    context of a decode step is known exactly: the step producing token j (j = 2..new) reads prompt + j - 1
    positions, whose mean over the decode is prompt + new/2.

    Under tensor parallelism it is one GPU's floor: its share of the weights and KV (what `info` reports), plus
    the all-reduces a step cannot skip, at the time measured for them at start-up (`allreduce_us`, in a graph)."""
    if new_tokens < 2 or not gbps:
        return {"mean_context_tokens": None, "bytes_per_step": None, "ms_per_step": None, "allreduce_ms": None}
    context = requests * (prompt_tokens + new_tokens / 2)
    nbytes = info["weight_bytes"] + info["kv_bytes_per_token"] * context
    allreduce_ms = allreduce_ms_per_step(info, requests)
    return {"mean_context_tokens": context, "bytes_per_step": int(nbytes), "allreduce_ms": allreduce_ms,
            "ms_per_step": round(nbytes / (gbps * 1e9) * 1e3 + (allreduce_ms or 0.0), 4)}


def allreduce_ms_per_step(info: dict, rows: int) -> float | None:
    """All-reduces per decode step times one all-reduce of the step's rows (the smallest size measured that
    holds them, as the step's graph bucket does); None on one GPU."""
    per_step, measured = info.get("allreduces_per_step") or 0, info.get("allreduce_us") or {}
    if not per_step or not measured:
        return None
    sizes = sorted(int(k) for k in measured)
    size = next((n for n in sizes if n >= rows), sizes[-1])
    return round(per_step * measured[str(size)] / 1e3, 4)


def _median_ms(fn, iters: int, trials: int, cuda: bool) -> float:
    """Median over `trials` of the mean time of `iters` calls: CUDA events on CUDA, the host clock elsewhere."""
    times_ms = []
    for _ in range(trials):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            times_ms.append(start.elapsed_time(end) / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            times_ms.append((time.perf_counter() - t0) * 1e3 / iters)
    return statistics.median(times_ms)


def measure_gemm_peak(device: torch.device, dtype: torch.dtype, trials: int = 5, hold_s: float = 1.5) -> dict:
    """Dense GEMM throughput in TFLOP/s (1e12 FLOP/s) at a large square size, the compute roof a step's GEMMs
    meet once they have enough rows. CUDA: 8192^3 in `dtype`, timed with CUDA events; CPU: 1024^3, host clock.

    `tflops` is the best a short burst reaches. On CUDA `held_tflops` is the rate after `hold_s` seconds of
    GEMMs back to back: a GPU at its power limit lowers its clock under sustained load (an H200 at 700 W from
    1980 MHz to about 1450), and a long decode run at many rows runs at that clock, not the burst's."""
    cuda = device.type == "cuda"
    n = 8192 if cuda else 1024
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    for _ in range(2):
        a @ b
    gemm = partial(torch.matmul, a, b)
    ms = _median_ms(gemm, 10 if cuda else 2, trials, cuda)
    held_ms = None
    if cuda:
        t_end = time.perf_counter() + hold_s
        while time.perf_counter() < t_end:
            _median_ms(gemm, 20, 1, cuda)
        held_ms = _median_ms(gemm, 20, 3, cuda)
    del a, b
    if cuda:
        torch.cuda.empty_cache()

    def tflops(t_ms: float) -> float:
        return round(2 * n ** 3 / (t_ms * 1e-3) / 1e12, 2)

    return {"tflops": tflops(ms), "held_tflops": tflops(held_ms) if held_ms else None,
            "hold_s": hold_s if cuda else None, "size": n, "dtype": str(dtype).replace("torch.", ""),
            "ms_per_gemm": round(ms, 4),
            "method": "cuda events" if cuda else "host clock"}


def weight_classes(model: torch.nn.Module, experts_per_token: int | None = None) -> dict:
    """Per op class, (bytes a decode step reads, multiply-accumulates per row): dense linears (each row multiplies
    every weight), experts (a row multiplies only its top-k experts' weights) and the lm_head. The embedding table
    is a lookup (no weights read whole, no FLOPs)."""
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    out = {"linear": [0, 0], "experts": [0, 0], "lm_head": [0, 0]}
    seen = {id(embed)}
    for module in model.modules():
        if module is head:
            continue
        gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
        if isinstance(gate_up, torch.Tensor) and gate_up.dim() == 3 and isinstance(down, torch.Tensor):
            e = gate_up.shape[0]
            params = gate_up.numel() + down.numel()
            out["experts"][0] += params * gate_up.element_size()
            out["experts"][1] += params // e * (experts_per_token or e)
            seen.update({id(gate_up), id(down)})
        elif isinstance(module, torch.nn.Linear) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            out["linear"][0] += module.weight.numel() * module.weight.element_size()
            out["linear"][1] += module.weight.numel()
    w = head.weight
    out["lm_head"] = [w.numel() * w.element_size(), w.numel()]
    return {k: {"bytes": b, "macs_per_row": m} for k, (b, m) in out.items()}


def roofline_floor(classes: dict, info: dict, requests: int, prompt_tokens: int, new_tokens: int, gbps: float,
                   tflops: float) -> dict:
    """The roofline floor of a decode step: per op class, the larger of its bytes over the copy bandwidth and its
    FLOPs (2 per multiply-accumulate, for every request's row) over the GEMM peak; summed, plus the KV read
    (attention at decode is a memory-bound read of every request's context) and the all-reduces (tensor
    parallel). The bandwidth floor is the same sum with every class memory-bound."""
    if new_tokens < 2 or not gbps or not tflops:
        return {"ms_per_step": None, "classes": None}
    context = requests * (prompt_tokens + new_tokens / 2)
    parts = {}
    for name, c in classes.items():
        mem_ms = c["bytes"] / (gbps * 1e9) * 1e3
        flop_ms = 2 * c["macs_per_row"] * requests / (tflops * 1e12) * 1e3
        parts[name] = {"memory_ms": round(mem_ms, 4), "compute_ms": round(flop_ms, 4),
                       "bound": "compute" if flop_ms > mem_ms else "memory"}
    kv_ms = info["kv_bytes_per_token"] * context / (gbps * 1e9) * 1e3
    parts["kv"] = {"memory_ms": round(kv_ms, 4), "compute_ms": None, "bound": "memory"}
    allreduce = allreduce_ms_per_step(info, requests) or 0.0
    total = sum(max(p["memory_ms"], p["compute_ms"] or 0.0) for p in parts.values()) + allreduce
    return {"ms_per_step": round(total, 4), "classes": parts, "allreduce_ms": allreduce or None,
            "gemm_tflops": tflops}


def workload_floors(model: torch.nn.Module, info: dict, requests: int, prompt_tokens: int, new_tokens: int,
                    gbps: float) -> dict:
    """Both floors of the workload's decode step: the bandwidth floor, with the roofline floor and the GEMM peak
    it was computed with (measured here, in the model's dtype on its device) beside it; and the roofline again at
    the GEMM rate the GPU holds under sustained load (`roofline_held`, None where that is not measured)."""
    floor = decode_floor(info, requests, prompt_tokens, new_tokens, gbps)
    gemm = measure_gemm_peak(next(model.parameters()).device, next(model.parameters()).dtype)
    topk = getattr(model.config, "num_experts_per_tok", None)
    classes = weight_classes(model, topk)
    floor["roofline"] = roofline_floor(classes, info, requests, prompt_tokens, new_tokens, gbps, gemm["tflops"])
    floor["roofline_held"] = roofline_floor(classes, info, requests, prompt_tokens, new_tokens, gbps,
                                            gemm["held_tflops"])
    floor["gemm_peak"] = gemm
    return floor
