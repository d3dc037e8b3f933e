"""The paged KV cache: fixed-size blocks in device tensors, and the allocator that owns them."""
from __future__ import annotations

from collections import deque

import torch

from .model.kv_layout import KVLayout


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


class KVCache:
    """Per layer (k, v) views of shape [num_blocks + 1, block_size, kv_heads, k_dim or v_dim]. Keys and values
    live in one allocation when their widths match, else in one each (MLA). The extra block (`scratch_block`)
    belongs to no request: padding rows of graph-replayed steps write there."""

    def __init__(self, lay: KVLayout, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device):
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
    def blocks_for_memory(layout: KVLayout, block_size: int, dtype: torch.dtype, device: torch.device,
                          fraction: float) -> int:
        """How many blocks fit in `fraction` of the device's free memory (after the weights are loaded)."""
        free, _total = torch.cuda.mem_get_info(device)
        per_block = layout.bytes_per_token(dtype) * block_size
        return max(2, int(free * fraction) // per_block - 1)
