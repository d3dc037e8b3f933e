"""Paged attention, plugged into transformers through its AttentionInterface.

The model runs on one flat "ragged" batch: all scheduled tokens of all requests in a single row
(input_ids [1, T]). transformers computes q/k/v and RoPE; our function writes the new keys and values into the
paged cache at `slot_mapping` and attends each request's queries to its own blocks. No dense batch mask is ever
built (see `register`); each request's causality comes from its positions.

The step's metadata reaches the attention function through `use_metadata` (a per-thread slot), not through the
forward's keyword arguments: some decoder layers (StableLM's) do not pass extra keyword arguments on to their
attention, and the metadata must reach every layer all the same.

Besides the plain kind, this covers what transformers passes for the supported families: sliding windows,
logit soft-capping (Gemma 2) and keys wider than values (multi-head latent attention, DeepSeek-V2/V3). Anything
else a model asks of its attention is caught at load by a probe forward (`ProbeMetadata`, `support.check_support`).
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

ATTN_NAME = "batchscope_paged"
_current = threading.local()


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
    backend: str = "torch"           # the attention backend: "torch" (reference) | "triton" (kernels/)
    # One step's decode masks, built by its first layer and reused by the rest: a metadata object describes one
    # step (the runner makes a new one per forward); whoever rewrites its tensors in place must clear this.
    decode_masks: dict = field(default_factory=dict, repr=False)


@contextlib.contextmanager
def use_metadata(meta):
    """Make `meta` the metadata every attention call on this thread sees, for the duration of a forward."""
    prev = getattr(_current, "meta", None)
    _current.meta = meta
    try:
        yield meta
    finally:
        _current.meta = prev


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Scatter this step's keys [T, kv_heads, Dk] and values [T, kv_heads, Dv] into their cache slots."""
    nb, bs, h, dk = k_cache.shape
    k_cache.view(nb * bs, h, dk).index_copy_(0, slot_mapping, key)
    v_cache.view(nb * bs, h, v_cache.shape[-1]).index_copy_(0, slot_mapping, value)


def _attend_explicit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, softcap: float | None,
                     mask: torch.Tensor) -> torch.Tensor:
    """softmax(softcap(q k^T * scale) + mask) v written out, in transformers' eager order of operations (SDPA
    has no soft-capping). q [..., G, Dk], k [..., L, Dk], v [..., L, Dv], additive mask broadcast to [..., G, L]."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    probs = (scores + mask).softmax(dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)


def paged_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                          scale: float, sliding_window: int | None = None,
                          softcap: float | None = None) -> torch.Tensor:
    """Reference: q [T, H, Dk] -> out [T, H, Dv]. Gathers only the batch's own blocks, never the whole cache."""
    if meta.max_query_len == 1 and len(meta.seq_lens_host) == q.shape[0]:    # every request decodes one token
        return _decode_torch(q, k_cache, v_cache, meta, scale, sliding_window, softcap)
    T, H, _ = q.shape
    out = q.new_empty(T, H, v_cache.shape[-1])
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    qsl, lens = meta.query_start_host, meta.seq_lens_host
    for b in range(len(lens)):
        start, end, ctx = qsl[b], qsl[b + 1], lens[b]
        if end == start:
            continue
        n_blocks = (ctx + block_size - 1) // block_size
        table = meta.block_tables[b, :n_blocks]
        k = k_cache[table].flatten(0, 1)[:ctx]            # [ctx, kv_heads, Dk]
        v = v_cache[table].flatten(0, 1)[:ctx]
        n = end - start
        q_pos = torch.arange(ctx - n, ctx, device=q.device)
        k_pos = torch.arange(ctx, device=q.device)
        allowed = k_pos[None, :] <= q_pos[:, None]
        if sliding_window is not None:
            allowed &= k_pos[None, :] > q_pos[:, None] - sliding_window
        if softcap is None:
            o = F.scaled_dot_product_attention(
                q[start:end].transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                attn_mask=allowed, scale=scale, enable_gqa=True)
        else:
            G = H // kv_heads
            mask = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(~allowed, float("-inf"))
            o = _attend_explicit(q[start:end].transpose(0, 1), k.transpose(0, 1).repeat_interleave(G, 0),
                                 v.transpose(0, 1).repeat_interleave(G, 0), scale, softcap, mask)
        out[start:end] = o.transpose(0, 1)
    return out


def _decode_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                  scale: float, sliding_window: int | None, softcap: float | None = None) -> torch.Tensor:
    """One query per request, all requests at once: one gather of the batch's blocks per layer and one fused
    attention call, instead of a loop over requests (which costs ~10x more launches, on CPU most of a step)."""
    B, H, D = q.shape
    block_size, kv_heads, Dv = k_cache.shape[1], k_cache.shape[2], v_cache.shape[-1]
    n_blocks = -(-meta.max_seq_len // block_size)
    L = n_blocks * block_size
    table = meta.block_tables[:B, :n_blocks].reshape(-1)
    # [B, kv_heads, L, D] as strided views of the gather: SDPA reads them in place, no permute copy
    k = k_cache.index_select(0, table).view(B, L, kv_heads, D).transpose(1, 2)
    v = v_cache.index_select(0, table).view(B, L, kv_heads, Dv).transpose(1, 2)
    # A KV head's query heads go in SDPA's query-length dim: plain attention with no GQA expansion of k/v.
    # The CPU flash kernel keeps the softmax in fp32 and skips the [B, H, L] score tensors.
    grouped = q.unflatten(1, (kv_heads, H // kv_heads))
    mask = _decode_mask(meta, B, L, sliding_window, q.dtype)
    if softcap is None:
        out = F.scaled_dot_product_attention(grouped, k, v, attn_mask=mask, scale=scale)
    else:
        out = _attend_explicit(grouped, k, v, scale, softcap, mask)
    return out.reshape(B, H, Dv)


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


# --------------------------------------------------------------------------------------------------------------
# The probe: one forward at load, to learn what each attention layer asks for before any request depends on it.
# --------------------------------------------------------------------------------------------------------------
# Keyword arguments transformers may pass that change nothing we compute (or that we honour: window, softcap).
# Anything else with a value (attention sinks' `s_aux`, say) is an attention kind we do not implement.
HANDLED_KWARGS = frozenset({"sliding_window", "softcap", "position_ids", "use_cache", "cache_position",
                            "past_key_values", "cache", "output_attentions", "batchscope", "is_causal"})


@dataclass
class AttentionCall:
    layer_idx: object
    module: str
    q_shape: tuple
    k_shape: tuple
    v_shape: tuple
    mask_given: bool
    dropout: float
    is_causal: object
    sliding_window: object
    softcap: object
    unknown: dict


class ProbeMetadata:
    """Stands in for AttentionMetadata during the load-time probe forward (one sequence, no cache): records
    every attention call and answers it with plain causal attention so that the forward can go on."""

    def __init__(self):
        self.calls: list[AttentionCall] = []

    def attend(self, module, query, key, value, attention_mask, scaling, dropout, kwargs):
        unknown = {k: v for k, v in kwargs.items() if k not in HANDLED_KWARGS and v is not None}
        window = kwargs.get("sliding_window") or getattr(module, "sliding_window", None)
        softcap = kwargs.get("softcap")
        self.calls.append(AttentionCall(
            getattr(module, "layer_idx", None), type(module).__name__, tuple(query.shape), tuple(key.shape),
            tuple(value.shape), attention_mask is not None, float(dropout or 0.0),
            kwargs.get("is_causal", getattr(module, "is_causal", True)), window, softcap, unknown))
        T, H, kvh = query.shape[2], query.shape[1], key.shape[1]
        pos = torch.arange(T, device=query.device)
        allowed = pos[None, :] <= pos[:, None]
        if window:
            allowed &= pos[None, :] > pos[:, None] - window
        mask = torch.zeros(T, T, dtype=query.dtype, device=query.device).masked_fill_(~allowed, float("-inf"))
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        k = key[0].repeat_interleave(H // kvh, 0) if kvh and H % kvh == 0 else key[0]
        v = value[0].repeat_interleave(H // kvh, 0) if kvh and H % kvh == 0 else value[0]
        out = _attend_explicit(query[0], k, v, scale, softcap, mask)      # [H, T, Dv]
        return out.transpose(0, 1).unsqueeze(0), None


def _attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers calls this for every attention layer with q/k/v [1, heads, T, D] (RoPE applied)."""
    meta = kwargs.get("batchscope") or getattr(_current, "meta", None)
    if meta is None:
        raise RuntimeError("batchscope's paged attention was called outside a batchscope forward")
    if isinstance(meta, ProbeMetadata):
        return meta.attend(module, query, key, value, attention_mask, scaling, dropout, kwargs)
    k_cache, v_cache = meta.kv_caches[module.layer_idx]
    q = query[0].transpose(0, 1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    window = kwargs.get("sliding_window") or getattr(module, "sliding_window", None)
    softcap = kwargs.get("softcap")
    if meta.backend == "triton":
        from ..kernels.kv_write import write_kv_triton
        from ..kernels.paged_attention import paged_attention_triton
        write_kv_triton(k_cache, v_cache, key[0].transpose(0, 1), value[0].transpose(0, 1), meta.slot_mapping)
        out = paged_attention_triton(q, k_cache, v_cache, meta, scale, window, softcap)
    else:
        write_kv(k_cache, v_cache, key[0].transpose(0, 1), value[0].transpose(0, 1), meta.slot_mapping)
        out = paged_attention_torch(q, k_cache, v_cache, meta, scale, window, softcap)
    return out.unsqueeze(0), None


def register() -> str:
    """Register our attention with transformers; returns the implementation name.

    Deliberately no mask function: for an attention name without one, transformers builds no mask at all. With
    one registered it would first inspect position_ids for packed sequences, a host-synchronising check."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, _attention_forward)
    return ATTN_NAME
