"""The Triton paged-attention kernels give the torch reference's answer, read only device tensors, and replay
inside a CUDA graph as lengths and block tables change.

Without a GPU the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1) on tiny shapes; with one, the
`gpu`-marked tests run them compiled, on realistic shapes.
"""
from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    # Must be set before the kernels are decorated, i.e. before engine.attention_triton is imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton", reason="triton is not installed (pip install triton)")

from helpers import compile_for_hopper  # noqa: E402
from batchscope.engine.kernels import paged_attention as at  # noqa: E402
from batchscope.engine.kernels.kv_write import write_kv_triton  # noqa: E402
from batchscope.engine.model.attention import AttentionMetadata, paged_attention_torch  # noqa: E402

# The interpreter must have been on when the kernels were decorated (this module is normally the first importer).
INTERPRETED = type(at._prefill_kernel).__name__ == "InterpretedFunction"
TOL = {torch.float32: 1e-3, torch.bfloat16: 1e-2, torch.float16: 1e-2}


@pytest.fixture(autouse=True, scope="module")
def _interpreter_index_fix():
    """Triton < 3.9's interpreter turns a loaded scalar (a 1-element array) into a Python int with int(array),
    which numpy >= 2.4 refuses; loop bounds read from memory hit it. Newer Triton squeezes first; so do we."""
    if not INTERPRETED:
        yield
        return
    import triton.runtime.interpreter as interp

    original = interp._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    interp._patch_lang_tensor = patched
    yield
    interp._patch_lang_tensor = original


def make_inputs(seq_lens, query_lens, heads, kv_heads, head_dim, block_size, dtype, device="cpu", seed=0):
    """A random paged cache with shuffled, non-contiguous block tables, and q as the transpose that
    transformers hands over ([1, H, T, D] -> [T, H, D]). Unused table entries point at real blocks holding
    random data, so a kernel that reads past a request's length gets a wrong answer rather than a lucky one."""
    gen = torch.Generator().manual_seed(seed)
    n_blocks = [(s + block_size - 1) // block_size for s in seq_lens]
    max_blocks = max(n_blocks) + 2
    num_blocks = sum(n_blocks) + 4
    order = torch.randperm(num_blocks, generator=gen)
    tables = torch.randint(0, num_blocks, (len(seq_lens), max_blocks), generator=gen, dtype=torch.int32)
    used = 0
    for b, n in enumerate(n_blocks):
        tables[b, :n] = order[used:used + n]
        used += n
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    qsl = [0]
    for n in query_lens:
        qsl.append(qsl[-1] + n)
    total = qsl[-1]
    q = torch.randn(1, heads, total, head_dim, generator=gen).to(dtype)[0].transpose(0, 1)
    slots = []
    for b, (n, ctx) in enumerate(zip(query_lens, seq_lens)):
        for pos in range(ctx - n, ctx):
            slots.append(int(tables[b, pos // block_size]) * block_size + pos % block_size)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=tables.to(device),
        query_start_host=qsl, seq_lens_host=list(seq_lens),
        max_query_len=max(query_lens), max_seq_len=max(seq_lens),
        kv_caches=[(k_cache.to(device), v_cache.to(device))], backend="triton")
    k_cache, v_cache = meta.kv_caches[0]
    return q.to(device), k_cache, v_cache, meta


def reference(q, k_cache, v_cache, meta, scale, window=None):
    """The torch reference in float32 on the same (already rounded) inputs."""
    return paged_attention_torch(q.float(), k_cache.float(), v_cache.float(), meta, scale, window)


def rel_err(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def check(out, ref, dtype):
    assert out.shape == ref.shape
    assert torch.isfinite(out.float()).all()
    err = rel_err(out, ref)
    assert err < TOL[dtype], f"relative error {err:.2e} >= {TOL[dtype]:.0e}"


interp = pytest.mark.skipif(not INTERPRETED, reason="CPU interpreter tests run where there is no CUDA device "
                                                   "(and need TRITON_INTERPRET=1 before engine.attention_triton "
                                                   "is first imported)")


def gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")(test))

# Tiny shapes for the interpreter: lengths around and not on block boundaries, one shorter than a block.
CTX = [37, 80, 5, 16]
GQA_SHAPES = [(1, 2, 64), (4, 2, 128), (8, 1, 64)]   # (group size, kv heads, head_dim)


# ------------------------------------------------------------------------------------------------ interpreter
@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group,kv_heads,head_dim", GQA_SHAPES)
def test_decode_matches_reference_in_interpreter(dtype, group, kv_heads, head_dim):
    q, kc, vc, meta = make_inputs(CTX, [1] * len(CTX), group * kv_heads, kv_heads, head_dim, 16, dtype)
    # Small tiles and splits so each request spans several tiles and several splits (some of them empty).
    out = at.paged_decode(q, kc, vc, meta, head_dim ** -0.5, num_splits=3, block_n=16, min_split_keys=16)
    check(out, reference(q, kc, vc, meta, head_dim ** -0.5), dtype)


@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group,kv_heads,head_dim", GQA_SHAPES)
def test_prefill_matches_reference_in_interpreter(dtype, group, kv_heads, head_dim):
    # Whole prompts, a chunk continuing earlier context (30 of 80), and a single decode token mixed in.
    q, kc, vc, meta = make_inputs([37, 80, 5, 40], [37, 30, 1, 17], group * kv_heads, kv_heads, head_dim, 16,
                                  dtype)
    out = at.paged_prefill(q, kc, vc, meta, head_dim ** -0.5, block_m=32, block_n=16)
    check(out, reference(q, kc, vc, meta, head_dim ** -0.5), dtype)


@interp
@pytest.mark.parametrize("block_size,block_n", [(32, 16), (16, 64)])
def test_tiles_smaller_and_larger_than_a_block(block_size, block_n):
    q, kc, vc, meta = make_inputs(CTX, [1] * len(CTX), 8, 2, 64, block_size, torch.float32, seed=1)
    out = at.paged_decode(q, kc, vc, meta, 0.125, num_splits=2, block_n=block_n, min_split_keys=16)
    check(out, reference(q, kc, vc, meta, 0.125), torch.float32)
    q, kc, vc, meta = make_inputs([37, 80], [20, 80], 8, 2, 64, block_size, torch.float32, seed=2)
    out = at.paged_prefill(q, kc, vc, meta, 0.125, block_m=32, block_n=block_n)
    check(out, reference(q, kc, vc, meta, 0.125), torch.float32)


@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sliding_window_in_interpreter(dtype):
    q, kc, vc, meta = make_inputs(CTX, [1] * len(CTX), 8, 2, 64, 16, dtype, seed=3)
    out = at.paged_decode(q, kc, vc, meta, 0.125, 20, num_splits=3, block_n=16, min_split_keys=16)
    check(out, reference(q, kc, vc, meta, 0.125, 20), dtype)
    q, kc, vc, meta = make_inputs([37, 80, 5, 40], [37, 30, 1, 17], 8, 2, 64, 16, dtype, seed=4)
    out = at.paged_prefill(q, kc, vc, meta, 0.125, 20, block_m=32, block_n=16)
    check(out, reference(q, kc, vc, meta, 0.125, 20), dtype)


@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_write_kernel_matches_index_copy(dtype):
    from batchscope.engine.model.attention import write_kv

    gen = torch.Generator().manual_seed(5)
    caches = [torch.randn(2, 9, 16, 3, 64, generator=gen).to(dtype)]     # [K/V, blocks, block_size, heads, D]
    caches.append(caches[0].clone())
    # keys as transformers hands them over: [1, kv_heads, T, D] transposed, so not contiguous
    key = torch.randn(1, 3, 20, 64, generator=gen).to(dtype)[0].transpose(0, 1)
    value = torch.randn(1, 3, 20, 64, generator=gen).to(dtype)[0].transpose(0, 1)
    slots = torch.randperm(9 * 16, generator=gen)[:20]
    write_kv(caches[0][0], caches[0][1], key, value, slots)
    write_kv_triton(caches[1][0], caches[1][1], key, value, slots)
    assert torch.equal(caches[0], caches[1])


@interp
def test_requests_without_queries_are_skipped():
    # A padded slot (no query, no context) between real requests, in both paths.
    q, kc, vc, meta = make_inputs([37, 0, 20], [1, 0, 1], 8, 2, 64, 16, torch.float32, seed=5)
    out = at.paged_decode(q, kc, vc, meta, 0.125, num_splits=2, block_n=16, min_split_keys=16)
    check(out, reference(q, kc, vc, meta, 0.125), torch.float32)
    q, kc, vc, meta = make_inputs([37, 9, 20], [37, 0, 3], 8, 2, 64, 16, torch.float32, seed=6)
    out = at.paged_prefill(q, kc, vc, meta, 0.125, block_m=16, block_n=16)
    check(out, reference(q, kc, vc, meta, 0.125), torch.float32)


@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_over_a_mixed_graph_layout_gives_the_real_rows_their_unpadded_answer(dtype):
    """A mixed step padded for its CUDA graph (graphs.py): tokens past the last query start that belong to no
    request, rows with no query and no context after the real ones. The grid and the row count are the padded
    ones, as baked into the graph; the real tokens' outputs must be exactly the unpadded call's."""
    q, kc, vc, meta = make_inputs([37, 80, 5, 40], [37, 30, 1, 17], 8, 2, 64, 16, dtype, seed=12)
    plain = at.paged_prefill(q, kc, vc, meta, 0.125, block_m=32, block_n=16)
    T, pad_tokens, pad_rows = q.shape[0], 11, 3
    qsl = meta.query_start_host + [T] * pad_rows
    lens = meta.seq_lens_host + [0] * pad_rows
    tables = torch.cat([meta.block_tables, torch.zeros(pad_rows, meta.block_tables.shape[1], dtype=torch.int32)])
    padded_q = torch.cat([q, torch.full((pad_tokens, *q.shape[1:]), float("nan"), dtype=q.dtype)])
    padded = AttentionMetadata(
        slot_mapping=torch.cat([meta.slot_mapping, torch.zeros(pad_tokens, dtype=torch.int64)]),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32), seq_lens=torch.tensor(lens, dtype=torch.int32),
        block_tables=tables, query_start_host=qsl, seq_lens_host=lens, max_query_len=meta.max_query_len,
        max_seq_len=meta.max_seq_len, kv_caches=meta.kv_caches, backend="triton")
    out = at.paged_prefill(padded_q, kc, vc, padded, 0.125, block_m=32, block_n=16)
    assert out.shape[0] == T + pad_tokens
    assert torch.equal(out[:T], plain)          # the padding tokens (NaN here) reach no real row


@interp
def test_group_size_that_is_not_a_power_of_two():
    # SmolLM2-135M's shape: 9 query heads over 3 KV heads (groups of 3, padded to 4 / 16 rows inside).
    q, kc, vc, meta = make_inputs(CTX, [1] * len(CTX), 9, 3, 64, 16, torch.float32, seed=9)
    out = at.paged_decode(q, kc, vc, meta, 0.125, num_splits=2, block_n=16, min_split_keys=16)
    check(out, reference(q, kc, vc, meta, 0.125), torch.float32)
    q, kc, vc, meta = make_inputs([37, 50], [37, 2], 9, 3, 64, 16, torch.float32, seed=10)
    out = at.paged_prefill(q, kc, vc, meta, 0.125, block_m=16, block_n=16)
    check(out, reference(q, kc, vc, meta, 0.125), torch.float32)


@interp
def test_dispatcher_picks_the_path_from_max_query_len():
    q, kc, vc, meta = make_inputs(CTX, [1] * len(CTX), 8, 2, 64, 16, torch.float32, seed=7)
    check(at.paged_attention_triton(q, kc, vc, meta, 0.125), reference(q, kc, vc, meta, 0.125), torch.float32)
    q, kc, vc, meta = make_inputs([37, 50], [37, 2], 8, 2, 64, 16, torch.float32, seed=8)
    check(at.paged_attention_triton(q, kc, vc, meta, 0.125), reference(q, kc, vc, meta, 0.125), torch.float32)


# Compiles (no GPU needed: Triton ships ptxas) the kernels for sm_90 with exactly the arguments the host code
# launches them with, recorded through a stand-in launcher. Runs in a subprocess because this process may have
# decorated the kernels for the interpreter.
COMPILE_FOR_HOPPER = r"""
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource
from batchscope.engine.kernels import paged_attention as at
from batchscope.engine.kernels import kv_write as kw
from batchscope.engine.model.attention import AttentionMetadata

launches = []

class Record:
    def __init__(self, kernel):
        self.kernel = kernel
    def __getitem__(self, grid):
        return lambda *args, **kwargs: launches.append((self.kernel, args, kwargs))

for name in ("_decode_split_kernel", "_decode_merge_kernel", "_prefill_kernel"):
    setattr(at, name, Record(getattr(at, name)))
kw._write_kv_kernel = Record(kw._write_kv_kernel)

def meta(seq_lens, query_lens, block_size):
    width = max(seq_lens) // block_size + 1
    qsl = [0]
    for n in query_lens:
        qsl.append(qsl[-1] + n)
    i32 = lambda x: torch.tensor(x, dtype=torch.int32)
    return AttentionMetadata(torch.zeros(qsl[-1], dtype=torch.int64), i32(qsl), i32(seq_lens),
                             torch.zeros(len(seq_lens), width, dtype=torch.int32), qsl, seq_lens,
                             max(query_lens), max(seq_lens), [], "triton")

def case(heads, kv_heads, d, block_size, dtype, seq_lens, query_lens, window):
    cache = torch.empty(64, block_size, kv_heads, d, dtype=dtype)
    q = torch.empty(1, heads, sum(query_lens), d, dtype=dtype)[0].transpose(0, 1)
    at.paged_attention_triton(q, cache, cache, meta(seq_lens, query_lens, block_size), d ** -0.5, window)

case(32, 8, 128, 16, torch.bfloat16, [900, 4000], [1, 1], None)          # split decode + merge
case(9, 3, 64, 32, torch.float16, [40, 7], [1, 1], 16)                    # one split: direct output, window
case(32, 8, 128, 16, torch.bfloat16, [900, 4000, 5], [256, 1, 5], None)   # prefill, decode rows mixed in
case(16, 2, 128, 16, torch.float32, [90, 3], [90, 1], 32)                 # fp32 prefill, window
case(32, 8, 128, 16, torch.bfloat16, [300] * 100, [1] * 100, None)       # 800 programs: one-warp tiles
kv = torch.empty(64, 16, 8, 128, dtype=torch.bfloat16)
new = torch.empty(1, 8, 32, 128, dtype=torch.bfloat16)[0].transpose(0, 1)   # [T, kv_heads, D] as transformers hands it
kw.write_kv_triton(kv[:32], kv[32:], new, new, torch.zeros(32, dtype=torch.int64))

for kernel, args, kwargs in launches:
    params = [p for p in kernel.params if not p.is_constexpr]
    signature, constants, attrs = {}, {}, {}
    for i, (p, value) in enumerate(zip(params, args)):
        if isinstance(value, torch.Tensor):
            signature[p.name] = "*" + {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
                                       torch.int32: "i32", torch.int64: "i64"}[value.dtype]
            aligned = value.data_ptr() % 16 == 0
        elif isinstance(value, float):
            signature[p.name], aligned = "fp32", False
        elif value == 1:   # the launcher turns integer 1 into a constant
            signature[p.name], aligned = "constexpr", False
            constants[p.name] = 1
        else:
            signature[p.name], aligned = "i32", value % 16 == 0
        if aligned:
            attrs[(kernel.arg_names.index(p.name),)] = [["tt.divisibility", 16]]
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
    kwargs["PDL"], options["launch_pdl"] = True, True   # as on Hopper (CPU tensors here launch the ordinary way)
    for name, value in kwargs.items():
        signature[name] = "constexpr"
        constants[name] = value
    compiled = triton.compile(ASTSource(kernel, signature, constants, attrs), target=GPUTarget("cuda", 90, 32),
                              options=options)
    assert compiled.metadata.shared <= 227 * 1024, (kernel.fn.__name__, compiled.metadata.shared)
    print(kernel.fn.__name__, constants.get("HEAD_DIM"), "shared", compiled.metadata.shared)
print("compiled", len(launches))
"""


def test_kernels_compile_for_hopper_with_the_launch_arguments():
    out = compile_for_hopper(COMPILE_FOR_HOPPER)
    assert "compiled 7" in out, out  # split decode + merge, 2 direct decodes, 2 prefills, KV write


def test_decode_splits_fill_the_gpu_without_overshooting():
    assert at.decode_splits(128, 16) == 1
    assert at.decode_splits(4096, 16) == 4096 // at.MIN_KEYS_PER_SPLIT
    assert at.decode_splits(1 << 20, 16) == at.MAX_SPLITS
    # Splits stop at about PROGRAMS_PER_SM programs per SM: a big batch fills the SMs without them.
    assert at.decode_splits(8448, 16, batch_size=1, num_kv_heads=8, num_sms=132) == 2 * 132 // 8
    assert at.decode_splits(8448, 16, batch_size=8, num_kv_heads=8, num_sms=132) == 4
    assert at.decode_splits(8448, 16, batch_size=32, num_kv_heads=8, num_sms=132) == 1
    assert at.decode_splits(8448, 16, batch_size=1024, num_kv_heads=8, num_sms=132) == 1


def test_decode_tile_is_wide_for_few_programs_deep_for_more_and_small_for_many():
    assert at.decode_tile(torch.bfloat16, 128, programs=256, num_sms=132) == (128, 2, 4)  # batch 32 x 8 KV heads
    assert at.decode_tile(torch.bfloat16, 128, programs=512, num_sms=132) == (64, 3, 4)   # batch 64
    assert at.decode_tile(torch.float16, 64, programs=512, num_sms=132) == (64, 3, 4)
    assert at.decode_tile(torch.bfloat16, 128, programs=1024, num_sms=132) == (32, 2, 1)  # batch 128
    assert at.decode_tile(torch.bfloat16, 128, programs=2048, num_sms=132) == (32, 2, 1)  # batch 256
    assert at.decode_tile(torch.float32, 128, programs=2048, num_sms=132) == (32, 2, 4)   # exact fp32 dots
    assert at.decode_tile(torch.bfloat16, 192, programs=8, num_sms=132) == (32, 2, 4)     # wide (MLA) heads


# ------------------------------------------------------------------------------------------------ GPU
GPU_CASES = [  # (dtype, group, kv_heads, head_dim, block_size)
    (torch.bfloat16, 1, 8, 128, 16), (torch.bfloat16, 4, 8, 128, 16), (torch.bfloat16, 8, 4, 128, 16),
    (torch.bfloat16, 4, 8, 64, 16), (torch.bfloat16, 8, 2, 64, 32), (torch.float32, 4, 8, 128, 16),
    (torch.float32, 1, 4, 64, 32), (torch.float16, 4, 8, 128, 16),
]


def _rand_lens(n, lo, hi, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi, (n,), generator=gen).tolist()


@pytest.mark.parametrize("window", [None, 300])
@pytest.mark.parametrize("dtype,group,kv_heads,head_dim,block_size", GPU_CASES)
@gpu
def test_gpu_decode_matches_reference(dtype, group, kv_heads, head_dim, block_size, window):
    lens = _rand_lens(13, 1, 3000, seed=head_dim + group) + [1, block_size, 4096]
    q, kc, vc, meta = make_inputs(lens, [1] * len(lens), group * kv_heads, kv_heads, head_dim, block_size, dtype,
                                  device="cuda", seed=11)
    out = at.paged_attention_triton(q, kc, vc, meta, head_dim ** -0.5, window)
    check(out, reference(q, kc, vc, meta, head_dim ** -0.5, window), dtype)
    for splits in (1, 7):
        out = at.paged_decode(q, kc, vc, meta, head_dim ** -0.5, window, num_splits=splits)
        check(out, reference(q, kc, vc, meta, head_dim ** -0.5, window), dtype)


@pytest.mark.parametrize("window", [None, 300])
@pytest.mark.parametrize("dtype,group,kv_heads,head_dim,block_size", GPU_CASES)
@gpu
def test_gpu_prefill_matches_reference(dtype, group, kv_heads, head_dim, block_size, window):
    # Full prompts, chunks continuing cached context, and single decode tokens in one varlen batch.
    lens = [700, 1500, 33, 900, 2000, 17, 4100]
    qlens = [700, 256, 1, 1, 513, 17, 1]
    q, kc, vc, meta = make_inputs(lens, qlens, group * kv_heads, kv_heads, head_dim, block_size, dtype,
                                  device="cuda", seed=12)
    out = at.paged_attention_triton(q, kc, vc, meta, head_dim ** -0.5, window)
    check(out, reference(q, kc, vc, meta, head_dim ** -0.5, window), dtype)


@pytest.mark.parametrize("dtype,group,kv_heads,head_dim,block_size", GPU_CASES)
@gpu
def test_gpu_decode_of_a_large_batch_matches_reference(dtype, group, kv_heads, head_dim, block_size):
    # Enough (request, KV head) programs for the many-programs tile, with padded slots (no query) among them.
    n = -(-at.MANY_PROGRAMS_PER_SM * at.sm_count(torch.device("cuda")) // kv_heads) + 8
    lens = _rand_lens(n, 1, 1200, seed=head_dim + group + 2)
    lens[7] = lens[n // 2] = 0
    q, kc, vc, meta = make_inputs(lens, [int(n > 0) for n in lens], group * kv_heads, kv_heads, head_dim,
                                  block_size, dtype, device="cuda", seed=15)
    out = at.paged_attention_triton(q, kc, vc, meta, head_dim ** -0.5)
    live = torch.tensor([r for r, n in enumerate(lens) if n > 0], device="cuda")
    rows = meta.query_start_loc[live].long()
    check(out[rows], reference(q, kc, vc, meta, head_dim ** -0.5)[rows], dtype)


@gpu
def test_gpu_decode_replays_in_a_cuda_graph_as_lengths_and_tables_change():
    heads, kv_heads, head_dim, block_size, batch = 32, 8, 128, 16, 8
    q, kc, vc, meta = make_inputs([300] * batch, [1] * batch, heads, kv_heads, head_dim, block_size,
                                  torch.bfloat16, device="cuda", seed=13)
    scale = head_dim ** -0.5
    at.paged_decode(q, kc, vc, meta, scale)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = at.paged_decode(q, kc, vc, meta, scale)
    gen = torch.Generator().manual_seed(14)
    for lens in ([1, 17, 300, 16, 250, 3, 120, 299], [64, 2, 5, 299, 31, 200, 90, 1]):
        # New lengths, new random tables and new queries, written in place into the captured tensors.
        table = torch.randint(0, kc.shape[0], tuple(meta.block_tables.shape), generator=gen, dtype=torch.int32)
        q.copy_(torch.randn(q.shape, generator=gen).to(q.dtype))
        meta.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        meta.block_tables.copy_(table)
        meta.seq_lens_host = lens
        meta.decode_masks.clear()   # the reference's per-step mask cache: this meta now describes another step
        graph.replay()
        torch.cuda.synchronize()
        check(out, reference(q, kc, vc, meta, scale), torch.bfloat16)


@gpu
def test_gpu_kernels_never_synchronise_with_the_host():
    q, kc, vc, meta = make_inputs([100, 2000, 7], [1, 1, 1], 32, 8, 128, 16, torch.bfloat16, device="cuda",
                                  seed=16)
    qp, kcp, vcp, metap = make_inputs([100, 2000, 7], [100, 64, 1], 32, 8, 128, 16, torch.bfloat16,
                                      device="cuda", seed=17)
    at.paged_attention_triton(q, kc, vc, meta, 0.1)
    at.paged_attention_triton(qp, kcp, vcp, metap, 0.1, 64)  # compile outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        at.paged_attention_triton(q, kc, vc, meta, 0.1)
        at.paged_attention_triton(qp, kcp, vcp, metap, 0.1, 64)
    finally:
        torch.cuda.set_sync_debug_mode("default")

