"""Merged projections: one GEMM for q/k/v and one for gate/up in every decoder layer.

A batch-32 decode step multiplies 32 rows by each weight matrix, so each GEMM is bound by streaming its weight
from memory, and small weights stream badly: on an H200 the separate k and v projections of Llama-3-8B (8 MB
each) reach well under half of the copy bandwidth, and every extra GEMM is one more launch (on CPU, one more
under-threaded call). `merge_projections(model)` concatenates sibling weights once, after loading:

- attention modules with `q_proj`, `k_proj`, `v_proj` (plain `nn.Linear`, same input): `q_proj` computes the
  product with the merged weight and keeps it; `k_proj` and `v_proj`, called next on the same input tensor,
  return their slices of it. Called on any other input, each projection computes its own product as before, so
  a model that calls them differently stays correct.
- MLP modules whose forward is, op for op, `_mlp_eager` below: one GEMM on the merged gate/up weight, the
  activation times the up half (one fused kernel on CUDA, see `kernels.silu_mul`), then `down_proj`.

The original parameters become views into the merged weights, so no memory is added and `state_dict` is
unchanged. Each output element is the same dot product as before; only the GEMM's blocking changes.
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

from .common import same_code


def _mlp_eager(self, x):
    down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
    return down_proj


class MergedWeight:
    """The concatenated weight (and bias) of sibling projections, and the last product, which the later
    siblings slice while the input is the same tensor."""

    def __init__(self, layers: list[nn.Linear]):
        self.weight = torch.cat([m.weight.detach() for m in layers])
        has_bias = layers[0].bias is not None
        self.bias = torch.cat([m.bias.detach() for m in layers]) if has_bias else None
        self.bounds = []
        start = 0
        for m in layers:   # the originals become views: same memory, same state_dict
            end = start + m.out_features
            m.weight = nn.Parameter(self.weight[start:end], requires_grad=False)
            if has_bias:
                m.bias = nn.Parameter(self.bias[start:end], requires_grad=False)
            self.bounds.append((start, end))
            start = end
        self.last: tuple[torch.Tensor, torch.Tensor] | None = None
        self.packed = None          # on a CPU, the merged weight prepacked for oneDNN (kernels.cpu_gemm)
        self.skinny = None          # on CUDA, the few-row decode kernel where it beats cuBLAS (kernels.skinny_gemm)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None and x.device.type == "cpu" and x.dtype == torch.float32:
            return self.packed(x)
        if self.skinny is not None:
            out = self.skinny.linear(x)
            if out is not None:
                return out
        return F.linear(x, self.weight, self.bias)


def _lead_forward(self, x):
    merged: MergedWeight = self.batchscope_merged
    out = merged(x)
    merged.last = (x, out)
    start, end = merged.bounds[0]
    return out[..., start:end]


def _sibling_forward(self, x):
    merged: MergedWeight = self.batchscope_merged
    last = merged.last
    if last is None or last[0] is not x:
        return F.linear(x, self.weight, self.bias)
    start, end = merged.bounds[self.batchscope_part]
    if end == merged.weight.shape[0]:
        merged.last = None          # the last sibling: release the product
    return last[1][..., start:end]


def _merged_mlp_forward(self, x):
    merged: MergedWeight = self.batchscope_merged
    gate_up = merged(x)
    split = merged.bounds[0][1]
    hidden = self.batchscope_silu(gate_up, split) if self.batchscope_silu else None
    if hidden is None:
        hidden = self.act_fn(gate_up[..., :split]) * gate_up[..., split:]
    return self.down_proj(hidden)


def _plain_linears(*modules) -> bool:
    if not all(type(m) is nn.Linear for m in modules):
        return False
    w = modules[0].weight
    return all(m.in_features == modules[0].in_features and m.weight.dtype == w.dtype
               and m.weight.device == w.device and (m.bias is None) == (modules[0].bias is None)
               for m in modules)


def is_silu(act) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ in ("SiLUActivation", "SiLU")


def merge_projections(model: nn.Module, fused_silu: bool = False) -> list[str]:
    """Merge q/k/v and gate/up weights in place; returns what was merged. `fused_silu`: run SiLU(gate) * up as
    one Triton kernel (CUDA tensors only; the eager ops otherwise). Idempotent."""
    merged: list[str] = []
    silu_mul = None
    if fused_silu:
        from .silu_mul import silu_mul    # lazy: Triton kernels compile only where they run
    for name, module in model.named_modules():
        if "forward" in module.__dict__:
            continue    # an instance-level forward (a hook wrapper, or already merged) is left alone
        qkv = [getattr(module, p, None) for p in ("q_proj", "k_proj", "v_proj")]
        if all(isinstance(m, nn.Module) for m in qkv) and _plain_linears(*qkv) and not any(
                "forward" in m.__dict__ for m in qkv):
            weights = MergedWeight(qkv)
            for part, proj in enumerate(qkv):
                proj.batchscope_merged, proj.batchscope_part = weights, part
                proj.forward = types.MethodType(_sibling_forward if part else _lead_forward, proj)
            merged.append(f"{name} (q/k/v)")
        gate, up, down = (getattr(module, p, None) for p in ("gate_proj", "up_proj", "down_proj"))
        if (isinstance(gate, nn.Module) and isinstance(up, nn.Module) and isinstance(down, nn.Module)
                and _plain_linears(gate, up) and same_code(type(module).forward, _mlp_eager)):
            module.batchscope_merged = MergedWeight([gate, up])
            module.batchscope_silu = silu_mul if silu_mul and is_silu(getattr(module, "act_fn", None)) else None
            module.forward = types.MethodType(_merged_mlp_forward, module)
            merged.append(f"{name} (gate/up)")
    return merged
