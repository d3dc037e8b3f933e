"""CPU linears on prepacked oneDNN weights: every float32 linear of a loaded model is packed (merged q/k/v and
gate/up included), each output matches F.linear to float32 rounding, and the engine uses them by default."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from batchscope.engine.kernels import cpu_gemm

pytestmark = pytest.mark.skipif(not cpu_gemm.available(), reason="this torch build has no oneDNN linear")


def test_a_packed_linear_gives_f_linear():
    torch.manual_seed(0)
    layer = nn.Linear(96, 200)
    assert cpu_gemm.pack_linears(layer) == [""]
    assert "forward" in layer.__dict__
    for s in ((8, 96), (1, 5, 96), (1, 96)):
        x = torch.randn(*s)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    assert cpu_gemm.pack_linears(nn.Linear(96, 200).bfloat16()) == []        # float32 weights only


def test_the_engine_packs_every_linear_on_cpu_and_not_when_told_not_to(tmp_path):
    from batchscope.engine import Engine, EngineConfig, SamplingParams

    prompts = [[5, 9, 200, 31, 7], [44, 45, 46]]
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    outs = {}
    for fast in (True, False):
        with Engine(EngineConfig(model="tiny-random", device="cpu", dtype="float32", num_blocks=64,
                                 fused_kernels=fast)) as eng:
            layers = [m for m in eng.model.modules() if isinstance(m, nn.Linear)]
            packed = [m for m in layers if hasattr(m, "batchscope_packed")]
            merged = {id(m.batchscope_merged): m.batchscope_merged for m in eng.model.modules()
                      if hasattr(m, "batchscope_merged")}
            if fast:
                # o_proj, down_proj and lm_head are packed themselves; q/k/v and gate/up only through their merge
                assert len(packed) == 2 * eng.model.config.num_hidden_layers + 1
                assert not any(hasattr(m.mlp.gate_proj, "batchscope_packed") for m in eng.model.model.layers)
                assert all(m.packed is not None for m in merged.values()) and merged
                assert any(name.startswith("packed ") for name in eng.kernels)
            else:
                assert not packed and all(m.packed is None for m in merged.values())
            outs[fast] = [o.token_ids for o in eng.generate(prompts, params)]
    assert outs[True] == outs[False]


def test_any_row_count_reaches_onednn_as_one_of_a_few_shapes(monkeypatch):
    """oneDNN keeps a compiled primitive per input shape (about 0.6 MB each, up to 1,024 of them in each of two
    caches): every row count from 1 to 600 must come down to a bounded set of shapes, with the same outputs."""
    torch.manual_seed(0)
    weight, bias = torch.randn(48, 40), torch.randn(48)
    packed = cpu_gemm.PackedWeight(weight, bias)
    shapes = set()
    real = cpu_gemm._linear

    def spy(x, w, b):
        shapes.add(tuple(x.shape))
        return real(x, w, b)

    monkeypatch.setattr(cpu_gemm, "_linear", spy)
    for rows in range(1, 601):
        x = torch.randn(rows, 40)
        torch.testing.assert_close(packed(x), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    assert len(shapes) <= 28, sorted(shapes)
    assert max(s[0] for s in shapes) == cpu_gemm.CHUNK_ROWS
    for x in (torch.randn(1, 300, 40), torch.randn(1, 13, 40)):   # the model's (1, tokens, hidden)
        torch.testing.assert_close(packed(x), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    assert [cpu_gemm.padded_rows(n) for n in (0, 1, 8, 9, 13, 17, 33, 64, 65, 100, 129, 256)] == \
        [0, 1, 8, 10, 14, 20, 40, 64, 80, 112, 160, 256]
