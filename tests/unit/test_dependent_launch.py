"""Programmatic dependent launch (engine.dependent_launch): every kernel batchscope launches early waits for the
kernel before it ahead of its first activation read and its first write, as compiled for sm_90; it is used only
where the hardware has it; and tokens stay transformers' on the GPU with it on and off.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (pip install triton)")

from helpers import compile_for_hopper  # noqa: E402
from test_fused import gpu  # noqa: E402

# Compiles each decode-path kernel for sm_90 with the launch attribute on and prints, per kernel, whether it waits
# and releases, and the memory instructions its PTX issues before the wait. (ptxas ships with Triton: no GPU.)
PTX_ORDER = r"""
import re
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource
from batchscope.engine.kernels import kv_write as kw, paged_attention as at, residual_norm as rn, rms_norm as rms, rotary as rot, silu_mul as silu
from batchscope.engine.kernels import skinny_gemm as sg

MEMORY = re.compile(r"^\s*(?:@%p\d+\s+)?(ld\.global|st\.global|cp\.async|atom\.|red\.|ld\.shared|prefetch\.global)",
                    re.M)

def build(kernel, pointers, ints, floats, constants, warps=4, stages=3):
    # pointers are bf16 unless named "name:dtype"
    signature = {name.split(":")[0]: "*" + (name.split(":") + ["bf16"])[1] for name in pointers}
    signature.update({name: "i32" for name in ints})
    signature.update({name: "fp32" for name in floats})
    signature.update({name: "constexpr" for name in constants})
    constants = dict(constants, PDL=True)
    signature["PDL"] = "constexpr"
    names = [p.name for p in kernel.params]
    assert sorted(names) == sorted(signature), (kernel.fn.__name__, set(names) ^ set(signature))
    compiled = triton.compile(ASTSource(kernel, signature, constants), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": warps, "num_stages": stages, "launch_pdl": True})
    ptx = compiled.asm["ptx"]
    wait = ptx.find("griddepcontrol.wait")
    before = sorted({m.group(1) for m in MEMORY.finditer(ptx[:wait])}) if wait >= 0 else None
    print(kernel.fn.__name__, "wait", wait >= 0, "release", "griddepcontrol.launch_dependents" in ptx,
          "before", ",".join(before or []) or "-", "pdl", compiled.metadata.launch_pdl)

build(sg._skinny_gemm_kernel, ["x", "w", "out", "partial:fp32", "counters:i32"], ["m", "N", "K", "stride_xm", "stride_om"], [],
      {"SPLIT_K": 2, "BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 128}, stages=5)
build(rn._add_rms_norm_kernel, ["residual", "delta", "w", "total", "out"], ["n_rows", "n_cols"], ["eps"],
      {"BLOCK_N": 4096, "ROWS": 1}, warps=16)
build(rms._rms_norm_kernel, ["x", "w", "out"],
      ["n_rows", "n_cols", "inner", "stride_outer", "stride_inner", "stride_out"], ["eps"],
      {"BLOCK_N": 4096, "ROWS": 1}, warps=16)
build(rot._rotary_kernel, ["q", "k", "cos", "sin", "q_out", "k_out"],
      ["seq_len", "q_heads", "k_heads", "sq_b", "sq_h", "sq_t", "sk_b", "sk_h", "sk_t", "oq_b", "oq_h", "oq_t",
       "ok_b", "ok_h", "ok_t", "sc_b", "sc_t", "ss_b", "ss_t"], [], {"HALF": 64, "HALF_PAD": 64, "BLOCK_H": 8})
build(silu._silu_mul_kernel, ["gate_up", "out"], ["n_rows", "n_cols", "stride_in", "stride_out"], [],
      {"BLOCK": 1024})
build(kw._write_kv_kernel, ["key", "value", "k_cache", "v_cache", "slot_mapping:i64"],
      ["stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_kcs", "stride_kch", "stride_vcs", "stride_vch"],
      [], {"KV_HEADS": 8, "HEAD_DIM": 128, "V_DIM": 128, "H_PAD": 8, "D_PAD": 128, "DV_PAD": 128})
tables = ["block_tables:i32", "seq_lens:i32", "query_start_loc:i32"]
strides = ["stride_qt", "stride_qh", "stride_kb", "stride_ks", "stride_kh", "stride_vb", "stride_vs", "stride_vh",
           "stride_bt", "stride_ot", "stride_oh"]
shape = {"HEAD_DIM": 128, "D_PAD": 128, "V_DIM": 128, "DV_PAD": 128, "BLOCK_SIZE": 16, "USE_WINDOW": False,
         "SOFTCAP": False, "PRECISION": at._precision(torch.bfloat16), "DOT_F32": False}
build(at._decode_split_kernel, ["q", "k_cache", "v_cache", *tables, "part_out:fp32", "part_lse:fp32", "out"],
      ["window", "num_splits", "min_tiles", *strides], ["qk_scale", "softcap"],
      dict(shape, NUM_HEADS=32, G=4, G_PAD=16, BLOCK_N=64, DIRECT_OUT=False))
build(at._decode_merge_kernel, ["part_out:fp32", "part_lse:fp32", "query_start_loc:i32", "out"],
      ["num_splits", "stride_ot", "stride_oh"], [], {"NUM_HEADS": 32, "HEAD_DIM": 128, "D_PAD": 128, "S_PAD": 4})
build(at._prefill_kernel, ["q", "k_cache", "v_cache", *tables, "out"],
      ["window", "num_seqs", "search_steps", *strides], ["qk_scale", "softcap"],
      dict(shape, G=4, G_PAD=4, BLOCK_Q=32, BLOCK_N=64), warps=8)
print("built")
"""

KERNELS = ["_skinny_gemm_kernel", "_add_rms_norm_kernel", "_rms_norm_kernel", "_rotary_kernel", "_silu_mul_kernel",
           "_write_kv_kernel", "_decode_split_kernel", "_decode_merge_kernel", "_prefill_kernel"]


def test_every_kernel_waits_before_its_first_activation_read_or_write():
    out = compile_for_hopper(PTX_ORDER)
    assert out.strip().endswith("built"), out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if " wait " in line}
    assert sorted(lines) == sorted(KERNELS), out
    for name, words in lines.items():
        info = dict(zip(words[1::2], words[2::2]))
        assert info["wait"] == "True" and info["release"] == "True" and info["pdl"] == "True", (name, out)
        assert info["before"] == "-", (name, out)     # no memory instruction before the wait


def test_every_launched_kernel_takes_the_switch():
    """A kernel added to these modules without the PDL switch (and its `enter`) would be launched the old way
    beside ones launched early: this lists them all."""
    import inspect

    from triton.runtime.jit import KernelInterface

    from batchscope.engine.kernels import (kv_write, paged_attention, residual_norm, rms_norm, rotary, silu_mul,
                                           skinny_gemm)
    kernels = {name: obj for mod in (paged_attention, rms_norm, rotary, silu_mul, kv_write, residual_norm, skinny_gemm)
               for name, obj in vars(mod).items() if isinstance(obj, KernelInterface) and name.endswith("_kernel")}
    assert sorted(kernels) == sorted(KERNELS)
    for name, kernel in kernels.items():     # compiled or interpreted, the Python function is `.fn`
        assert "PDL" in inspect.signature(kernel.fn).parameters, name
        assert re.search(r"\benter\(PDL\)", inspect.getsource(kernel.fn)), name


def _options_in_fresh_process(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "BATCHSCOPE_DEPENDENT_LAUNCH")}
    if env_value is not None:
        env["BATCHSCOPE_DEPENDENT_LAUNCH"] = env_value
    code = ("import torch; from batchscope.engine.kernels import dependent_launch as d; "
            "print(d.launch_options(torch.device('cpu')), d.supported(torch.device('cpu')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def test_cpu_tensors_launch_the_ordinary_way():
    assert _options_in_fresh_process(None) == "{'PDL': False} False"


@gpu
def test_gpu_switch_follows_the_hardware_and_the_environment(monkeypatch):
    from batchscope.engine.kernels import dependent_launch as d
    dev = torch.device("cuda", torch.cuda.current_device())
    hopper = torch.cuda.get_device_capability(dev)[0] >= 9
    assert d.supported(dev) == hopper
    assert d.launch_options(dev) == ({"PDL": True, "launch_pdl": True} if hopper else {"PDL": False})
    monkeypatch.setenv("BATCHSCOPE_DEPENDENT_LAUNCH", "0")
    assert d.launch_options(dev) == {"PDL": False}


def _decode_layer_chain(monkeypatch, enabled: bool, replays: int) -> list[torch.Tensor]:
    """A decode layer's kernel chain at Llama-3-8B widths, 32 rows, captured in one CUDA graph: RMSNorm, the
    few-row GEMM (no split), SiLU x up, the split-K GEMM, the residual add with the next norm. Each
    kernel reads what the one before wrote and some overwrite memory an earlier one read: launched early without
    waiting, replays would differ."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from batchscope.engine.kernels import residual_norm, rms_norm as rms, silu_mul as silu, skinny_gemm
    from test_fused import norm_module

    monkeypatch.setenv("BATCHSCOPE_DEPENDENT_LAUNCH", "1" if enabled else "0")
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows, hidden, inter = 32, 4096, 14336
    x = torch.randn(rows, hidden, generator=gen, device="cuda", dtype=torch.bfloat16)
    norm = norm_module(LlamaRMSNorm, hidden, torch.bfloat16, device="cuda")
    rms.install_rms_norms(torch.nn.ModuleDict({"norm": norm}))   # the add's norm: one kernel
    w_up = torch.randn(2 * inter, hidden, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02
    w_down = torch.randn(hidden, inter, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02
    up = skinny_gemm.SkinnyGemm(w_up, 1, 3)            # 448 row tiles: several waves, no split
    down = skinny_gemm.SkinnyGemm(w_down, 2, 5)        # 64 row tiles: split K, the last program sums

    def layer():
        h = rms.rms_norm(x, norm.weight, norm.variance_epsilon)
        act = silu.silu_mul(up(h), inter)
        total, normed = residual_norm.add_rms_norm(x, down(act), norm)
        return torch.cat([total, normed], 1)

    assert rms.is_fused_norm(norm)
    layer()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer()
    results = []
    for _ in range(replays):
        graph.replay()
        results.append(out.clone())
    torch.cuda.synchronize()
    rms.uninstall_rms_norms(torch.nn.ModuleDict({"norm": norm}))
    return results


@gpu
def test_gpu_early_launches_in_a_graph_give_the_ordinary_results_every_replay(monkeypatch):
    ordinary = _decode_layer_chain(monkeypatch, False, 1)[0]
    for result in _decode_layer_chain(monkeypatch, True, 200):
        assert torch.equal(result, ordinary)
