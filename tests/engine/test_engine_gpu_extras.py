"""Logprobs and penalties on a CUDA device, where decode steps replay the graphs captured at start-up: the extras
path is captured beside the three sampling paths (which stay as they were), its steps replay it, tokens and
logprobs equal the references (exact in float32, within bf16 noise in bfloat16) in sync, async and across switches,
through preemption, and the step loop holds no host synchronisation."""
from __future__ import annotations

import contextlib

import pytest
import torch

from helpers import generate_in_mode, random_prompts, reference_logprobs, reference_penalized_generate
from batchscope.engine import Engine, EngineConfig, SamplingParams
from test_engine_penalties import MIX

pytestmark = pytest.mark.gpu

ATOL = 1e-3      # float32 logprobs, our kernels against transformers' on the same device

_engines: dict = {}


def _engine(model: str, dtype: str, cuda_graphs: bool = True, **options) -> Engine:
    key = (model, dtype, cuda_graphs, tuple(sorted(options.items())))
    if key not in _engines:
        config = {**dict(num_blocks=256, max_batch_tokens=128, max_running=16, seed=0), **options}
        _engines[key] = Engine(EngineConfig(model=model, device="cuda", dtype=dtype, attention="triton",
                                            cuda_graphs=cuda_graphs, mode="async", **config))
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


def _tiny_reference(dtype: str):
    from batchscope.engine.model.loading import load_model
    return load_model(EngineConfig(model="tiny-random", device="cuda", dtype=dtype)).model


def _penalized(model, prompt, n, eos=None, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0,
               **_other):
    return reference_penalized_generate(model, prompt, n, presence_penalty, frequency_penalty, repetition_penalty,
                                        eos)


@contextlib.contextmanager
def only_the_wait_may_sync(runner):
    """Every implicit sync (.item(), .tolist() of a device tensor, pageable copies) raises inside; only the one
    deliberate wait on the D2H event is allowed."""
    original = runner.wait

    def allowed_wait(launched):
        torch.cuda.set_sync_debug_mode(0)
        try:
            return original(launched)
        finally:
            torch.cuda.set_sync_debug_mode("error")
    runner.wait = allowed_wait
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(0)
        runner.wait = original


def test_the_extras_graphs_are_captured_at_start_up_and_their_steps_replay_them():
    eng = _engine("tiny-random", "float32")
    graphs = eng.runner.graphs
    assert graphs.enabled and "extras" not in graphs.eager_paths, graphs.note
    slots = (0, 1)
    old = {(s, shape, p) for s in slots for shape in graphs.shapes() for p in ("greedy", "random", "filtered")}
    assert {k for k in graphs.keys() if k[2] != "extras"} == old          # the paths without extras: unchanged
    assert {k for k in graphs.keys() if k[2] == "extras"} == {(s, shape, "extras") for s in slots
                                                              for shape in graphs.shapes()}
    assert set(graphs.graphs) == set(graphs.keys())
    print(f"graphs: {len(graphs.keys())} (was {len(old)}); penalty counts: {eng.runner.penalties.nbytes} bytes")
    captured, replayed = graphs.captures, []
    replay = graphs.replay

    def spy(batch, start=None):
        done = replay(batch, start)
        replayed.append((batch.extras, done))
        return done
    graphs.replay = spy
    try:
        prompts = random_prompts(5, 49152, 3, 30, seed=4)
        eng.generate(prompts, SamplingParams(max_new_tokens=8, ignore_eos=True))
        assert replayed and all(not extras and done for extras, done in replayed)
        replayed.clear()
        eng.generate(prompts, [SamplingParams(max_new_tokens=8, ignore_eos=True, **MIX[i]) for i in range(5)])
        assert replayed and all(extras and done for extras, done in replayed)
    finally:
        graphs.replay = replay
    assert graphs.captures == captured


@pytest.mark.parametrize("mode", ["sync", "async", "switch"])
def test_penalties_and_logprobs_under_graphs_equal_the_references_in_float32(mode):
    eng = _engine("tiny-random", "float32")
    model = _tiny_reference("float32")
    prompts = random_prompts(len(MIX), 49152, 1, 40, seed=31)
    params = [SamplingParams(max_new_tokens=16, ignore_eos=True, **dict(kw, logprobs=kw.get("logprobs", 3)))
              for kw in MIX]
    outs = generate_in_mode(eng, prompts, params, mode)
    for p, kw, sp, out in zip(prompts, MIX, params, outs):
        assert out.token_ids == _penalized(model, p, 16, None, **kw), kw
        ref = reference_logprobs(model, p, out.token_ids).cpu()
        torch.testing.assert_close(torch.tensor(out.logprobs), ref[torch.arange(16), torch.tensor(out.token_ids)],
                                   atol=ATOL, rtol=0)
        for i, top in enumerate(out.top_logprobs):      # torch.topk's values; ids where no near-tie can swap them
            ids, values = torch.tensor([t for t, _ in top]), torch.tensor([v for _, v in top])
            torch.testing.assert_close(values, ref[i].topk(sp.logprobs).values, atol=ATOL, rtol=0)
            torch.testing.assert_close(ref[i][ids], values, atol=ATOL, rtol=0)


@pytest.mark.parametrize("mode", ["sync", "async", "switch"])
def test_penalties_survive_preemption_on_cuda(qwen3_checkpoint, mode):
    path, _cpu_model, _eos = qwen3_checkpoint
    eng = _engine(path, "float32", block_size=8, num_blocks=12, max_batch_tokens=16, max_running=6)
    model = _reference_model(path, "float32")
    traces = []

    def observe(event):
        if hasattr(event, "preempted"):
            traces.append(event)
    eng.add_observer(observe)
    try:
        prompts = random_prompts(6, 512, 20, 45, seed=3)
        kinds = MIX[1:7]
        outs = generate_in_mode(eng, prompts, [SamplingParams(max_new_tokens=20, ignore_eos=True, **kw)
                                               for kw in kinds], mode)
    finally:
        eng.remove_observer(observe)
    for p, kw, out in zip(prompts, kinds, outs):
        assert out.token_ids == _penalized(model, p, 20, None, **kw), kw
    assert any(t.preempted for t in traces), "no preemption happened"
    assert eng.scheduler.penalty_rows.num_free == 6


def test_seeded_sampling_with_penalties_and_logprobs_is_the_same_in_every_mode_on_cuda():
    eng = _engine("tiny-random", "bfloat16")
    prompt = [5, 6, 7, 8, 9]
    params = SamplingParams(max_new_tokens=24, temperature=0.5, top_p=0.95, seed=77, ignore_eos=True, logprobs=5,
                            presence_penalty=-2.0, frequency_penalty=-1.0, repetition_penalty=0.5)
    seen = {mode: generate_in_mode(eng, [prompt], [params], mode)[0] for mode in ("sync", "async", "switch")}
    assert len({tuple(o.token_ids) for o in seen.values()}) == 1
    for out in seen.values():       # the same kernels on the same tokens: equal up to reduction order at most
        torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(seen["sync"].logprobs), atol=1e-5,
                                   rtol=0)


def _first_divergence(ours: list[int], ref: list[int]) -> int | None:
    return next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), None)


def _penalized_logits(model, prompt, out, kw) -> torch.Tensor:
    """vLLM's penalized float32 logits of transformers' model after `prompt + out`."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out], device="cuda")).logits[0, -1].float()
    width = logits.shape[-1]
    in_prompt = torch.zeros(width, dtype=torch.bool, device="cuda")
    in_prompt[torch.tensor(prompt, device="cuda")] = True
    counts = torch.bincount(torch.tensor(out, dtype=torch.long, device="cuda"), minlength=width)
    penalty = torch.where(in_prompt | (counts > 0), kw.get("repetition_penalty", 1.0), 1.0)
    logits = logits * torch.where(logits > 0, 1.0 / penalty, penalty)
    logits = logits - kw.get("frequency_penalty", 0.0) * counts
    return logits - kw.get("presence_penalty", 0.0) * (counts > 0)


@pytest.mark.parametrize("mode", ["sync", "async", "switch"])
def test_bfloat16_penalties_and_logprobs_under_graphs_agree_with_the_reference(qwen3_checkpoint, mode):
    """bf16: two correct implementations may round a near-tie differently, so tokens may part where the reference
    itself rates both within bf16 noise; up to there the logprobs agree within bf16 noise too. The same holds for
    an eager engine (no graphs) given the same requests."""
    path, _cpu_model, eos = qwen3_checkpoint
    model = _reference_model(path, "bfloat16")
    prompts = random_prompts(len(MIX), 512, 1, 50, seed=17)
    params = [SamplingParams(max_new_tokens=24, **dict(kw, logprobs=kw.get("logprobs", 2))) for kw in MIX]
    outs = generate_in_mode(_engine(path, "bfloat16"), prompts, params, mode)
    eager = generate_in_mode(_engine(path, "bfloat16", cuda_graphs=False), prompts, params, mode)
    for p, kw, out, plain in zip(prompts, MIX, outs, eager):
        ref = _penalized(model, p, 24, eos, **kw)
        for ours in (out.token_ids, plain.token_ids):
            i = _first_divergence(ours, ref)
            if i is not None:
                logits = _penalized_logits(model, p, ref[:i], kw)
                gap = (logits[ref[i]] - logits[ours[i]]).abs().item()
                assert gap <= 0.02 * logits.abs().max().item() + 0.05, f"{kw}: diverged at {i} with gap {gap}"
        agree = _first_divergence(out.token_ids, ref)
        agree = min(len(out.token_ids), len(ref)) if agree is None else agree
        if agree:
            lp = reference_logprobs(model, p, out.token_ids[:agree])
            chosen = lp[torch.arange(agree, device="cuda"), torch.tensor(out.token_ids[:agree], device="cuda")]
            torch.testing.assert_close(torch.tensor(out.logprobs[:agree]), chosen.cpu(), atol=0.05, rtol=0.02)


def test_the_step_loop_holds_no_host_sync_with_penalties_and_logprobs(qwen3_checkpoint):
    path, _m, _eos = qwen3_checkpoint
    eng = _engine(path, "bfloat16")
    runner = eng.runner
    prompts = random_prompts(8, 512, 5, 40, seed=1)
    kinds = [dict(MIX[i], temperature=0.8 * (i % 2), seed=i, top_k=20 * (i % 3 == 0)) for i in range(8)]
    params = [SamplingParams(max_new_tokens=20, ignore_eos=True, **kw) for kw in kinds]
    eng.generate(prompts[:2], params[:2])                                       # graphs and kernels warm
    with only_the_wait_may_sync(runner):
        for mode in ("async", "sync"):
            eng.set_mode(mode)
            outs = eng.generate(prompts, params)
            assert all(o.finish_reason == "length" and o.error is None for o in outs), [o.error for o in outs]
            asked = [o for o, kw in zip(outs, kinds) if kw.get("logprobs") is not None]
            assert asked and all(len(o.logprobs) == 20 for o in asked)
