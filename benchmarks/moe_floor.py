"""The decode floor of a mixture-of-experts model: only the experts a step routes to must cross HBM.

Loads a preset (default qwen3-30b-a3b-random) the way the engine does, prefills a batch of random prompts with
transformers' own forward, then decodes a few greedy steps while hooks on every router record which experts the
step's tokens chose. Per decode step, the bytes that must be read are:

    dense weights (attention, norms, routers, shared experts, lm_head; not the embedding table)
  + experts touched in that step, layer by layer, x bytes of one expert
  + KV of every token of context (2 x layers x kv_heads x head_dim x bytes)

The floor is those bytes over the measured copy bandwidth (read + write of a large device-to-device copy).

    python3 benchmarks/moe_floor.py --requests 32 --prompt-tokens 256 --context 512 --out moe_floor.json
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from batchscope.engine import EngineConfig
from batchscope.engine.model.loading import load_model


def copy_bandwidth_gbps(device: torch.device, mib: int = 1024) -> float:
    """Read + write bytes per second of a large device-to-device copy, median of 10."""
    src = torch.empty(mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(12):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * src.numel() / statistics.median(times[2:]) / 1e9


def expert_blocks(model) -> list[tuple[torch.nn.Module, torch.nn.Module, int]]:
    """(router, experts, number of experts) per MoE layer."""
    found = []
    for module in model.modules():
        gate, experts = getattr(module, "gate", None), getattr(module, "experts", None)
        if gate is not None and experts is not None:
            n = getattr(experts, "num_experts", None) or getattr(gate, "num_experts", None) or len(experts)
            found.append((gate, experts, int(n)))
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3-30b-a3b-random")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--decode-steps", type=int, default=16)
    p.add_argument("--context", type=int, default=512, help="mean context per request for the KV term")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default="moe_floor.json")
    args = p.parse_args()

    device = torch.device(args.device)
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    model = load_model(EngineConfig(model=args.model, device=args.device, dtype=dtype, seed=0)).model
    blocks = expert_blocks(model)
    if not blocks:
        raise SystemExit(f"{args.model} has no MoE layers")
    chosen: list[list[torch.Tensor]] = [[] for _ in blocks]
    decoding = {"on": False}

    def recorder(i):
        def hook(_module, _inputs, output):
            if decoding["on"]:
                indices = output[-1] if isinstance(output, tuple) else None
                chosen[i].append(indices.detach().reshape(-1))
        return hook

    for i, (gate, _experts, _n) in enumerate(blocks):
        gate.register_forward_hook(recorder(i))

    cfg = model.config
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(3, cfg.vocab_size, (args.requests, args.prompt_tokens), generator=g).to(device)
    touched_per_step = []
    with torch.no_grad():
        out = model(ids, use_cache=True)
        cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        decoding["on"] = True
        for _ in range(args.decode_steps):
            for c in chosen:
                c.clear()
            out = model(nxt, past_key_values=cache, use_cache=True)
            cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            touched_per_step.append([int(torch.unique(torch.cat(c)).numel()) for c in chosen])

    bytes_of = lambda params: sum(t.numel() * t.element_size() for t in params)  # noqa: E731
    expert_bytes = [bytes_of(experts.parameters()) / n for _gate, experts, n in blocks]
    all_expert_bytes = sum(bytes_of(experts.parameters()) for _gate, experts, _n in blocks)
    embed_bytes = bytes_of(model.get_input_embeddings().parameters())
    dense_bytes = bytes_of(model.parameters()) - embed_bytes - all_expert_bytes
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_bytes = (2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * model.dtype.itemsize
                * args.requests * args.context)
    touched_bytes = [sum(k * b for k, b in zip(step, expert_bytes)) for step in touched_per_step]
    num_experts = blocks[0][2]
    touched_share = statistics.mean(statistics.mean(step) for step in touched_per_step) / num_experts
    bandwidth = copy_bandwidth_gbps(device) if device.type == "cuda" else float("nan")
    step_bytes = dense_bytes + statistics.median(touched_bytes) + kv_bytes
    result = {
        "model": args.model, "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "requests": args.requests,
        "prompt_tokens": args.prompt_tokens, "context": args.context, "decode_steps": args.decode_steps,
        "moe_layers": len(blocks), "experts_per_layer": num_experts,
        "experts_per_token": getattr(cfg, "num_experts_per_tok", None),
        "touched_share": touched_share,
        "touched_per_step_mean": [statistics.mean(s) for s in touched_per_step],
        "dense_bytes": dense_bytes, "expert_bytes_each": expert_bytes[0], "all_expert_bytes": all_expert_bytes,
        "touched_expert_bytes_median": statistics.median(touched_bytes), "kv_bytes": kv_bytes,
        "step_bytes": step_bytes, "copy_bandwidth_gbps": bandwidth,
        "floor_ms_per_step": step_bytes / (bandwidth * 1e9) * 1e3,
        "dense_floor_ms_per_step": (dense_bytes + all_expert_bytes + kv_bytes) / (bandwidth * 1e9) * 1e3,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "touched_per_step_mean"}, indent=1))


if __name__ == "__main__":
    main()
