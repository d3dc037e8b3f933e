"""The paged KV cache: fixed-size blocks in device tensors, and the allocator that owns them."""
from __future__ import annotations

import weakref
from collections import deque
from dataclasses import dataclass

import torch


class BlockAllocator:
    """Hands out block ids; pure Python, so the scheduler can use it without touching the device."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise MemoryError(f"asked for {n} KV blocks, {len(self._free)} free")
        return [self._free.popleft() for _ in range(n)]

    def free(self, blocks: list[int]) -> None:
        self._free.extend(blocks)


@dataclass(frozen=True)
class KVLayout:
    """What one token stores per attention layer: `kv_heads` keys of `k_dim` and values of `v_dim`."""
    num_layers: int
    kv_heads: int
    k_dim: int
    v_dim: int


# Layouts seen by the load-time probe forward (support.check_support), by id of the model's config: what the
# attention layers actually hand over wins over what the config's fields suggest.
_observed: dict[int, KVLayout] = {}


def remember_layout(model_config, layout: KVLayout) -> None:
    key = id(model_config)
    _observed[key] = layout
    weakref.finalize(model_config, _observed.pop, key, None)


def kv_layout(model_config) -> KVLayout:
    """The per-token K/V shapes the attention layers hand to the attention function.

    Multi-head latent attention (DeepSeek-V2/V3) expands its compressed latent into one key of
    qk_nope + qk_rope dims and one value of v_head_dim dims per query head before attention, so the cache keeps
    num_attention_heads heads of two different widths. Everything else keeps num_key_value_heads heads of
    head_dim for both. Once `support.check_support` has probed the model, its observation is used instead."""
    seen = _observed.get(id(model_config))
    if seen is not None:
        return seen
    heads = model_config.num_attention_heads
    layers = model_config.num_hidden_layers
    nope, rope = getattr(model_config, "qk_nope_head_dim", None), getattr(model_config, "qk_rope_head_dim", None)
    v_dim = getattr(model_config, "v_head_dim", None)
    if nope is not None and rope is not None and v_dim is not None:
        return KVLayout(layers, heads, nope + rope, v_dim)
    kv_heads = getattr(model_config, "num_key_value_heads", None) or heads
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // heads
    return KVLayout(layers, kv_heads, head_dim, head_dim)


def kv_bytes_per_token(model_config, dtype: torch.dtype) -> int:
    lay = kv_layout(model_config)
    return lay.num_layers * lay.kv_heads * (lay.k_dim + lay.v_dim) * torch.finfo(dtype).bits // 8


class KVCache:
    """Per layer (k, v) views of shape [num_blocks + 1, block_size, kv_heads, k_dim or v_dim]. Keys and values
    live in one allocation when their widths match, else in one each (MLA). The extra block (`scratch_block`)
    belongs to no request: padding rows of graph-replayed steps write there."""

    def __init__(self, model_config, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device):
        lay = kv_layout(model_config)
        self.layout = lay
        self.num_layers, self.kv_heads = lay.num_layers, lay.kv_heads
        self.head_dim, self.v_head_dim = lay.k_dim, lay.v_dim
        self.num_blocks, self.block_size = num_blocks, block_size
        self.scratch_block = num_blocks
        shape = (self.num_layers, num_blocks + 1, block_size, self.kv_heads)
        if lay.k_dim == lay.v_dim:
            self.storage = torch.zeros(self.num_layers, 2, *shape[1:], lay.k_dim, dtype=dtype, device=device)
            self.layers = [(self.storage[i, 0], self.storage[i, 1]) for i in range(self.num_layers)]
        else:
            self.k_storage = torch.zeros(*shape, lay.k_dim, dtype=dtype, device=device)
            self.v_storage = torch.zeros(*shape, lay.v_dim, dtype=dtype, device=device)
            self.layers = [(self.k_storage[i], self.v_storage[i]) for i in range(self.num_layers)]

    @staticmethod
    def blocks_for_memory(model_config, block_size: int, dtype: torch.dtype, device: torch.device,
                          fraction: float) -> int:
        """How many blocks fit in `fraction` of the device's free memory (after the weights are loaded)."""
        free, _total = torch.cuda.mem_get_info(device)
        per_block = kv_bytes_per_token(model_config, dtype) * block_size
        return max(2, int(free * fraction) // per_block - 1)
