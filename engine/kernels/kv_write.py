"""The KV write in one Triton kernel: this step's keys and values into their paged cache slots, both in one
launch (two index_copy_ calls are two launches per layer, latency-bound at a decode step's few hundred KB)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dependent_launch import enter, launch_options


@triton.jit(do_not_specialize=["slot_mapping", "stride_kt", "stride_kh", "stride_vt", "stride_vh"])
def _write_kv_kernel(key, value, k_cache, v_cache, slot_mapping, stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_kcs, stride_kch, stride_vcs, stride_vch, KV_HEADS: tl.constexpr,
                     HEAD_DIM: tl.constexpr, V_DIM: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr,
                     DV_PAD: tl.constexpr, PDL: tl.constexpr):
    enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping + t).to(tl.int64)
    h = tl.arange(0, H_PAD)
    d = tl.arange(0, D_PAD)
    mask = (h < KV_HEADS)[:, None] & (d < HEAD_DIM)[None, :]
    k = tl.load(key + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    tl.store(k_cache + slot * stride_kcs + h[:, None] * stride_kch + d[None, :], k, mask=mask)
    dv = tl.arange(0, DV_PAD)
    v_mask = (h < KV_HEADS)[:, None] & (dv < V_DIM)[None, :]
    v = tl.load(value + t * stride_vt + h[:, None] * stride_vh + dv[None, :], mask=v_mask)
    tl.store(v_cache + slot * stride_vcs + h[:, None] * stride_vch + dv[None, :], v, mask=v_mask)


def _whole_blocks(cache: torch.Tensor) -> bool:
    return cache.stride(3) == 1 and cache.stride(0) == cache.shape[1] * cache.stride(1)


def write_kv_triton(k_cache: torch.Tensor, v_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    slot_mapping: torch.Tensor) -> None:
    """`engine.attention.write_kv` in one kernel: keys [T, kv_heads, D] and values [T, kv_heads, Dv] (any
    strides, last dim contiguous) into caches [num_blocks, block_size, kv_heads, D or Dv]."""
    T, KVH, D = key.shape
    Dv = value.shape[-1]
    if key.stride(2) != 1 or value.stride(2) != 1:
        key, value = key.contiguous(), value.contiguous()
    if not (_whole_blocks(k_cache) and _whole_blocks(v_cache)) or k_cache.shape[:3] != v_cache.shape[:3]:
        raise ValueError("the K and V caches must hold the same blocks, each block a run of contiguous slots")
    if T == 0:
        return
    _write_kv_kernel[(T,)](key, value, k_cache, v_cache, slot_mapping, key.stride(0), key.stride(1),
                           value.stride(0), value.stride(1), k_cache.stride(1), k_cache.stride(2),
                           v_cache.stride(1), v_cache.stride(2), KV_HEADS=KVH, HEAD_DIM=D, V_DIM=Dv,
                           H_PAD=triton.next_power_of_2(KVH), D_PAD=triton.next_power_of_2(D),
                           DV_PAD=triton.next_power_of_2(Dv), num_warps=4, **launch_options(key.device))
