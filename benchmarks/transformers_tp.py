"""transformers' own tensor parallelism (`tp_plan="auto"`) with its continuous batching, for the side-by-side
with `batchscope bench -tp 2`. Run under torchrun, one process per GPU:

    torchrun --nproc-per-node 2 benchmarks/transformers_tp.py --model llama3-8b-random --out tf_tp.json

tp_plan loads from a checkpoint on disk only, so rank 0 first saves the random preset (same seed and shapes as the
engine's TP=1 preset) to --checkpoint; 70B-class shapes need ~141 GB of disk for that.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama3-8b-random")
    p.add_argument("--checkpoint", default="/tmp/batchscope-tf-tp-ckpt")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--async-batching", type=int, default=1)
    p.add_argument("--out", default="tf_tp.json")
    args = p.parse_args()
    for key, value in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                       "NVSHMEM_DISABLE_NVLS": "1"}.items():
        os.environ.setdefault(key, value)
    from transformers import AutoModelForCausalLM, ContinuousBatchingConfig, GenerationConfig

    from batchscope.engine.model.loading import _random_model, random_preset_config

    rank = int(os.environ.get("RANK", "0"))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    ckpt = Path(args.checkpoint)
    if rank == 0 and not (ckpt / "config.json").exists():
        model = _random_model(random_preset_config(args.model, 49152), 0, torch.bfloat16, torch.device("cuda"))
        model.save_pretrained(ckpt)
        del model
        torch.cuda.empty_cache()
    dist.init_process_group("nccl")
    dist.barrier()
    result: dict = {"model": args.model, "world_size": dist.get_world_size(), "system": "transformers tp_plan=auto"}
    try:
        t0 = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(ckpt, tp_plan="auto", dtype=torch.bfloat16,
                                                     attn_implementation="sdpa")
        result["load_s"] = time.perf_counter() - t0
        import random
        rng = random.Random(0)
        prompts = [[rng.randrange(49152) for _ in range(args.prompt_tokens)] for _ in range(args.requests)]
        gen = GenerationConfig(max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
        cb = ContinuousBatchingConfig(num_blocks=args.requests * (-(-(args.prompt_tokens + args.new_tokens)
                                                                   // 256) + 1),
                                      max_batch_tokens=8192, use_cuda_graph=True,
                                      use_async_batching=bool(args.async_batching))
        for label, n in (("warmup", 8), ("timed", args.new_tokens)):
            gen.max_new_tokens = n
            t0 = time.perf_counter()
            out = model.generate_batch(inputs=prompts, generation_config=gen, continuous_batching_config=cb,
                                       record_timestamps=True, progress_bar=False)
            call_s = time.perf_counter() - t0
        outs = list(out.values())
        gaps = [(b - a) * 1e3 for o in outs for a, b in zip(o.timestamps or [], (o.timestamps or [])[1:])]
        result.update(call_s=call_s, output_tokens=sum(len(o.generated_tokens) for o in outs),
                      decode_ms_per_step=statistics.median(gaps) if gaps else None, ok=True)
    except Exception as exc:
        result.update(ok=False, error=f"{type(exc).__name__}: {exc}")
    if rank == 0:
        Path(args.out).write_text(json.dumps(result, indent=2))
        print(json.dumps(result))
    os._exit(0)


if __name__ == "__main__":
    main()
