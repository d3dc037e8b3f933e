"""The model support policy, family by family: every supported decoder gives transformers' own greedy tokens (in
sync, in async, and with the mode switched live, through a KV cache small enough to force chunked prefill and
preemption); every unsupported one is refused at load with a message that names its model type and the reason;
broken checkpoint folders get a clear ConfigError, and `batchscope serve` says so in one line.

Checkpoints are tiny random models built from transformers' config classes and saved to a temporary folder (no
downloads). benchmarks/model_matrix_gpu.py imports FAMILIES, REFUSED and build_checkpoint from here, so the GPU
check runs the same matrix; the `gpu`-marked tests below run it on CUDA (graphs and fused kernels on).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # The Triton kernels run in Triton's CPU interpreter here (must be set before they are first imported).
    os.environ.setdefault("TRITON_INTERPRET", "1")

from helpers import generate_in_mode, random_prompts, reference_generate  # noqa: E402
from batchscope.engine import ConfigError, Engine, EngineConfig, SamplingParams  # noqa: E402

try:    # the interpreter fix for Triton < 3.9 (an autouse fixture) applies to the kernel tests here too
    from test_attention_triton import _interpreter_index_fix  # noqa: E402, F401
except (ImportError, pytest.skip.Exception):
    pass

VOCAB = 256
_BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2, tie_word_embeddings=False)
# family (the engine's model_type) -> (transformers config class, its arguments). Small windows and caps so that
# sliding windows and soft-capping change the answer at these prompt lengths.
FAMILIES: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", dict(_BASE)),
    "mistral": ("MistralConfig", dict(_BASE, sliding_window=8)),
    "qwen2": ("Qwen2Config", dict(_BASE)),
    "qwen3": ("Qwen3Config", dict(_BASE, head_dim=16)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(_BASE, head_dim=16, moe_intermediate_size=32, num_experts=8,
                                         num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
                                         norm_topk_prob=True)),
    "mixtral": ("MixtralConfig", dict(_BASE, num_local_experts=4, num_experts_per_tok=2)),
    "gemma": ("GemmaConfig", dict(_BASE, head_dim=16)),
    "gemma2": ("Gemma2Config", dict(_BASE, head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
                                    attn_logit_softcapping=2.0, final_logit_softcapping=3.0)),
    "gemma3_text": ("Gemma3TextConfig", dict(_BASE, head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
                                             layer_types=["sliding_attention", "full_attention"])),
    "phi3": ("Phi3Config", dict(_BASE, pad_token_id=0, eos_token_id=2)),
    "olmo2": ("Olmo2Config", dict(_BASE, pad_token_id=0, eos_token_id=2)),
    "granite": ("GraniteConfig", dict(_BASE, embedding_multiplier=2.0, logits_scaling=4.0, residual_multiplier=0.5,
                                      attention_multiplier=0.3)),
    "gpt_neox": ("GPTNeoXConfig", dict(_BASE, num_key_value_heads=None, rotary_pct=0.5)),
    "gpt2": ("GPT2Config", dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=512,
                                initializer_range=0.2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                bos_token_id=1, eos_token_id=2)),
    "cohere": ("CohereConfig", dict(_BASE, logit_scale=0.5, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "smollm3": ("SmolLM3Config", dict(_BASE, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                      no_rope_layer_interval=2)),
    "stablelm": ("StableLmConfig", dict(_BASE, partial_rotary_factor=0.25, qk_layernorm=True,
                                        use_parallel_residual=True)),
    "deepseek_v2": ("DeepseekV2Config", dict(_BASE, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16,
                                             qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
                                             n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                                             moe_intermediate_size=32, first_k_dense_replace=1,
                                             topk_method="greedy")),
    "deepseek_v3": ("DeepseekV3Config", dict(_BASE, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16,
                                             qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
                                             n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                                             n_shared_experts=1, moe_intermediate_size=32,
                                             first_k_dense_replace=1)),
}
# family -> (config class, arguments, the reason its refusal must give)
REFUSED: dict[str, tuple[str, dict, str]] = {
    "falcon": ("FalconConfig", dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    initializer_range=0.2),
               # transformers before 5.25 computes Falcon's attention itself; 5.25 moved it to the
               # AttentionInterface, and its head (`lm_logits = self.lm_head(...)`) is then what batchscope refuses
               "(no attention-backend support|an output head that batchscope does not reproduce)"),
    "mamba": ("MambaConfig", dict(vocab_size=VOCAB, hidden_size=64, state_size=8, num_hidden_layers=2),
              "recurrent or attention-free layers"),
    "jamba": ("JambaConfig", dict(_BASE, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                                  expert_layer_offset=1, num_experts=2, mamba_d_state=8),
              "recurrent or attention-free layers"),
    "falcon_h1": ("FalconH1Config", dict(_BASE, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8,
                                         mamba_chunk_size=16), "recurrent or attention-free layers"),
    "gpt_oss": ("GptOssConfig", dict(_BASE, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                     sliding_window=8, layer_types=["sliding_attention", "full_attention"]),
                "unsupported attention kind"),
}
# The engine settings of the matrix: 12 blocks of 8 tokens for 5 requests of up to 48 tokens each cannot hold them
# all (preemption), and a 24-token step budget splits the longer prompts (chunked prefill).
MATRIX_ENGINE = dict(block_size=8, num_blocks=12, max_batch_tokens=24, max_running=5, seed=0)
NEW_TOKENS = 8


def build_checkpoint(family: str, path: str | Path, seed: int = 0) -> str:
    """Save a tiny random checkpoint of `family` (supported or refused) to `path`; returns the path."""
    import transformers

    cls, kwargs = (FAMILIES[family] if family in FAMILIES else REFUSED[family][:2])
    with _quiet_transformers():
        cfg = getattr(transformers, cls)(**kwargs)
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        model.save_pretrained(path)
    return str(path)


def reference_model(path: str, device: str = "cpu"):
    """The checkpoint under transformers' own attention. Gemma 2 gets "eager", its reference implementation:
    transformers 5.17 defaults it to SDPA, which drops the attention soft-capping the model is defined with."""
    import transformers

    with _quiet_transformers():
        cfg = transformers.AutoConfig.from_pretrained(path)
        extra = {"attn_implementation": "eager"} if getattr(cfg, "attn_logit_softcapping", None) else {}
        return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **extra).to(device).eval()


def matrix_prompts(seed: int = 5) -> list[list[int]]:
    return random_prompts(5, VOCAB, 18, 40, seed=seed)


class _quiet_transformers:
    """transformers warns about the tiny configs' token ids and RoPE defaults; the tests do not care."""

    def __enter__(self):
        from transformers.utils import logging
        self.level = logging.get_verbosity()
        logging.set_verbosity_error()

    def __exit__(self, *exc):
        from transformers.utils import logging
        logging.set_verbosity(self.level)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    cache: dict[str, str] = {}

    def get(family: str) -> str:
        if family not in cache:
            cache[family] = build_checkpoint(family, root / family)
        return cache[family]
    return get


def run_matrix_family(path: str, device: str, modes=("sync", "async", "switch"), **overrides) -> dict:
    """Generate the matrix prompts in each mode and compare with transformers' greedy generate; returns what
    happened (used by the tests here and by benchmarks/model_matrix_gpu.py)."""
    prompts = matrix_prompts()
    ref_model = reference_model(path, device)
    refs = [reference_generate(ref_model, p, NEW_TOKENS, None) for p in prompts]
    del ref_model
    traces = []
    eng = Engine(EngineConfig(model=path, device=device, dtype="float32", mode="async",
                              **{**MATRIX_ENGINE, **overrides}))
    eng.add_observer(lambda ev: traces.append(ev) if hasattr(ev, "preempted") else None)
    result = {"info": dict(eng.info), "modes": {}, "graphs_note": eng.runner.graphs.note,
              "graph_experts": eng.runner.graphs.experts_impl, "use_graphs": eng.runner.graphs.enabled}
    try:
        for mode in modes:
            outs = generate_in_mode(eng, prompts, SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True), mode)
            got = [o.token_ids for o in outs]
            result["modes"][mode] = {"exact": got == refs, "finish": sorted({o.finish_reason for o in outs}),
                                     "mismatches": [i for i, (a, b) in enumerate(zip(got, refs)) if a != b]}
    finally:
        eng.close()
    result["preempted"] = any(t.preempted for t in traces)
    result["chunked"] = any(t.prefill_tokens and t.prefill_tokens < len(p) for t in traces for p in prompts) \
        and max(len(p) for p in prompts) > MATRIX_ENGINE["max_batch_tokens"]
    return result


# ----------------------------------------------------------------------------------------------------- CPU matrix

@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_greedy_equals_transformers(checkpoints, family):
    res = run_matrix_family(checkpoints(family), "cpu")
    for mode, r in res["modes"].items():
        assert r["exact"], f"{family} {mode}: prompts {r['mismatches']} differ from transformers' generate"
        assert r["finish"] == ["length"]
    assert res["preempted"], "the small cache never preempted: the matrix lost its point"
    assert res["chunked"]


@pytest.mark.parametrize("family", list(REFUSED))
def test_unsupported_family_is_refused_at_load(checkpoints, family):
    path = checkpoints(family)
    reason = REFUSED[family][2]
    with pytest.raises(ConfigError) as exc:
        Engine(EngineConfig(model=path, device="cpu", dtype="float32", num_blocks=16))
    msg = str(exc.value)
    assert f"model type {family!r} is not supported" in msg and re.search(reason, msg) and "Supported:" in msg, msg
    assert msg.count("(") == msg.count(")") and ". Supported:" in msg and "its forward" not in msg, msg
    assert "llama" in msg.split("Supported:")[1]


def test_refusals_by_config_alone_happen_before_weights_are_read(checkpoints, tmp_path):
    """Recurrent and non-AttentionInterface families are refused from config.json before any weight is read (the
    Engine's and the CLI's preflight): a folder whose weights are garbage still gets the support message, not a
    weight error."""
    import shutil

    from batchscope.engine import Engine
    from batchscope.engine.model.loading import preflight

    for family in ("mamba", "falcon"):
        folder = tmp_path / family
        shutil.copytree(checkpoints(family), folder)
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])        # truncated
        with pytest.raises(ConfigError, match=f"model type '{family}' is not supported: {REFUSED[family][2]}"):
            preflight(str(folder))
        with pytest.raises(ConfigError, match=f"model type '{family}' is not supported: {REFUSED[family][2]}"):
            Engine(EngineConfig(model=str(folder), device="cpu"))


def test_unsupported_attention_kwarg_is_caught_by_the_probe(checkpoints):
    """gpt-oss passes attention sinks (s_aux) to the attention function: only the probe forward sees that."""
    from batchscope.engine.model.attention import register
    from batchscope.engine.model.loading import load_model
    from batchscope.engine.model.support import static_support
    from transformers import AutoConfig

    path = checkpoints("gpt_oss")
    static_support(AutoConfig.from_pretrained(path))             # nothing in the config gives it away
    with pytest.raises(ConfigError, match="s_aux"):
        load_model(EngineConfig(model=path, device="cpu", dtype="float32"), register())


def test_support_report_names_what_each_model_uses(checkpoints):
    from batchscope.engine.model.attention import register
    from batchscope.engine.model.loading import load_model

    def report(family):
        return load_model(EngineConfig(model=checkpoints(family), device="cpu", dtype="float32"),
                          register()).support

    g2 = report("gemma2")
    assert g2["verified"] and {"sliding window", "logit soft-capping", "logits post-processing"} <= set(
        g2["attention"])
    ds = report("deepseek_v3")
    assert (ds["kv_heads"], ds["k_dim"], ds["v_dim"]) == (4, 24, 12)
    assert {"keys wider than values (MLA)", "mixture of experts"} <= set(ds["attention"])
    assert report("llama")["attention"] == []


def test_logits_epilogue_reproduces_the_models_own_head(checkpoints):
    """Soft-capping (Gemma 2), logits_scaling (Granite), logit_scale (Cohere): the runner's head gives the
    model's own logits, so sampling sees the distribution transformers would, not just the same argmax."""
    from batchscope.engine.model.source import logits_epilogue

    ids = torch.tensor([[5, 9, 33, 2, 70]])
    for family in ("gemma2", "granite", "cohere", "llama"):
        model = reference_model(checkpoints(family))
        steps = logits_epilogue(model)
        assert len(steps) == {"gemma2": 3, "granite": 1, "cohere": 1, "llama": 0}[family]
        with torch.no_grad():
            want = model(ids).logits
            got = model.lm_head(model.model(ids).last_hidden_state)
            raw = got
            for step in steps:
                got = step(got)
        assert torch.equal(got, want), family
        if steps:
            assert not torch.allclose(raw, want)


def test_runner_and_cache_use_separate_key_and_value_widths(checkpoints):
    from transformers import AutoConfig

    from batchscope.engine.kv_cache import KVCache
    from batchscope.engine.model.kv_layout import KVLayout

    cfg = AutoConfig.from_pretrained(checkpoints("deepseek_v2"))
    layout = KVLayout.from_config(cfg)
    kv = KVCache(layout, 4, 8, torch.float32, torch.device("cpu"))
    k, v = kv.layers[1]
    assert k.shape == (5, 8, 4, 24) and v.shape == (5, 8, 4, 12)
    assert layout.bytes_per_token(torch.float32) == 2 * 4 * (24 + 12) * 4


# -------------------------------------------------------------------------------------------- the Triton kernels

def _interpreted() -> bool:
    from batchscope.engine.kernels import paged_attention as at
    return type(at._prefill_kernel).__name__ == "InterpretedFunction"


@pytest.mark.parametrize("softcap", [None, 2.0])
@pytest.mark.parametrize("v_dim", [16, 12])
def test_triton_kernels_softcap_and_narrow_values(softcap, v_dim):
    """The decode (split and direct) and prefill kernels against the torch reference, with Gemma 2's
    soft-capping and with values narrower than keys (MLA); the cap must change the answer."""
    pytest.importorskip("triton")
    if not (torch.cuda.is_available() or _interpreted()):
        pytest.skip("needs CUDA or Triton's interpreter before the kernels are first imported")
    from test_attention_triton import make_inputs, rel_err
    from batchscope.engine.kernels import paged_attention as at
    from batchscope.engine.model.attention import paged_attention_torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ctx = [37, 80, 5, 16]
    for query_lens, window in (([1, 1, 1, 1], None), ([5, 80, 5, 1], 20)):
        q, kc, vc, meta = make_inputs(ctx, query_lens, 4, 2, 24, 16, torch.float32, device=dev)
        vc = torch.randn(*vc.shape[:3], v_dim, device=dev)
        meta.kv_caches = [(kc, vc)]
        ref = paged_attention_torch(q, kc, vc, meta, 0.4, window, softcap)
        if softcap:
            assert rel_err(paged_attention_torch(q, kc, vc, meta, 0.4, window, None), ref) > 1e-2
        if query_lens[0] == 1:
            outs = [at.paged_decode(q, kc, vc, meta, 0.4, window, num_splits=3, block_n=16, min_split_keys=16,
                                    softcap=softcap),
                    at.paged_decode(q, kc, vc, meta, 0.4, window, num_splits=1, softcap=softcap)]
        else:
            outs = [at.paged_prefill(q, kc, vc, meta, 0.4, window, softcap=softcap)]
        for out in outs:
            assert out.shape == (q.shape[0], 4, v_dim)
            assert rel_err(out, ref) < 1e-5


def test_triton_kv_write_with_separate_widths():
    pytest.importorskip("triton")
    if not (torch.cuda.is_available() or _interpreted()):
        pytest.skip("needs CUDA or Triton's interpreter")
    from batchscope.engine.model.attention import write_kv
    from batchscope.engine.kernels.kv_write import write_kv_triton

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    kc, vc = torch.zeros(6, 4, 2, 24, device=dev), torch.zeros(6, 4, 2, 12, device=dev)
    kc2, vc2 = kc.clone(), vc.clone()
    key, val = torch.randn(5, 2, 24, device=dev), torch.randn(5, 2, 12, device=dev)
    slots = torch.tensor([3, 7, 8, 20, 1], device=dev)
    write_kv(kc, vc, key, val, slots)
    write_kv_triton(kc2, vc2, key, val, slots)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)


@pytest.mark.parametrize("family", ["gemma2", "deepseek_v3"])
def test_triton_attention_path_end_to_end(checkpoints, family):
    """The engine on the Triton kernels (the CUDA path; here in the interpreter) for soft-capping and MLA."""
    pytest.importorskip("triton")
    if torch.cuda.is_available() or not _interpreted():
        pytest.skip("CPU interpreter check (the gpu matrix covers CUDA)")
    res = run_matrix_family(checkpoints(family), "cpu", modes=("async",), attention="triton")
    assert res["info"]["attention"] == "triton"
    assert res["modes"]["async"]["exact"], res["modes"]


# ----------------------------------------------------------------------------------------- bad checkpoint folders

def _bad_folder(checkpoints, tmp_path, what: str) -> str:
    import shutil

    folder = tmp_path / what
    shutil.copytree(checkpoints("llama"), folder)
    if what == "no-config":
        (folder / "config.json").unlink()
    elif what == "bad-config":
        (folder / "config.json").write_text("{not json")
    elif what == "truncated-weights":
        w = folder / "model.safetensors"
        w.write_bytes(w.read_bytes()[:-100])
    elif what == "garbage-weights":
        (folder / "model.safetensors").write_bytes(b"\x00" * 64)
    elif what == "no-weights":
        (folder / "model.safetensors").unlink()
    elif what == "tokenizer-incomplete":
        (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    elif what == "tokenizer-corrupt":
        (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
        (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "nonsense"}}')
    return str(folder)


BAD = {"no-config": "config.json is missing", "bad-config": "not readable JSON",
       "truncated-weights": "corrupt safetensors", "garbage-weights": "corrupt safetensors",
       "no-weights": "no weights", "tokenizer-incomplete": "tokenizer files are incomplete",
       "tokenizer-corrupt": "tokenizer does not load"}


@pytest.mark.parametrize("what", list(BAD))
def test_bad_checkpoint_folder_is_a_clear_config_error(checkpoints, tmp_path, what):
    folder = _bad_folder(checkpoints, tmp_path, what)
    with pytest.raises(ConfigError, match=BAD[what]) as exc:
        Engine(EngineConfig(model=folder, device="cpu", dtype="float32", num_blocks=16))
    assert folder in str(exc.value)


def test_folder_without_tokenizer_loads_for_token_ids(checkpoints):
    eng = Engine(EngineConfig(model=checkpoints("llama"), device="cpu", dtype="float32", num_blocks=16))
    try:
        assert eng.tokenizer is None
        assert len(eng.generate([[5, 6, 7]], SamplingParams(max_new_tokens=2))[0].token_ids) == 2
        with pytest.raises(ConfigError, match="no tokenizer"):
            eng.generate(["text"], SamplingParams(max_new_tokens=2))
    finally:
        eng.close()


@pytest.mark.parametrize("what", ["no-config", "truncated-weights", "tokenizer-incomplete", "mamba"])
def test_serve_with_a_bad_model_exits_with_one_line(checkpoints, tmp_path, what):
    folder = checkpoints("mamba") if what == "mamba" else _bad_folder(checkpoints, tmp_path, what)
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}
    proc = subprocess.run([sys.executable, "-m", "batchscope.app.cli", "serve", "--model", folder, "--device", "cpu",
                           "--no-ui", "--port", "0"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr
    assert len(lines) == 1 and lines[0].startswith("batchscope: "), proc.stderr
    assert (REFUSED["mamba"][2] if what == "mamba" else BAD[what]) in lines[0]


# ----------------------------------------------------------------------------------------------------- presets

def test_qwen3_30b_a3b_preset_has_the_real_shapes():
    from batchscope.engine.model.loading import PRESETS, random_preset_config
    from transformers import AutoModelForCausalLM

    assert "qwen3-30b-a3b-random" in PRESETS
    cfg = random_preset_config("qwen3-30b-a3b-random")
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.num_experts, cfg.num_experts_per_tok) == ("qwen3_moe", 48,
                                                                                               128, 8)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    assert 30.0e9 < params < 31.0e9                       # "30B", about 3.3B of them active per token


# ------------------------------------------------------------------------------------------- the same on CUDA

@pytest.mark.gpu
@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_greedy_equals_transformers_on_cuda(checkpoints, family):
    res = run_matrix_family(checkpoints(family), "cuda")
    for mode, r in res["modes"].items():
        assert r["exact"], f"{family} {mode}: prompts {r['mismatches']} differ from transformers' generate"
    assert res["use_graphs"], f"{family}: decode fell back to eager: {res['graphs_note']}"
    if family in ("qwen3_moe", "mixtral", "deepseek_v2", "deepseek_v3"):
        assert res["graph_experts"] == "batched_mm"       # float32 grouped_mm syncs; the graphs use batched_mm


@pytest.mark.gpu
def test_uncapturable_decode_runs_eagerly_and_says_why(checkpoints):
    """A decode step that syncs with the host (here: a hook calling .item()) cannot be captured: the engine
    must start, run eagerly, say why, and still give the exact tokens."""
    path = checkpoints("llama")
    from transformers.models.llama import modeling_llama

    original = modeling_llama.LlamaMLP.forward

    def syncing(self, x):
        out = original(self, x)
        out.sum().item()                                  # a host sync in every layer
        return out
    modeling_llama.LlamaMLP.forward = syncing
    try:
        res = run_matrix_family(path, "cuda", modes=("async",))
    finally:
        modeling_llama.LlamaMLP.forward = original
    assert not res["use_graphs"] and "synchronises with the host" in res["graphs_note"]
    assert res["info"]["cuda_graphs"] is False
    assert res["modes"]["async"]["exact"]


@pytest.mark.gpu
def test_a_capture_that_fails_midway_is_undone_cleanly(checkpoints):
    """A step that passes the warm-up but breaks the capture itself (a sync only while capturing) leaves the
    allocator consistent: the engine runs eagerly, later allocations and a fresh engine's graphs work."""
    from transformers.models.llama import modeling_llama

    original = modeling_llama.LlamaMLP.forward

    def breaks_capture(self, x):
        out = original(self, x)
        if torch.cuda.is_current_stream_capturing():
            out.sum().item()                              # invalidates the capture
        return out
    modeling_llama.LlamaMLP.forward = breaks_capture
    try:
        res = run_matrix_family(checkpoints("llama"), "cuda", modes=("sync", "async"))
    finally:
        modeling_llama.LlamaMLP.forward = original
    assert not res["use_graphs"] and "capturing the decode step failed" in res["graphs_note"]
    assert all(r["exact"] for r in res["modes"].values())
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    again = run_matrix_family(checkpoints("llama"), "cuda", modes=("async",))
    assert again["use_graphs"] and again["modes"]["async"]["exact"]
