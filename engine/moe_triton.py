"""Fused expert GEMMs for MoE decode: each touched expert's weights cross HBM once per step.

A decode step of Qwen3-30B-A3B shapes at batch 32 routes 32 x 8 = 256 (token, expert) pairs over 128 experts,
two pairs per expert on average. A grouped GEMM over such tiny groups reads the weights well below the copy
bandwidth, and the step ran at 2.2x its routed floor (docs/BENCHMARKS.md, MoE). Here:

1. `align`: the pairs are sorted by expert into blocks of BLOCK_M rows, each block holding pairs of one expert
   (padded with a sentinel), with every shape fixed by the number of pairs and experts alone, so the whole
   step stays capturable in a CUDA graph (no host sync, no data-dependent shape).
2. `_expert_gemm_kernel`, once for gate/up and once for down: a program per (block, column tile) multiplies its
   block's rows (gathered from the token rows, or the pair rows) by its expert's weight tile, and writes them back
   to the pairs' rows; unused blocks return at once. The down pass multiplies by the routing weight.
3. SiLU(gate) * up between them (engine.fused.silu_mul), and the top-k sum per token at the end, as the
   experts' own forward does.

Registered in transformers' ExpertsInterface as "batchscope_fused" and used by the decode graphs of bf16/fp16
MoE models (graphs.py); float32 keeps transformers' own experts (exactness tests compare those).
"""
from __future__ import annotations

import torch

from .projections import _is_silu

try:    # transformers' default SiLU(gate) * up, which `_gate` runs as one kernel (another version: its gate, unfused)
    from transformers.integrations.moe import _default_apply_gate
    _default_gate_code = _default_apply_gate.__code__
except ImportError:
    _default_gate_code = None

try:
    import triton
    import triton.language as tl

    from .fused import silu_mul
except Exception:       # pragma: no cover - no Triton: the module cannot be used, callers check `available`
    triton = None

NAME = "batchscope_fused"
BLOCK_M = 16


def available() -> bool:
    return triton is not None


if triton is not None:
    @triton.jit
    def _expert_gemm_kernel(a, w, out, pairs, block_expert, route_w, n_pairs, n_cols, k_dim, a_div,
                            stride_a, stride_we, stride_wn, stride_out,
                            HAS_ROUTE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
        block = tl.program_id(0)
        expert = tl.load(block_expert + block)
        if expert >= 0:
            rows = tl.arange(0, BLOCK_M)
            pair = tl.load(pairs + block * BLOCK_M + rows)
            live = pair < n_pairs
            a_row = tl.where(live, pair // a_div, 0).to(tl.int64)
            cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            col_ok = cols < n_cols
            ks = tl.arange(0, BLOCK_K)
            w_base = w + expert.to(tl.int64) * stride_we + cols[None, :].to(tl.int64) * stride_wn
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, k_dim, BLOCK_K):
                k_ok = (k0 + ks) < k_dim
                x = tl.load(a + a_row[:, None] * stride_a + (k0 + ks)[None, :],
                            mask=live[:, None] & k_ok[None, :], other=0.0)
                wt = tl.load(w_base + (k0 + ks)[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
                if IEEE:
                    acc += tl.dot(x, wt, input_precision="ieee")
                else:
                    acc += tl.dot(x, wt)
            if HAS_ROUTE:
                scale = tl.load(route_w + tl.where(live, pair, 0), mask=live, other=0.0).to(tl.float32)
                # as the experts' own forward rounds: the product in the dtype, then scaled
                acc = acc.to(out.dtype.element_ty).to(tl.float32) * scale[:, None]
            dest = tl.where(live, pair, 0).to(tl.int64)
            tl.store(out + dest[:, None] * stride_out + cols[None, :], acc.to(out.dtype.element_ty),
                     mask=live[:, None] & col_ok[None, :])


if triton is not None:
    @triton.jit
    def _align_kernel(expert_ids, pairs, block_expert, n_pairs, n_experts, n_blocks,
                      CHUNK: tl.constexpr, E_POW2: tl.constexpr, NB_POW2: tl.constexpr, BLOCK_M: tl.constexpr):
        """One program does what `align_torch` does in ~25 small kernels: count each expert's pairs, lay the
        experts out in whole blocks, place every pair at its expert's start plus its rank among that expert's
        pairs (pairs in order), and name each block's expert. Pairs go in chunks of CHUNK; a pair's rank is the
        count of its expert in the chunks before (one-hot against the running counts) plus those before it in
        its own chunk."""
        experts = tl.arange(0, E_POW2)
        counts = tl.zeros((E_POW2,), dtype=tl.int32)
        for c0 in range(0, n_pairs, CHUNK):
            offs = c0 + tl.arange(0, CHUNK)
            e = tl.load(expert_ids + offs, mask=offs < n_pairs, other=-1).to(tl.int32)
            counts += tl.sum((e[:, None] == experts[None, :]).to(tl.int32), axis=0)
        padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
        ends = tl.cumsum(padded, axis=0)
        starts = ends - padded
        total = tl.sum(padded, axis=0)
        # every slot a sentinel first; the barrier orders these stores before the pairs' own
        for b0 in range(0, n_blocks * BLOCK_M, CHUNK):
            slots = b0 + tl.arange(0, CHUNK)
            tl.store(pairs + slots, tl.full((CHUNK,), 0, tl.int32) + n_pairs, mask=slots < n_blocks * BLOCK_M)
        tl.debug_barrier()
        seen = tl.zeros((E_POW2,), dtype=tl.int32)
        rows = tl.arange(0, CHUNK)
        for c0 in range(0, n_pairs, CHUNK):
            offs = c0 + rows
            live = offs < n_pairs
            e = tl.load(expert_ids + offs, mask=live, other=-1).to(tl.int32)
            onehot = (e[:, None] == experts[None, :]).to(tl.int32)                  # [CHUNK, E]
            before = tl.sum(onehot * seen[None, :], axis=1)                           # in earlier chunks
            same = (e[:, None] == e[None, :]) & (rows[None, :] < rows[:, None])       # earlier in this chunk
            rank = before + tl.sum(same.to(tl.int32), axis=1)
            dest = tl.sum(onehot * starts[None, :], axis=1) + rank
            tl.store(pairs + dest, offs.to(tl.int32), mask=live)
            seen += tl.sum(onehot, axis=0)
        blocks = tl.arange(0, NB_POW2)
        first = blocks * BLOCK_M
        owner = tl.sum((ends[None, :] <= first[:, None]).to(tl.int32), axis=1)    # experts that end before it
        owner = tl.where((first < total) & (owner < n_experts), owner, -1)
        tl.store(block_expert + blocks, owner, mask=blocks < n_blocks)


def max_blocks(n_pairs: int, n_experts: int, block_m: int = BLOCK_M) -> int:
    """Blocks enough for any routing: every expert's pairs rounded up to whole blocks."""
    return -(-n_pairs // block_m) + min(n_experts, n_pairs)


def align(expert_ids: torch.Tensor, n_experts: int, block_m: int = BLOCK_M) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairs (flat indices into `expert_ids`) sorted by expert into blocks of `block_m` (sentinel: the number of
    pairs), and the expert of each block (-1: unused). Shapes depend only on the sizes: capturable. One Triton
    program (`_align_kernel`); `align_torch` is the same in torch ops."""
    flat = expert_ids.reshape(-1).contiguous()
    n = flat.numel()
    nb = max_blocks(n, n_experts, block_m)
    pairs = torch.empty(nb * block_m, dtype=torch.int32, device=flat.device)
    block_expert = torch.empty(nb, dtype=torch.int32, device=flat.device)
    _align_kernel[(1,)](flat, pairs, block_expert, n, n_experts, nb, CHUNK=128,
                        E_POW2=triton.next_power_of_2(n_experts), NB_POW2=triton.next_power_of_2(nb),
                        BLOCK_M=block_m, num_warps=4)
    return pairs, block_expert


def align_torch(expert_ids: torch.Tensor, n_experts: int,
                block_m: int = BLOCK_M) -> tuple[torch.Tensor, torch.Tensor]:
    """`align` in torch ops (about 25 small kernels): the reference the kernel is checked against."""
    flat = expert_ids.reshape(-1)
    n = flat.numel()
    nb = max_blocks(n, n_experts, block_m)
    counts = torch.zeros(n_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    first = torch.cumsum(counts, 0) - counts          # where each expert's pairs start, unpadded
    order = torch.argsort(flat, stable=True)
    expert_of = flat[order]
    dest = (ends - padded)[expert_of] + torch.arange(n, device=flat.device) - first[expert_of]
    pairs = torch.full((nb * block_m,), n, dtype=torch.int32, device=flat.device)
    pairs[dest] = order.to(torch.int32)
    starts = torch.arange(nb, device=flat.device) * block_m
    block_expert = torch.searchsorted(ends, starts, right=True)
    block_expert = torch.where(starts < ends[-1], block_expert, -1).to(torch.int32)
    return pairs, block_expert


# Tile settings: a program streams a BLOCK_N x k_dim slice of one expert's weight (memory-bound at decode sizes).
# benchmarks/moe_kernel.py times the alternatives on the H200 at Qwen3-30B-A3B shapes.
TILE = {"block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 3}


def expert_gemm(a: torch.Tensor, weight: torch.Tensor, pairs: torch.Tensor, block_expert: torch.Tensor,
                n_pairs: int, a_div: int, route: torch.Tensor | None = None, tile: dict | None = None) -> torch.Tensor:
    """out[p] = a[p // a_div] @ weight[expert of p].T (times route[p] when given), for every pair p."""
    tile = {**TILE, **(tile or {})}
    n_cols, k_dim = weight.shape[1], weight.shape[2]
    out = torch.empty(n_pairs, n_cols, dtype=a.dtype, device=a.device)
    block_n = tile["block_n"]
    block_k = min(tile["block_k"], max(16, triton.next_power_of_2(k_dim)))
    grid = (block_expert.numel(), triton.cdiv(n_cols, block_n))
    _expert_gemm_kernel[grid](
        a, weight, out, pairs, block_expert, route if route is not None else out, n_pairs, n_cols, k_dim, a_div,
        a.stride(0), weight.stride(0), weight.stride(1), out.stride(0),
        HAS_ROUTE=route is not None, BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k,
        IEEE=a.dtype == torch.float32, num_warps=tile["num_warps"], num_stages=tile["num_stages"])
    return out


def supports(experts: torch.nn.Module) -> bool:
    """Experts whose layout and math the fused forward reproduces: [gate; up] concatenated, not transposed, no
    bias, no post-expert norm, not expert-parallel, weights contiguous in the last dim. (A flag older
    transformers versions do not set is a feature they do not have.)"""
    gate_up, down = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    return (isinstance(gate_up, torch.Tensor) and isinstance(down, torch.Tensor) and gate_up.dim() == 3
            and getattr(experts, "has_gate", False) and getattr(experts, "is_concatenated", False)
            and not any(getattr(experts, flag, False) for flag in ("is_transposed", "has_bias",
                                                                   "has_post_expert_norm", "_is_expert_parallel"))
            and gate_up.stride(-1) == 1 and down.stride(-1) == 1)


def fused_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                          top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts' forward (transformers' experts interface signature) on the fused kernels."""
    if not (hidden_states.is_cuda and supports(self)):
        raise RuntimeError(f"{NAME}: these experts or inputs are not covered (CUDA, concatenated gate/up, no bias)")
    tokens, top_k = top_k_index.shape
    n_pairs = tokens * top_k
    x = hidden_states.contiguous()
    pairs, block_expert = align(top_k_index, self.gate_up_proj.shape[0])
    gate_up = expert_gemm(x, self.gate_up_proj, pairs, block_expert, n_pairs, top_k)
    act = _gate(self, gate_up)
    out = expert_gemm(act.contiguous(), self.down_proj, pairs, block_expert, n_pairs, 1,
                      route=top_k_weights.reshape(-1).contiguous())
    return out.view(tokens, top_k, -1).sum(dim=1).to(hidden_states.dtype)


def _gate(experts, gate_up: torch.Tensor) -> torch.Tensor:
    """The experts' own gate; SiLU(gate) * up as one kernel where that is what it computes."""
    if _default_gate_code is not None and _is_silu(getattr(experts, "act_fn", None)) \
            and getattr(type(experts)._apply_gate, "__code__", None) is _default_gate_code:
        out = silu_mul(gate_up, gate_up.shape[-1] // 2)
        if out is not None:
            return out
    return experts._apply_gate(gate_up)


def register() -> bool:
    """Make "batchscope_fused" an experts implementation transformers can dispatch to; False without Triton or
    without transformers' experts interface."""
    if triton is None:
        return False
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except Exception:
        return False
    ALL_EXPERTS_FUNCTIONS[NAME] = fused_experts_forward
    return True
