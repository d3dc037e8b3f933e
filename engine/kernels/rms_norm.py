"""RMSNorm in one Triton kernel, swapped into a transformers decoder's norm modules.

In eager PyTorch one RMSNorm is ~8 kernels (cast, square, mean, add, rsqrt, mul, cast, mul); in a batch-32 decode
step of Llama-3-8B these launches and the poorly parallel mean are a large share of the time spent outside the
GEMMs. `install_rms_norms(model)` gives every norm module whose class is in `RMS_NORM_CLASSES` and whose forward
is, op for op, `_rms_norm_eager` below a per-instance forward running `rms_norm` (the Qwen3 q/k norms over
head_dim too).

It reproduces transformers' rounding order (normalize in fp32, round to the input dtype, then multiply by the weight
in the promoted dtype): equal to the eager result except where the fp32 sum of squares, summed in another order,
flips the rounded normalized value by one ulp (rare in bf16; up to two ulps of the product after the weight).
Anything not covered (CPU tensors, autograd, other dtypes, odd strides) goes to the original forward. The kernel
allocates with torch.empty only and never reads a device value on the host, so it is CUDA-graph capturable.
"""
from __future__ import annotations

import types

import torch
import triton
import triton.language as tl

from .common import DTYPES, device_of, same_code, usable
from .dependent_launch import enter, launch_options

MAX_ROW = 16384            # longest RMSNorm row kept whole in registers; longer rows use the original forward

# Classes verified against transformers' source to compute exactly `_rms_norm_eager` (Gemma-style norms, which
# scale by 1 + weight, are not here). The bytecode check in `same_code` re-verifies each at install time.
RMS_NORM_CLASSES = frozenset({
    "LlamaRMSNorm", "MistralRMSNorm", "MixtralRMSNorm", "MinistralRMSNorm", "Qwen2RMSNorm", "Qwen2MoeRMSNorm",
    "Qwen3RMSNorm", "Qwen3MoeRMSNorm", "Phi3RMSNorm", "GraniteRMSNorm", "GraniteMoeRMSNorm", "OlmoeRMSNorm",
    "GlmRMSNorm", "Glm4RMSNorm", "SmolLM3RMSNorm", "SeedOssRMSNorm", "DeepseekV3RMSNorm", "Ernie4_5RMSNorm",
})


# What the kernel reproduces: transformers' RMSNorm forward, kept here to compare bytecode against.
def _rms_norm_eager(self, hidden_states):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)


# The token count changes every step: no specialisation on it (== 1, divisible by 16), so a new batch size never
# compiles a new kernel in the middle of serving. Strides follow the model's widths and stay specialised.
@triton.jit(do_not_specialize=["n_rows"])
def _rms_norm_kernel(x, w, out, n_rows, n_cols, inner, stride_outer, stride_inner, stride_out, eps,
                     BLOCK_N: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr):
    enter(PDL)
    # ROWS whole rows per program: a row of up to MAX_ROW elements stays in registers, so x is read once.
    # Row r of x sits at (r // inner) * stride_outer + (r % inner) * stride_inner: the heads of a q or k slice
    # of a merged q/k/v product (Qwen3's head norms) are rows too, read in place.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    mask = (rows < n_rows)[:, None] & col_ok[None, :]
    rows = rows.to(tl.int64)
    x_rows = (rows // inner) * stride_outer + (rows % inner) * stride_inner
    xv = tl.load(x + x_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    res = weighted_rms_norm(xv, w, cols, col_ok, n_cols, eps, x.dtype.element_ty)
    tl.store(out + rows[:, None] * stride_out + cols[None, :], res.to(out.dtype.element_ty), mask=mask)


@triton.jit
def weighted_rms_norm(xv, w, cols, col_ok, n_cols, eps, X_DTYPE: tl.constexpr):
    """transformers' RMSNorm of fp32 rows `xv` (their values in X_DTYPE), in fp32, to be rounded once to the
    output dtype by the caller's store."""
    variance = tl.sum(xv * xv, axis=1) / n_cols
    normed = xv * tl.math.rsqrt(variance + eps)[:, None]
    # transformers rounds the normalized row to the input dtype before the weight multiply
    normed = normed.to(X_DTYPE).to(tl.float32)
    wv = tl.load(w + cols, mask=col_ok, other=0.0).to(tl.float32)
    # both factors have <= 11-bit mantissas (or the output is fp32): the fp32 product is the exact one, and a
    # single rounding to the output dtype gives what the eager dtype-promoted multiply gives
    return wv[None, :] * normed


def rms_norm_launch_config(n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_N, ROWS, num_warps): about 2k elements per program for short rows (Qwen3 head norms), one row and
    up to 16 warps (8 elements, one 16-byte bf16 load, per thread at hidden 4096) for long ones."""
    block_n = triton.next_power_of_2(n_cols)
    rows = max(1, min(16, 2048 // block_n))
    num_warps = max(1, min(16, block_n * rows // 256))
    return block_n, rows, num_warps


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """`weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)` over the last dim, in one kernel; None when the
    inputs are not covered (the caller then runs the eager code)."""
    n = x.shape[-1] if x.dim() else 0
    if (not usable(x) or weight.device != x.device or weight.dtype not in DTYPES or weight.dim() != 1
            or weight.shape[0] != n or not 0 < n <= MAX_ROW or x.stride(-1) != 1
            or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))):
        return None
    rows = _row_layout(x)
    if rows is None or not weight.is_contiguous():
        return None
    inner, stride_outer, stride_inner = rows
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    m = x.numel() // n
    if m == 0:
        return out
    block_n, per_prog, num_warps = rms_norm_launch_config(n)
    with device_of(x):
        _rms_norm_kernel[(triton.cdiv(m, per_prog),)](
            x, weight, out, m, n, inner, stride_outer, stride_inner, n, float(eps), BLOCK_N=block_n,
            ROWS=per_prog, num_warps=num_warps, **launch_options(x.device))
    return out


def _row_layout(x: torch.Tensor) -> tuple[int, int, int] | None:
    """(inner, stride_outer, stride_inner) such that row r of x (its last dim) starts at
    (r // inner) * stride_outer + (r % inner) * stride_inner; None for layouts that do not fit."""
    n = x.shape[-1]
    try:
        return 1, x.view(-1, n).stride(0), 0        # every leading layout that flattens to evenly strided rows
    except RuntimeError:
        pass
    try:                                            # heads of a sliced [tokens, heads, head_dim] view
        heads = x.view(-1, x.shape[-2], n)
    except (RuntimeError, IndexError):
        return None
    return heads.shape[1], heads.stride(0), heads.stride(1)


def is_fused_norm(module) -> bool:
    """Whether `module` runs the fused RMSNorm forward installed here."""
    return getattr(getattr(module, "__dict__", {}).get("forward"), "__func__", None) is _fused_rms_norm_forward


def _version(t: torch.Tensor) -> int | None:
    """The in-place-change counter; inference tensors keep none (kernels.residual_norm then guarantees that nothing
    changes the tensor between `leave_ahead` and the norm's call)."""
    return None if t.is_inference() else t._version


def leave_ahead(norm, x: torch.Tensor, normed: torch.Tensor) -> None:
    """Give a fused norm its output on `x`, computed elsewhere (with the add that made x, kernels.residual_norm):
    its next call returns it if that call is on this very tensor, unchanged."""
    norm.batchscope_ahead = (x, _version(x), normed)


def _fused_rms_norm_forward(self, hidden_states):
    ahead = self.__dict__.get("batchscope_ahead")
    if ahead is not None:
        self.batchscope_ahead = None
        if ahead[0] is hidden_states and ahead[1] == _version(hidden_states):
            return ahead[2]
    out = rms_norm(hidden_states, self.weight, self.variance_epsilon)
    return out if out is not None else type(self).forward(self, hidden_states)


def install_rms_norms(model: torch.nn.Module) -> list[str]:
    """Give each covered norm module the fused forward; returns the modules done. Idempotent: an instance-level
    forward (a hook wrapper, or one already fused) is left alone."""
    patched: list[str] = []
    for name, module in model.named_modules():
        cls = type(module)
        if cls.__name__ not in RMS_NORM_CLASSES or "forward" in module.__dict__:
            continue
        if not (same_code(cls.forward, _rms_norm_eager) and isinstance(getattr(module, "weight", None),
                                                                         torch.Tensor)
                and isinstance(getattr(module, "variance_epsilon", None), float)):
            continue
        module.forward = types.MethodType(_fused_rms_norm_forward, module)
        patched.append(f"{name or '<root>'} ({cls.__name__})")
    return patched


def uninstall_rms_norms(model: torch.nn.Module) -> None:
    """Give `model`'s norms their original forwards back, and drop any result left ahead for them."""
    for module in model.modules():
        if is_fused_norm(module):
            del module.forward
        module.__dict__.pop("batchscope_ahead", None)
