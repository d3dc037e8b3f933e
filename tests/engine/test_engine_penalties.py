"""Presence, frequency and repetition penalties as vLLM applies them: greedy tokens equal a plain loop over
transformers' model that applies vLLM's formulas step by step, in sync, in async and across live switches, through
EOS finishes (whose extra in-flight token must not count), preemption, cancellation and batches that mix requests
with and without penalties. Requests without any of it run exactly the steps they ran before penalties existed."""
from __future__ import annotations

import pytest
import torch

from helpers import generate_in_mode, random_prompts, reference_generate, reference_penalized_generate
from batchscope.engine import ConfigError, Engine, EngineConfig, SamplingParams
from batchscope.engine.penalties import PenaltyState

# what each prompt of a batch asks for, penalties or none (a neutral row in a step that runs the penalties)
MIX = [dict(),
       dict(presence_penalty=1.5),
       dict(frequency_penalty=-2.0),                          # negative: the output repeats itself
       dict(repetition_penalty=1.6),
       dict(repetition_penalty=0.5),                          # below 1: the prompt's tokens are favoured
       dict(frequency_penalty=-1.0, presence_penalty=-1.0),
       dict(presence_penalty=-2.0, repetition_penalty=0.8, frequency_penalty=0.3),
       dict(presence_penalty=-1.5, frequency_penalty=0.8, logprobs=2)]


def _reference(model, prompt, n, eos=None, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0,
               **_other):
    return reference_penalized_generate(model, prompt, n, presence_penalty, frequency_penalty, repetition_penalty,
                                        eos)


EOS_PROMPTS = random_prompts(12, 512, 1, 30, seed=8)
EOS_KINDS = [MIX[i % len(MIX)] for i in range(1, 13)]


@pytest.fixture(scope="module")
def qwen_small(qwen3_checkpoint, tmp_path_factory):
    """The grouped-KV Qwen3 with room for 4 requests at a time (12 requests reuse its penalty rows), saved with an
    EOS that its penalized greedy outputs actually produce: the token most of them reach after a few steps."""
    import copy

    _path, model, _eos = qwen3_checkpoint
    reached: dict[int, int] = {}
    for p, kw in zip(EOS_PROMPTS, EOS_KINDS):
        for t in set(_reference(model, p, 24, None, **kw)[3:]):
            reached[t] = reached.get(t, 0) + 1
    eos = max(reached, key=reached.get)
    model = copy.deepcopy(model)
    model.config.eos_token_id = model.generation_config.eos_token_id = eos
    path = tmp_path_factory.mktemp("qwen3-penalized-eos")
    model.save_pretrained(path)
    eng = Engine(EngineConfig(model=str(path), device="cpu", dtype="float32", mode="async", num_blocks=96,
                              max_batch_tokens=64, max_running=4, seed=0))
    yield eng, model, eos
    eng.close()


@pytest.mark.parametrize("mode", ["sync", "async", "switch"])
def test_penalized_greedy_tokens_equal_vllms_formulas_over_transformers(tiny_engine, tiny_reference, mode):
    prompts = random_prompts(len(MIX), 49152, 1, 40, seed=31)
    lengths = [14, 20, 9, 16, 12, 18, 10, 15]
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True, **kw) for n, kw in zip(lengths, MIX)]
    outs = generate_in_mode(tiny_engine, prompts, params, mode)
    changed = 0
    for p, n, kw, out in zip(prompts, lengths, MIX, outs):
        assert out.token_ids == _reference(tiny_reference, p, n, **kw), kw
        changed += out.token_ids != reference_generate(tiny_reference, p, n, None)
    assert changed >= 4, "the penalties hardly changed anything: the test would not see them misapplied"
    assert tiny_engine.scheduler.penalty_rows.num_free == tiny_engine.config.max_running


@pytest.mark.parametrize("mode", ["sync", "async", "switch"])
def test_rows_reused_after_eos_finishes_hold_only_their_new_requests_tokens(qwen_small, mode):
    """EOS is learned a step late in async: the extra token sampled after it is dropped and must not count, and
    the row goes to a request admitted later, which must start from zero."""
    eng, model, eos = qwen_small
    params = [SamplingParams(max_new_tokens=24, **kw) for kw in EOS_KINDS]
    outs = generate_in_mode(eng, EOS_PROMPTS, params, mode)
    stopped = 0
    for p, kw, out in zip(EOS_PROMPTS, EOS_KINDS, outs):
        assert out.token_ids == _reference(model, p, 24, eos, **kw), kw
        stopped += out.finish_reason == "eos"
    assert stopped >= 3, "the EOS path was hardly exercised"
    assert eng.scheduler.penalty_rows.num_free == 4


@pytest.mark.parametrize("mode", ["sync", "async", "switch"])
def test_penalties_survive_preemption_and_chunked_prefill(qwen3_checkpoint, mode):
    """A preempted request loses its KV and its row; re-admitted, it recomputes its prompt and output and its
    counts are rebuilt from those same tokens on the device."""
    path, model, _eos = qwen3_checkpoint
    eng = Engine(EngineConfig(model=path, device="cpu", dtype="float32", mode="async", block_size=8,
                              num_blocks=12, max_batch_tokens=16, max_running=6, seed=0))
    traces = []
    eng.add_observer(lambda ev: traces.append(ev) if hasattr(ev, "preempted") else None)
    try:
        prompts = random_prompts(6, 512, 20, 45, seed=3)
        kinds = MIX[1:7]
        params = [SamplingParams(max_new_tokens=20, ignore_eos=True, **kw) for kw in kinds]
        outs = generate_in_mode(eng, prompts, params, mode)
        assert eng.scheduler.penalty_rows.num_free == 6
    finally:
        eng.close()
    for p, kw, out in zip(prompts, kinds, outs):
        assert out.token_ids == _reference(model, p, 20, None, **kw), kw
    assert any(t.preempted for t in traces), "no preemption happened"


def test_a_cancelled_requests_row_starts_from_zero_for_the_next_one(qwen_small):
    eng, model, _eos = qwen_small
    eng.set_mode("async")
    params = SamplingParams(max_new_tokens=400, ignore_eos=True, frequency_penalty=-2.0, logprobs=1)
    long = [eng.submit([7, 8, 9, 10 + i], params) for i in range(4)]      # every row taken
    for handle in long:
        next(iter(handle))
    for handle in long:
        handle.cancel()
    for handle in long:
        out = handle.result(timeout=60)
        assert out.finish_reason == "cancelled"
        assert len(out.logprobs) == len(out.top_logprobs) == len(out.token_ids)
    prompts = random_prompts(4, 512, 3, 20, seed=12)
    kinds = MIX[1:5]
    outs = eng.generate(prompts, [SamplingParams(max_new_tokens=16, ignore_eos=True, **kw) for kw in kinds])
    for p, kw, out in zip(prompts, kinds, outs):
        assert out.token_ids == _reference(model, p, 16, None, **kw), kw
    assert eng.scheduler.penalty_rows.num_free == 4


def test_seeded_sampling_with_penalties_gives_the_same_tokens_in_every_mode_and_batch(tiny_engine):
    prompt = [5, 6, 7, 8, 9]
    params = SamplingParams(max_new_tokens=16, temperature=0.5, top_p=0.95, seed=77, ignore_eos=True,
                            presence_penalty=-2.0, frequency_penalty=-1.0, repetition_penalty=0.5)
    mates = [SamplingParams(max_new_tokens=9, temperature=1.0, seed=i, ignore_eos=True, **MIX[i]) for i in range(6)]
    crowd = random_prompts(6, 49152, 3, 40, seed=2)
    seen = {}
    for mode in ("sync", "async", "switch"):
        seen[mode] = generate_in_mode(tiny_engine, [prompt], [params], mode)[0].token_ids
        seen[mode + " with mates"] = generate_in_mode(tiny_engine, crowd[:3] + [prompt] + crowd[3:],
                                                      mates[:3] + [params] + mates[3:], mode)[3].token_ids
    assert len(set(map(tuple, seen.values()))) == 1, seen
    plain = SamplingParams(max_new_tokens=16, temperature=0.5, top_p=0.95, seed=77, ignore_eos=True)
    assert tiny_engine.generate([prompt], plain)[0].token_ids != seen["sync"]


@pytest.mark.parametrize("params, message", [
    (SamplingParams(presence_penalty=2.5), "presence_penalty must be a number in \\[-2, 2\\]"),
    (SamplingParams(frequency_penalty=-3), "frequency_penalty must be a number in \\[-2, 2\\]"),
    (SamplingParams(frequency_penalty=float("nan")), "frequency_penalty"),
    (SamplingParams(presence_penalty=True), "presence_penalty"),
    (SamplingParams(repetition_penalty=0.0), "repetition_penalty must be a finite number > 0"),
    (SamplingParams(repetition_penalty=float("inf")), "repetition_penalty"),
    (SamplingParams(repetition_penalty="1.2"), "repetition_penalty"),
    (SamplingParams(logprobs=21), "logprobs must be None or an integer in \\[0, 20\\]"),
    (SamplingParams(logprobs=-1), "logprobs"),
    (SamplingParams(logprobs=True), "logprobs"),
    (SamplingParams(logprobs=2.0), "logprobs"),
])
def test_bad_penalties_and_logprobs_are_config_errors(tiny_engine, params, message):
    with pytest.raises(ConfigError, match=message):
        tiny_engine.submit([1, 2, 3], params)
    SamplingParams(presence_penalty=-2, frequency_penalty=2.0, repetition_penalty=5, logprobs=20).validate()
    assert not SamplingParams().has_penalties and SamplingParams(repetition_penalty=0.9).has_penalties


def test_penalty_arithmetic_is_vllms_and_neutral_rows_keep_their_logits_bit_for_bit():
    torch.manual_seed(0)
    vocab, state = 50, PenaltyState(3, 50, torch.device("cpu"))
    scratch = state.scratch
    # row 0: prompt [1, 2, 2] then outputs [2, 5, 5]; row 1: prompt [7] and no output yet; scratch: the rest
    ids = torch.tensor([1, 2, 2, 2, 5, 5, 7, 9, 9])
    prompt_rows = torch.tensor([0, 0, 0, scratch, scratch, scratch, 1, scratch, scratch])
    output_rows = torch.tensor([scratch, scratch, scratch, 0, 0, 0, scratch, scratch, scratch])
    state.output_counts[1, 3] = 4                   # a previous holder's counts: row 1 starts in this step
    state.count_inputs(ids, torch.tensor([0, 1, scratch]), prompt_rows, output_rows)
    assert state.output_counts[1].sum() == 0 and state.output_counts[0].tolist()[:6] == [0, 0, 1, 0, 0, 2]
    logits = torch.randn(3, vocab) * 3
    rows = torch.tensor([0, 1, scratch])
    rep, freq, pres = torch.tensor([1.5, 0.8, 1.0]), torch.tensor([0.7, -0.4, 0.0]), torch.tensor([1.1, 2.0, 0.0])
    got = state.apply(logits, rows, rep, freq, pres)
    for r in range(2):
        want = logits[r].clone()
        counts = torch.bincount(torch.tensor([[2, 5, 5], []][r], dtype=torch.long), minlength=vocab).float()
        seen = torch.zeros(vocab, dtype=torch.bool)
        seen[[[1, 2], [7]][r]] = True
        seen |= counts > 0
        want = torch.where(seen & (want > 0), want / rep[r], torch.where(seen, want * rep[r], want))
        want = want - freq[r] * counts - pres[r] * (counts > 0).float()
        torch.testing.assert_close(got[r], want)
    assert torch.equal(got[2], logits[2])            # neutral penalties: not one bit changed
    assert state.nbytes == 4 * 50 * (4 + 1)


def test_steps_without_penalties_or_logprobs_run_what_they_ran_before(tiny_engine, monkeypatch):
    """The benchmark path (greedy, no logprobs, no penalties): the same pack fields, the same one-token-per-row
    copy back, and no penalty or logprobs work at all; a step with them does all of it."""
    import batchscope.engine.forward as forward_module      # the captured step: forward, penalties, sampling

    runner = tiny_engine.runner
    calls, batches = [], []
    for name in ("count_inputs", "apply"):
        original = getattr(runner.penalties, name)
        monkeypatch.setattr(runner.penalties, name,
                            lambda *a, _o=original, _n=name, **k: calls.append(_n) or _o(*a, **k))
    write = forward_module.write_logprobs
    monkeypatch.setattr(forward_module, "write_logprobs", lambda *a: calls.append("logprobs") or write(*a))
    launch = runner.launch
    monkeypatch.setattr(runner, "launch", lambda batch: batches.append(batch) or launch(batch))
    prompts = random_prompts(5, 49152, 3, 40, seed=6)
    for mode in ("sync", "async"):
        tiny_engine.set_mode(mode)
        tiny_engine.generate(prompts, SamplingParams(max_new_tokens=6, ignore_eos=True))
    assert calls == [] and batches and not any(b.extras for b in batches)
    before = ["input_ids", "positions", "slot_mapping", "carry_rows", "sample_idx", "seeds", "sample_pos"]
    for b in batches:
        assert list(b.layout.i64()) == before and list(b.layout.f32()) == ["temperature", "top_p"]
        assert b.slot.out_size(b.num_sampled, b.extras) == b.num_sampled
    tiny_engine.generate(prompts[:1], SamplingParams(max_new_tokens=3, ignore_eos=True, logprobs=0))
    assert {"count_inputs", "apply", "logprobs"} <= set(calls)
