"""What one token stores in the KV cache: the shapes a model's attention layers hand to the attention function.

The load-time probe (support.check_support) observes them and is the authority; `from_config` reads what the
config's fields suggest, for a model loaded without batchscope's attention. Tensor parallel keeps a rank's share of
the KV heads (parallel.sharding.TPLayout.kv_share). The cache (engine.kv_cache) is built from one of these."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVLayout:
    """Per attention layer, per token: `kv_heads` keys of `k_dim` and values of `v_dim`."""
    num_layers: int
    kv_heads: int
    k_dim: int
    v_dim: int

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return self.num_layers * self.kv_heads * (self.k_dim + self.v_dim) * torch.finfo(dtype).bits // 8

    @classmethod
    def from_config(cls, model_config) -> "KVLayout":
        """Multi-head latent attention (DeepSeek-V2/V3) expands its compressed latent into one key of
        qk_nope + qk_rope dims and one value of v_head_dim dims per query head before attention, so the cache
        keeps num_attention_heads heads of two different widths. Everything else keeps num_key_value_heads heads
        of head_dim for both."""
        heads = model_config.num_attention_heads
        layers = model_config.num_hidden_layers
        nope = getattr(model_config, "qk_nope_head_dim", None)
        rope = getattr(model_config, "qk_rope_head_dim", None)
        v_dim = getattr(model_config, "v_head_dim", None)
        if nope is not None and rope is not None and v_dim is not None:
            return cls(layers, heads, nope + rope, v_dim)
        kv_heads = getattr(model_config, "num_key_value_heads", None) or heads
        head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // heads
        return cls(layers, kv_heads, head_dim, head_dim)
