"""The fused expert GEMMs: the alignment puts every (token, expert) pair in a block of its expert exactly once,
with fixed shapes; the kernels give the experts' own forward (float32: to rounding; bf16: within bf16 noise);
on CUDA the fused forward replays in a CUDA graph and the MoE decode graphs use it in bf16.

Without a GPU the kernel runs in Triton's CPU interpreter (TRITON_INTERPRET=1) on tiny shapes."""
from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")      # before the kernel is decorated

triton = pytest.importorskip("triton", reason="triton is not installed (pip install triton)")

from batchscope.engine.kernels import moe as moe_triton  # noqa: E402


def gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")(test))


def _routing(tokens: int, top_k: int, experts: int, seed: int, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(tokens, experts, generator=g)
    weights, index = scores.topk(top_k, dim=-1)
    return index.to(device), (weights / weights.sum(-1, keepdim=True)).to(device)


@pytest.mark.parametrize("tokens, top_k, experts", [(1, 2, 4), (5, 2, 8), (32, 8, 128), (40, 3, 5)])
def test_align_places_every_pair_once_in_a_block_of_its_expert(tokens, top_k, experts):
    index, _ = _routing(tokens, top_k, experts, seed=tokens, device="cuda" if HAS_CUDA else "cpu")
    pairs, block_expert = moe_triton.align(index, experts)
    pairs, block_expert, index = pairs.cpu(), block_expert.cpu(), index.cpu()
    n = tokens * top_k
    bm = moe_triton.BLOCK_M
    assert pairs.numel() == moe_triton.max_blocks(n, experts) * bm == block_expert.numel() * bm
    flat = index.reshape(-1)
    seen = []
    for b, e in enumerate(block_expert.tolist()):
        block = pairs[b * bm:(b + 1) * bm].tolist()
        live = [p for p in block if p < n]
        if e < 0:
            assert not live
            continue
        assert all(flat[p] == e for p in live)
        seen += live
    assert sorted(seen) == list(range(n))


@pytest.mark.parametrize("tokens, top_k, experts", [(1, 2, 4), (40, 3, 5), (256, 8, 128), (3, 8, 64)])
def test_the_align_kernel_places_pairs_as_the_torch_ops_do(tokens, top_k, experts):
    """One Triton program against the ~25 torch ops it replaces: the same block experts and, block by block, the
    same pairs in the same slots up to their order inside an expert's slots (the kernel's ranks come from
    atomics), across chunk boundaries (256 x 8 pairs)."""
    index, _ = _routing(tokens, top_k, experts, seed=experts)
    device = "cuda" if HAS_CUDA else "cpu"
    got = [t.cpu() for t in moe_triton.align(index.to(device), experts)]
    want = [t.cpu() for t in moe_triton.align_torch(index.to(device), experts)]
    assert torch.equal(got[1], want[1])
    bm = moe_triton.BLOCK_M
    for e in range(experts):          # each expert's slot range: same pairs, then the same sentinels
        slots = torch.cat([torch.arange(b * bm, (b + 1) * bm) for b in (want[1] == e).nonzero().flatten()]
                          or [torch.empty(0, dtype=torch.long)])
        g, w = got[0][slots], want[0][slots]
        assert torch.equal(g.sort().values, w.sort().values), e
        assert torch.equal(g == tokens * top_k, w == tokens * top_k), e
    unused = (want[1] < 0).repeat_interleave(bm)
    assert torch.equal(got[0][unused], want[0][unused])


class _Experts(torch.nn.Module):
    """The experts layout transformers' Qwen3-MoE and Mixtral use, with its eager forward as the reference."""

    def __init__(self, experts: int, hidden: int, inter: int, dtype, device, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.gate_up_proj = torch.nn.Parameter((torch.randn(experts, 2 * inter, hidden, generator=g) * 0.1)
                                               .to(dtype).to(device), requires_grad=False)
        self.down_proj = torch.nn.Parameter((torch.randn(experts, hidden, inter, generator=g) * 0.1)
                                            .to(dtype).to(device), requires_grad=False)
        self.act_fn = torch.nn.SiLU()
        self.has_gate, self.is_concatenated, self.is_transposed = True, True, False
        self.has_bias, self.has_post_expert_norm, self._is_expert_parallel = False, False, False

    def _apply_gate(self, gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up

    def reference(self, x, index, weights):
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(index.shape[1]):
                e = int(index[t, j])
                h = self._apply_gate(x[t] @ self.gate_up_proj[e].to(x.dtype).T) @ self.down_proj[e].to(x.dtype).T
                out[t] += (h * weights[t, j]).to(x.dtype)
        return out


@pytest.mark.skipif(HAS_CUDA, reason="the CPU interpreter variant; on CUDA the gpu tests below run it compiled")
def test_the_kernel_gives_the_experts_forward_in_the_interpreter():
    experts = _Experts(6, 32, 24, torch.float32, "cpu")
    index, weights = _routing(5, 2, 6, seed=3)
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(1))
    n = index.numel()
    pairs, block_expert = moe_triton.align(index, 6)
    gate_up = moe_triton.expert_gemm(x, experts.gate_up_proj, pairs, block_expert, n, a_div=2)
    want_gate_up = torch.stack([x[p // 2] @ experts.gate_up_proj[int(index.reshape(-1)[p])].T for p in range(n)])
    torch.testing.assert_close(gate_up, want_gate_up, rtol=1e-5, atol=1e-5)
    act = experts._apply_gate(gate_up)
    out = moe_triton.expert_gemm(act, experts.down_proj, pairs, block_expert, n, a_div=1,
                                 route=weights.reshape(-1).contiguous())
    got = moe_triton.combine(out, 2, torch.float32)
    torch.testing.assert_close(got, out.view(5, 2, -1).sum(1), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got, experts.reference(x, index, weights), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(moe_triton.fused_experts_forward(experts, x, index, weights), got)


def _router_reference(logits, top_k, normalize, out_dtype):
    probs = torch.softmax(logits.float(), dim=-1)
    values, index = probs.topk(top_k, dim=-1)
    if normalize:
        values = values / values.sum(-1, keepdim=True)
    return values.to(out_dtype), index


@pytest.mark.parametrize("tokens, experts, top_k, normalize, out_dtype", [
    (32, 128, 8, True, torch.bfloat16),      # Qwen3-30B-A3B
    (5, 8, 2, True, torch.float32),          # Mixtral: fp32 scores
    (3, 60, 4, False, torch.bfloat16),       # Qwen2-MoE without normalizing, experts not a power of two
    (0, 16, 2, True, torch.bfloat16)])
def test_router_kernel_gives_softmax_topk_and_normalize(tokens, experts, top_k, normalize, out_dtype):
    device = "cuda" if HAS_CUDA else "cpu"
    g = torch.Generator().manual_seed(tokens + experts)
    logits = (torch.randn(tokens, experts, generator=g) * 2).to(torch.bfloat16).to(device)
    weights, index = moe_triton.router_topk(logits, top_k, normalize, out_dtype)
    want_w, want_i = _router_reference(logits, top_k, normalize, out_dtype)
    assert weights.dtype == out_dtype and index.dtype == torch.int64 and index.shape == (tokens, top_k)
    # the same probabilities, largest first; among equal bf16 logits the kernel takes the lower expert, where
    # torch's topk picks either way (its CPU and CUDA kernels differ)
    probs = torch.softmax(logits.float(), dim=-1)
    assert torch.equal(probs.gather(-1, index), probs.gather(-1, want_i))
    ties = probs.gather(-1, index)[:, :-1] == probs.gather(-1, index)[:, 1:]
    assert (index[:, :-1] < index[:, 1:])[ties].all()
    # the kernel's exp and sum order differ from torch's in the last fp32 bits: within one rounding of the dtype
    tol = 2 ** -7 if out_dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(weights.float(), want_w.float(), rtol=tol, atol=tol)


def _tiny_moe(kind: str, dtype: torch.dtype, device: str):
    from transformers import AutoModelForCausalLM, MixtralConfig, Qwen3MoeConfig

    common = dict(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, num_experts_per_tok=2, initializer_range=0.2,
                  bos_token_id=None, eos_token_id=None)
    cfg = (Qwen3MoeConfig(head_dim=16, moe_intermediate_size=32, num_experts=8, **common) if kind == "qwen3_moe"
           else MixtralConfig(num_local_experts=8, **common))
    torch.manual_seed(5)
    return AutoModelForCausalLM.from_config(cfg, dtype=dtype).to(device).eval().requires_grad_(False)


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
def test_routers_are_fused_where_their_code_is_the_reference(kind):
    """Qwen3-MoE's and Mixtral's routers get the kernel (and the layer's tokens keep their experts); float32
    inputs and plain linears are left to transformers."""
    device = "cuda" if HAS_CUDA else "cpu"
    model = _tiny_moe(kind, torch.bfloat16, device)
    x = (torch.randn(1, 6, 64, generator=torch.Generator().manual_seed(0)) * 2).to(torch.bfloat16).to(device)
    router = model.model.layers[0].mlp.gate
    with torch.inference_mode():
        want = router(x)
        patched = moe_triton.install_fused_router(model)
        assert patched == [f"model.layers.{i}.mlp.gate ({type(router).__name__})" for i in range(2)]
        assert moe_triton.install_fused_router(model) == []          # idempotent
        got = router(x)
        assert torch.equal(got[0], want[0])
        probs = torch.softmax(got[0].float(), dim=-1)
        assert torch.equal(probs.gather(-1, got[2]), probs.gather(-1, want[2]))   # ties: either expert
        assert got[1].dtype == want[1].dtype
        torch.testing.assert_close(got[1].float(), want[1].float(), rtol=2 ** -7, atol=2 ** -7)
        calls = []
        kernel = moe_triton.router_topk
        moe_triton.router_topk = lambda *a: calls.append(1) or kernel(*a)
        try:
            router(x.float().to(torch.bfloat16))
            assert calls, "the bf16 router did not run the kernel"
            calls.clear()
            router.float()(x.float())
            assert not calls, "a float32 router must keep transformers' ops"
        finally:
            moe_triton.router_topk = kernel


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_forward_matches_the_experts_forward_on_cuda(dtype):
    experts = _Experts(128, 2048, 768, dtype, "cuda")
    index, weights = _routing(32, 8, 128, seed=7, device="cuda")
    x = (torch.randn(32, 2048, generator=torch.Generator().manual_seed(2)) * 0.5).to(dtype).cuda()
    weights = weights.to(dtype)
    got = moe_triton.fused_experts_forward(experts, x, index, weights)
    if dtype == torch.float32:
        torch.testing.assert_close(got, experts.reference(x, index, weights), rtol=1e-4, atol=1e-4)
        return
    # bf16: against transformers' own grouped_mm experts, within the rounding of bf16 intermediates
    from transformers.integrations.moe import grouped_mm_experts_forward
    experts.num_experts = 128
    want = grouped_mm_experts_forward(experts, x, index, weights).float()
    scale = want.abs().max().item()
    assert (got.float() - want).abs().max().item() <= 0.02 * scale
    exact = experts.reference(x.float(), index, weights.float())
    assert (got.float() - exact).abs().mean().item() <= 1.5 * (want - exact).abs().mean().item() + 1e-6


@gpu
def test_fused_forward_replays_in_a_cuda_graph():
    experts = _Experts(16, 256, 128, torch.bfloat16, "cuda")
    index, weights = _routing(8, 4, 16, seed=1, device="cuda")
    x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    weights = weights.to(torch.bfloat16)
    eager = moe_triton.fused_experts_forward(experts, x, index, weights)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        moe_triton.fused_experts_forward(experts, x, index, weights)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = moe_triton.fused_experts_forward(experts, x, index, weights)
    torch.cuda.current_stream().wait_stream(stream)
    index2, weights2 = _routing(8, 4, 16, seed=9, device="cuda")
    index.copy_(index2)
    weights.copy_(weights2.to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, moe_triton.fused_experts_forward(experts, x, index, weights))
    assert not torch.equal(out, eager)           # the replay followed the new routing


@gpu
def test_bf16_moe_decode_graphs_use_the_fused_experts(tmp_path):
    """bf16 MoE decode graphs run the fused experts (float32 keeps transformers' own), and their tokens agree with
    the same engine run eagerly on transformers' experts (bf16: a rounding may flip a rare token, garbage would
    not agree)."""
    from batchscope.engine import Engine, EngineConfig, SamplingParams
    from test_model_matrix import build_checkpoint, matrix_prompts

    path = build_checkpoint("qwen3_moe", tmp_path / "m")
    prompts = matrix_prompts()
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    outs = {}
    for graphs in (True, False):
        with Engine(EngineConfig(model=path, device="cuda", dtype="bfloat16", num_blocks=64, max_running=8,
                                 cuda_graphs=graphs)) as eng:
            if graphs:
                assert eng.runner.graphs.experts_impl == moe_triton.NAME, eng.runner.graphs.experts_impl
            outs[graphs] = [o.token_ids for o in eng.generate(prompts, params)]
    same = sum(a == b for x, y in zip(outs[True], outs[False]) for a, b in zip(x, y))
    assert same >= 0.8 * sum(len(x) for x in outs[True]), (outs[True], outs[False])
    with Engine(EngineConfig(model=path, device="cuda", dtype="float32", num_blocks=64, max_running=8)) as eng:
        assert eng.runner.graphs.experts_impl != moe_triton.NAME
