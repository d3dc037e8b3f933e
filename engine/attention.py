"""Paged attention, plugged into transformers through its AttentionInterface.

The model runs on one flat "ragged" batch: all scheduled tokens of all requests in a single row
(input_ids [1, T]). transformers computes q/k/v and RoPE; our function writes the new keys and values into the
paged cache at `slot_mapping` and attends each request's queries to its own blocks. No dense batch mask is ever
built (see `register`); each request's causality comes from its positions.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

ATTN_NAME = "batchscope_paged"


@dataclass
class AttentionMetadata:
    """Where this step's tokens sit in the paged cache. Device tensors for kernels, host lists for loops."""
    slot_mapping: torch.Tensor       # [T] int64: flat cache slot (block * block_size + offset) of each token
    query_start_loc: torch.Tensor    # [B + 1] int32: request b's queries are tokens [qsl[b], qsl[b+1])
    seq_lens: torch.Tensor           # [B] int32: context length of request b including this step's tokens
    block_tables: torch.Tensor       # [B, max_blocks] int32: request b's blocks, in order
    query_start_host: list[int]
    seq_lens_host: list[int]
    max_query_len: int
    max_seq_len: int
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]   # per layer (k, v): [num_blocks, block_size, kv_heads, D]
    kernel: str = "torch"            # "torch" | "triton"
    # One step's decode masks, built by its first layer and reused by the rest: a metadata object describes one
    # step (the runner makes a new one per forward); whoever rewrites its tensors in place must clear this.
    decode_masks: dict = field(default_factory=dict, repr=False)


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Scatter this step's keys/values [T, kv_heads, D] into their cache slots."""
    nb, bs, h, d = k_cache.shape
    k_cache.view(nb * bs, h, d).index_copy_(0, slot_mapping, key)
    v_cache.view(nb * bs, h, d).index_copy_(0, slot_mapping, value)


def paged_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                          scale: float, sliding_window: int | None = None) -> torch.Tensor:
    """Reference: q [T, H, D] -> out [T, H, D]. Gathers only the batch's own blocks, never the whole cache."""
    if meta.max_query_len == 1 and len(meta.seq_lens_host) == q.shape[0]:    # every request decodes one token
        return _decode_torch(q, k_cache, v_cache, meta, scale, sliding_window)
    out = torch.empty_like(q)
    block_size = k_cache.shape[1]
    qsl, lens = meta.query_start_host, meta.seq_lens_host
    for b in range(len(lens)):
        start, end, ctx = qsl[b], qsl[b + 1], lens[b]
        if end == start:
            continue
        n_blocks = (ctx + block_size - 1) // block_size
        table = meta.block_tables[b, :n_blocks]
        k = k_cache[table].flatten(0, 1)[:ctx]            # [ctx, kv_heads, D]
        v = v_cache[table].flatten(0, 1)[:ctx]
        n = end - start
        q_pos = torch.arange(ctx - n, ctx, device=q.device)
        k_pos = torch.arange(ctx, device=q.device)
        allowed = k_pos[None, :] <= q_pos[:, None]
        if sliding_window is not None:
            allowed &= k_pos[None, :] > q_pos[:, None] - sliding_window
        o = F.scaled_dot_product_attention(
            q[start:end].transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
            attn_mask=allowed, scale=scale, enable_gqa=True)
        out[start:end] = o.transpose(0, 1)
    return out


def _decode_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                  scale: float, sliding_window: int | None) -> torch.Tensor:
    """One query per request, all requests at once: one gather of the batch's blocks per layer and one fused
    attention call, instead of a loop over requests (which costs ~10x more launches, on CPU most of a step)."""
    B, H, D = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    n_blocks = -(-meta.max_seq_len // block_size)
    L = n_blocks * block_size
    table = meta.block_tables[:B, :n_blocks].reshape(-1)
    # [B, kv_heads, L, D] as strided views of the gather: SDPA reads them in place, no permute copy
    k = k_cache.index_select(0, table).view(B, L, kv_heads, D).transpose(1, 2)
    v = v_cache.index_select(0, table).view(B, L, kv_heads, D).transpose(1, 2)
    # A KV head's query heads go in SDPA's query-length dim: plain attention with no GQA expansion of k/v.
    # The CPU flash kernel keeps the softmax in fp32 and skips the [B, H, L] score tensors.
    out = F.scaled_dot_product_attention(q.unflatten(1, (kv_heads, H // kv_heads)), k, v,
                                         attn_mask=_decode_mask(meta, B, L, sliding_window, q.dtype), scale=scale)
    return out.reshape(B, H, D)


def _decode_mask(meta: AttentionMetadata, B: int, L: int, sliding_window: int | None,
                 dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [B, 1, 1, L] hiding keys past each request's length (or out of its window). The same for
    every layer of a step, so it is built once per step; additive because SDPA would convert a boolean one on
    every call."""
    key = (B, L, sliding_window, dtype)
    mask = meta.decode_masks.get(key)
    if mask is None:
        pos = torch.arange(L, device=meta.seq_lens.device)
        lens = meta.seq_lens[:B, None]
        hidden = pos >= lens
        if sliding_window is not None:
            hidden |= pos < lens - sliding_window
        mask = torch.zeros(B, 1, 1, L, dtype=dtype, device=pos.device).masked_fill_(hidden[:, None, None, :],
                                                                                      float("-inf"))
        meta.decode_masks[key] = mask
    return mask


def _attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers calls this for every attention layer with q/k/v [1, heads, T, D] (RoPE applied)."""
    meta: AttentionMetadata = kwargs["batchscope"]
    k_cache, v_cache = meta.kv_caches[module.layer_idx]
    q = query[0].transpose(0, 1)
    window = kwargs.get("sliding_window") or getattr(module, "sliding_window", None)
    if meta.kernel == "triton":
        from .attention_triton import paged_attention_triton, write_kv_triton
        write_kv_triton(k_cache, v_cache, key[0].transpose(0, 1), value[0].transpose(0, 1), meta.slot_mapping)
        out = paged_attention_triton(q, k_cache, v_cache, meta, scaling, window)
    else:
        write_kv(k_cache, v_cache, key[0].transpose(0, 1), value[0].transpose(0, 1), meta.slot_mapping)
        out = paged_attention_torch(q, k_cache, v_cache, meta, scaling, window)
    return out.unsqueeze(0), None


def register() -> str:
    """Register our attention with transformers; returns the implementation name.

    Deliberately no mask function: for an attention name without one, transformers builds no mask at all. With
    one registered it would first inspect position_ids for packed sequences, a host-synchronising check."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, _attention_forward)
    return ATTN_NAME
