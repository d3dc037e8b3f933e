"""Engine tests: an engine (or its kernels and scheduler) on a tiny model built in memory or from a preset;
no server and no browser."""
from __future__ import annotations

import pytest
import torch

from batchscope.engine import EngineConfig
from helpers import random_prompts, reference_generate


@pytest.fixture(scope="module")
def tiny_engine():
    """The tiny-random preset on CPU in async mode, one engine per test module. Its cache (3,200 slots) is
    smaller than the model's context (4,096), so a request that could never fit exists."""
    from batchscope.engine import Engine

    eng = Engine(EngineConfig(model="tiny-random", device="cpu", dtype="float32", mode="async",
                              num_blocks=200, max_batch_tokens=256, max_running=32, seed=0))
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def qwen3_checkpoint(tmp_path_factory):
    """A tiny random Qwen3 (grouped KV heads, q/k norms) saved as a local checkpoint, with an EOS token that
    greedy decoding actually produces, so EOS-on paths get exercised."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    cfg = Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                      initializer_range=0.2, tie_word_embeddings=False, eos_token_id=None, bos_token_id=None)
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    prompts = random_prompts(8, 512, 3, 40, seed=5)
    counts: dict[int, int] = {}
    for p in prompts:
        for t in reference_generate(model, p, 24, None)[2:20]:
            counts[t] = counts.get(t, 0) + 1
    eos = max(counts, key=counts.get)
    model.config.eos_token_id = eos
    model.generation_config.eos_token_id = eos
    path = tmp_path_factory.mktemp("qwen3-tiny")
    model.save_pretrained(path)
    return str(path), model, eos
