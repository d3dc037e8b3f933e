"""Merged q/k/v and gate/up projections compute what the separate ones do, share their memory, and leave alone
what they do not recognise."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from batchscope.engine.kernels.projections import merge_projections


def tiny(kind: str, bias: bool = False):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    common = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  initializer_range=0.2, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                  attention_bias=bias)
    cfg = LlamaConfig(**common) if kind == "llama" else Qwen3Config(head_dim=16, **common)
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval().requires_grad_(False)
    if bias:   # random biases, so that a wrong slice of the merged bias would show
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.data.normal_()
    return model


def greedy(model, prompt, n):
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         eos_token_id=-1, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("kind,bias", [("llama", False), ("llama", True), ("qwen3", False)])
def test_merged_model_gives_the_same_logits_tokens_and_state(kind, bias):
    model = tiny(kind, bias)
    prompt = [5, 17, 99, 3, 200, 41, 7]
    ids = torch.tensor([prompt])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.inference_mode():
        ref_logits, ref_tokens = model(ids).logits, greedy(model, prompt, 8)
    merged = merge_projections(model)
    assert merged == ["model.layers.0.self_attn (q/k/v)", "model.layers.0.mlp (gate/up)",
                      "model.layers.1.self_attn (q/k/v)", "model.layers.1.mlp (gate/up)"]
    with torch.inference_mode():
        logits, tokens = model(ids).logits, greedy(model, prompt, 8)
    assert (logits - ref_logits).abs().max().item() < 1e-5
    assert tokens == ref_tokens
    after = model.state_dict()
    assert after.keys() == state.keys() and all(torch.equal(after[k], state[k]) for k in state)


def test_projections_become_views_of_one_weight():
    model = tiny("llama", bias=True)
    before = sum(p.numel() for p in model.parameters())
    merge_projections(model)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    w = attn.q_proj.batchscope_merged.weight
    assert w.shape == (64 + 2 * 32, 64)
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
        assert proj.weight.untyped_storage().data_ptr() == w.untyped_storage().data_ptr()
        assert proj.bias.untyped_storage().data_ptr() == attn.q_proj.batchscope_merged.bias.untyped_storage(
        ).data_ptr()
    assert mlp.gate_proj.weight.untyped_storage().data_ptr() == mlp.batchscope_merged.weight.untyped_storage(
    ).data_ptr()
    assert sum(p.numel() for p in model.parameters()) == before


def test_siblings_called_on_another_input_compute_their_own_product():
    model = tiny("llama", bias=True)
    merge_projections(model)
    attn = model.model.layers[0].self_attn
    x, y = torch.randn(3, 64), torch.randn(3, 64)
    q = attn.q_proj(x)
    assert torch.allclose(q, F.linear(x, attn.q_proj.weight, attn.q_proj.bias), atol=1e-6)
    # k on another tensor: not a slice of x's product
    assert torch.allclose(attn.k_proj(y), F.linear(y, attn.k_proj.weight, attn.k_proj.bias), atol=1e-6)
    assert torch.allclose(attn.v_proj(x), F.linear(x, attn.v_proj.weight, attn.v_proj.bias), atol=1e-6)
    assert attn.q_proj.batchscope_merged.last is None        # v, the last sibling, released the product
    assert torch.allclose(attn.v_proj(x), F.linear(x, attn.v_proj.weight, attn.v_proj.bias), atol=1e-6)


class GatedGelu(nn.Module):
    """Same attribute names as a Llama MLP, different math: must not be merged."""

    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(8, 16), nn.Linear(8, 16), nn.Linear(16, 8)
        self.act_fn = nn.GELU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.up_proj(x)) + self.gate_proj(x))


class QuantLinear(nn.Linear):
    pass


def test_unrecognised_modules_are_left_alone_and_merging_is_idempotent():
    root = nn.Module()
    root.mlp = GatedGelu()
    root.attn = nn.Module()
    root.attn.q_proj, root.attn.k_proj, root.attn.v_proj = nn.Linear(8, 8), QuantLinear(8, 4), nn.Linear(8, 4)
    root.other = nn.Module()
    root.other.q_proj, root.other.k_proj, root.other.v_proj = nn.Linear(8, 8), nn.Linear(6, 4), nn.Linear(8, 4)
    assert merge_projections(root) == []
    assert "forward" not in root.mlp.__dict__ and "forward" not in root.attn.q_proj.__dict__

    model = tiny("qwen3")
    assert len(merge_projections(model)) == 4
    assert merge_projections(model) == []


def test_engine_merges_by_default_and_can_be_told_not_to():
    from batchscope.engine import Engine, EngineConfig, SamplingParams

    outputs = {}
    for merge in (True, False):
        engine = Engine(EngineConfig(model="tiny-random", device="cpu", num_blocks=64, merge_projections=merge))
        try:
            assert (engine.info["merged_projections"] > 0) == merge
            outputs[merge] = [o.token_ids for o in engine.generate(
                [[1, 2, 3, 4], [9, 8, 7]], SamplingParams(max_new_tokens=6, ignore_eos=True))]
        finally:
            engine.close()
    assert outputs[True] == outputs[False]
