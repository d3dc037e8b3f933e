"""Triton paged attention: a split-K decode kernel and a varlen prefill kernel, both reading the paged KV cache.

Shapes follow engine/attention.py: q [T, H, D] (any strides, last dim contiguous), caches
[num_blocks, block_size, KVH, D] for keys and [num_blocks, block_size, KVH, Dv] for values (Dv = D except for
multi-head latent attention, whose keys are wider than its values), and an `AttentionMetadata` whose device
tensors (query_start_loc, seq_lens, block_tables) are the only per-request inputs the kernels read. Nothing here
reads a device value on the host, so both paths are free of host synchronisation, and the decode path is CUDA-graph
capturable: its grid depends only on the batch size, the number of KV heads and a fixed number of splits.

Grouped-query attention: one program serves all G = H / KVH query heads of one KV head. The G heads (and, in
prefill, several query tokens) are stacked as the rows of one matrix, so every K/V tile is loaded from HBM once per
KV head, not once per query head.

Softmax runs online in the log2 domain (scores are pre-multiplied by scale * log2(e) so exp2 can be used).
With logit soft-capping (Gemma 2) the score is capped in natural units first, cap * tanh(score * scale / cap),
and then moved to the log2 domain.
"""
from __future__ import annotations


import torch
import triton
import triton.language as tl

from .common import DEFAULT_NUM_SMS, interpreted, sm_count
from .dependent_launch import enter, launch_options

LOG2E = 1.4426950408889634

# A decode split handles at least this many keys: fewer would spend more on writing and re-reading the fp32
# partial output (D floats per query head) than on the keys it saves. (benchmarks/decode_tuning.py on an H200:
# 128 beat 256, 512 and 1024 over contexts 300..8448 at batch 32.)
MIN_KEYS_PER_SPLIT = 128
MAX_SPLITS = 64
# Split a decode until there are about this many programs per SM, no further: more only adds partial-output
# traffic and merge work. Up to that many programs, each streams 128-key tiles; with more (large batches), 64-key
# tiles three stages deep. (benchmarks/decode_batch_sweep.py on an H200, batches 1-256, contexts 300-16000: at
# batch 32 one split of 128-key tiles read the cache at 1.03-1.90x the floor where 4 splits of 64 took 1.10-2.41x;
# at batches 64-256, one split of 64-key tiles in 3 stages was best at every context.)
PROGRAMS_PER_SM = 2
# From about this many programs per SM (batch 128 and up at 8 KV heads), one-warp programs of 32-key tiles: the SM
# then holds many small programs whose start-up loads (lengths, query, first pages) interleave with the others'
# streams, where four-warp programs start and end in step. (benchmarks/decode_batch_sweep.py on an H200 over
# contexts 256-1024: at 256 requests 1.04x the K/V floor on average against 1.065x for 64-key tiles 3 stages
# deep in four warps, at 128 requests 1.093x against 1.118x; at 64 requests the four-warp tiles stay ahead.)
MANY_PROGRAMS_PER_SM = 6
# Triton's CPU interpreter (TRITON_INTERPRET=1, used by the CPU tests) multiplies bf16/fp16 tiles as raw integer
# bits; there the kernels upcast dot operands to fp32 (after the same bf16 rounding of p the GPU does).


# --------------------------------------------------------------------------------------------------------------
# Shared inner step: attend a block of query rows to one tile of BLOCK_N keys gathered through the block table.
# --------------------------------------------------------------------------------------------------------------
@triton.jit
def _softcap_log2(s, softcap):
    # cap * tanh(s / cap) in log2 units; tanh from exp of a non-positive argument, so it never overflows
    x = s / softcap
    e = tl.exp(-2.0 * tl.abs(x))
    th = (1.0 - e) / (1.0 + e)
    th = tl.where(x < 0, -th, th)
    return th * (softcap * 1.4426950408889634)


@triton.jit
def _attend_tile(acc, m_i, l_i, q, q_pos, t, table_row, k_cache, v_cache, k_head, v_head,
                 stride_kb, stride_ks, stride_vb, stride_vs, qk_scale, softcap, kv_start, kv_end, window,
                 BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                 V_DIM: tl.constexpr, DV_PAD: tl.constexpr,
                 ROW_MASK: tl.constexpr, USE_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, PRECISION: tl.constexpr,
                 DOT_F32: tl.constexpr):
    k_pos = t * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = (k_pos >= kv_start) & (k_pos < kv_end)
    # A tile may span several pages that are not adjacent in memory: look up each key's page.
    page = tl.load(table_row + k_pos // BLOCK_SIZE, mask=col_ok, other=0).to(tl.int64)
    slot = k_pos % BLOCK_SIZE
    d = tl.arange(0, D_PAD)
    if HEAD_DIM == D_PAD:
        k_mask = col_ok[:, None]
    else:
        k_mask = col_ok[:, None] & (d[None, :] < HEAD_DIM)
    dv = tl.arange(0, DV_PAD)
    if V_DIM == DV_PAD:
        v_mask = col_ok[:, None]
    else:
        v_mask = col_ok[:, None] & (dv[None, :] < V_DIM)
    k = tl.load(k_cache + k_head + page[:, None] * stride_kb + slot[:, None] * stride_ks + d[None, :],
                mask=k_mask, other=0.0)
    if DOT_F32:
        s = tl.dot(q.to(tl.float32), tl.trans(k).to(tl.float32))
    else:
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    s = s * qk_scale
    if SOFTCAP:
        s = _softcap_log2(s, softcap)    # qk_scale is the plain scale here: the cap applies in natural units
    ok = col_ok[None, :]
    if ROW_MASK:
        # Causal (and sliding-window) limits differ per query row.
        ok = ok & (k_pos[None, :] <= q_pos[:, None])
        if USE_WINDOW:
            ok = ok & (k_pos[None, :] > q_pos[:, None] - window)
    s = tl.where(ok, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # A row that has seen no allowed key yet keeps m = -inf; exponentiate against 0 then to avoid inf - inf.
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_cache + v_head + page[:, None] * stride_vb + slot[:, None] * stride_vs + dv[None, :],
                mask=v_mask, other=0.0)
    p = p.to(v.dtype)  # the tensor cores take P in the cache's dtype
    if DOT_F32:
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float32), v.to(tl.float32))
    else:
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
    return acc, m_new, l_i


# --------------------------------------------------------------------------------------------------------------
# Decode: one query token per request. Grid (num_splits, KVH, B); each program attends G heads to one slice of
# the request's context and writes a partial (normalised output + log-sum-exp); a second kernel merges the slices.
# Splits are the fastest grid axis so that the cheap programs of empty splits (short requests) interleave with
# busy ones instead of queueing up as a tail at the end of the launch.
# --------------------------------------------------------------------------------------------------------------
# Arguments that change from step to step are not specialised on (== 1, divisible by 16, pointer alignment):
# otherwise each new combination compiles a new kernel, ~1 s each, in the middle of serving.
_STEP_VARYING = ["block_tables", "seq_lens", "query_start_loc", "window", "stride_bt"]


@triton.jit(do_not_specialize=_STEP_VARYING + ["num_splits", "min_tiles"])
def _decode_split_kernel(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, part_out, part_lse, out,
        qk_scale, softcap, window, num_splits, min_tiles,
        stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        stride_bt, stride_ot, stride_oh,
        NUM_HEADS: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
        D_PAD: tl.constexpr, V_DIM: tl.constexpr, DV_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
        BLOCK_N: tl.constexpr, USE_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, DIRECT_OUT: tl.constexpr,
        PRECISION: tl.constexpr, DOT_F32: tl.constexpr, PDL: tl.constexpr):
    enter(PDL)
    split = tl.program_id(0)
    kvh = tl.program_id(1)
    b = tl.program_id(2)

    row = tl.load(query_start_loc + b)
    has_query = tl.load(query_start_loc + b + 1) > row
    # A request without a query this step (a padded graph slot) gets an empty key range.
    ctx = tl.where(has_query, tl.load(seq_lens + b), 0)
    kv_start = 0
    if USE_WINDOW:
        kv_start = tl.maximum(ctx - window, 0)

    # The split size is decided on the device from this request's own length: splits past the end get no tiles.
    first_tile = kv_start // BLOCK_N
    n_tiles = tl.cdiv(ctx, BLOCK_N) - first_tile
    per_split = tl.maximum(tl.cdiv(n_tiles, num_splits), min_tiles)
    t0 = first_tile + split * per_split
    t1 = tl.minimum(t0 + per_split, first_tile + n_tiles)
    has_work = t1 > t0
    # A context that fits in one split (most of them while contexts are short) is finished here: split 0 writes
    # the output itself, and the merge, seeing a single live partial, leaves the row alone.
    single = n_tiles <= per_split

    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D_PAD)
    dv = tl.arange(0, DV_PAD)
    head = kvh * G + g
    row_ok = g < G
    q_mask = row_ok[:, None] & (d[None, :] < HEAD_DIM)
    o_mask = row_ok[:, None] & (dv[None, :] < V_DIM)
    # Scalar conditions join a block mask through tl.where, not `&`: Triton 3.9's interpreter gives `block & scalar`
    # an int8 mask, which loads and stores reject.
    qv = tl.load(q + row * stride_qt + head[:, None] * stride_qh + d[None, :],
                 mask=tl.where(has_work, q_mask, False), other=0.0)

    acc = tl.zeros([G_PAD, DV_PAD], dtype=tl.float32)
    m_i = tl.full([G_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([G_PAD], dtype=tl.float32)
    table_row = block_tables + b.to(tl.int64) * stride_bt
    k_head = kvh * stride_kh
    v_head = kvh * stride_vh
    for t in range(t0, t1):
        acc, m_i, l_i = _attend_tile(acc, m_i, l_i, qv, None, t, table_row, k_cache, v_cache, k_head, v_head,
                                     stride_kb, stride_ks, stride_vb, stride_vs, qk_scale, softcap, kv_start, ctx,
                                     window, BLOCK_SIZE, BLOCK_N, HEAD_DIM, D_PAD, V_DIM, DV_PAD, False, USE_WINDOW,
                                     SOFTCAP, PRECISION, DOT_F32)

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    if DIRECT_OUT:
        # One split: the partial is the answer.
        tl.store(out + row * stride_ot + head[:, None] * stride_oh + dv[None, :], o.to(out.dtype.element_ty),
                 mask=tl.where(has_query, o_mask, False))
    else:
        # An empty split stores only lse = -inf, which the merge reads as weight 0 (it skips that output slot).
        part = (b * NUM_HEADS + head) * num_splits + split
        tl.store(part_lse + part, tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf")), mask=row_ok)
        if single:
            tl.store(out + row * stride_ot + head[:, None] * stride_oh + dv[None, :], o.to(out.dtype.element_ty),
                     mask=tl.where(has_query & has_work, o_mask, False))
        else:
            tl.store(part_out + part[:, None] * V_DIM + dv[None, :], o, mask=tl.where(has_work, o_mask, False))


@triton.jit(do_not_specialize=["query_start_loc", "num_splits"])
def _decode_merge_kernel(part_out, part_lse, query_start_loc, out, num_splits, stride_ot, stride_oh,
                         NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                         S_PAD: tl.constexpr, PDL: tl.constexpr):
    enter(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    row = tl.load(query_start_loc + b)
    has_query = tl.load(query_start_loc + b + 1) > row
    s = tl.arange(0, S_PAD)
    d = tl.arange(0, D_PAD)
    part = (b * NUM_HEADS + h) * num_splits + s
    lse = tl.load(part_lse + part, mask=s < num_splits, other=float("-inf"))
    live = lse > float("-inf")
    # One live partial: the split kernel already wrote this row's output (see `single` there).
    merge = tl.sum(live.to(tl.int32), 0) > 1
    live = tl.where(merge, live, False)
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m)
    # Empty splits never wrote their output slot: do not read it (it may hold NaN from torch.empty).
    o = tl.load(part_out + part[:, None] * HEAD_DIM + d[None, :], mask=live[:, None] & (d[None, :] < HEAD_DIM),
                other=0.0)
    total = tl.sum(w, 0)
    total = tl.where(total > 0, total, 1.0)
    res = tl.sum(o * w[:, None], 0) / total
    tl.store(out + row * stride_ot + h * stride_oh + d, res.to(out.dtype.element_ty),
             mask=tl.where(has_query & merge, d < HEAD_DIM, False))


# --------------------------------------------------------------------------------------------------------------
# Prefill / mixed batches: varlen over query_start_loc, causal against the request's whole paged context.
# Grid (T // BLOCK_Q + B, KVH). Request b owns query tiles starting at index qsl[b] // BLOCK_Q + b (a strictly
# increasing sequence), so a program finds its request by binary search and its tile by subtraction; spare
# programs find no rows and exit through empty loops. No host list is needed, and padding is at most B programs.
# --------------------------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=_STEP_VARYING + ["num_seqs", "search_steps", "stride_qh"])
def _prefill_kernel(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out,
        qk_scale, softcap, window, num_seqs, search_steps,
        stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        stride_bt, stride_ot, stride_oh,
        G: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
        V_DIM: tl.constexpr, DV_PAD: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, USE_WINDOW: tl.constexpr,
        SOFTCAP: tl.constexpr, PRECISION: tl.constexpr, DOT_F32: tl.constexpr, PDL: tl.constexpr):
    BLOCK_M: tl.constexpr = BLOCK_Q * G_PAD
    enter(PDL)
    pid = tl.program_id(0)
    kvh = tl.program_id(1)

    # Largest b with qsl[b] // BLOCK_Q + b <= pid. (Runtime step count: a new batch size needs no recompile.)
    lo = pid * 0
    hi = lo + num_seqs
    for _ in range(search_steps):
        mid = (lo + hi) // 2
        go_right = tl.load(query_start_loc + mid) // BLOCK_Q + mid <= pid
        lo = tl.where(go_right, mid, lo)
        hi = tl.where(go_right, hi, mid)
    b = lo

    q_start = tl.load(query_start_loc + b)
    q_len = tl.load(query_start_loc + b + 1) - q_start
    ctx = tl.load(seq_lens + b)
    first_i = (pid - (q_start // BLOCK_Q + b)) * BLOCK_Q
    n_rows = tl.minimum(q_len - first_i, BLOCK_Q)  # <= 0 for a spare program

    # Row r is query token first_i + r // G_PAD of head kvh * G + r % G_PAD.
    r = tl.arange(0, BLOCK_M)
    i = first_i + r // G_PAD
    g = r % G_PAD
    d = tl.arange(0, D_PAD)
    dv = tl.arange(0, DV_PAD)
    row_ok = (i < q_len) & (g < G)
    io_mask = row_ok[:, None] & (d[None, :] < HEAD_DIM)
    o_mask = row_ok[:, None] & (dv[None, :] < V_DIM)
    tok = (q_start + i).to(tl.int64)
    head = kvh * G + g
    qv = tl.load(q + tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :], mask=io_mask, other=0.0)

    # The chunk's queries sit at the end of the context (their K/V are already in the cache).
    q_pos = ctx - q_len + i
    first_pos = ctx - q_len + first_i
    kv_end = tl.where(n_rows > 0, first_pos + n_rows, 0)
    kv_start = 0
    if USE_WINDOW:
        kv_start = tl.maximum(first_pos - window + 1, 0)
    # Tiles wholly at or before the first query position need no causal mask; the rest (the diagonal) do.
    lo_tile = kv_start // BLOCK_N
    mid_tile = tl.maximum(tl.minimum((first_pos + 1) // BLOCK_N, tl.cdiv(kv_end, BLOCK_N)), lo_tile)
    hi_tile = tl.cdiv(kv_end, BLOCK_N)

    acc = tl.zeros([BLOCK_M, DV_PAD], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    table_row = block_tables + b.to(tl.int64) * stride_bt
    k_head = kvh * stride_kh
    v_head = kvh * stride_vh
    for t in range(lo_tile, mid_tile):
        acc, m_i, l_i = _attend_tile(acc, m_i, l_i, qv, q_pos, t, table_row, k_cache, v_cache, k_head, v_head,
                                     stride_kb, stride_ks, stride_vb, stride_vs, qk_scale, softcap, kv_start, kv_end,
                                     window, BLOCK_SIZE, BLOCK_N, HEAD_DIM, D_PAD, V_DIM, DV_PAD, USE_WINDOW,
                                     USE_WINDOW, SOFTCAP, PRECISION, DOT_F32)
    for t in range(mid_tile, hi_tile):
        acc, m_i, l_i = _attend_tile(acc, m_i, l_i, qv, q_pos, t, table_row, k_cache, v_cache, k_head, v_head,
                                     stride_kb, stride_ks, stride_vb, stride_vs, qk_scale, softcap, kv_start, kv_end,
                                     window, BLOCK_SIZE, BLOCK_N, HEAD_DIM, D_PAD, V_DIM, DV_PAD, True, USE_WINDOW,
                                     SOFTCAP, PRECISION, DOT_F32)

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    tl.store(out + tok[:, None] * stride_ot + head[:, None] * stride_oh + dv[None, :], o.to(out.dtype.element_ty),
             mask=o_mask)


# --------------------------------------------------------------------------------------------------------------
# Host side: configuration and launches. Only shapes (host ints) are read here, never device values.
# --------------------------------------------------------------------------------------------------------------
def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _precision(dtype: torch.dtype) -> str:
    # fp32 inputs must not be rounded to tf32 on the tensor cores: that would cost ~1e-3 relative error.
    return "ieee" if dtype == torch.float32 else "tf32"


def _dot_f32(dtype: torch.dtype) -> bool:
    return interpreted() and dtype != torch.float32


def _decode_block_n(dtype: torch.dtype, head_dim: int) -> int:
    return 64 if (dtype != torch.float32 and head_dim <= 128) else 32


def decode_tile(dtype: torch.dtype, head_dim: int, programs: int,
                num_sms: int = DEFAULT_NUM_SMS) -> tuple[int, int, int]:
    """(block_n, num_stages, num_warps) of the decode kernel for a grid of `programs` (see PROGRAMS_PER_SM and
    MANY_PROGRAMS_PER_SM)."""
    block_n = _decode_block_n(dtype, head_dim)
    if block_n < 64:
        return block_n, 2, 4        # fp32 (exact dots) and wide heads keep small tiles: registers
    if programs <= PROGRAMS_PER_SM * num_sms:
        return 128, 2, 4
    return (64, 3, 4) if programs < MANY_PROGRAMS_PER_SM * num_sms else (32, 2, 1)


def decode_splits(max_model_len: int, block_size: int, batch_size: int | None = None,
                  num_kv_heads: int | None = None, num_sms: int = DEFAULT_NUM_SMS) -> int:
    """Number of decode splits (a fixed grid dimension, safe to bake into a CUDA graph).

    From the longest context alone: enough splits that each covers at least MIN_KEYS_PER_SPLIT keys of a
    max_model_len context. Given the batch shape too, it is capped at what the GPU needs to be filled
    (PROGRAMS_PER_SM programs per SM): more would only add partial-output traffic. At run time each request uses
    only as many of these splits as its own length calls for.
    """
    tile = max(_decode_block_n(torch.bfloat16, 128), block_size)
    by_len = triton.cdiv(max(1, max_model_len), max(MIN_KEYS_PER_SPLIT, tile))
    splits = min(by_len, MAX_SPLITS)
    if batch_size is not None and num_kv_heads is not None:
        splits = min(splits, PROGRAMS_PER_SM * num_sms // max(1, batch_size * num_kv_heads))
    return max(1, splits)


def _check(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta) -> None:
    if q.dim() != 3 or k_cache.dim() != 4 or v_cache.dim() != 4 or v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(f"expected q [T, H, D] and caches [blocks, block_size, kv_heads, D or Dv], got "
                         f"{tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    if q.shape[1] % k_cache.shape[2]:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of {k_cache.shape[2]} KV heads")
    if q.shape[2] != k_cache.shape[3]:
        raise ValueError(f"query head dim {q.shape[2]} differs from the key cache's {k_cache.shape[3]}")
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("the KV cache's last dimension must be contiguous")
    for name in ("query_start_loc", "seq_lens", "block_tables"):
        if getattr(meta, name).dtype != torch.int32:
            raise ValueError(f"meta.{name} must be int32")


def _score_scale(scale: float, softcap: float | None) -> float:
    # without a cap the kernels work in log2 units throughout; with one, the cap needs the natural-unit score
    return scale if softcap else scale * LOG2E


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta, scale: float,
                 sliding_window: int | None = None, num_splits: int | None = None, block_n: int | None = None,
                 min_split_keys: int = MIN_KEYS_PER_SPLIT, num_warps: int | None = None, num_stages: int | None = None,
                 out: torch.Tensor | None = None, softcap: float | None = None) -> torch.Tensor:
    """One query per request (rows with none are skipped). Capturable: the grid is (num_splits, KVH, B).

    num_splits: None picks `decode_splits` from the block table's width (the longest context it can hold) and
    the batch shape, both host-side shapes, so a captured graph stays valid as lengths change.
    """
    _check(q, k_cache, v_cache, meta)
    if q.stride(2) != 1:
        q = q.contiguous()
    T, H, D = q.shape
    _, block_size, KVH, _ = k_cache.shape
    Dv = v_cache.shape[-1]
    B = meta.seq_lens.shape[0]
    G = H // KVH
    if num_splits is None:
        num_splits = getattr(meta, "decode_splits", None) or decode_splits(
            meta.block_tables.shape[1] * block_size, block_size, B, KVH, sm_count(q.device))
    tile_n, tile_stages, tile_warps = decode_tile(q.dtype, max(D, Dv), num_splits * KVH * B, sm_count(q.device))
    block_n = block_n or tile_n
    if out is None:
        out = torch.empty((T, H, Dv), dtype=q.dtype, device=q.device)
    if T == 0 or B == 0:
        return out
    direct = num_splits == 1
    if direct:
        part_out = part_lse = out  # unused
    else:
        part_out = torch.empty((B, H, num_splits, Dv), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((B, H, num_splits), dtype=torch.float32, device=q.device)
    D_PAD = _pow2(max(16, D))
    DV_PAD = _pow2(max(16, Dv))
    _decode_split_kernel[(num_splits, KVH, B)](
        q, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc, part_out, part_lse, out,
        _score_scale(scale, softcap), float(softcap or 0.0), int(sliding_window or 0), num_splits,
        max(1, min_split_keys // block_n),
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        meta.block_tables.stride(0), out.stride(0), out.stride(1),
        NUM_HEADS=H, G=G, G_PAD=_pow2(max(16, G)), HEAD_DIM=D, D_PAD=D_PAD, V_DIM=Dv, DV_PAD=DV_PAD,
        BLOCK_SIZE=block_size, BLOCK_N=block_n,
        USE_WINDOW=bool(sliding_window), SOFTCAP=bool(softcap), DIRECT_OUT=direct, PRECISION=_precision(q.dtype),
        DOT_F32=_dot_f32(q.dtype),
        num_warps=num_warps or tile_warps, num_stages=num_stages or tile_stages, **launch_options(q.device))
    if not direct:
        _decode_merge_kernel[(B, H)](
            part_out, part_lse, meta.query_start_loc, out, num_splits, out.stride(0), out.stride(1),
            NUM_HEADS=H, HEAD_DIM=Dv, D_PAD=DV_PAD, S_PAD=_pow2(num_splits),
            num_warps=4 if DV_PAD >= 128 else 2, **launch_options(q.device))
    return out


def paged_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta, scale: float,
                  sliding_window: int | None = None, block_m: int | None = None, block_n: int | None = None,
                  out: torch.Tensor | None = None, softcap: float | None = None) -> torch.Tensor:
    """Any mix of query lengths (prefill chunks and single decode tokens); causal against the paged context."""
    _check(q, k_cache, v_cache, meta)
    if q.stride(2) != 1:
        q = q.contiguous()
    T, H, D = q.shape
    _, block_size, KVH, _ = k_cache.shape
    Dv = v_cache.shape[-1]
    B = meta.seq_lens.shape[0]
    G = H // KVH
    G_PAD = _pow2(G)
    D_PAD = _pow2(max(16, D))
    DV_PAD = _pow2(max(16, Dv))
    if q.element_size() > 2:
        # fp32 runs exact (non-tensor-core) dots: small tiles keep registers and compile time in check.
        cfg_m, cfg_n, warps, stages = 32, 32, 4, 2
    elif max(D_PAD, DV_PAD) > 128:
        cfg_m, cfg_n, warps, stages = 64, 32, 4, 2
    else:
        cfg_m, cfg_n, warps, stages = 128, 64, 8, 3
    block_m = block_m or cfg_m
    block_n = block_n or cfg_n
    # Rows are (token, head) pairs: BLOCK_Q tokens x G_PAD heads, and at least 16 rows for the tensor cores.
    block_q = max(1, block_m // G_PAD, 16 // G_PAD)
    if out is None:
        out = torch.empty((T, H, Dv), dtype=q.dtype, device=q.device)
    if T == 0 or B == 0:
        return out
    _prefill_kernel[(T // block_q + B, KVH)](
        q, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc, out,
        _score_scale(scale, softcap), float(softcap or 0.0), int(sliding_window or 0), B,
        max(1, B - 1).bit_length() + 1,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        meta.block_tables.stride(0), out.stride(0), out.stride(1),
        G=G, G_PAD=G_PAD, HEAD_DIM=D, D_PAD=D_PAD, V_DIM=Dv, DV_PAD=DV_PAD, BLOCK_SIZE=block_size,
        BLOCK_Q=block_q, BLOCK_N=block_n, USE_WINDOW=bool(sliding_window), SOFTCAP=bool(softcap),
        PRECISION=_precision(q.dtype), DOT_F32=_dot_f32(q.dtype),
        num_warps=warps if block_q * G_PAD > 64 else 4, num_stages=stages, **launch_options(q.device))
    return out


def paged_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta, scale: float,
                           sliding_window: int | None = None, softcap: float | None = None) -> torch.Tensor:
    """q [T, H, D] -> out [T, H, Dv]: the decode kernel when every request has one query, else the varlen one."""
    if meta.max_query_len == 1:
        return paged_decode(q, k_cache, v_cache, meta, scale, sliding_window, softcap=softcap)
    return paged_prefill(q, k_cache, v_cache, meta, scale, sliding_window, softcap=softcap)
