"""SiLU(gate) * up in one Triton kernel, on the merged gate/up product of engine.kernels.projections (and the
fused experts of engine.kernels.moe). Rounded as the eager ops round: silu in fp32, rounded to the dtype; the product
in fp32, rounded again."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import device_of, usable
from .dependent_launch import enter, launch_options


@triton.jit(do_not_specialize=["n_rows"])   # the token count changes every step (see rms_norm._rms_norm_kernel)
def _silu_mul_kernel(gate_up, out, n_rows, n_cols, stride_in, stride_out, BLOCK: tl.constexpr,
                     PDL: tl.constexpr):
    enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_cols
    g = tl.load(gate_up + row * stride_in + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gate_up + row * stride_in + n_cols + cols, mask=ok, other=0.0).to(tl.float32)
    ty = out.dtype.element_ty
    # as the eager ops round: silu in fp32, rounded to the dtype; the product in fp32, rounded again
    act = (g / (1.0 + tl.exp(-g))).to(ty).to(tl.float32)
    tl.store(out + row * stride_out + cols, (act * u).to(ty), mask=ok)


def silu_mul(gate_up: torch.Tensor, split: int) -> torch.Tensor | None:
    """`silu(gate_up[..., :split]) * gate_up[..., split:]` in one kernel, for a gate/up product whose halves are
    equal; None when not covered (the caller runs the eager ops)."""
    n = gate_up.shape[-1] if gate_up.dim() else 0
    if (not usable(gate_up) or n != 2 * split or split == 0 or gate_up.stride(-1) != 1
            or (torch.is_grad_enabled() and gate_up.requires_grad)):
        return None
    try:
        rows = gate_up.view(-1, n)
    except RuntimeError:
        return None
    out = torch.empty((*gate_up.shape[:-1], split), dtype=gate_up.dtype, device=gate_up.device)
    if rows.shape[0] == 0:
        return out
    block = min(1024, triton.next_power_of_2(split))
    with device_of(gate_up):
        _silu_mul_kernel[(rows.shape[0], triton.cdiv(split, block))](
            rows, out, rows.shape[0], split, rows.stride(0), split, BLOCK=block, num_warps=4,
            **launch_options(gate_up.device))
    return out

