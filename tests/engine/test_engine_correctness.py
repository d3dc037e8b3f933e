"""Greedy tokens equal transformers' own generate: in sync, in async, and with the mode switched live."""
from __future__ import annotations

import pytest
import torch

from helpers import generate_in_mode, random_prompts, reference_generate
from batchscope.engine import Engine, EngineConfig, SamplingParams
from batchscope.engine.model.attention import AttentionMetadata, paged_attention_torch


@pytest.mark.parametrize("mode", ["sync", "async", "switch"])
def test_tiny_random_greedy_equals_transformers(tiny_engine, tiny_reference, mode):
    prompts = random_prompts(10, 49152, 1, 70, seed=11)
    lengths = [5, 17, 9, 24, 12, 3, 30, 8, 20, 14]
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in lengths]
    outs = generate_in_mode(tiny_engine, prompts, params, mode)
    for p, n, out in zip(prompts, lengths, outs):
        assert out.finish_reason == "length"
        assert out.token_ids == reference_generate(tiny_reference, p, n, None)


def test_string_prompts_and_text(tiny_engine, tiny_reference):
    out = tiny_engine.generate(["Hello, batchscope!"], SamplingParams(max_new_tokens=6, ignore_eos=True))[0]
    ids = tiny_engine.tokenizer.encode("Hello, batchscope!", add_special_tokens=False)
    assert out.prompt_token_ids == ids
    assert out.token_ids == reference_generate(tiny_reference, ids, 6, None)
    assert out.text == tiny_engine.tokenizer.decode(out.token_ids, skip_special_tokens=True)


def test_compute_start_is_recorded_just_before_the_first_kernel(tiny_engine, monkeypatch):
    """A step's compute_start event completes as soon as its stream reaches it, so nothing slow may sit between
    it and the first kernel: the input views are cut before it, the event follows the step's one-element start
    kernel, and the runner looks the embedding up itself right after it (the decoder's own Python before its
    embedding would count as compute on an idle GPU)."""
    from batchscope.engine.batch import Batch

    runner = tiny_engine.runner
    step = runner.forward
    order = []
    marker = torch.zeros_like(step.started)

    class StartedSpy:                                 # the start kernel's one-element tensor
        def fill_(self, value):
            order.append("start kernel")
            return marker.fill_(value)

    monkeypatch.setattr(step, "started", StartedSpy())

    class EventSpy:                                   # stands in for a CUDA event on CPU
        def __init__(self, name):
            self.name = name

        def record(self):
            order.append(self.name)

    class SlotEventsSpy:
        compute_start, compute_started, last_marked = EventSpy("start"), EventSpy("started"), False

    compute = runner._compute
    monkeypatch.setattr(runner, "_compute", lambda batch, prev_out, ev=None: compute(batch, prev_out,
                                                                                     SlotEventsSpy()))
    view = Batch.view
    monkeypatch.setattr(Batch, "view", lambda self, name: order.append(f"view {name}") or view(self, name))
    assert step.embed is step.base.embed_tokens               # a Llama decoder only looks its ids up
    hooks = [step.base.register_forward_pre_hook(lambda module, args: order.append("decoder")),
             step.embed.register_forward_pre_hook(lambda module, args: order.append("embedding"))]
    try:
        out = tiny_engine.generate([[5, 6, 7, 8]], SamplingParams(max_new_tokens=3, ignore_eos=True))[0]
    finally:
        for hook in hooks:
            hook.remove()
    assert len(out.token_ids) == 3
    steps = [i for i, what in enumerate(order) if what == "start"]
    assert len(steps) == 3                            # one prefill and two decode steps
    for i in steps:
        assert order[i + 1:i + 5] == ["start kernel", "started", "embedding", "decoder"]
        inputs = [what for what in order[max(0, i - 12):i] if what.startswith("view ")]
        assert {"view input_ids", "view positions", "view slot_mapping", "view block_tables"} <= set(inputs)


class ScaledLookupDecoder(torch.nn.Module):
    """Scales its lookup on the input_ids path only (as Falcon-H1 does): embeddings from outside would differ."""

    def forward(self, input_ids=None, inputs_embeds=None):
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("exactly one")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids) * 2.0
        return inputs_embeds


class PerLayerIdsDecoder(torch.nn.Module):
    """Derives more than the embedding from its ids (as Gemma3n's per-layer inputs do)."""

    def forward(self, input_ids=None, inputs_embeds=None):
        if input_ids is not None:
            inputs_embeds = self.embed_tokens(input_ids)
        return inputs_embeds + self.per_layer(input_ids)


def test_the_runner_looks_embeddings_up_only_for_decoders_that_do_nothing_else_with_the_ids(tiny_engine):
    from batchscope.engine.model.source import embeds_only

    assert embeds_only(tiny_engine.runner.forward.base)
    for cls in (ScaledLookupDecoder, PerLayerIdsDecoder):
        decoder = cls()
        decoder.embed_tokens = torch.nn.Embedding(4, 2)
        assert not embeds_only(decoder), cls.__name__
    assert not embeds_only(torch.nn.Linear(2, 2))               # no embed_tokens at all
    # the other path (the decoder embeds its own ids) gives the same tokens
    step = tiny_engine.runner.forward
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    prompts = random_prompts(3, 49152, 4, 20, seed=3)
    looked_up = [o.token_ids for o in tiny_engine.generate(prompts, params)]
    embed, step.embed = step.embed, None
    try:
        assert [o.token_ids for o in tiny_engine.generate(prompts, params)] == looked_up
    finally:
        step.embed = embed


@pytest.fixture(scope="module")
def qwen_engine(qwen3_checkpoint):
    path, _model, _eos = qwen3_checkpoint
    eng = Engine(EngineConfig(model=path, device="cpu", dtype="float32", mode="async",
                              num_blocks=128, max_batch_tokens=96, max_running=16, seed=0))
    yield eng
    eng.close()


@pytest.mark.parametrize("mode", ["sync", "async", "switch"])
@pytest.mark.parametrize("eos", [True, False], ids=["eos-on", "eos-off"])
def test_qwen3_grouped_kv_greedy_equals_transformers(qwen_engine, qwen3_checkpoint, mode, eos):
    _path, model, eos_id = qwen3_checkpoint
    prompts = random_prompts(12, 512, 1, 60, seed=7)
    params = SamplingParams(max_new_tokens=24, ignore_eos=not eos)
    outs = generate_in_mode(qwen_engine, prompts, params, mode)
    stopped = 0
    for p, out in zip(prompts, outs):
        ref = reference_generate(model, p, 24, eos_id if eos else None)
        assert out.token_ids == ref
        if eos and ref[-1] == eos_id and len(ref) < 24:
            assert out.finish_reason == "eos"
            stopped += 1
        else:
            assert out.finish_reason == "length"
    if eos:
        assert stopped > 0, "the EOS path was never exercised"


@pytest.mark.parametrize("mode", ["sync", "async", "switch"])
def test_tiny_cache_forces_chunked_prefill_and_preemption(qwen3_checkpoint, mode):
    path, model, eos_id = qwen3_checkpoint
    # 12 blocks of 8 tokens for 6 requests of up to ~70 tokens each: they cannot all stay resident
    eng = Engine(EngineConfig(model=path, device="cpu", dtype="float32", mode="async", block_size=8,
                              num_blocks=12, max_batch_tokens=16, max_running=6, seed=0))
    traces = []
    eng.add_observer(lambda ev: traces.append(ev) if hasattr(ev, "preempted") else None)
    try:
        prompts = random_prompts(6, 512, 20, 45, seed=3)
        outs = generate_in_mode(eng, prompts, SamplingParams(max_new_tokens=20, ignore_eos=True), mode)
    finally:
        eng.close()
    for p, out in zip(prompts, outs):
        assert out.token_ids == reference_generate(model, p, 20, None)
    assert any(t.preempted for t in traces), "no preemption happened"
    # every prompt is longer than the 16-token budget, so matching tokens above means chunked prefill worked
    assert min(len(p) for p in prompts) > 16
    assert all(t.prefill_tokens + t.decode_tokens <= 16 for t in traces)


def test_batched_decode_attention_matches_per_request_attention():
    """The batched decode path (one gather, one SDPA, a mask built once per step) against attention written out
    per request and head. One metadata object serves every call, as it serves every layer of a step, here with
    layers with and without a sliding window."""
    torch.manual_seed(0)
    heads, kv_heads, d, block_size, lens = 9, 3, 64, 16, [37, 80, 5, 16]
    k_cache, v_cache = torch.randn(2, 24, block_size, kv_heads, d).unbind(0)
    tables = torch.randperm(24).view(4, 6).to(torch.int32)
    meta = AttentionMetadata(torch.zeros(4, dtype=torch.int64), torch.arange(5, dtype=torch.int32),
                             torch.tensor(lens, dtype=torch.int32), tables, list(range(5)), lens, 1, max(lens),
                             [(k_cache, v_cache)])
    q = torch.randn(4, heads, d)
    for window in (None, 20, None):
        out = paged_attention_torch(q, k_cache, v_cache, meta, 0.125, window)
        for b, n in enumerate(lens):
            lo = 0 if window is None else max(0, n - window)
            k = k_cache[tables[b].long()].flatten(0, 1)[lo:n].double()
            v = v_cache[tables[b].long()].flatten(0, 1)[lo:n].double()
            for h in range(heads):
                g = h // (heads // kv_heads)
                probs = (k[:, g] @ q[b, h].double() * 0.125).softmax(0)
                torch.testing.assert_close(out[b, h].double(), probs @ v[:, g], rtol=1e-5, atol=1e-5)


def test_two_engines_running_at_once_each_see_only_their_own_metadata(tiny_engine, tiny_reference, qwen_engine,
                                                                      qwen3_checkpoint):
    """The attention layers find their step's metadata in a per-thread slot (engine.attention.use_metadata), so
    two engines stepping at the same time, each on its own thread, never read each other's caches."""
    import threading

    _path, qwen_model, _eos = qwen3_checkpoint
    tiny_prompts = random_prompts(6, 49152, 5, 40, seed=21)
    qwen_prompts = random_prompts(6, 512, 5, 40, seed=22)
    params = SamplingParams(max_new_tokens=10, ignore_eos=True)
    results = {}
    start = threading.Barrier(2)

    def run(name, eng, prompts):
        start.wait()
        results[name] = [o.token_ids for o in eng.generate(prompts, params)]
    threads = [threading.Thread(target=run, args=("tiny", tiny_engine, tiny_prompts)),
               threading.Thread(target=run, args=("qwen", qwen_engine, qwen_prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results["tiny"] == [reference_generate(tiny_reference, p, 10, None) for p in tiny_prompts]
    assert results["qwen"] == [reference_generate(qwen_model, p, 10, None) for p in qwen_prompts]
