"""The few-row decode GEMM (engine.skinny_gemm): equals F.linear up to fp32 summation order, split-K or not, run
after run; is planned only for the shapes it was measured to win; installs on plain and merged projections and
leaves greedy generation unchanged.

Without a GPU the kernel runs in Triton's CPU interpreter on small shapes; the `gpu` tests run it compiled at
Llama-3-8B shapes, inside a CUDA graph.
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton", reason="triton is not installed (pip install triton)")

from batchscope.engine.kernels import skinny_gemm  # noqa: E402
from batchscope.engine.kernels.projections import merge_projections  # noqa: E402
from test_fused import INTERPRETED, _interpreter_bf16_rounding, gpu  # noqa: E402,F401

interp = pytest.mark.skipif(not INTERPRETED, reason="CPU interpreter tests run where there is no CUDA device")


def check(n, k, rows, split_k, dtype=torch.float32, device="cpu", calls=2):
    gen = torch.Generator().manual_seed(n + rows)
    w = (torch.randn(n, k, generator=gen) * 0.05).to(dtype).to(device)
    x = torch.randn(rows, k, generator=gen).to(dtype).to(device)
    gemm = skinny_gemm.SkinnyGemm(w, split_k, 2)
    ref = F.linear(x.float(), w.float())
    first = gemm(x)
    for _ in range(calls - 1):             # the tile counters reset themselves: the next call sums afresh
        assert torch.equal(gemm(x), first)
    assert not gemm.counters.any()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert (first.float() - ref).abs().max().item() < tol * ref.abs().max().item()
    return first


@interp
@pytest.mark.parametrize("rows,split_k", [(1, 1), (5, 2), (16, 1), (23, 2), (32, 2)])
def test_matches_linear_in_interpreter(rows, split_k):
    check(128, 512, rows, split_k)


def test_plan_follows_the_measured_shapes():
    def w(n, k):
        return torch.empty(n, k, dtype=torch.bfloat16)
    assert skinny_gemm.plan(w(4096, 4096), 132) == (2, 5)      # Llama-3-8B o: 64 row tiles, split in two
    assert skinny_gemm.plan(w(4096, 14336), 132) == (2, 5)     # down
    assert skinny_gemm.plan(w(6144, 4096), 132) == (1, 5)      # merged q/k/v: 96 tiles, one wave
    assert skinny_gemm.plan(w(28672, 4096), 132) is None       # merged gate/up: 3.4 waves, cuBLAS
    assert skinny_gemm.plan(w(128256, 4096), 132) == (1, 3)    # lm_head: many waves
    assert skinny_gemm.plan(w(4000, 4096), 132) is None        # rows do not tile
    assert skinny_gemm.plan(w(4096, 576), 132) is None         # K does not tile (SmolLM2)


@interp
def test_linear_declines_what_it_does_not_cover_in_interpreter():
    w = torch.randn(128, 256)
    gemm = skinny_gemm.SkinnyGemm(w, 1, 2)
    assert gemm.linear(torch.randn(33, 256)) is None                            # more rows than the kernel holds
    assert gemm.linear(torch.randn(4, 256, dtype=torch.float64)) is None        # another dtype
    assert gemm.linear(torch.randn(256, 4).t()) is None                         # strided rows
    out = gemm.linear(torch.randn(1, 3, 256))
    assert out is not None and out.shape == (1, 3, 128)


@interp
def test_installs_on_plain_and_merged_projections_and_keeps_tokens_in_interpreter():
    from transformers import AutoModelForCausalLM, LlamaConfig
    cfg = LlamaConfig(vocab_size=8192, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                      bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval().requires_grad_(False)
    ids = torch.tensor([[5, 17, 99, 3, 200, 41, 7]])
    with torch.inference_mode():
        ref = model(ids).logits
    merge_projections(model)
    installed = skinny_gemm.install_skinny_gemms(model)
    # 2 layers x (merged q/k/v, o, down) and the lm_head (128 tiles); the merged gate/up (8 tiles) too
    assert "lm_head" in installed and "model.layers.0.self_attn.o_proj" in installed
    assert "model.layers.1.mlp.down_proj" in installed and "model.layers.0.self_attn.q_proj (merged)" in installed
    assert not any("gate_proj" in n or "k_proj" in n for n in installed), installed
    calls = []
    kernel = skinny_gemm.SkinnyGemm.__call__
    skinny_gemm.SkinnyGemm.__call__ = lambda self, *a: calls.append(1) or kernel(self, *a)
    try:
        with torch.inference_mode():
            logits = model(ids).logits
    finally:
        skinny_gemm.SkinnyGemm.__call__ = kernel
        skinny_gemm.uninstall_skinny_gemms(model)
    assert len(calls) == len(installed)
    assert torch.equal(logits.argmax(-1), ref.argmax(-1))
    assert (logits - ref).abs().max().item() < 1e-4
    assert "forward" not in model.lm_head.__dict__


@gpu
@pytest.mark.parametrize("shape,rows", [((4096, 4096), 32), ((4096, 14336), 7), ((6144, 4096), 32),
                                        ((128256, 4096), 16)])
def test_gpu_llama_shapes_match_linear(shape, rows):
    settings = skinny_gemm.plan(torch.empty(shape, dtype=torch.bfloat16), 132)
    check(*shape, rows, settings[0], torch.bfloat16, "cuda", calls=3)


@gpu
def test_gpu_replays_in_a_cuda_graph():
    w = torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda") * 0.02
    x = torch.randn(32, 4096, dtype=torch.bfloat16, device="cuda")
    gemm = skinny_gemm.SkinnyGemm(w, 2, 5)
    out = torch.empty(32, 4096, dtype=torch.bfloat16, device="cuda")
    gemm(x, out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm(x, out)
    expected = gemm(x).clone()
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected)
