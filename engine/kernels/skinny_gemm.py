"""Decode GEMMs with few rows: `x @ w.T` for a handful of token rows, streamed at close to copy bandwidth.

A decode step at batch 32 multiplies 32 rows by every weight matrix: each GEMM is bound by reading its weight
once. cuBLAS picks tiles made for many rows; on an H200 the small Llama-3-8B projections (merged q/k/v, o: 32-48
MB) stream at about 70% of copy bandwidth and the down projection adds a split-K reduction kernel. Here each
program owns BLOCK_N whole weight rows and streams them with a deep pipeline; the token rows (at most BLOCK_M,
padded) ride along. Where a matrix has too few row tiles to fill the GPU, the K dimension is split and the last
program of each tile to finish sums the partial tiles in a fixed order (so results do not change from run to run)
and writes the output: no second kernel.

The sum of each output element runs in fp32 over K in another order than cuBLAS's, so outputs can differ from
`F.linear` in the last bit, as they can between two cuBLAS kernels chosen for different row counts.
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .common import device_of, interpreted, sm_count, usable
from .dependent_launch import enter, launch_options

MAX_ROWS = 32          # at most this many rows take the kernel; more rows leave cuBLAS too little to lose
BLOCK_N, BLOCK_K = 64, 128
# fp32 would run on tf32 tensor cores (about 1e-3 relative error): 16-bit weights only. Triton's CPU interpreter
# runs its dots on fp32 alone, so there the tests check the kernel in fp32.
_DTYPES = (torch.float32,) if interpreted() else (torch.bfloat16, torch.float16)


@triton.jit(do_not_specialize=["m"])
def _skinny_gemm_kernel(x, w, out, partial, counters, m, N, K, stride_xm, stride_om,
                        SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    tile = tl.program_id(0)
    split = tl.program_id(1)
    rn = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    k_per_split = K // SPLIT_K
    k0 = split * k_per_split
    enter(PDL)
    w_ptrs = w + rn.to(tl.int64)[:, None] * K + (k0 + rk)[None, :]
    x_ptrs = x + rm[None, :] * stride_xm + (k0 + rk)[:, None]
    row_ok = rm[None, :] < m
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for _ in range(0, k_per_split, BLOCK_K):
        wt = tl.load(w_ptrs)
        xt = tl.load(x_ptrs, mask=row_ok, other=0.0)
        acc += tl.dot(wt, xt)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    out_ptrs = out + rm[None, :] * stride_om + rn[:, None]
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc.to(out.dtype.element_ty), mask=row_ok)
    else:
        part_ptrs = partial + (rm[None, :] * N + rn[:, None])
        tl.store(part_ptrs + split * (BLOCK_M * N), acc)
        tl.debug_barrier()          # every thread's partial is written before the count says so
        done = tl.atomic_add(counters + tile, 1, sem="acq_rel")
        if done == SPLIT_K - 1:     # the last split of this tile: sum the partials in split order
            total = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            for s in range(SPLIT_K):
                total += tl.load(part_ptrs + s * (BLOCK_M * N), cache_modifier=".cg")
            tl.store(out_ptrs, total.to(out.dtype.element_ty), mask=row_ok)
            tl.store(counters + tile, 0)      # ready for the next call (and the next graph replay)


def plan(weight: torch.Tensor, sms: int) -> tuple[int, int] | None:
    """(split_k, num_stages) for `weight` [N, K], or None where cuBLAS is the better choice. Measured on an H200
    (benchmarks/skinny_gemm_sweep.py, 32 rows): a matrix whose row tiles fit in one wave of programs wins (the
    attention's q/k/v and o, the MLP's down projection: cuBLAS runs them at 1.2-1.7x the copy-bandwidth floor, the
    down projection with a separate split-K reduction), as does one of many waves (the lm_head); in between (the
    MLP's gate/up, 3.4 waves) the last partial wave costs more than cuBLAS's own tiling does."""
    if weight.dim() != 2 or not weight.is_contiguous():
        return None
    n, k = weight.shape
    if n % BLOCK_N or k % (2 * BLOCK_K):
        return None
    tiles = n // BLOCK_N
    if tiles * 2 <= sms:
        return 2, 5       # split K in two: a full wave, and the last of the two sums the halves
    if tiles <= sms:
        return 1, 5
    if tiles >= 8 * sms:
        return 1, 3
    return None


def scratch_size(weight: torch.Tensor, split_k: int, block_m: int = MAX_ROWS, block_n: int = BLOCK_N) -> int:
    return split_k * block_m * weight.shape[0] if split_k > 1 else 1


class SkinnyGemm:
    """`x @ weight.T` for x of at most MAX_ROWS rows, with its launch settings and split-K tile counters."""

    def __init__(self, weight: torch.Tensor, split_k: int, num_stages: int, block_m: int = MAX_ROWS,
                 block_n: int = BLOCK_N, block_k: int = BLOCK_K, num_warps: int = 4,
                 scratch: torch.Tensor | None = None):
        """`scratch`: fp32 room for the split-K partial sums, which the GEMMs of one model share (they run one
        after another on its stream); a captured graph keeps its address, so it lives as long as they do."""
        n, k = weight.shape
        if not weight.is_contiguous() or n % block_n or k % (split_k * block_k):
            raise ValueError(f"weight {tuple(weight.shape)} does not tile as {block_n} x {split_k * block_k}")
        self.weight, self.block_m, self.block_n, self.block_k, self.split_k = weight, block_m, block_n, block_k, split_k
        self.num_stages, self.num_warps = num_stages, num_warps
        dev = weight.device
        need = scratch_size(weight, split_k, block_m, block_n)
        if scratch is None or scratch.numel() < need or scratch.device != dev:
            scratch = torch.empty(need, dtype=torch.float32, device=dev)
        self.scratch = scratch
        self.counters = torch.zeros(n // block_n, dtype=torch.int32, device=dev)

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        m, k = x.shape
        n = self.weight.shape[0]
        if m > self.block_m or x.stride(1) != 1 or k != self.weight.shape[1]:
            raise ValueError(f"{m} rows do not fit in {self.block_m}")
        if out is None:
            out = torch.empty(m, n, dtype=x.dtype, device=x.device)
        block_m = 16 if m <= 16 else self.block_m
        with device_of(x):
            _skinny_gemm_kernel[(n // self.block_n, self.split_k)](
                x, self.weight, out, self.scratch, self.counters, m, n, k, x.stride(0), out.stride(0),
                SPLIT_K=self.split_k, BLOCK_M=block_m, BLOCK_N=self.block_n, BLOCK_K=self.block_k,
                num_stages=self.num_stages, num_warps=self.num_warps, **launch_options(x.device))
        return out

    def linear(self, x: torch.Tensor) -> torch.Tensor | None:
        """F.linear(x, weight) through the kernel, or None for inputs it does not cover (too many rows, another
        dtype or device, autograd, odd strides)."""
        k = self.weight.shape[1]
        if (x.shape[-1] != k or x.dtype != self.weight.dtype or x.device != self.weight.device
                or not usable(x) or x.dtype not in _DTYPES or x.numel() > self.block_m * k
                or (torch.is_grad_enabled() and x.requires_grad)):
            return None
        try:
            rows = x.view(-1, k)
        except RuntimeError:
            return None
        if rows.shape[0] == 0 or rows.stride(1) != 1:
            return None
        return self(rows).view(*x.shape[:-1], self.weight.shape[0])


def _skinny_linear_forward(self, x):
    out = self.batchscope_skinny.linear(x)
    return out if out is not None else F.linear(x, self.weight, self.bias)


def install_skinny_gemms(model: torch.nn.Module) -> list[str]:
    """Give the planned bias-free bf16/fp16 linears (plain nn.Linear, and the merged q/k/v and gate/up weights of
    kernels.projections) the kernel for inputs of at most MAX_ROWS rows; returns their names."""
    from .projections import MergedWeight
    planned: list[tuple[str, object, torch.Tensor, tuple[int, int]]] = []
    merged_storage = {m.batchscope_merged.weight.untyped_storage().data_ptr() for m in model.modules()
                      if isinstance(getattr(m, "batchscope_merged", None), MergedWeight)}
    seen: set[int] = set()
    for name, module in model.named_modules():
        merged = getattr(module, "batchscope_merged", None)
        if isinstance(merged, MergedWeight) and merged.bias is None and merged.skinny is None \
                and id(merged) not in seen:
            seen.add(id(merged))
            settings = _plannable(merged.weight)
            if settings:
                planned.append((f"{name} (merged)", merged, merged.weight, settings))
        if (type(module) is not torch.nn.Linear or module.bias is not None or "forward" in module.__dict__
                or module.weight.untyped_storage().data_ptr() in merged_storage):   # part of a merged weight
            continue
        settings = _plannable(module.weight)
        if settings:
            planned.append((name, module, module.weight, settings))
    if not planned:
        return []
    scratch = torch.empty(max(scratch_size(w, s[0]) for _, _, w, s in planned), dtype=torch.float32,
                          device=planned[0][2].device)
    for name, owner, weight, settings in planned:
        gemm = SkinnyGemm(weight, *settings, scratch=scratch)
        if isinstance(owner, MergedWeight):
            owner.skinny = gemm
        else:
            owner.batchscope_skinny = gemm
            owner.forward = types.MethodType(_skinny_linear_forward, owner)
    return [name for name, *_ in planned]


def _plannable(weight: torch.Tensor) -> tuple[int, int] | None:
    if weight.dtype not in _DTYPES or not usable(weight) or weight.requires_grad:
        return None
    return plan(weight, sm_count(weight.device))


def uninstall_skinny_gemms(model: torch.nn.Module) -> None:
    for module in model.modules():
        if getattr(module.__dict__.get("forward"), "__func__", None) is _skinny_linear_forward:
            del module.forward
            del module.batchscope_skinny
        merged = getattr(module, "batchscope_merged", None)
        if merged is not None and getattr(merged, "skinny", None) is not None:
            merged.skinny = None
