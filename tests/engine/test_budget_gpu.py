"""The adaptive budget on CUDA: buffers for its largest step, mixed-step graphs for the steps that carry decodes,
greedy tokens exact in float32 in every mode, and its step-time model fed from events without a host wait."""
from __future__ import annotations

import pytest
import torch

from helpers import generate_in_mode, random_prompts, reference_generate
from batchscope.engine import Engine, EngineConfig, SamplingParams

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def adaptive_engine(qwen3_checkpoint):
    path, _model, _eos = qwen3_checkpoint
    eng = Engine(EngineConfig(model=path, device="cuda", dtype="float32", attention="triton", mode="async",
                              num_blocks=512, max_running=16))
    yield eng
    eng.close()


@pytest.mark.parametrize("mode", ["sync", "async", "switch"])
def test_adaptive_steps_replay_graphs_and_keep_greedy_tokens(adaptive_engine, qwen3_checkpoint, mode):
    path, _m, eos = qwen3_checkpoint
    eng = adaptive_engine
    graphs = eng.runner.graphs
    assert eng.info["max_batch_tokens"] == 8192 and eng.info["budget"]["mode"] == "adaptive"
    assert graphs.mixed_buckets and graphs.mixed_buckets[-1] == 2048, (graphs.mixed_note, graphs.mixed_buckets)
    assert eng.info["budget"]["decode_max_tokens"] == 2048
    captured, replays, budgets = graphs.captures, [], []
    replay = graphs.replay

    def spy(batch, start=None):
        done = replay(batch, start)
        replays.append(done)
        return done
    graphs.replay = spy
    eng.add_observer(observe := (lambda ev: budgets.append((ev.budget, ev.decode_tokens, ev.prefill_tokens))
                                 if hasattr(ev, "budget") else None))
    try:
        from transformers import AutoModelForCausalLM
        ref_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
        prompts = random_prompts(10, 512, 20, 400, seed=31)
        outs = generate_in_mode(eng, prompts, SamplingParams(max_new_tokens=16, ignore_eos=False), mode)
        for p, out in zip(prompts, outs):
            assert out.token_ids == reference_generate(ref_model, p, 16, eos)
    finally:
        graphs.replay = replay
        eng.remove_observer(observe)
    assert graphs.captures == captured                       # nothing captured while serving
    assert replays and all(replays), "a step with a graph shape ran eagerly"
    reasons = {b["reason"] for b, _d, _p in budgets}
    assert reasons <= {"no_decode", "decode_target"} and "decode_target" in reasons, reasons
    assert all(d + p <= b["tokens"] for b, d, p in budgets)
    assert all(b["tokens"] <= 2048 for b, d, _p in budgets if d)     # decodes stay within the graphs
    model = eng.info["budget"]["step_time_model"]
    assert model["steps_seen"] > 0 and all(c["ms"] > 0 for c in model["buckets"]), model
    assert all(v >= 0 for v in model["coefficients"].values()), model     # the fit stays non-negative


def test_learning_step_times_adds_no_host_wait(adaptive_engine):
    """Under sync debug mode "error" any implicit synchronisation raises; only the loop's one wait is let through.
    The budget reads each consumed step's compute events (already complete) and must not add one."""
    eng = adaptive_engine
    runner = eng.runner
    original_wait = runner.wait
    seen_before = eng.scheduler.budget.model.steps

    def allowed_wait(launched):
        torch.cuda.set_sync_debug_mode(0)
        try:
            return original_wait(launched)
        finally:
            torch.cuda.set_sync_debug_mode("error")
    runner.wait = allowed_wait
    eng.set_mode("async")
    torch.cuda.set_sync_debug_mode("error")
    try:
        outs = eng.generate(random_prompts(8, 512, 5, 300, seed=2), SamplingParams(max_new_tokens=20, ignore_eos=True))
    finally:
        torch.cuda.set_sync_debug_mode(0)
        runner.wait = original_wait
    assert all(o.finish_reason == "length" and o.error is None for o in outs), [o.error for o in outs]
    assert eng.scheduler.budget.model.steps > seen_before           # it did learn from those steps
