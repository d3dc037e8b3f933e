"""Prepacked weights for the CPU's GEMMs.

A decode step multiplies a few rows by every weight, so on a CPU it is a stream of weights through the cores. At 8
rows, MKL's sgemm (what `F.linear` runs) streamed SmolLM2-135M's 538 MB of float32 weights at 11 GB/s on a 2-core
VM, a quarter of what the memory gives a plain read (43 GB/s); oneDNN's linear on weights reordered once into its
blocked layout streamed them at 31 GB/s (benchmarks/cpu_gemm_stream.py, docs/BENCHMARKS.md (d)).

`pack_linears(model)` reorders each linear's weight once, after loading and merging (kernels.projections): plain
`nn.Linear` layers get a forward that runs oneDNN's linear on the packed copy, and merged q/k/v and gate/up
weights use it too. The packed copy is extra memory (the weights stay where transformers expects them), and each
output element is the same dot product in another summation order, as with the merged GEMMs.
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

ROWS_HINT = 8           # the batch the reorder is tuned for: a decode step's few rows


def available() -> bool:
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class PackedWeight:
    """A weight (and bias) in oneDNN's blocked layout, and the linear that reads it."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)
        self.bias = bias.detach() if bias is not None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def _packed_forward(self, x):
    if x.dtype != torch.float32 or x.device.type != "cpu":
        return F.linear(x, self.weight, self.bias)
    return self.batchscope_packed(x)


def pack_linears(model: nn.Module) -> list[str]:
    """Pack every float32 CPU linear of the model (merged projections included); returns what was packed."""
    if not available():
        return []
    packed: list[str] = []
    merged = {}                 # id -> (a module's name, its MergedWeight)
    for name, module in model.named_modules():
        m = getattr(module, "batchscope_merged", None)
        if m is not None and id(m) not in merged:
            merged[id(m)] = (name, m)
    for name, m in merged.values():
        if _packable(m.weight):
            m.packed = PackedWeight(m.weight, m.bias)
            packed.append(f"{name} (merged)")
    # the parts of a merged weight (gate_proj, up_proj) are read only through it: no packed copy of their own
    merged_storage = {m.weight.untyped_storage().data_ptr() for _, m in merged.values()}
    for name, module in model.named_modules():
        if (type(module) is nn.Linear and "forward" not in module.__dict__ and _packable(module.weight)
                and module.weight.untyped_storage().data_ptr() not in merged_storage):
            module.batchscope_packed = PackedWeight(module.weight, module.bias)
            module.forward = types.MethodType(_packed_forward, module)
            packed.append(name)
    return packed


def _packable(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.dim() == 2
