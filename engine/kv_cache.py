"""The paged KV cache: fixed-size blocks in one device tensor, and the allocator that owns them."""
from __future__ import annotations

from collections import deque

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


def kv_bytes_per_token(model_config, dtype: torch.dtype) -> int:
    layers = model_config.num_hidden_layers
    kv_heads = getattr(model_config, "num_key_value_heads", None) or model_config.num_attention_heads
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // model_config.num_attention_heads
    return 2 * layers * kv_heads * head_dim * torch.finfo(dtype).bits // 8


class KVCache:
    """Per layer (k, v) views of shape [num_blocks + 1, block_size, kv_heads, head_dim] over one allocation.
    The extra block (`scratch_block`) belongs to no request: padding rows of graph-replayed steps write there."""

    def __init__(self, model_config, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device):
        self.num_layers = model_config.num_hidden_layers
        self.kv_heads = getattr(model_config, "num_key_value_heads", None) or model_config.num_attention_heads
        self.head_dim = (getattr(model_config, "head_dim", None)
                         or model_config.hidden_size // model_config.num_attention_heads)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.scratch_block = num_blocks
        self.storage = torch.zeros(self.num_layers, 2, num_blocks + 1, block_size, self.kv_heads, self.head_dim,
                                   dtype=dtype, device=device)
        self.layers = [(self.storage[i, 0], self.storage[i, 1]) for i in range(self.num_layers)]

    @staticmethod
    def blocks_for_memory(model_config, block_size: int, dtype: torch.dtype, device: torch.device,
                          fraction: float) -> int:
        """How many blocks fit in `fraction` of the device's free memory (after the weights are loaded)."""
        free, _total = torch.cuda.mem_get_info(device)
        per_block = kv_bytes_per_token(model_config, dtype) * block_size
        return max(2, int(free * fraction) // per_block - 1)
