"""Rotary embedding on q and k in one Triton kernel, swapped into the attention modules of one loaded model.

In eager PyTorch rotary on q and k is ~10 kernels (slices, neg, cat, muls, adds). `install_rotary(model)` makes
each attention module of `model` call `apply_rotary` instead of its modeling file's `apply_rotary_pos_emb`, where
that function and its `rotate_half` are, op for op, `_rotary_eager` and `_rotate_half_eager` below (Llama,
Qwen2/3, Mistral, Mixtral, Qwen3-MoE and their kin). Each product and the sum are rounded in the output dtype as the
eager ops round them: the result matches bit for bit. Inputs not covered go to the original function.

The swap is per model, at one of two depths, whichever transformers offers:
- with the `kernels` package installed (transformers 5.25 requires it), each attention class decorated
  `use_kernelized_func(apply_rotary_pos_emb)` holds a private rotary object per instance; that object gets our
  forward, as `kernels.kernelize` gives it a hub kernel's (nothing is downloaded: the kernel is ours);
- otherwise the attention forward reads the module-level function: the instance gets the class's own forward code
  with the fused rotary in its globals.
No module global changes, so transformers' own models in the same process (the bench's baseline) keep theirs.
"""
from __future__ import annotations

import inspect
import types

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


_NAME = "apply_rotary_pos_emb"   # transformers' rotary, in every modeling file that has one


def _fused(original):
    """transformers' rotary through the kernel, falling back to `original` for inputs the kernel does not cover."""
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        res = apply_rotary(q, k, cos, sin, unsqueeze_dim)
        return res if res is not None else original(q, k, cos, sin, unsqueeze_dim)
    apply_rotary_pos_emb.__doc__ = original.__doc__
    apply_rotary_pos_emb.batchscope_original = original
    return apply_rotary_pos_emb


def _fused_method(original):
    """The same as a method, for the private rotary object transformers' `kernels` integration gives each attention
    module (the hook `kernels.kernelize` itself uses: an instance `forward`)."""
    fused = _fused(original)

    def forward(self, q, k, cos, sin, unsqueeze_dim=1):
        return fused(q, k, cos, sin, unsqueeze_dim)
    forward.batchscope_original = original
    return forward


def _plain_function(obj):
    """The function behind transformers' rotary: the module global itself, or, where the `kernels` package turned it
    into a module (`use_kernel_forward_from_hub`), the function that module wraps (see compat.py)."""
    if inspect.isfunction(obj):
        return obj
    forward = getattr(type(obj), "forward", None)
    if obj is None or not inspect.isfunction(forward):
        return None
    wrapped = inspect.getclosurevars(forward).nonlocals.get("func")
    return wrapped if inspect.isfunction(wrapped) else None


def _covered(fn) -> str | None:
    """None where `fn` is the rotary the kernel reproduces (and calls the rotate_half it reproduces), else why not."""
    if fn is None:
        return "its apply_rotary_pos_emb is neither a function nor a kernels module around one"
    if not same_code(fn, _rotary_eager):
        return f"{fn.__module__}.apply_rotary_pos_emb is not the rotary the kernel reproduces"
    if not same_code(fn.__globals__.get("rotate_half"), _rotate_half_eager):
        return f"{fn.__module__}.rotate_half is not the one the kernel reproduces"
    return None


def _swap_private(module: torch.nn.Module) -> tuple[str | None, str | None]:
    """transformers 5.x with `kernels` installed: an attention class decorated
    `use_kernelized_func(apply_rotary_pos_emb)` gives each instance its own rotary object in `_kernel_funcs`, which
    its forward routes the global call to. Give that object our forward. Returns (the modeling module patched, why
    not); (None, None) where there is no such hook."""
    private = _private_rotary(module)
    if private is None:
        return None, None
    fn = _plain_function(private)
    why = _covered(fn)
    if why:
        return None, f"{type(module).__name__}: {why}"
    current = private.__dict__.get("forward")
    if current is None:
        private.forward = types.MethodType(_fused_method(fn), private)
    elif not _ours(current, "batchscope_original"):
        return None, f"{type(module).__name__}: its rotary was already replaced (kernels.kernelize?)"
    return fn.__module__, None


def _private_rotary(module: torch.nn.Module):
    """The attention module's own rotary object from the `kernels` integration (keyed by its hub layer name,
    "rotary_pos_emb" today), or None."""
    funcs = module.__dict__.get("_kernel_funcs")
    for obj in funcs.values() if isinstance(funcs, dict) else ():
        fn = _plain_function(obj)
        if fn is not None and fn.__name__ == _NAME:
            return obj
    return None


def _ours(method, mark: str) -> bool:
    return hasattr(getattr(method, "__func__", None), mark)


_FORWARDS: dict[type, types.FunctionType] = {}   # attention class -> its forward reading the fused rotary


def _innermost(fn):
    """The function under a stack of functools.wraps decorators (transformers wraps some forwards in
    `deprecate_kwarg`)."""
    while inspect.isfunction(getattr(fn, "__wrapped__", None)):
        fn = fn.__wrapped__
    return fn


def _with_global(fn, name: str, value):
    """A copy of `fn` whose code reads `value` for the global `name`; decorators made with functools.wraps are
    rebuilt around the copy (the closure cell holding the wrapped function swapped). None where that cannot be."""
    inner = getattr(fn, "__wrapped__", None)
    if inner is None:
        new = types.FunctionType(fn.__code__, {**fn.__globals__, name: value}, fn.__name__, fn.__defaults__,
                                 fn.__closure__)
    else:
        new_inner = _with_global(inner, name, value) if inspect.isfunction(inner) else None
        cells = fn.__closure__ or ()
        holds = [_cell_holds(c, inner) for c in cells]
        if new_inner is None or not any(holds):
            return None
        closure = tuple(types.CellType(new_inner) if h else c for c, h in zip(cells, holds))
        new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__dict__.update(fn.__dict__)
    if inner is not None:
        new.__wrapped__ = new_inner
    return new


def _cell_holds(cell, obj) -> bool:
    try:
        return cell.cell_contents is obj
    except ValueError:          # an empty cell
        return False


def _swap_global(module: torch.nn.Module) -> tuple[str | None, str | None]:
    """An attention forward that calls its modeling file's module-level rotary: give this instance a forward whose
    globals name the fused rotary instead (the code and everything else it reads are the class's own), so that other
    models of the family in the process, transformers' own among them, keep the original."""
    forward = type(module).forward
    code = getattr(_innermost(forward), "__code__", None)
    if code is None or _NAME not in code.co_names:
        return None, None
    fn = _plain_function(_innermost(forward).__globals__.get(_NAME))
    why = _covered(fn)
    if why:
        return None, f"{type(module).__name__}: {why}"
    current = module.__dict__.get("forward")
    if current is not None and not _ours(current, "batchscope_rotary"):
        return None, f"{type(module).__name__}: its forward was already replaced"
    if current is None:
        own = _FORWARDS.get(type(module))
        if own is None:
            own = _with_global(forward, _NAME, _fused(fn))
            if own is None:
                return None, f"{type(module).__name__}: its forward is wrapped in a way batchscope cannot rebuild"
            own.batchscope_rotary = True
            _FORWARDS[type(module)] = own
        module.forward = types.MethodType(own, module)
    return fn.__module__, None


def install_rotary(model: torch.nn.Module, skipped: list[str] | None = None) -> list[str]:
    """Route the rotary of each attention module of `model` (only this model: no module global is rewritten)
    through the kernel, where transformers' code is, op for op, the covered one. Returns the modeling modules
    patched; appends to `skipped` why an attention module that applies a rotary was left alone. Idempotent."""
    patched: set[str] = set()
    reasons: set[str] = set()
    for module in model.modules():
        if not type(module).__module__.startswith("transformers.models."):
            continue
        done, why = _swap_private(module)
        if done is None and why is None:
            done, why = _swap_global(module)
        if done:
            patched.add(f"{done}.{_NAME}")
        if why:
            reasons.add(f"rotary not fused for {why}")
    if skipped is not None:
        skipped.extend(sorted(reasons))
    return sorted(patched)


def uninstall_rotary(model: torch.nn.Module) -> None:
    """Give every attention module of `model` transformers' own rotary back."""
    for module in model.modules():
        private = _private_rotary(module)
        if private is not None and _ours(private.__dict__.get("forward"), "batchscope_original"):
            del private.forward
        if _ours(module.__dict__.get("forward"), "batchscope_rotary"):
            del module.forward
