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
ideep's, up to 1,024 shapes each: about half a MB per shape, so a server whose steps carry every row count from 1
to a few hundred grew by 500 MB over a 2,000-request soak. So the rows it sees are few: inputs are padded to
`padded_rows` (multiples of 8 up to 64 rows, four sizes per doubling up to `CHUNK_ROWS`) and longer ones run in
pieces of `CHUNK_ROWS`, 17 shapes per weight in all. A padded row is free where it matters (a decode step streams
the weights whatever its few rows), and the real rows do not change: oneDNN's kernels for 2 rows and more reduce in
one order, so here they came out bit for bit as unpadded. One row is left alone (it gets a matrix-vector kernel
of its own, which rounds differently).
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

ROWS_HINT = 8           # the batch the reorder is tuned for: a decode step's few rows
CHUNK_ROWS = 256        # longer inputs run in pieces of this many rows (compute-bound there: a piece rereads the
                        # weights once, a few % of its time)


def padded_rows(rows: int) -> int:
    """The row count oneDNN is given for `rows` rows (at most CHUNK_ROWS): 0 and 1 as they are, then the next
    multiple of 8 up to 64, then of a quarter of the power of two at or above (80, 96, ..., 128, 160, ..., 256)."""
    if rows <= 1:
        return rows
    if rows <= 64:
        return -(-rows // 8) * 8
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
        flat = x.reshape(-1, x.shape[-1])
        rows = flat.shape[0]
        if rows <= CHUNK_ROWS:
            out = self._rows(flat)
        else:
            out = torch.cat([self._rows(flat[i:i + CHUNK_ROWS]) for i in range(0, rows, CHUNK_ROWS)])
        return out.reshape(*x.shape[:-1], out.shape[-1])

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        pad = padded_rows(rows) - rows
        if not pad:
            return _linear(x, self.packed, self.bias)
        return _linear(F.pad(x, (0, 0, 0, pad)), self.packed, self.bias)[:rows]


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
