"""The decode GEMMs of Llama-3-8B at 256 rows, and the 8192^3 peak GEMM, in short bursts and under sustained load,
with the SM clock and board power NVML reports meanwhile: how much a power-limited GPU slows down once it is hot.

    python benchmarks/gemm_clock.py OUT.json          # ROWS=128 for another row count; cuBLAS env vars apply

Each GEMM runs as a CUDA graph over several weight copies (so weights stream from HBM, as in the model): the best
of five short bursts after a 0.5 s pause, then about 2 s back to back, then a 0.3 s measured stretch.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

import pynvml
import torch

SHAPES = {"gate_up": (28672, 4096), "down": (4096, 14336), "qkv": (6144, 4096), "o": (4096, 4096),
          "lm_head": (128256, 4096)}   # (out features, in features)


class NvmlSampler:
    """SM clock (MHz) and board power (W) every 20 ms, on a thread."""

    def __init__(self):
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.samples: list[tuple[float, int, float]] = []
        self.running = True
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while self.running:
            self.samples.append((time.perf_counter(), pynvml.nvmlDeviceGetClockInfo(self.handle, pynvml.NVML_CLOCK_SM),
                                 pynvml.nvmlDeviceGetPowerUsage(self.handle) / 1000))
            time.sleep(0.02)

    def mean(self, t0: float, t1: float, index: int) -> float | None:
        vals = [s[index] for s in self.samples if t0 <= s[0] <= t1]
        return round(sum(vals) / len(vals)) if vals else None


def graph_us(graph: torch.cuda.CUDAGraph, reps: int, per_replay: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * per_replay)


def gemm(nvml: NvmlSampler, rows: int, n: int, k: int) -> dict:
    copies = max(1, min(8, (2 << 30) // (n * k * 2)))
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    outs = [torch.empty(rows, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    for w, o in zip(ws, outs):
        torch.matmul(x, w.t(), out=o)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w, o in zip(ws, outs):
            torch.matmul(x, w.t(), out=o)
    graph_us(graph, 3, copies)
    time.sleep(0.5)
    burst = min(graph_us(graph, max(1, 3000 // max(1, copies * 50)), copies) for _ in range(5))
    us = graph_us(graph, 1, copies)
    graph_us(graph, max(1, int(2e6 / (us * copies))), copies)      # about 2 s of load
    t1 = time.perf_counter()
    held = graph_us(graph, max(1, int(3e5 / (us * copies))), copies)
    t2 = time.perf_counter()
    flops = 2 * rows * n * k
    return {"burst_us": round(burst, 2), "sustained_us": round(held, 2),
            "burst_tflops": round(flops / burst / 1e6, 1), "sustained_tflops": round(flops / held / 1e6, 1),
            "sustained_sm_mhz": nvml.mean(t1, t2, 1), "sustained_power_w": nvml.mean(t1, t2, 2)}


def peak(nvml: NvmlSampler, res: dict) -> None:
    """The 8192^3 GEMM the bench's roofline uses: best of three 5-GEMM bursts, then after 1500 in a row."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b, c = torch.randn_like(a), torch.empty_like(a)

    def tflops(reps: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            torch.matmul(a, b, out=c)
        end.record()
        end.synchronize()
        return 2 * 8192 ** 3 / (start.elapsed_time(end) / reps * 1e-3) / 1e12

    tflops(3)
    time.sleep(1.0)
    res["peak_burst_tflops"] = round(max(tflops(5) for _ in range(3)), 1)
    tflops(1500)
    t1 = time.perf_counter()
    res["peak_sustained_tflops"] = round(tflops(200), 1)
    res["peak_sustained_sm_mhz"] = nvml.mean(t1, time.perf_counter(), 1)


def main() -> None:
    nvml = NvmlSampler()
    rows = int(os.environ.get("ROWS", "256"))
    res = {"env": {k: os.environ.get(k) for k in ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE",
                                                 "TORCH_BLAS_PREFER_CUBLASLT")}, "rows": rows}
    for name, (n, k) in SHAPES.items():
        res[name] = gemm(nvml, rows, n, k)
        print(name, res[name], flush=True)
        torch.cuda.empty_cache()
        time.sleep(1.0)
    peak(nvml, res)
    nvml.running = False
    res["max_sm_mhz"] = pynvml.nvmlDeviceGetMaxClockInfo(nvml.handle, pynvml.NVML_CLOCK_SM)
    res["power_limit_w"] = pynvml.nvmlDeviceGetEnforcedPowerLimit(nvml.handle) / 1000
    print(json.dumps(res))
    with open(sys.argv[1], "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
