"""Logprobs: each sampled token's logprob and its top alternatives equal torch.log_softmax and torch.topk of
transformers' own logits for the same model and prompt (float32, CPU), in sync, in async and across live switches;
they are the raw ones (before penalties and temperature, as vLLM returns them by default), come after the model's
own logit epilogue, and stream with their tokens."""
from __future__ import annotations

import pytest
import torch

from helpers import generate_in_mode, random_prompts, reference_generate, reference_logprobs
from batchscope.engine import Engine, EngineConfig, SamplingParams

ATOL = 1e-4      # our forward against transformers' one, both float32: they round differently, not more


def assert_logprobs_match(model, prompt, out, k):
    """`out`'s logprobs against the log-softmax of transformers' logits for the tokens it produced."""
    if k is None:
        assert out.logprobs is None and out.top_logprobs is None
        return
    n = len(out.token_ids)
    assert len(out.logprobs) == len(out.top_logprobs) == n
    ref = reference_logprobs(model, prompt, out.token_ids)
    chosen = ref[torch.arange(n), torch.tensor(out.token_ids)]
    torch.testing.assert_close(torch.tensor(out.logprobs), chosen, atol=ATOL, rtol=0)
    top = ref.topk(k, dim=-1) if k else None
    for i, alternatives in enumerate(out.top_logprobs):
        assert len(alternatives) == k
        if k:
            assert [t for t, _ in alternatives] == top.indices[i].tolist()
            torch.testing.assert_close(torch.tensor([v for _, v in alternatives]), top.values[i], atol=ATOL, rtol=0)


@pytest.mark.parametrize("mode", ["sync", "async", "switch"])
def test_logprobs_equal_log_softmax_of_transformers_logits(tiny_engine, tiny_reference, mode):
    asked = [None, 0, 1, 5, 20, 3, None, 20, 2, 0]
    prompts = random_prompts(len(asked), 49152, 1, 60, seed=13)
    lengths = [7, 15, 9, 20, 12, 4, 18, 10, 14, 6]
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True, logprobs=k) for n, k in zip(lengths, asked)]
    outs = generate_in_mode(tiny_engine, prompts, params, mode)
    for p, n, k, out in zip(prompts, lengths, asked, outs):
        assert out.token_ids == reference_generate(tiny_reference, p, n, None)   # asking changes no token
        assert_logprobs_match(tiny_reference, p, out, k)
        if k:
            assert [t for t, _ in out.top_logprobs[0]][0] == out.token_ids[0]      # greedy: the top one


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_logprobs_of_grouped_kv_qwen3_through_eos_and_chunked_prefill(qwen3_checkpoint, mode):
    """A budget of 16 tokens a step splits every prompt; EOS ends some requests a step late in async, and the
    token dropped then has no logprob either."""
    path, model, eos = qwen3_checkpoint
    with Engine(EngineConfig(model=path, device="cpu", dtype="float32", mode=mode, block_size=8, num_blocks=64,
                             max_batch_tokens=16, max_running=6, seed=0)) as eng:
        prompts = random_prompts(8, 512, 17, 60, seed=7)
        outs = eng.generate(prompts, SamplingParams(max_new_tokens=24, logprobs=4))
    assert any(o.finish_reason == "eos" for o in outs), "the EOS path was never exercised"
    for p, out in zip(prompts, outs):
        assert out.token_ids == reference_generate(model, p, 24, eos)
        assert_logprobs_match(model, p, out, 4)


def test_logprobs_come_after_the_models_own_logit_soft_capping(tmp_path):
    """Gemma 2 soft-caps its final logits (tanh, cap 3 here): the logprobs are of the capped logits, as
    transformers' forward gives them."""
    from transformers import AutoModelForCausalLM, Gemma2Config

    cfg = Gemma2Config(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                       initializer_range=0.2, sliding_window=8, query_pre_attn_scalar=16,
                       attn_logit_softcapping=2.0, final_logit_softcapping=3.0, tie_word_embeddings=False)
    torch.manual_seed(4)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    model.save_pretrained(tmp_path)
    prompts = random_prompts(4, 256, 3, 30, seed=3)
    with Engine(EngineConfig(model=str(tmp_path), device="cpu", dtype="float32", num_blocks=64, seed=0)) as eng:
        for mode in ("sync", "async", "switch"):
            outs = generate_in_mode(eng, prompts, SamplingParams(max_new_tokens=10, ignore_eos=True, logprobs=3),
                                    mode)
            for p, out in zip(prompts, outs):
                assert_logprobs_match(model, p, out, 3)
    model.config.final_logit_softcapping = None             # what the logprobs would be without the cap
    uncapped = reference_logprobs(model, prompts[0], outs[0].token_ids)
    chosen = uncapped[torch.arange(10), torch.tensor(outs[0].token_ids)]
    assert (torch.tensor(outs[0].logprobs) - chosen).abs().max() > 100 * ATOL


def test_sampled_and_penalized_tokens_get_the_raw_logprobs(tiny_engine, tiny_reference):
    """Temperature, top-k and penalties choose the token; its logprob is still the model's own (vLLM's default,
    "raw_logprobs"), so the chosen token need not be the top alternative."""
    prompt = [21, 22, 23, 24]
    params = SamplingParams(max_new_tokens=12, temperature=1.5, top_k=8, seed=5, ignore_eos=True, logprobs=20,
                            presence_penalty=-2.0, repetition_penalty=0.5)
    for mode in ("async", "sync"):
        tiny_engine.set_mode(mode)
        out = tiny_engine.generate([prompt], params)[0]
        ref = reference_logprobs(tiny_reference, prompt, out.token_ids)
        chosen = ref[torch.arange(len(out.token_ids)), torch.tensor(out.token_ids)]
        torch.testing.assert_close(torch.tensor(out.logprobs), chosen, atol=ATOL, rtol=0)
        assert any(top[0][0] != tok for top, tok in zip(out.top_logprobs, out.token_ids)), "always greedy?"


def test_streamed_deltas_carry_the_logprobs_of_their_tokens(tiny_engine):
    for mode in ("async", "sync"):
        tiny_engine.set_mode(mode)
        asked = tiny_engine.submit([5, 6, 7], SamplingParams(max_new_tokens=9, ignore_eos=True, logprobs=2))
        plain = tiny_engine.submit([5, 6, 7], SamplingParams(max_new_tokens=9, ignore_eos=True))
        deltas, out = list(asked), asked.result(timeout=60)
        assert [t for d in deltas for t in d.token_ids] == out.token_ids
        assert [v for d in deltas for v in d.logprobs] == out.logprobs
        assert [a for d in deltas for a in d.top_logprobs] == out.top_logprobs
        assert all(len(d.logprobs) == len(d.top_logprobs) == len(d.token_ids) for d in deltas)
        plain_deltas = list(plain)
        assert all(d.logprobs is None and d.top_logprobs is None for d in plain_deltas)
        assert plain.result(timeout=60).token_ids == out.token_ids and plain.result().logprobs is None
