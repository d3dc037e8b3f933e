"""The support policy: at load, decide whether the engine runs a model exactly or refuses it.

Every model either runs with greedy tokens equal to transformers' own `generate` (float32; CPU, and CUDA with
graphs and fused kernels on) or is refused with a ConfigError that names its model type, the reason and what is
supported. The decision has two parts:
- static, from the config alone (so that `EngineConfig.validate` can refuse a folder before any weight is read):
  recurrent or attention-free layers (Mamba/SSM state, which no KV cache holds), and attention layers that do not
  go through transformers' AttentionInterface (their attention would never see the paged cache);
- dynamic, on the loaded model: one probe forward through our attention function records every attention call
  (one per layer, causal, no mask of the model's own, no keyword argument we do not honour, K/V shapes the cache
  is laid out for), and the causal-LM head is read for what it does to the logits (see source.logits_epilogue).
  What the probe sees of K/V is the model's KV layout (`check_support` returns it), which sizes the cache.
Families checked token-exact by tests/engine/test_model_matrix.py are listed in VERIFIED_FAMILIES; another model that
passes every check loads too, and engine.info says it is not in the verified list.
"""
from __future__ import annotations

import inspect
import re
import sys

import torch

from ..config import ConfigError
from .attention import ProbeMetadata, use_metadata
from .checkpoint import first_line
from .experts import experts_configs
from .kv_layout import KVLayout
from .source import UnsupportedHead, check_head, logits_epilogue

# Checked token-exact against transformers' generate in sync, async and across live switches (model matrix).
VERIFIED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "gemma", "gemma2",
                     "gemma3_text", "phi3", "olmo2", "granite", "gpt_neox", "gpt2", "cohere", "smollm3", "stablelm",
                     "deepseek_v2", "deepseek_v3")
# Decoders whose layers keep a recurrent state (Mamba/SSM, linear attention, RNN) instead of, or beside, KV.
RECURRENT_FAMILIES = frozenset({
    "mamba", "mamba2", "falcon_mamba", "jamba", "falcon_h1", "zamba", "zamba2", "bamba", "nemotron_h",
    "granitemoehybrid", "lfm2", "lfm2_moe", "lfm2_vl", "qwen3_next", "qwen3_5", "qwen3_5_moe", "plamo2",
    "recurrent_gemma", "rwkv", "xlstm", "minimax", "kimi_linear", "mamba_hybrid", "bailing_hybrid"})
# Per-layer type names (config.layer_types / layers_block_type) that are attention layers.
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "attention", "global", "local",
                                   "chunked_attention", "global_attention", "local_attention"})
SUPPORTED_SUMMARY = ("decoder-only causal LMs whose every layer is a causal self-attention that goes through "
                     "transformers' AttentionInterface (optionally with a sliding window, logit soft-capping, or "
                     "keys wider than values as in multi-head latent attention), dense or mixture-of-experts; "
                     "checked exact: " + ", ".join(VERIFIED_FAMILIES))


def unsupported(model_type: str, reason: str, detail: str) -> ConfigError:
    return ConfigError(f"model type {model_type!r} is not supported: {reason} ({detail}). "
                       f"Supported: {SUPPORTED_SUMMARY}")


def _causal_lm_class(model_type: str):
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    import transformers
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if name is None:
        return None
    try:
        return getattr(transformers, name)
    except (AttributeError, ImportError):
        return None


def _uses_attention_interface(cls) -> bool:
    """Whether the modeling file of `cls` dispatches its attention through transformers' AttentionInterface
    (the same source test transformers itself uses to decide whether an implementation can be set)."""
    try:
        source = inspect.getsource(sys.modules[cls.__module__])
    except (OSError, TypeError, KeyError):
        return True                 # unknown: the probe forward decides
    return ".get_interface(" in source and "ALL_ATTENTION_FUNCTIONS" in source


def _recurrent_reason(model_type: str, cfg: dict) -> str | None:
    for key in ("layers_block_type", "layer_types", "block_types"):
        kinds = cfg.get(key)
        if isinstance(kinds, (list, tuple)):
            others = sorted({str(k) for k in kinds} - ATTENTION_LAYER_TYPES)
            if others:
                return f"its {key} has {', '.join(others)} layers"
    if model_type in RECURRENT_FAMILIES:
        return "its layers keep a recurrent (Mamba/SSM or linear-attention) state"
    hints = sorted(k for k in cfg if re.match(r"(mamba|ssm|linear_attn|conv_kernel$|attn_layer_period$|"
                                                r"hybrid_override_pattern$)", k))
    if hints:
        return f"its config describes non-attention layers ({', '.join(hints[:4])})"
    return None


def static_support(cfg) -> None:
    """The refusals that need only the config (a dict or a transformers config)."""
    if not isinstance(cfg, dict):
        cfg = cfg.to_dict()
    model_type = cfg.get("model_type", "?")
    reason = _recurrent_reason(model_type, cfg)
    if reason is not None:
        raise unsupported(model_type, "recurrent or attention-free layers",
                          f"{reason}, which batchscope's paged KV cache does not hold")
    cls = _causal_lm_class(model_type)
    if cls is None:
        return                      # unknown here: loading decides, and the probe checks what it loads
    if not _uses_attention_interface(cls):
        raise unsupported(model_type, "no attention-backend support",
                          f"{cls.__name__} computes attention itself instead of through transformers' "
                          f"AttentionInterface, so the paged KV cache would never be used")
    try:
        check_head(cls)
    except UnsupportedHead as exc:
        raise _head_refusal(model_type, cls, exc) from None


def _head_refusal(model_type: str, cls, exc: UnsupportedHead) -> ConfigError:
    return unsupported(model_type, "an output head that batchscope does not reproduce", f"{cls.__name__}.forward {exc}")


def decoder_of(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack the runner calls (everything but the causal-LM head)."""
    return model.get_decoder() if hasattr(model, "get_decoder") else model.model


def check_support(model: torch.nn.Module) -> tuple[dict, KVLayout]:
    """The dynamic half of the policy, on the loaded model with our attention set: returns what it found (for
    engine.info) and the K/V layout its attention layers hand over, which the cache is built for."""
    cfg = model.config
    model_type = getattr(cfg, "model_type", type(model).__name__)
    static_support(cfg)
    try:
        steps = logits_epilogue(model)
    except UnsupportedHead as exc:
        raise _head_refusal(model_type, type(model), exc) from None
    try:
        num_layers = int(cfg.num_hidden_layers)
        decoder = decoder_of(model)
    except (AttributeError, TypeError) as exc:
        raise unsupported(model_type, "not a decoder with attention layers", str(exc)) from None
    probe = ProbeMetadata()
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = (torch.arange(5, device=model.device) * 7 + 3) % vocab
    try:
        with torch.inference_mode(), use_metadata(probe):
            decoder(input_ids=ids[None], position_ids=torch.arange(5, device=model.device)[None], use_cache=False)
    except Exception as exc:
        raise unsupported(model_type, "its forward fails with batchscope's attention",
                          f"{exc.__class__.__name__}: {first_line(exc)}") from None
    calls = probe.calls
    if not calls:
        raise unsupported(model_type, "no attention-backend support",
                          "no layer called the attention function transformers was given")
    layers = [c.layer_idx for c in calls]
    expected = list(range(num_layers))
    if sorted(layers, key=str) != sorted(expected, key=str):
        missing = sorted(set(expected) - set(layers), key=str)
        if missing and len(set(layers)) == len(layers) and set(layers) <= set(expected):
            raise unsupported(model_type, "recurrent or attention-free layers",
                              f"layers {missing} of {num_layers} have no attention")
        raise unsupported(model_type, "unsupported attention kind",
                          f"attention calls per layer index {layers} do not match its {num_layers} layers "
                          f"(cross-attention or shared KV layers)")
    features = set()
    shapes = {(c.k_shape[1], c.k_shape[3], c.v_shape[3]) for c in calls}
    if len(shapes) != 1:
        raise unsupported(model_type, "unsupported attention kind",
                          f"its layers hand over K/V of different shapes {sorted(shapes)} (heads, key dims, value "
                          f"dims); the paged cache holds one shape for all layers")
    kv_heads, k_dim, v_dim = shapes.pop()
    for c in calls:
        where = f"{c.module} of layer {c.layer_idx}"
        if c.unknown:
            raise unsupported(model_type, "unsupported attention kind",
                              f"{where} passes {', '.join(sorted(c.unknown))} to its attention function")
        if c.mask_given:
            raise unsupported(model_type, "unsupported attention kind", f"{where} brings its own attention mask")
        if c.is_causal is False:
            raise unsupported(model_type, "unsupported attention kind", f"{where} is not causal")
        heads, q_dim = c.q_shape[1], c.q_shape[3]
        if q_dim != k_dim or heads % kv_heads or c.v_shape[1] != kv_heads:
            raise unsupported(model_type, "unsupported attention kind",
                              f"{where}: {heads} query heads of {q_dim} dims against {kv_heads} KV heads of "
                              f"{k_dim} dims")
        if c.sliding_window:
            features.add("sliding window")
        if c.softcap:
            features.add("logit soft-capping")
    layout = KVLayout(num_layers, kv_heads, k_dim, v_dim)
    if layout.k_dim != layout.v_dim:
        features.add("keys wider than values (MLA)")
    if steps:
        features.add("logits post-processing")
    if experts_configs(model):
        features.add("mixture of experts")
    return {"model_type": model_type, "verified": model_type in VERIFIED_FAMILIES,
            "attention": sorted(features), "kv_heads": layout.kv_heads, "k_dim": layout.k_dim,
            "v_dim": layout.v_dim}, layout
