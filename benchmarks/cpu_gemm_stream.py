"""Why the CPU's linears run on prepacked oneDNN weights (engine/cpu_gemm.py), measured on this machine:

1. a plain read of 512 MB (a sum): the memory's read rate;
2. SmolLM2-135M's decode GEMMs (merged q/k/v, o, merged gate/up, down per layer, then lm_head; 8 rows), one after
   the other as a step runs them, through F.linear (MKL's sgemm) and through oneDNN on packed weights;
3. where a decode step of the engine goes (torch.profiler over 3 steps, 8 requests), with packing off and on:
   the share of the step in the GEMM operators.

    python3 benchmarks/cpu_gemm_stream.py --out cpu_gemm_stream.json
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from batchscope.engine import Engine, EngineConfig, SamplingParams, cpu_gemm


def _ms(fn, reps: int = 5) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def read_rate() -> float:
    big = torch.randn(128 * 2**20)
    return big.numel() * 4 / (_ms(big.sum) / 1e3) / 1e9


def step_weights(eng) -> list[torch.Tensor]:
    """The weights a decode step multiplies, in its order: merged q/k/v, o, merged gate/up, down, then lm_head."""
    out = []
    for layer in eng.model.model.layers:
        out += [layer.self_attn.q_proj.batchscope_merged.weight, layer.self_attn.o_proj.weight,
                layer.mlp.batchscope_merged.weight, layer.mlp.down_proj.weight]
    return out + [eng.model.get_output_embeddings().weight]


def gemm_chain(weights: list[torch.Tensor], rows: int = 8) -> dict:
    xs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights}
    packed = [cpu_gemm.PackedWeight(w, None) for w in weights]
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    plain = _ms(lambda: [F.linear(xs[w.shape[1]], w) for w in weights])
    fast = _ms(lambda: [p(xs[w.shape[1]]) for w, p in zip(weights, packed)])
    return {"weights": len(weights), "bytes": nbytes, "f_linear_ms": round(plain, 2),
            "f_linear_gbps": round(nbytes / plain / 1e6, 1), "onednn_packed_ms": round(fast, 2),
            "onednn_packed_gbps": round(nbytes / fast / 1e6, 1)}


def step_profile(packed: bool) -> dict:
    """Median decode forward and the share of it in GEMM operators, the engine's own path (sync, 8 requests)."""
    rng = random.Random(0)
    eng = Engine(EngineConfig(model="smollm2-135m", device="cpu", mode="sync", max_running=8, num_blocks=128,
                              fused_kernels=packed))
    prompts = [[rng.randrange(49152) for _ in range(128)] for _ in range(8)]
    eng.generate(prompts, SamplingParams(max_new_tokens=4, ignore_eos=True))
    runner, forward = eng.runner, eng.runner._forward
    seen = {"n": 0, "ms": [], "prof": None}

    def timed(batch, prev, start=None):
        seen["n"] += 1
        t0 = time.perf_counter()
        if seen["n"] == 12:
            with profile(activities=[ProfilerActivity.CPU]) as p:
                for _ in range(3):
                    forward(batch, prev, start)
            seen["prof"] = p
        else:
            forward(batch, prev, start)
            seen["ms"].append((time.perf_counter() - t0) * 1e3)
    runner._forward = timed
    eng.generate(prompts, SamplingParams(max_new_tokens=24, ignore_eos=True))
    eng.close()
    events = seen["prof"].key_averages()
    total = sum(e.self_cpu_time_total for e in events) / 3 / 1e3
    gemm_ops = ("aten::mm", "aten::addmm", "mkldnn::_linear_pointwise")
    gemm = sum(e.self_cpu_time_total for e in events if e.key in gemm_ops) / 3 / 1e3
    return {"forward_ms_median": round(statistics.median(seen["ms"][2:]), 2),
            "profiled_step_ms": round(total, 2), "gemm_ms": round(gemm, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="cpu_gemm_stream.json")
    args = ap.parse_args()
    eng = Engine(EngineConfig(model="smollm2-135m", device="cpu", fused_kernels=False, num_blocks=16))
    weights = step_weights(eng)
    eng.close()
    result = {"threads": torch.get_num_threads(), "torch": torch.__version__, "read_gbps": round(read_rate(), 1),
              "chain": gemm_chain(weights), "step_unpacked": step_profile(False), "step_packed": step_profile(True)}
    print(json.dumps(result, indent=2))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
