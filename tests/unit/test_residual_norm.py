"""The residual add fused with the RMSNorm after it (engine/kernels/residual_norm.py): the sum is the eager add's bit for bit,
the norm the fused RMSNorm's; only decoder layers whose forward is the Llama template are swapped; a norm computed
ahead is used only on the very tensor it was computed for; greedy generation is unchanged.

Without a GPU the kernel runs in Triton's CPU interpreter on tiny shapes; the `gpu` tests run it compiled.
"""
from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton", reason="triton is not installed (pip install triton)")

from transformers.models.gemma2.modeling_gemma2 import Gemma2DecoderLayer  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm  # noqa: E402

from batchscope.engine.kernels import residual_norm, rms_norm as rms  # noqa: E402
from test_fused import (INTERPRETED, install, uninstall, _interpreter_bf16_rounding, _tiny, _greedy, gpu, norm_module,  # noqa: E402,F401
                        ulp_distance)

interp = pytest.mark.skipif(not INTERPRETED, reason="CPU interpreter tests run where there is no CUDA device")


def fused_norm(n, dtype, device="cpu", seed=0):
    module = norm_module(LlamaRMSNorm, n, dtype, device=device, seed=seed)
    rms.install_rms_norms(torch.nn.ModuleDict({"norm": module}))
    return module


def check_add_norm(rows, n, dtype, device="cpu"):
    gen = torch.Generator().manual_seed(rows)
    residual = (torch.randn(rows, n, generator=gen) * 4).to(dtype).to(device)
    delta = torch.randn(rows, n, generator=gen).to(dtype).to(device)
    norm = fused_norm(n, dtype, device)
    total, normed = residual_norm.add_rms_norm(residual, delta, norm)
    eager_total = residual + delta
    assert torch.equal(total, eager_total)                     # one rounding of the fp32 sum, as the add
    ref = LlamaRMSNorm.forward(norm, eager_total)
    assert normed.dtype == ref.dtype
    dist = ulp_distance(normed, ref)
    assert dist.max().item() <= (2 if dtype != torch.float32 else 8)
    if dtype != torch.float32:
        assert (dist > 0).float().mean().item() < 0.01
    assert torch.equal(normed, rms.rms_norm(eager_total, norm.weight, norm.variance_epsilon))


@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rms_norm_matches_add_then_norm_in_interpreter(dtype):
    check_add_norm(5, 48, dtype)


@interp
def test_add_rms_norm_falls_back_for_an_unfused_norm_and_odd_inputs():
    residual, delta = torch.randn(3, 16), torch.randn(3, 16)
    plain = LlamaRMSNorm(16)                       # not fused: the module's own forward, after the eager add
    total, normed = residual_norm.add_rms_norm(residual, delta, plain)
    assert torch.equal(total, residual + delta) and torch.equal(normed, plain(residual + delta))
    norm = fused_norm(16, torch.float32)
    strided = torch.randn(16, 3).t()               # not contiguous: eager add, then the norm module
    total, normed = residual_norm.add_rms_norm(strided, delta, norm)
    assert torch.equal(total, strided + delta) and torch.allclose(normed, LlamaRMSNorm.forward(norm, total))


@interp
def test_a_norm_computed_ahead_is_used_only_on_its_own_unchanged_tensor():
    norm = fused_norm(32, torch.float32)
    residual, delta = torch.randn(4, 32), torch.randn(4, 32)
    total = residual_norm.add_norm_ahead(residual, delta, norm)
    calls = []
    kernel = rms.rms_norm
    rms.rms_norm = lambda *a: calls.append(1) or kernel(*a)
    try:
        ahead = norm(total)                        # the value computed with the add: no kernel of its own
        assert calls == [] and torch.equal(ahead, kernel(total, norm.weight, norm.variance_epsilon))
        assert "batchscope_ahead" not in norm.__dict__ or norm.batchscope_ahead is None
        total = residual_norm.add_norm_ahead(residual, delta, norm)
        total.mul_(2)                              # changed in place after the add: computed afresh
        assert torch.allclose(norm(total), LlamaRMSNorm.forward(norm, total))
        other = residual_norm.add_norm_ahead(residual, delta, norm)
        assert torch.allclose(norm(other.clone() * 3), LlamaRMSNorm.forward(norm, other * 3))   # another tensor
        assert len(calls) == 2
    finally:
        rms.rms_norm = kernel


def test_only_template_layers_are_recognised():
    from transformers import Gemma2Config, LlamaConfig
    cfg = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
    spec = residual_norm.layer_spec(LlamaDecoderLayer(LlamaConfig(**cfg), 0))
    assert spec is not None and spec["positional"][0] == "attention_mask"
    assert spec["defaults"]["use_cache"] is False
    # Gemma 2 normalizes before and after each block: four norms, another forward
    assert residual_norm.layer_spec(Gemma2DecoderLayer(Gemma2Config(head_dim=8, **cfg), 0)) is None

    class Scaled(LlamaDecoderLayer):               # one statement changed: not the template
        def forward(self, hidden_states, attention_mask=None, **kwargs):
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
            hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask, **kwargs)
            hidden_states = residual + 2 * hidden_states
            residual = hidden_states
            hidden_states = self.post_attention_layernorm(hidden_states)
            hidden_states = self.mlp(hidden_states)
            hidden_states = residual + hidden_states
            return hidden_states
    assert residual_norm.layer_spec(Scaled(LlamaConfig(**cfg), 0)) is None


@interp
@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_tiny_model_greedy_output_unchanged_in_interpreter(kind):
    model = _tiny(kind, torch.float32)
    prompt = [5, 17, 99, 3, 200, 41, 7]
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        ref_tokens = _greedy(model, prompt, 5)
        ref_logits = model(ids).logits
    install(model)
    installed = residual_norm.install_residual_norms(model)
    assert installed == ["model.layers.0", "model.layers.1"]
    norms = []
    kernel = rms.rms_norm
    rms.rms_norm = lambda *a: norms.append(1) or kernel(*a)
    try:
        with torch.inference_mode():
            logits = model(ids).logits
            per_forward = len(norms)
            tokens = _greedy(model, prompt, 5)
    finally:
        rms.rms_norm = kernel
        residual_norm.uninstall_residual_norms(model)
        uninstall(model)
    # of the five decoder norms only the first layer's input norm runs alone (Qwen3: and its q/k head norms)
    assert per_forward == (1 if kind == "llama" else 1 + 2 * 2)
    assert (logits - ref_logits).abs().max().item() < 1e-4
    assert tokens == ref_tokens
    assert all("forward" not in m.__dict__ for m in model.modules())


def _fused_tiny_llama():
    model = _tiny("llama", torch.float32)
    install(model)
    assert residual_norm.install_residual_norms(model)
    return model


@interp
def test_a_hook_that_changes_a_layer_output_in_place_is_seen_in_inference_mode():
    """Inference tensors keep no version counter: with a hook between the add and the next norm, the norm is
    computed from the tensor as the hook left it."""
    ids = torch.tensor([[5, 17, 99, 3, 200, 41, 7]])
    plain = _tiny("llama", torch.float32)
    model = _fused_tiny_llama()
    try:
        for m in (plain, model):
            m.model.layers[0].register_forward_hook(lambda mod, args, out: out.add_(1.0))
        with torch.inference_mode():
            assert (model(ids).logits - plain(ids).logits).abs().max().item() < 1e-4
    finally:
        residual_norm.uninstall_residual_norms(model)
        uninstall(model)


@interp
def test_the_fused_layer_takes_its_arguments_as_the_original_does():
    from transformers import DynamicCache
    model = _fused_tiny_llama()
    layer, plain = model.model.layers[0], _tiny("llama", torch.float32).model.layers[0]
    x = torch.randn(1, 4, 64)
    cos_sin = model.model.rotary_emb(x, torch.arange(4)[None])
    try:
        caches = []
        for fwd in (layer, plain):   # the deprecated name still reaches the cache (deprecate_kwarg renames it)
            cache = DynamicCache(config=model.config)
            with torch.inference_mode():
                fwd(x, position_embeddings=cos_sin, past_key_values=cache, use_cache=True)
            caches.append(cache.get_seq_length())
        assert caches == [4, 4]
        with pytest.raises(TypeError):
            layer(x, None, None, None, False, cos_sin, "one too many")
    finally:
        residual_norm.uninstall_residual_norms(model)
        uninstall(model)


@gpu
@pytest.mark.parametrize("rows", [1, 32, 256])
def test_gpu_add_rms_norm_matches_add_then_norm(rows):
    check_add_norm(rows, 4096, torch.bfloat16, "cuda")
