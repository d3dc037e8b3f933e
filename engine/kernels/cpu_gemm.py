"""Prepacked weights for the CPU's GEMMs.

A decode step multiplies a few rows by every weight, so on a CPU it is a stream of weights through the cores. At 8
rows, MKL's sgemm (what `F.linear` runs) streamed SmolLM2-135M's 538 MB of float32 weights at 11 GB/s on a 2-core
VM, a quarter of what the memory gives a plain read (43 GB/s); oneDNN's linear on weights reordered once into its
blocked layout streamed them at 31 GB/s (benchmarks/cpu_gemm_stream.py, docs/BENCHMARKS.md (d)).

`pack_linears(model)` reorders each linear's weight once, after loading and merging (kernels.projections): plain
`nn.Linear` layers get a forward that runs oneDNN's linear on the packed copy, and merged q/k/v and gate/up
weights use it too. The packed copy is extra memory (the weights stay where transformers expects them), and each
output element is the same dot product in another summation order, as with the merged GEMMs.

oneDNN builds (JIT-compiles) a primitive for every input shape it meets and keeps it, in its own cache and in
ideep's, up to 1,024 shapes each: about 0.6 MB per row count and weight, so a server whose steps carried every
row count from 1 to a few hundred grew by 500 MB over a 2,000-request soak. So the rows it sees are few: up to 8
rows go as they are, more are padded to `padded_rows` (four sizes per doubling: 10, 12, 14, 16, 20, ..., 256, so
at most a quarter more rows and about 8% on average), and longer inputs run in pieces of `CHUNK_ROWS`: 28 row
counts per weight in all. Padding is not free (past 8 rows a step's GEMMs cost about 40 us per row on the 2-core
VM: they compute, not only stream), which is why the sizes are this close. The real rows do not change: oneDNN's
kernels for 2 rows and more reduce in one order, so here they came out bit for bit as unpadded (one row gets a
matrix-vector kernel that rounds differently, so a piece of one row is padded to two).
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

ROWS_HINT = 8           # the batch the reorder is tuned for: a decode step's few rows
CHUNK_ROWS = 256        # longer inputs run in pieces of this many rows (a piece rereads the weights once: a few %
                        # of its compute)


def padded_rows(rows: int) -> int:
    """The row count oneDNN is given for `rows` rows (at most CHUNK_ROWS): up to 8 as they are, then the next
    multiple of a quarter of the power of two at or above: 10, 12, 14, 16, 20, 24, 28, 32, 40, ..., 224, 256."""
    if rows <= 8:
        return rows
    step = 1 << ((rows - 1).bit_length() - 3)
    return -(-rows // step) * step


def available() -> bool:
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class PackedWeight:
    """A weight (and bias) in oneDNN's blocked layout, and the linear that reads it."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)
        self.bias = bias.detach() if bias is not None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[-2] if x.dim() > 1 else 0      # the model's (1, tokens, hidden), lm_head's (rows, hidden)
        if rows > CHUNK_ROWS:
            return torch.cat([self._piece(p) for p in x.split(CHUNK_ROWS, dim=-2)], dim=-2)
        padded = padded_rows(rows)
        if padded == rows:
            return _linear(x, self.packed, self.bias)
        return self._padded(x, rows, padded)

    def _piece(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[-2]
        padded = max(2, padded_rows(rows))      # a piece of one row would round unlike the rest of its input
        return _linear(x, self.packed, self.bias) if padded == rows else self._padded(x, rows, padded)

    def _padded(self, x: torch.Tensor, rows: int, padded: int) -> torch.Tensor:
        return _linear(F.pad(x, (0, 0, 0, padded - rows)), self.packed, self.bias).narrow(-2, 0, rows)


def _linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


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
