"""Paged attention, plugged into transformers through its AttentionInterface.

The model runs on one flat "ragged" batch: all scheduled tokens of all requests in a single row
(input_ids [1, T]). transformers computes q/k/v and RoPE; our function writes the new keys and values into the
paged cache at `slot_mapping` and attends each request's queries to its own blocks. No dense batch mask is ever
built (see `register`); each request's causality comes from its positions.
"""
from __future__ import annotations

from dataclasses import dataclass

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
    """One query per request, all requests at once: one gather of the batch's blocks per layer and two batched
    matmuls, instead of a loop over requests (which costs ~10x more launches, on CPU most of a step)."""
    B, H, D = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    n_blocks = -(-meta.max_seq_len // block_size)
    table = meta.block_tables[:B, :n_blocks].reshape(-1)
    k = k_cache.index_select(0, table).view(B, n_blocks * block_size, kv_heads, D)   # [B, L, kv_heads, D]
    v = v_cache.index_select(0, table).view(B, n_blocks * block_size, kv_heads, D)
    qg = q.reshape(B, kv_heads, H // kv_heads, D)        # query heads grouped by the KV head they share
    scores = torch.einsum("bhgd,blhd->bhgl", qg, k).float() * scale
    pos = torch.arange(k.shape[1], device=q.device)
    lens = meta.seq_lens[:B].to(torch.long)[:, None]
    allowed = pos[None, :] < lens
    if sliding_window is not None:
        allowed &= pos[None, :] >= lens - sliding_window
    scores = scores.masked_fill(~allowed[:, None, None, :], float("-inf"))
    probs = scores.softmax(dim=-1).to(v.dtype)
    return torch.einsum("bhgl,blhd->bhgd", probs, v).reshape(B, H, D)


def _attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers calls this for every attention layer with q/k/v [1, heads, T, D] (RoPE applied)."""
    meta: AttentionMetadata = kwargs["batchscope"]
    k_cache, v_cache = meta.kv_caches[module.layer_idx]
    q = query[0].transpose(0, 1)
    write_kv(k_cache, v_cache, key[0].transpose(0, 1), value[0].transpose(0, 1), meta.slot_mapping)
    window = kwargs.get("sliding_window") or getattr(module, "sliding_window", None)
    if meta.kernel == "triton":
        from .attention_triton import paged_attention_triton
        out = paged_attention_triton(q, k_cache, v_cache, meta, scaling, window)
    else:
        out = paged_attention_torch(q, k_cache, v_cache, meta, scaling, window)
    return out.unsqueeze(0), None


def register() -> str:
    """Register our attention with transformers; returns the implementation name.

    Deliberately no mask function: for an attention name without one, transformers builds no mask at all. With
    one registered it would first inspect position_ids for packed sequences, a host-synchronising check."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, _attention_forward)
    return ATTN_NAME
