"""Mixture-of-experts dispatch: which of a model's configs pick its expert modules' forward (transformers'
experts interface), switching that choice for a while, and which choice a CUDA graph can capture."""
from __future__ import annotations

import contextlib

import torch

# Capture-safe expert dispatch for MoE decoders built on transformers' experts interface: one batched GEMM over
# the gathered weights of each (token, expert) pair, no host sync and no data-dependent shape. The default,
# grouped_mm, is used wherever it is capture-safe itself (bf16 on Hopper); in float32 it falls back to a loop
# over the host-side group offsets (a device-to-host copy), which ends any capture. In bf16/fp16 the decode
# graphs first try batchscope's fused expert GEMMs (kernels/moe.py), which read each touched expert once.
GRAPH_SAFE_EXPERTS = "batched_mm"


def fused_experts_fit(model: torch.nn.Module) -> bool:
    """Whether the decode graphs may use kernels.moe's fused experts: CUDA, bf16/fp16, Triton, and every experts
    module in the layout the fused forward reproduces."""
    from ..kernels import moe as fused_moe

    experts = [m for m in model.modules() if hasattr(m, "has_gate") and hasattr(m, "is_concatenated")]
    dtype = next(model.parameters()).dtype
    return (bool(experts) and fused_moe.available() and dtype in (torch.bfloat16, torch.float16)
            and all(m.gate_up_proj.is_cuda and fused_moe.supports(m) for m in experts if hasattr(m, "gate_up_proj"))
            and all(hasattr(m, "gate_up_proj") for m in experts) and fused_moe.register())


def experts_configs(model: torch.nn.Module) -> list:
    """The configs whose `_experts_implementation` picks the forward of the model's expert modules (those
    wrapped by transformers' `use_experts_implementation`)."""
    seen: dict[int, object] = {}
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(m, "has_gate") and hasattr(m, "is_concatenated") \
                and hasattr(type(m), "_apply_gate") and hasattr(cfg, "_experts_implementation_internal"):
            seen.setdefault(id(cfg), cfg)
    return list(seen.values())


@contextlib.contextmanager
def experts_implementation(configs: list, name: str | None):
    """Run the experts with `name` for the duration (None: leave them alone)."""
    if name is None or not configs:
        yield
        return
    before = [cfg._experts_implementation_internal for cfg in configs]
    for cfg in configs:
        cfg._experts_implementation_internal = name
    try:
        yield
    finally:
        for cfg, impl in zip(configs, before):
            cfg._experts_implementation_internal = impl
