"""The fused RMSNorm, rotary and SiLU*up kernels give the eager transformers result (rotary: bit for bit; RMSNorm
and SiLU*up: bit for bit but for rare one-ulp flips of a rounded intermediate), patch only the modules whose math
they reproduce, leave greedy generation unchanged, and replay in CUDA graphs.

Without a GPU the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1) on tiny shapes; with one, the
`gpu`-marked tests run them compiled, on Llama-3-8B and Qwen3 shapes.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from helpers import compile_for_hopper

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    # Must be set before the kernels are decorated, i.e. before the kernels are imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton", reason="triton is not installed (pip install triton)")

from transformers.models.gemma.modeling_gemma import GemmaRMSNorm  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402
from transformers.models.mistral.modeling_mistral import MistralRMSNorm  # noqa: E402
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm  # noqa: E402
from transformers.models.qwen3 import modeling_qwen3  # noqa: E402
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm  # noqa: E402

from batchscope.engine.kernels import rms_norm as rms, rotary as rot, silu_mul as silu  # noqa: E402

INTERPRETED = type(rms._rms_norm_kernel).__name__ == "InterpretedFunction"
interp = pytest.mark.skipif(not INTERPRETED, reason="CPU interpreter tests run where there is no CUDA device "
                                                   "(and need TRITON_INTERPRET=1 before the kernels are first "
                                                   "imported)")


def gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")(test))


@pytest.fixture(autouse=True, scope="module")
def _interpreter_bf16_rounding():
    """Triton 3.6's interpreter truncates fp32 -> bf16 (the GPU rounds to nearest even). Make it round like the
    hardware so that the bit-exactness the kernels are built for can be checked on CPU."""
    if not INTERPRETED:
        yield
        return
    import triton.language as tl
    import triton.runtime.interpreter as interp_mod

    original = interp_mod._convert_float

    def convert(data, src, dst, rounding_mode):
        if src == tl.float32 and dst == tl.bfloat16:
            t = torch.from_numpy(data.reshape(-1).astype("float32").copy()).to(torch.bfloat16)
            return t.view(torch.int16).numpy().view("uint16").reshape(data.shape)
        return original(data, src, dst, rounding_mode)

    interp_mod._convert_float = convert
    yield
    interp_mod._convert_float = original


def install(model):
    """The norm and rotary kernels, as the engine installs them (model/speedups.py): norms first."""
    return rms.install_rms_norms(model) + rot.install_rotary(model)


def uninstall(model):
    rms.uninstall_rms_norms(model)
    rot.uninstall_rotary(model)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many representable values lie between a and b (same dtype): the integer distance of their bit
    patterns, ordered so that it is monotonic across zero."""
    assert a.dtype == b.dtype
    int_ty = {2: torch.int16, 4: torch.int32}[a.element_size()]
    sign = {2: 0x7FFF, 4: 0x7FFFFFFF}[a.element_size()]

    def ordered(t):
        bits = t.contiguous().view(int_ty).long()
        return torch.where(bits < 0, -(bits & sign), bits)
    return (ordered(a) - ordered(b)).abs()


def norm_module(cls, n, dtype, weight_dtype=None, eps=1e-5, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    module = cls(n, eps=eps)
    module.weight.data = (1 + 0.5 * torch.randn(n, generator=gen)).to(weight_dtype or dtype)
    return module.to(device).requires_grad_(False)


def check_norm(module, x):
    ref = type(module).forward(module, x)
    out = rms.rms_norm(x, module.weight, module.variance_epsilon)
    assert out is not None, "the kernel declined inputs it should cover"
    assert out.dtype == ref.dtype and out.shape == ref.shape
    dist = ulp_distance(out, ref)
    if out.element_size() == 2:
        # Only the fp32 sum of squares is ordered differently, so the normalized value, rounded to 16 bits, is
        # rarely 1 ulp off; times the weight that can show as 2 ulps of the product.
        assert dist.max().item() <= 2, dist.max().item()
        assert (dist > 0).float().mean().item() < 0.01
    else:
        assert dist.max().item() <= 8, dist.max().item()   # fp32: the sum's order and rsqrt
    return out


def rotary_inputs(B, Hq, Hk, T, D, dtype, cos_batch=None, device="cpu", seed=0):
    """q and k as transformers makes them ([B, T, H*D] projections viewed [B, T, H, D] and transposed), and a
    cos/sin pair like its rotary embedding's (duplicated halves, already in the model dtype)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, Hq, D, generator=gen).to(dtype).to(device).transpose(1, 2)
    k = torch.randn(B, T, Hk, D, generator=gen).to(dtype).to(device).transpose(1, 2)
    pos = torch.randint(0, 4096, (cos_batch or B, T), generator=gen).float()
    freqs = pos[..., None] * (10000.0 ** (-torch.arange(0, D, 2).float() / D))
    emb = torch.cat((freqs, freqs), dim=-1)
    return q, k, emb.cos().to(dtype).to(device), emb.sin().to(dtype).to(device)


def check_rotary(q, k, cos, sin, unsqueeze_dim=1):
    ref_q, ref_k = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
    res = rot.apply_rotary(q, k, cos, sin, unsqueeze_dim)
    assert res is not None, "the kernel declined inputs it should cover"
    for out, ref in zip(res, (ref_q, ref_k)):
        assert out.dtype == ref.dtype and out.shape == ref.shape
        # the eager layout (strides of dims longer than one) is kept: later views of q and k still work
        assert [s for s, n in zip(out.stride(), out.shape) if n > 1] == \
            [s for s, n in zip(ref.stride(), ref.shape) if n > 1]
        # the kernel rounds each product and the sum like the eager ops: identical bits
        assert torch.equal(out, ref), ulp_distance(out, ref).max().item()


def check_silu_mul(gate_up):
    split = gate_up.shape[-1] // 2
    ref = torch.nn.functional.silu(gate_up[..., :split]) * gate_up[..., split:]
    out = silu.silu_mul(gate_up, split)
    assert out is not None, "the kernel declined inputs it should cover"
    assert out.dtype == ref.dtype and out.shape == ref.shape and out.is_contiguous()
    # the same two roundings as the eager ops; only exp differs in its last fp32 bits (the GPU's fast exp2, a
    # few ulps), which rarely flips the rounded 16-bit activation by one ulp (two ulps of the product)
    dist = ulp_distance(out, ref)
    if out.element_size() == 2:
        assert dist.max().item() <= 2 and (dist > 0).float().mean().item() < 0.01, dist.max().item()
    else:
        assert dist.max().item() <= 32, dist.max().item()    # fp32: within 4e-6 relative


def silu_inputs(shape, dtype, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(shape, generator=gen)).to(dtype).to(device)


NORM_CLASSES = [LlamaRMSNorm, Qwen2RMSNorm, Qwen3RMSNorm, MistralRMSNorm]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


# ------------------------------------------------------------------------------------------------ interpreter
@interp
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cls", NORM_CLASSES)
def test_rms_norm_matches_the_module_in_interpreter(cls, dtype):
    gen = torch.Generator().manual_seed(1)
    for shape in [(5, 64), (2, 3, 100), (1, 7, 4, 16)]:   # hidden rows, odd width, Qwen3-style head rows
        module = norm_module(cls, shape[-1], dtype)
        check_norm(module, (3 * torch.randn(shape, generator=gen)).to(dtype))


@interp
def test_rms_norm_mixed_dtypes_and_strided_rows_in_interpreter():
    gen = torch.Generator().manual_seed(2)
    # an fp32 weight on a bf16 input gives an fp32 result, as the eager dtype promotion does
    module = norm_module(LlamaRMSNorm, 48, torch.bfloat16, weight_dtype=torch.float32)
    out = check_norm(module, torch.randn(6, 48, generator=gen).to(torch.bfloat16))
    assert out.dtype == torch.float32
    # rows with a stride (a slice of a wider tensor) need no copy
    module = norm_module(LlamaRMSNorm, 32, torch.bfloat16)
    wide = torch.randn(5, 80, generator=gen).to(torch.bfloat16)
    check_norm(module, wide[:, 8:40])
    # Qwen3's head norms on the q slice of a merged q/k/v product: [B, T, heads, head_dim] rows read in place
    module = norm_module(Qwen3RMSNorm, 16, torch.bfloat16)
    merged = torch.randn(2, 3, (4 + 2 * 2) * 16, generator=gen).to(torch.bfloat16)
    q = merged[..., :4 * 16].view(2, 3, 4, 16)
    assert rms._row_layout(q) == (4, 128, 16)       # (heads, token stride, head stride)
    check_norm(module, q)
    check_norm(module, merged[..., 4 * 16:6 * 16].view(2, 3, 2, 16))


@interp
def test_rms_norm_declines_what_it_does_not_cover_in_interpreter():
    module = norm_module(LlamaRMSNorm, 16, torch.float32)
    x = torch.randn(4, 16)
    assert rms.rms_norm(torch.randn(16, 4).t(), module.weight, 1e-5) is None          # last dim strided
    assert rms.rms_norm(x.double(), module.weight, 1e-5) is None                       # float64
    assert rms.rms_norm(torch.randn(4, 8), module.weight, 1e-5) is None                # wrong width
    with torch.enable_grad():
        assert rms.rms_norm(x.requires_grad_(), module.weight, 1e-5) is None           # autograd
    assert rms.rms_norm(torch.empty(0, 16), module.weight, 1e-5).shape == (0, 16)


@interp
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_matches_eager_in_interpreter(dtype):
    check_rotary(*rotary_inputs(1, 8, 2, 5, 16, dtype))               # GQA, batchscope's [1, H, T, D]
    check_rotary(*rotary_inputs(2, 3, 3, 4, 12, dtype, seed=1))       # heads and half-dim not powers of two
    check_rotary(*rotary_inputs(3, 4, 1, 2, 8, dtype, cos_batch=1, seed=2))   # cos/sin broadcast over batch
    q, k, cos, sin = rotary_inputs(2, 4, 2, 3, 16, dtype, seed=3)
    check_rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin, unsqueeze_dim=2)   # [B, T, H, D]
    check_rotary(q.contiguous(), k, cos, sin)                          # q contiguous, k transposed


@interp
def test_rotary_declines_what_it_does_not_cover_in_interpreter():
    q, k, cos, sin = rotary_inputs(1, 4, 2, 3, 16, torch.float32)
    assert rot.apply_rotary(q, k, cos, sin, unsqueeze_dim=0) is None
    assert rot.apply_rotary(q, k.to(torch.bfloat16), cos, sin) is None
    assert rot.apply_rotary(q[..., :15], k[..., :15], cos[..., :15], sin[..., :15]) is None   # odd head_dim
    assert rot.apply_rotary(q.double(), k.double(), cos.double(), sin.double()) is None


@interp
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_matches_eager_in_interpreter(dtype):
    check_silu_mul(silu_inputs((5, 96), dtype))
    check_silu_mul(silu_inputs((1, 3, 2 * 1500), dtype, seed=1))     # a half longer than one block


@interp
def test_silu_mul_declines_what_it_does_not_cover_in_interpreter():
    x = silu_inputs((4, 64), torch.float32)
    assert silu.silu_mul(x, 20) is None                      # halves of unequal size
    assert silu.silu_mul(x[:, ::2], 16) is None              # strided last dim
    assert silu.silu_mul(x.to(torch.int32), 32) is None


@interp
def test_install_patches_only_matching_norms_and_uninstalls():
    model = torch.nn.ModuleDict({
        "llama": LlamaRMSNorm(16), "qwen3": Qwen3RMSNorm(8), "gemma": GemmaRMSNorm(16),
        "linear": torch.nn.Linear(4, 4)})
    assert install(model) == ["llama (LlamaRMSNorm)", "qwen3 (Qwen3RMSNorm)"]   # no attention: no rotary
    assert "forward" in model["llama"].__dict__ and "forward" not in model["gemma"].__dict__
    assert install(model) == []   # idempotent: norms already fused
    uninstall(model)
    assert "forward" not in model["llama"].__dict__ and "forward" not in model["qwen3"].__dict__


def _rotary_routes(model) -> list[bool]:
    """Per attention module of `model`: does its forward reach the fused rotary? (counted calls of the kernel)"""
    calls = []
    kernel = rot.apply_rotary
    rot.apply_rotary = lambda *args: calls.append(1) or kernel(*args)
    try:
        routes = []
        for layer in model.model.layers:
            calls.clear()
            x = torch.randn(1, 3, model.config.hidden_size)
            cos_sin = model.model.rotary_emb(x, torch.arange(3)[None])
            with torch.inference_mode():
                layer.self_attn(x, position_embeddings=cos_sin, attention_mask=None)
            routes.append(bool(calls))
        return routes
    finally:
        rot.apply_rotary = kernel


@interp
def test_rotary_is_swapped_per_model_and_leaves_transformers_as_found():
    """The fused rotary goes into the attention modules of the model it is installed on and nowhere else: the
    modeling files' globals and classes stay as they were, another model of the same family (transformers' own, in
    the bench's baseline) keeps transformers' rotary, and uninstalling gives the model its own back."""
    found = {kind: (vars(mod).copy(), dict(vars(cls)))
             for kind, mod, cls in [("llama", modeling_llama, modeling_llama.LlamaAttention),
                                    ("qwen3", modeling_qwen3, modeling_qwen3.Qwen3Attention)]}
    ours, theirs = _tiny("llama", torch.float32), _tiny("llama", torch.float32)
    qwen = _tiny("qwen3", torch.float32)
    skipped: list[str] = []
    assert rot.install_rotary(ours, skipped) == ["transformers.models.llama.modeling_llama.apply_rotary_pos_emb"]
    assert rot.install_rotary(qwen, skipped) == ["transformers.models.qwen3.modeling_qwen3.apply_rotary_pos_emb"]
    # a version of transformers in our tested range whose code the kernel no longer finds fails here
    assert skipped == []
    assert rot.install_rotary(ours) == rot.install_rotary(ours)   # idempotent
    assert _rotary_routes(ours) == [True, True] and _rotary_routes(qwen) == [True, True]
    assert _rotary_routes(theirs) == [False, False]
    for kind, mod, cls in [("llama", modeling_llama, modeling_llama.LlamaAttention),
                           ("qwen3", modeling_qwen3, modeling_qwen3.Qwen3Attention)]:
        module_globals, class_dict = found[kind]
        assert all(vars(mod)[k] is v for k, v in module_globals.items()) and vars(mod).keys() == module_globals.keys()
        assert dict(vars(cls)) == class_dict
    rot.uninstall_rotary(ours)
    rot.uninstall_rotary(qwen)
    assert _rotary_routes(ours) == [False, False] and _rotary_routes(qwen) == [False, False]


@interp
def test_rotary_skips_other_rotaries_with_the_reason():
    from transformers import Phi3Config, Phi3ForCausalLM

    cfg = Phi3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)
    model = Phi3ForCausalLM(cfg).eval()
    skipped: list[str] = []
    assert rot.install_rotary(model, skipped) == []
    assert skipped == ["rotary not fused for Phi3Attention: transformers.models.phi3.modeling_phi3."
                       "apply_rotary_pos_emb is not the rotary the kernel reproduces"]
    assert "forward" not in model.model.layers[0].self_attn.__dict__


_WITHOUT_KERNELS = """
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.modules["kernels"] = None          # transformers without HF's kernels package: plain module-level functions
sys.path[:0] = [{tests!r}, os.path.dirname({tests!r})]
import torch
from test_fused import _tiny, _rotary_routes
from batchscope.engine.kernels import rotary as rot
from transformers.models.llama import modeling_llama
assert type(modeling_llama.apply_rotary_pos_emb).__name__ == "function"
before = modeling_llama.apply_rotary_pos_emb
model, theirs = _tiny("llama", torch.float32), _tiny("llama", torch.float32)
ref = model(torch.tensor([[5, 17, 99, 3]])).logits
skipped = []
assert rot.install_rotary(model, skipped) == ["transformers.models.llama.modeling_llama.apply_rotary_pos_emb"], skipped
assert _rotary_routes(model) == [True, True] and _rotary_routes(theirs) == [False, False]
assert torch.equal(model(torch.tensor([[5, 17, 99, 3]])).logits, ref)
assert modeling_llama.apply_rotary_pos_emb is before
rot.uninstall_rotary(model)
assert _rotary_routes(model) == [False, False]
print("ok")
"""


@interp
def test_rotary_swap_without_the_kernels_package():
    """Without HF's `kernels` (the H200 image's transformers 5.17) the attention forward reads the module global;
    the swap rebuilds the instance's forward (through transformers' decorators) instead of rewriting the global."""
    tests = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", _WITHOUT_KERNELS.format(tests=tests)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def _tiny(kind: str, dtype: torch.dtype, device: str = "cpu"):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config, Qwen3MoeConfig

    common = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  initializer_range=0.2, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None)
    if kind == "llama":
        cfg = LlamaConfig(**common)
    elif kind == "qwen3":
        cfg = Qwen3Config(head_dim=16, **common)
    else:
        cfg = Qwen3MoeConfig(head_dim=16, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                             **common)
    torch.manual_seed(3)
    return AutoModelForCausalLM.from_config(cfg, dtype=dtype).to(device).eval().requires_grad_(False)


def _greedy(model, prompt, n):
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         eos_token_id=-1, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def _check_model_unchanged(kind, dtype, device, new_tokens):
    model = _tiny(kind, dtype, device)
    prompt = [5, 17, 99, 3, 200, 41, 7]
    ids = torch.tensor([prompt], device=device)
    with torch.inference_mode():
        ref_tokens = _greedy(model, prompt, new_tokens)
        ref_logits = model(ids).logits
    patched = install(model)
    assert sum("RMSNorm" in p for p in patched) == (5 if kind == "llama" else 9)   # Qwen3s add q/k norms
    assert f"transformers.models.{kind}.modeling_{kind}.apply_rotary_pos_emb" in patched
    calls = []
    kernel = rot.apply_rotary
    rot.apply_rotary = lambda *args: calls.append(1) or kernel(*args)   # the attention really calls it
    try:
        with torch.inference_mode():
            logits = model(ids).logits
            tokens = _greedy(model, prompt, new_tokens)
    finally:
        rot.apply_rotary = kernel
        uninstall(model)
    assert len(calls) >= 2 * (1 + new_tokens)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    assert (logits.float() - ref_logits.float()).abs().max().item() < tol
    assert tokens == ref_tokens


@interp
@pytest.mark.parametrize("kind", ["llama", "qwen3", "qwen3_moe"])
def test_tiny_model_greedy_output_unchanged_in_interpreter(kind):
    _check_model_unchanged(kind, torch.float32, "cpu", 6)


def test_cpu_tensors_fall_back_to_eager_when_not_interpreting():
    # In a fresh interpreter without TRITON_INTERPRET (this one may run the kernels on CPU tensors on purpose).
    code = ("import torch; from batchscope.engine.kernels import rms_norm as rms; "
            "assert rms.rms_norm(torch.randn(2, 16), torch.ones(16), 1e-5) is None; print('eager')")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "eager", proc.stderr


# Compiles the kernels for sm_90 (no GPU needed: Triton ships ptxas) with the launch arguments of Llama-3-8B
# shapes, in a subprocess because this one may have decorated them for the interpreter.
COMPILE_FOR_HOPPER = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource
from batchscope.engine.kernels import rms_norm as rms, rotary as rot, silu_mul as silu

def build(kernel, signature, constants, warps, **options):
    signature, constants = dict(signature, PDL="constexpr"), dict(constants, PDL=True)   # launched early
    compiled = triton.compile(ASTSource(kernel, signature, constants), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": warps, "launch_pdl": True, **options})
    print(kernel.fn.__name__, constants, compiled.metadata.shared)

for n, dt in ((4096, "bf16"), (128, "bf16"), (100, "fp32")):
    block_n, rows, warps = rms.rms_norm_launch_config(n)
    build(rms._rms_norm_kernel, {"x": "*" + dt, "w": "*" + dt, "out": "*" + dt, "n_rows": "i32",
          "n_cols": "i32", "inner": "i32", "stride_outer": "i32", "stride_inner": "i32", "stride_out": "i32",
          "eps": "fp32", "BLOCK_N": "constexpr",
          "ROWS": "constexpr"}, {"BLOCK_N": block_n, "ROWS": rows}, warps)
ints = ["seq_len", "q_heads", "k_heads", "sq_b", "sq_h", "sq_t", "sk_b", "sk_h", "sk_t", "oq_b", "oq_h", "oq_t",
        "ok_b", "ok_h", "ok_t", "sc_b", "sc_t", "ss_b", "ss_t"]
sig = {p: "*bf16" for p in ("q", "k", "cos", "sin", "q_out", "k_out")}
sig.update({p: "i32" for p in ints})
sig.update({"HALF": "constexpr", "HALF_PAD": "constexpr", "BLOCK_H": "constexpr"})
build(rot._rotary_kernel, sig, {"HALF": 64, "HALF_PAD": 64, "BLOCK_H": 8}, 4, enable_fp_fusion=False)
build(silu._silu_mul_kernel, {"gate_up": "*bf16", "out": "*bf16", "n_rows": "i32", "n_cols": "i32",
      "stride_in": "i32", "stride_out": "i32", "BLOCK": "constexpr"}, {"BLOCK": 1024}, 4)
print("compiled 5")
"""


def test_kernels_compile_for_hopper():
    out = compile_for_hopper(COMPILE_FOR_HOPPER)
    assert "compiled 5" in out, out


# ------------------------------------------------------------------------------------------------ GPU
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(32, 4096), (7, 4096), (1, 32, 32, 128), (1, 32, 8, 128), (3, 5120),
                                   (2, 8192), (4, 1000)])
@gpu
def test_gpu_rms_norm_matches_the_module(shape, dtype):
    gen = torch.Generator().manual_seed(4)
    module = norm_module(LlamaRMSNorm, shape[-1], dtype, device="cuda")
    check_norm(module, (2 * torch.randn(shape, generator=gen)).to(dtype).cuda())


@pytest.mark.parametrize("dtype", DTYPES)
@gpu
def test_gpu_rotary_matches_eager(dtype):
    check_rotary(*rotary_inputs(1, 32, 8, 32, 128, dtype, device="cuda"))        # Llama-3-8B decode, batch 32
    check_rotary(*rotary_inputs(1, 32, 8, 700, 128, dtype, device="cuda", seed=1))   # prefill
    check_rotary(*rotary_inputs(1, 40, 8, 9, 64, dtype, device="cuda", seed=2))
    check_rotary(*rotary_inputs(4, 16, 4, 3, 256, dtype, cos_batch=1, device="cuda", seed=3))


@pytest.mark.parametrize("dtype", DTYPES)
@gpu
def test_gpu_silu_mul_matches_eager(dtype):
    check_silu_mul(silu_inputs((32, 2 * 14336), dtype, device="cuda"))      # Llama-3-8B decode, batch 32
    check_silu_mul(silu_inputs((1, 700, 2 * 1536), dtype, device="cuda", seed=1))


@gpu
def test_gpu_kernels_replay_in_a_cuda_graph_without_host_syncs():
    norm = norm_module(LlamaRMSNorm, 4096, torch.bfloat16, device="cuda")
    x = torch.randn(32, 4096, device="cuda").to(torch.bfloat16)
    q, k, cos, sin = rotary_inputs(1, 32, 8, 32, 128, torch.bfloat16, device="cuda")
    rms.rms_norm(x, norm.weight, 1e-5)
    rot.apply_rotary(q, k, cos, sin)   # compile outside the check and the capture
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        rms.rms_norm(x, norm.weight, 1e-5)
        rot.apply_rotary(q, k, cos, sin)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = rms.rms_norm(x, norm.weight, 1e-5)
        q_out, k_out = rot.apply_rotary(q, k, cos, sin)
    for seed in (5, 6):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        x.copy_(torch.randn(x.shape, generator=gen, device="cuda"))
        q.copy_(torch.randn(q.shape, generator=gen, device="cuda"))
        cos.copy_(torch.randn(cos.shape, generator=gen, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        assert ulp_distance(y, LlamaRMSNorm.forward(norm, x)).max().item() <= 2
        assert torch.equal(q_out, modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["llama", "qwen3", "qwen3_moe"])
@gpu
def test_gpu_tiny_model_greedy_output_unchanged(kind, dtype):
    _check_model_unchanged(kind, dtype, "cuda", 16)


def _transformers_as_found():
    """What the modeling files the engine reads hold: their module globals and the code of their classes
    (transformers itself caches plain values on its classes, e.g. `_can_set_attn_implementation_cached_value`)."""
    def code(cls):
        return {k: v for k, v in vars(cls).items() if callable(v) or isinstance(v, (staticmethod, classmethod, property))}
    mods = [modeling_llama, modeling_qwen3]
    return [(dict(vars(m)), {n: code(c) for n, c in vars(m).items() if isinstance(c, type)}) for m in mods]


def _same(a, b) -> bool:
    return all(ga.keys() == gb.keys() and all(ga[k] is gb[k] for k in ga) and ca == cb
               for (ga, ca), (gb, cb) in zip(a, b))


def test_an_engine_leaves_transformers_modules_as_it_found_them():
    """batchscope's kernels go into the engine's own model (per module); the modeling files and classes of
    transformers are the same objects before, during and after an engine's life."""
    from batchscope.engine import Engine, EngineConfig

    before = _transformers_as_found()
    eng = Engine(EngineConfig(model="tiny-random", device="cuda" if HAS_CUDA else "cpu", num_blocks=64))
    try:
        if HAS_CUDA:   # the fused rotary is in, without a skip, on the installed transformers
            assert any(k.endswith("modeling_llama.apply_rotary_pos_emb") for k in eng.kernels), eng.kernels
            assert eng.info["kernels_skipped"] == []
        assert _same(before, _transformers_as_found())
    finally:
        eng.close()
    assert _same(before, _transformers_as_found())
