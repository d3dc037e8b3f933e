"""Rotary embedding on q and k in one Triton kernel, swapped into the transformers modeling files a model uses.

In eager PyTorch rotary on q and k is ~10 kernels (slices, neg, cat, muls, adds). `install_rotary(model)` replaces
the module-level `apply_rotary_pos_emb` of each modeling file the model uses by `apply_rotary`, where that
function and its `rotate_half` are, op for op, `_rotary_eager` and `_rotate_half_eager` below (Llama, Qwen2/3,
Mistral, Mixtral, Qwen3-MoE and their kin). Each product and the sum are rounded in the output dtype as the eager
ops round them: the result matches bit for bit. Inputs not covered go to the original function. The patch is
per modeling module, so it applies to every model of that family in the process.
"""
from __future__ import annotations

import importlib

import torch
import triton
import triton.language as tl

from .common import device_of, same_code, usable
from .dependent_launch import enter, launch_options


# What the kernel reproduces: transformers' rotary functions, kept here to compare bytecode against.
def _rotate_half_eager(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def _rotary_eager(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)  # noqa: F821 (a global of the modeling file)
    k_embed = (k * cos) + (rotate_half(k) * sin)  # noqa: F821
    return q_embed, k_embed


@triton.jit
def _rotate_heads(src, dst, cos_row, sin_row, h0, n_heads, stride_sh, stride_dh,
                  HALF: tl.constexpr, HALF_PAD: tl.constexpr, BLOCK_H: tl.constexpr):
    # out[:half] = x1*cos1 - x2*sin1 and out[half:] = x2*cos2 + x1*sin2 (rotate_half is cat(-x2, x1)), with each
    # product and the sum rounded to the output dtype, as the eager ops do
    heads = h0 + tl.arange(0, BLOCK_H)
    j = tl.arange(0, HALF_PAD)
    j_ok = j < HALF
    mask = (heads < n_heads)[:, None] & j_ok[None, :]
    heads = heads.to(tl.int64)
    s = src + heads[:, None] * stride_sh + j[None, :]
    x1 = tl.load(s, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(s + HALF, mask=mask, other=0.0).to(tl.float32)
    c1 = tl.load(cos_row + j, mask=j_ok, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(cos_row + HALF + j, mask=j_ok, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(sin_row + j, mask=j_ok, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(sin_row + HALF + j, mask=j_ok, other=0.0).to(tl.float32)[None, :]
    ty = dst.dtype.element_ty
    lo = (x1 * c1).to(ty).to(tl.float32) + (-x2 * s1).to(ty).to(tl.float32)
    hi = (x2 * c2).to(ty).to(tl.float32) + (x1 * s2).to(ty).to(tl.float32)
    d = dst + heads[:, None] * stride_dh + j[None, :]
    tl.store(d, lo.to(ty), mask=mask)
    tl.store(d + HALF, hi.to(ty), mask=mask)


@triton.jit(do_not_specialize=["seq_len"])   # the token count changes every step (see rms_norm._rms_norm_kernel)
def _rotary_kernel(q, k, cos, sin, q_out, k_out, seq_len, q_heads, k_heads,
                   sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, oq_b, oq_h, oq_t, ok_b, ok_h, ok_t,
                   sc_b, sc_t, ss_b, ss_t,
                   HALF: tl.constexpr, HALF_PAD: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr):
    # grid: (batch * seq_len, q head blocks + k head blocks); q and k share one launch and one cos/sin row
    enter(PDL)
    b = (tl.program_id(0) // seq_len).to(tl.int64)   # int64 offsets: long prefills pass 2**31 elements
    t = (tl.program_id(0) % seq_len).to(tl.int64)
    hb = tl.program_id(1)
    q_blocks = tl.cdiv(q_heads, BLOCK_H)
    cos_row = cos + b * sc_b + t * sc_t
    sin_row = sin + b * ss_b + t * ss_t
    if hb < q_blocks:
        _rotate_heads(q + b * sq_b + t * sq_t, q_out + b * oq_b + t * oq_t, cos_row, sin_row,
                      hb * BLOCK_H, q_heads, sq_h, oq_h, HALF, HALF_PAD, BLOCK_H)
    else:
        _rotate_heads(k + b * sk_b + t * sk_t, k_out + b * ok_b + t * ok_t, cos_row, sin_row,
                      (hb - q_blocks) * BLOCK_H, k_heads, sk_h, ok_h, HALF, HALF_PAD, BLOCK_H)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor] | None:
    """transformers' apply_rotary_pos_emb for q [B, Hq, T, D], k [B, Hk, T, D] and cos/sin [B or 1, T, D]
    (unsqueeze_dim=1; unsqueeze_dim=2 takes [B, T, H, D]) in one kernel; outputs keep the layout of q and k.
    None when not covered."""
    if unsqueeze_dim == 2 and q.dim() == 4 and k.dim() == 4:
        res = apply_rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin, 1)
        return None if res is None else (res[0].transpose(1, 2), res[1].transpose(1, 2))
    if (unsqueeze_dim != 1 or q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or sin.shape != cos.shape
            or not (usable(q) and usable(k) and usable(cos) and usable(sin))
            or len({q.device, k.device, cos.device, sin.device}) != 1 or q.dtype != k.dtype
            or cos.dtype != sin.dtype):
        return None
    B, Hq, T, D = q.shape
    if (k.shape[0] != B or k.shape[2:] != (T, D) or D % 2 or cos.shape[1:] != (T, D) or cos.shape[0] not in (1, B)
            or any(t.stride(-1) != 1 for t in (q, k, cos, sin))
            or (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, cos, sin)))):
        return None
    out_dtype = torch.promote_types(q.dtype, cos.dtype)
    q_out = torch.empty_like(q, dtype=out_dtype)   # keeps q's strides, as the eager elementwise ops do
    k_out = torch.empty_like(k, dtype=out_dtype)
    Hk = k.shape[1]
    if q.numel() == 0 and k.numel() == 0:
        return q_out, k_out
    half = D // 2
    half_pad = triton.next_power_of_2(half)
    block_h = max(1, min(16, 512 // half_pad))           # ~1k elements per program for head_dim 128
    block_h = min(block_h, triton.next_power_of_2(max(Hq, Hk, 1)))
    grid = (B * T, triton.cdiv(Hq, block_h) + triton.cdiv(Hk, block_h))
    bc = 0 if cos.shape[0] == 1 else 1                   # a batch-1 cos/sin broadcasts over q's batch
    with device_of(q):
        _rotary_kernel[grid](
            q, k, cos, sin, q_out, k_out, T, Hq, Hk,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            q_out.stride(0), q_out.stride(1), q_out.stride(2), k_out.stride(0), k_out.stride(1), k_out.stride(2),
            cos.stride(0) * bc, cos.stride(1), sin.stride(0) * bc, sin.stride(1),
            HALF=half, HALF_PAD=half_pad, BLOCK_H=block_h, num_warps=4 if block_h * half_pad >= 512 else 2,
            # fp32: no mul+add -> fma contraction; the eager ops round the product first
            enable_fp_fusion=False, **launch_options(q.device))
    return q_out, k_out


def _make_rotary(original):
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        res = apply_rotary(q, k, cos, sin, unsqueeze_dim)
        return res if res is not None else original(q, k, cos, sin, unsqueeze_dim)
    apply_rotary_pos_emb.__doc__ = original.__doc__
    apply_rotary_pos_emb.batchscope_original = original
    return apply_rotary_pos_emb


_PATCHED_MODULES: dict[str, object] = {}   # modeling module name -> its original apply_rotary_pos_emb


def install_rotary(model: torch.nn.Module) -> list[str]:
    """Patch the rotary of every transformers modeling module `model` uses, where it is the covered code;
    returns the functions patched (already patched ones too). Idempotent."""
    patched: list[str] = []
    for mod_name in sorted({type(m).__module__ for m in model.modules()}):
        if not mod_name.startswith("transformers.models."):
            continue
        mod = importlib.import_module(mod_name)
        fn = getattr(mod, "apply_rotary_pos_emb", None)
        if mod_name not in _PATCHED_MODULES:
            if not (same_code(fn, _rotary_eager)
                    and same_code(getattr(mod, "rotate_half", None), _rotate_half_eager)):
                continue
            _PATCHED_MODULES[mod_name] = fn
            mod.apply_rotary_pos_emb = _make_rotary(fn)
        patched.append(f"{mod_name}.apply_rotary_pos_emb")
    return patched


def uninstall_rotary() -> None:
    """Give every patched modeling module its original rotary back."""
    for mod_name, original in list(_PATCHED_MODULES.items()):
        importlib.import_module(mod_name).apply_rotary_pos_emb = original
        del _PATCHED_MODULES[mod_name]
