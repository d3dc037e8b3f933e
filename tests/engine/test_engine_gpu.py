"""The engine on a CUDA device: correctness in both dtypes and attention paths, no hidden syncs, real overlap."""
from __future__ import annotations

import pytest
import torch

from helpers import generate_in_mode, random_prompts, reference_generate
from batchscope.engine import Engine, EngineConfig, SamplingParams, StepTrace

pytestmark = pytest.mark.gpu

_engines: dict = {}


def _engine(path: str, dtype: str, attention: str) -> Engine:
    key = (path, dtype, attention)
    if key not in _engines:
        _engines[key] = Engine(EngineConfig(model=path, device="cuda", dtype=dtype, attention=attention,
                                            mode="async", num_blocks=256, max_batch_tokens=128, max_running=16))
    return _engines[key]


@pytest.fixture(scope="module", autouse=True)
def _close_engines():
    yield
    for eng in _engines.values():
        eng.close()
    _engines.clear()


def _reference_model(path: str, dtype: str):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).cuda().eval()


def assert_greedy_equivalent(model, prompt, ours, ref, dtype):
    """Exact in float32. In bfloat16 two correct implementations may round a near-tie differently: allow a
    divergence only where the reference itself rates both tokens within bf16 noise."""
    if ours == ref or dtype == "float32":
        assert ours == ref
        return
    i = next(k for k, (a, b) in enumerate(zip(ours, ref)) if a != b) if any(
        a != b for a, b in zip(ours, ref)) else min(len(ours), len(ref))
    ids = torch.tensor([prompt + ref[:i]], device="cuda")
    with torch.no_grad():
        logits = model(ids).logits[0, -1].float()
    gap = (logits[ref[i]] - logits[ours[i]]).abs().item() if i < min(len(ours), len(ref)) else 0.0
    assert gap <= 0.02 * logits.abs().max().item() + 0.05, f"diverged at {i} with logit gap {gap}"


@pytest.mark.parametrize("mode", ["sync", "async", "switch"])
@pytest.mark.parametrize("attention", ["torch", "triton"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_qwen3_greedy_equals_transformers_on_cuda(qwen3_checkpoint, dtype, attention, mode):
    path, _cpu_model, eos = qwen3_checkpoint
    eng = _engine(path, dtype, attention)
    ref_model = _reference_model(path, dtype)
    prompts = random_prompts(12, 512, 1, 60, seed=7)
    outs = generate_in_mode(eng, prompts, SamplingParams(max_new_tokens=24, ignore_eos=False), mode)
    for p, out in zip(prompts, outs):
        ref = reference_generate(ref_model, p, 24, eos)
        assert_greedy_equivalent(ref_model, p, out.token_ids, ref, dtype)


@pytest.fixture(scope="module")
def llama_tiling_checkpoint(tmp_path_factory):
    """A small random Llama whose projections tile for the few-row GEMM (hidden 256, MLP 512, vocab 2048)."""
    from transformers import AutoModelForCausalLM, LlamaConfig
    cfg = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      initializer_range=0.1, tie_word_embeddings=False, eos_token_id=None, bos_token_id=None)
    torch.manual_seed(2)
    path = tmp_path_factory.mktemp("llama-tiling")
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_few_row_gemms_and_fused_residual_norms_keep_greedy_tokens_on_cuda(llama_tiling_checkpoint, dtype):
    eng = _engine(llama_tiling_checkpoint, dtype, "triton")
    assert sum("(few-row GEMM)" in f for f in eng.kernels) == 3 * 4 + 1   # q/k/v, o, gate/up, down; the lm_head
    assert sum("(residual adds with the norms)" in f for f in eng.kernels) == 3
    ref_model = _reference_model(llama_tiling_checkpoint, dtype)
    prompts = random_prompts(12, 2048, 1, 60, seed=9)
    for mode in ("sync", "async", "switch"):
        outs = generate_in_mode(eng, prompts, SamplingParams(max_new_tokens=24, ignore_eos=True), mode)
        for p, out in zip(prompts, outs):
            assert_greedy_equivalent(ref_model, p, out.token_ids, reference_generate(ref_model, p, 24, None), dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tiny_random_greedy_equals_transformers_on_cuda(dtype):
    _tiny_random_greedy_equals_transformers(dtype)


@pytest.mark.parametrize("dtype", ["bfloat16"])
def test_large_batch_decode_tile_keeps_greedy_tokens_on_cuda(dtype, monkeypatch):
    """The decode kernel's settings for many (request, KV head) programs (batch 128 and up on an 8B model),
    forced here on a small batch: the same tokens as transformers."""
    from batchscope.engine.kernels import paged_attention as at
    monkeypatch.setattr(at, "PROGRAMS_PER_SM", 0)
    monkeypatch.setattr(at, "MANY_PROGRAMS_PER_SM", 0)
    assert at.decode_tile(getattr(torch, dtype), 16, programs=8) == (32, 2, 1)   # tiny-random's heads of 16
    _tiny_random_greedy_equals_transformers(dtype)


def _tiny_random_greedy_equals_transformers(dtype):
    from batchscope.engine.model.loading import load_model
    eng = Engine(EngineConfig(model="tiny-random", device="cuda", dtype=dtype, num_blocks=256,
                              max_batch_tokens=256, max_running=32))
    try:
        ref_model = load_model(EngineConfig(model="tiny-random", device="cuda", dtype=dtype)).model
        prompts = random_prompts(10, 49152, 1, 70, seed=11)
        for mode in ("sync", "async", "switch"):
            outs = generate_in_mode(eng, prompts, SamplingParams(max_new_tokens=16, ignore_eos=True), mode)
            for p, out in zip(prompts, outs):
                assert_greedy_equivalent(ref_model, p, out.token_ids, reference_generate(ref_model, p, 16, None),
                                         dtype)
    finally:
        eng.close()


def test_async_loop_has_no_hidden_synchronisation(qwen3_checkpoint):
    """Every implicit sync (.item(), .tolist() of a device tensor, pageable copies) raises under this debug
    mode; only the one deliberate wait on the D2H event is allowed."""
    path, _m, _eos = qwen3_checkpoint
    eng = _engine(path, "bfloat16", "triton")
    runner = eng.runner
    original_wait = runner.wait

    def allowed_wait(launched):
        torch.cuda.set_sync_debug_mode(0)
        try:
            return original_wait(launched)
        finally:
            torch.cuda.set_sync_debug_mode("error")
    runner.wait = allowed_wait
    eng.set_mode("async")
    eng.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))     # graphs/kernels warm
    torch.cuda.set_sync_debug_mode("error")
    try:
        outs = eng.generate(random_prompts(8, 512, 5, 40, seed=1), SamplingParams(max_new_tokens=20, ignore_eos=True))
    finally:
        torch.cuda.set_sync_debug_mode(0)
        runner.wait = original_wait
    assert all(o.finish_reason == "length" and o.error is None for o in outs), [o.error for o in outs]


def test_async_fills_next_step_while_gpu_computes_and_sync_does_not():
    """From the step traces: in async mode the host finishes filling step N+1 before step N's compute ends
    on the GPU; in sync mode it never does."""
    eng = Engine(EngineConfig(model="llama3-8b-random", device="cuda", dtype="bfloat16", num_blocks=2048,
                              max_batch_tokens=4096, max_running=32))
    fill_end, compute_end = {}, {}
    anchor = {}

    def observe(ev):
        if not isinstance(ev, StepTrace) or ev.gpu_events is None:
            return
        if ev.anchor is not None:
            anchor["ev"], anchor["ns"] = ev.anchor
        fill_end[(ev.mode, ev.step)] = ev.host["fill"][1]
        end = ev.gpu_events["compute"][1]
        compute_end[(ev.mode, ev.step)] = anchor["ns"] + anchor["ev"].elapsed_time(end) * 1e6
    eng.add_observer(observe)
    try:
        prompts = random_prompts(32, 49152, 64, 64, seed=0)
        params = SamplingParams(max_new_tokens=48, ignore_eos=True)
        result = {}
        for mode in ("async", "sync"):
            eng.set_mode(mode)
            eng.generate(prompts, params)
            pairs = [(fill_end[(m, s + 1)], compute_end[(m, s)]) for (m, s) in compute_end
                     if m == mode and (m, s + 1) in fill_end]
            result[mode] = sum(f < c for f, c in pairs) / len(pairs)
    finally:
        eng.close()
    print(f"share of steps whose successor was filled before they finished computing: {result}")
    assert result["async"] > 0.9
    assert result["sync"] == 0.0


def test_a_real_out_of_memory_step_fails_alone_and_the_engine_keeps_serving():
    """Fill the device, then send a prefill larger than any before it: the allocator has no block for it, so the
    step runs out of memory. That request ends with "error"; once memory is back the engine serves exactly."""
    eng = Engine(EngineConfig(model="tiny-random", device="cuda", dtype="float32", mode="async", num_blocks=512,
                              max_batch_tokens=4096, max_running=8, seed=0))
    try:
        params = SamplingParams(max_new_tokens=8, ignore_eos=True)
        before = eng.generate([[5, 6, 7]], params)[0].token_ids
        ballast, chunk = [], 256 << 20
        while chunk >= 1 << 20:
            try:
                ballast.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
            except torch.cuda.OutOfMemoryError:
                chunk //= 2
        out = eng.generate([list(range(3, 4003))], SamplingParams(max_new_tokens=4))[0]
        ballast.clear()
        torch.cuda.empty_cache()
        assert out.finish_reason == "error" and "out of device memory" in out.error, out.error
        for mode in ("sync", "async"):
            eng.set_mode(mode)
            assert eng.generate([[5, 6, 7]], params)[0].token_ids == before
        assert eng.stats()["running"] == 0 and eng.scheduler.allocator.num_used == 0
    finally:
        eng.close()


def test_the_same_prompts_give_the_same_tokens_run_after_run_with_other_work_between(tmp_path):
    """bf16, near-uniform random logits (near-ties everywhere, so any change in rounding shows), thousands of
    tokens: the same generate call gives the same tokens again, after other work and in the other mode."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=False)
    torch.manual_seed(3)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(tmp_path)
    eng = Engine(EngineConfig(model=str(tmp_path), device="cuda", dtype="bfloat16", mode="async", num_blocks=4096,
                              max_batch_tokens=512, max_running=32, seed=0))
    try:
        prompts = random_prompts(24, 8192, 20, 300, seed=9)
        params = SamplingParams(max_new_tokens=1500, ignore_eos=True)
        first = [o.token_ids for o in eng.generate(prompts, params)]
        eng.set_mode("sync")
        eng.generate(random_prompts(9, 8192, 5, 500, seed=10), SamplingParams(max_new_tokens=300, ignore_eos=True))
        again_sync = [o.token_ids for o in eng.generate(prompts, params)]
        eng.set_mode("async")
        again_async = [o.token_ids for o in eng.generate(prompts, params)]
        assert all(len(t) == 1500 for t in first)
        assert again_sync == first and again_async == first
    finally:
        eng.close()


def test_sampled_decodes_replay_graphs_captured_at_start_up_and_never_wait_for_a_capture():
    """Every decode graph (slot x bucket x sampling path) exists once the engine is up: the first temperature or
    top-k request in a bucket captures nothing and syncs nothing. A greedy request that sets top_k runs the
    greedy graph and leaves the filtered one alone, so a later sampled request is still sampled."""
    eng = Engine(EngineConfig(model="tiny-random", device="cuda", dtype="float32", mode="async", num_blocks=256,
                              max_batch_tokens=256, max_running=16, seed=0))
    runner = eng.runner
    original_wait = runner.wait

    def allowed_wait(launched):
        torch.cuda.set_sync_debug_mode(0)
        try:
            return original_wait(launched)
        finally:
            torch.cuda.set_sync_debug_mode("error")
    try:
        assert runner.graphs.enabled, runner.graphs.note
        assert set(runner.graphs.graphs) == set(runner.graphs.keys())
        captured = runner.graphs.captures
        prompts = random_prompts(12, 49152, 3, 30, seed=4)
        kinds = [SamplingParams(max_new_tokens=10, ignore_eos=True),
                 SamplingParams(max_new_tokens=10, top_k=40, ignore_eos=True),           # greedy all the same
                 SamplingParams(max_new_tokens=10, temperature=0.8, seed=1, ignore_eos=True),
                 SamplingParams(max_new_tokens=10, temperature=0.8, top_k=40, top_p=0.9, seed=2, ignore_eos=True)]
        outs = {}
        runner.wait = allowed_wait
        torch.cuda.set_sync_debug_mode("error")
        try:
            for mode in ("async", "sync"):
                eng.set_mode(mode)
                for kind, params in enumerate(kinds):
                    for n in (1, 3, 12):                                                # three buckets
                        got = eng.generate(prompts[:n], params)
                        assert all(o.finish_reason == "length" for o in got), [o.error for o in got]
                        outs[(mode, kind, n)] = [o.token_ids for o in got]
        finally:
            torch.cuda.set_sync_debug_mode(0)
            runner.wait = original_wait
        assert runner.graphs.captures == captured
        for mode in ("async", "sync"):
            for n in (1, 3, 12):
                assert outs[(mode, 1, n)] == outs[(mode, 0, n)]
                assert outs[(mode, 2, n)] != outs[(mode, 0, n)] and outs[(mode, 3, n)] != outs[(mode, 0, n)]
    finally:
        eng.close()


@pytest.mark.parametrize("mode", ["sync", "async", "switch"])
def test_steps_with_prefill_replay_mixed_graphs_and_keep_greedy_tokens(qwen3_checkpoint, mode):
    """Chunked prefill mixed with decodes: every step replays a graph captured at start-up (mixed ones padded to
    a token bucket), float32 tokens equal transformers', and no capture happens while serving."""
    path, _m, eos = qwen3_checkpoint
    eng = _engine(path, "float32", "triton")
    graphs = eng.runner.graphs
    assert graphs.enabled and graphs.mixed_buckets and graphs.mixed_note is None, (graphs.note, graphs.mixed_note)
    assert eng.info["mixed_graph_tokens"] == graphs.mixed_buckets[:] and graphs.mixed_buckets[-1] == 128
    assert {k for k in graphs.graphs if k[1].kind == "mixed"}, "no mixed graph was captured"
    captured, kinds = graphs.captures, []
    replay = graphs.replay

    def spy(batch, start=None):
        done = replay(batch, start)
        kinds.append((batch.graph.kind, done is not None))
        return done
    graphs.replay = spy
    try:
        ref_model = _reference_model(path, "float32")
        prompts = random_prompts(10, 512, 20, 200, seed=13)          # over a 128-token budget: chunks, mixed in
        outs = generate_in_mode(eng, prompts, SamplingParams(max_new_tokens=16, ignore_eos=False), mode)
        for p, out in zip(prompts, outs):
            assert out.token_ids == reference_generate(ref_model, p, 16, eos)
    finally:
        graphs.replay = replay
    assert ("mixed", True) in kinds and ("decode", True) in kinds and all(done for _, done in kinds), kinds
    assert graphs.captures == captured


def test_without_mixed_graphs_steps_with_prefill_run_eagerly(qwen3_checkpoint):
    path, _m, eos = qwen3_checkpoint
    eng = Engine(EngineConfig(model=path, device="cuda", dtype="float32", attention="triton", mode="async",
                              num_blocks=256, max_batch_tokens=128, max_running=16, mixed_graphs=False))
    try:
        graphs = eng.runner.graphs
        assert graphs.enabled and graphs.mixed_buckets == [] and eng.info["mixed_graph_tokens"] == []
        assert all(k[1].kind == "decode" for k in graphs.graphs)
        ref_model = _reference_model(path, "float32")
        prompts = random_prompts(4, 512, 20, 200, seed=14)
        for p, out in zip(prompts, eng.generate(prompts, SamplingParams(max_new_tokens=8))):
            assert out.token_ids == reference_generate(ref_model, p, 8, eos)
    finally:
        eng.close()


def test_under_a_profiler_each_sync_step_starts_where_its_first_kernel_does(tmp_path):
    """In sync the device is idle when a step's start event is reached, and under torch.profiler a graph's
    kernels follow its head by a launch that takes long: the span must still start at the first kernel (the
    start kernel between two events), so that the imported trace and our events agree step by step."""
    from batchscope.telemetry import Telemetry
    from batchscope.telemetry.importers import import_trace
    from batchscope.telemetry.importers.agreement import compare_steps

    eng = Engine(EngineConfig(model="tiny-random", device="cuda", dtype="bfloat16", mode="sync", num_blocks=512,
                              max_batch_tokens=512, max_running=16))
    tel = Telemetry(eng, nvml_hz=0)
    try:
        assert 0.0 < eng.runner.start_kernel_ns < 20_000.0           # one element written: a few µs at most
        eng.generate(random_prompts(4, 49152, 8, 8, seed=1), SamplingParams(max_new_tokens=8, ignore_eos=True))
        path = tmp_path / "sync.pt.trace.json.gz"
        tel.start_recording("sync")
        capture = eng.profile(24, str(path))
        eng.generate(random_prompts(8, 49152, 16, 48, seed=2), SamplingParams(max_new_tokens=40, ignore_eos=True))
        assert capture.wait(120) and capture.state == "done", capture.as_dict()
        tel.stop_recording()
        own = tel.timeline("sync")
    finally:
        tel.close()
        eng.close()
    agree = compare_steps(import_trace(str(path)), own)
    fig = agree["per_mode"].get("sync") or agree
    print(f"sync under the profiler: {agree['steps_matched']} steps, compute span {fig['compute_span']}, "
          f"gap {fig['gap_before']}")
    assert agree["steps_matched"] >= 20
    assert fig["compute_span"]["within_pct"] >= 90.0
    assert fig["gap_before"]["within_pct"] >= 90.0
