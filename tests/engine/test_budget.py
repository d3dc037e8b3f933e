"""The per-step token budget (engine/budget.py): a fixed budget stays fixed, the adaptive one opens up when
nothing decodes and sizes its chunk from measured step times when something does, and no budget changes a
greedy token."""
from __future__ import annotations

import json
import math

import jsonschema
import pytest

from helpers import generate_in_mode, random_prompts, reference_generate
from batchscope.engine import Engine, EngineConfig, SamplingParams
from batchscope.engine.budget import (COLD_TOKENS, DECODE_FACTOR, MIN_CHUNK, REASONS, StepBudget, StepTimeModel,
                                      step_token_limits)
from batchscope.engine.config import ConfigError
from batchscope.telemetry import Telemetry, load_timeline
from batchscope.telemetry.schema import SCHEMA


def _taught(budget: StepBudget, base_ms: float = 5.0, per_token: float = 0.025) -> StepBudget:
    """A budget whose model has seen decode steps of 32 rows and prefill steps of 256 and 8192 tokens on the
    line base_ms + per_token x tokens (an 8B model on an H200, roughly)."""
    for _ in range(50):
        budget.observe(32, base_ms + per_token * 32, decode_only=True)
    for tokens in (256, 8192):
        budget.observe(tokens, base_ms + per_token * tokens, decode_only=False)
    return budget


def test_a_fixed_budget_is_the_same_for_every_step_and_says_so():
    budget = _taught(StepBudget(256, 256))
    for decoding, waiting in ((0, 0), (30, 50_000), (5, 10)):
        chosen = budget.choose(decoding, waiting, 10.0)
        assert (chosen.tokens, chosen.reason) == (256, "fixed")
    assert budget.snapshot["mode"] == "fixed" and budget.snapshot["fixed_tokens"] == 256


def test_with_nothing_decoding_the_adaptive_budget_opens_to_its_largest_step():
    budget = StepBudget(None, 8192)
    assert budget.choose(0, 4000, 0.0).as_dict() == {"tokens": 8192, "reason": "no_decode"}


def test_before_two_step_sizes_were_measured_decodes_get_the_cold_budget():
    budget = StepBudget(None, 8192)
    budget.observe(32, 5.0, decode_only=True)            # one bucket: no line yet
    chosen = budget.choose(32, 500, 100.0)
    assert (chosen.tokens, chosen.reason) == (COLD_TOKENS, "decode_target")


def test_with_decodes_the_chunk_fills_the_step_up_to_twice_the_decode_step():
    budget = _taught(StepBudget(None, 8192))
    decode_ms = 5.0 + 0.025 * 32
    chosen = budget.choose(32, 500, 300.0)                # little prefill waiting, long decodes ahead
    assert chosen.reason == "decode_target" and chosen.target_ms == pytest.approx(DECODE_FACTOR * decode_ms)
    # the line through the buckets is exact here, so the chunk is (target - decode) / ms per token
    assert chosen.tokens == pytest.approx(32 + (DECODE_FACTOR - 1) * decode_ms / 0.025, abs=1)


def test_an_itl_target_sizes_the_chunk_and_is_never_raised_for_a_backlog():
    budget = _taught(StepBudget(None, 8192, itl_target_ms=20.0))
    decode_ms = 5.0 + 0.025 * 32
    chosen = budget.choose(32, 100_000, 2.0)              # a huge backlog, decodes nearly done: still 20 ms
    assert chosen.target_ms == 20.0 and chosen.tokens == pytest.approx(32 + (20.0 - decode_ms) / 0.025, abs=1)


def test_prefill_outweighing_the_decodes_left_opens_the_step_to_the_largest():
    budget = _taught(StepBudget(None, 8192))
    # 30 prompts of 4000 waiting (about 3 s of prefill), 2 decoding requests with 60 tokens left (~0.35 s)
    assert budget.choose(2, 120_000, 60.0).tokens == 8192
    # the other way round (served: one prompt waiting, long outputs decoding) the decode target holds
    assert budget.choose(32, 600, 300.0).tokens < 400


def test_steps_that_carry_decodes_stay_within_the_mixed_graphs_and_always_move_prefill_on():
    budget = _taught(StepBudget(None, 8192))
    budget.limit_decode_steps([32, 64, 128, 256, 320, 384, 2048])
    assert budget.choose(32, 600, 300.0).tokens in (256, 320, 384)    # ends on a graph's bucket
    assert budget.choose(2, 120_000, 60.0).tokens == 8192    # prefill first: compute-bound, eager is fine
    budget.itl_target_ms = 1000.0                              # a target past the graphs: still within them
    assert budget.choose(32, 600, 300.0).tokens == 2048
    capped = _taught(StepBudget(None, 8192))
    capped.limit_decode_steps(300)                               # a cap alone: no bucket to end on
    assert capped.choose(32, 600, 300.0).tokens == pytest.approx(264, abs=1)
    capped.itl_target_ms = 1000.0
    assert capped.choose(32, 600, 300.0).tokens == 300
    slow = _taught(StepBudget(None, 8192), base_ms=5.0, per_token=50.0)    # every token costs a decode step
    assert slow.choose(32, 600, 300.0).tokens >= 32 + MIN_CHUNK


def test_a_decode_target_budget_ends_on_a_graph_bucket_so_no_step_pays_for_padding():
    budget = _taught(StepBudget(None, 8192))
    free = budget.choose(32, 500, 300.0).tokens                 # 32 + 232 = 264: would replay the 320 graph
    budget.limit_decode_steps([32, 64, 128, 192, 256, 320, 2048])
    assert free == pytest.approx(264, abs=1) and budget.choose(32, 500, 300.0).tokens == 256


def test_the_decode_time_is_that_of_steps_with_as_many_rows():
    model = StepTimeModel()
    for _ in range(20):
        model.observe(2, 4.5, decode_only=True)
        model.observe(32, 8.3, decode_only=True)
    assert model.decode_step_ms(2) == pytest.approx(4.5) and model.decode_step_ms(33) == pytest.approx(8.3)
    model.observe(2048, 60.0, decode_only=False)
    assert model.decode_step_ms(64) == pytest.approx(model.predict(64))     # no 64-row step seen: the line
    for _ in range(70):                                                      # long without 2-row decode steps
        model.observe(300, 12.0, decode_only=False)
    assert model.decode_step_ms(2) == pytest.approx(model.predict(2))


def test_the_model_weighs_each_token_bucket_once_not_each_step():
    model = StepTimeModel()
    for _ in range(1000):                                  # many decode steps, all in one bucket
        model.observe(32, 6.0, decode_only=True)
    model.observe(2048, 56.0, decode_only=False)          # one prefill step
    intercept, per_token = model.line()
    assert per_token == pytest.approx(50.0 / 2016, rel=1e-6) and intercept > 0
    assert model.decode_step_ms(32) == pytest.approx(6.0)
    assert StepTimeModel().line() is None                 # nothing seen: no guess


def test_config_keeps_a_given_budget_fixed_and_refuses_bad_values():
    assert EngineConfig().max_batch_tokens is None                      # adaptive by default
    cfg = EngineConfig(max_batch_tokens=256).validate()
    assert step_token_limits(cfg, "cuda") == (256, 256) and step_token_limits(EngineConfig(), "cuda") == (8192, 2048)
    assert step_token_limits(EngineConfig(budget_max_tokens=512), "cpu") == (512, 512)
    for bad in (dict(max_batch_tokens=0), dict(max_batch_tokens=True), dict(max_batch_tokens="256"),
                dict(itl_target_ms=0), dict(itl_target_ms=math.nan), dict(itl_target_ms="10"),
                dict(max_batch_tokens=256, itl_target_ms=10.0), dict(budget_max_tokens=0)):
        with pytest.raises(ConfigError):
            EngineConfig(**bad).validate()


@pytest.fixture(scope="module")
def engines():
    made = {name: Engine(EngineConfig(model="tiny-random", device="cpu", dtype="float32", mode="async",
                                      num_blocks=256, max_running=8, seed=0, **options))
            for name, options in (("adaptive", {}), ("fixed16", dict(max_batch_tokens=16)),
                                  ("fixed2048", dict(max_batch_tokens=2048)),
                                  ("itl", dict(itl_target_ms=3.0, budget_max_tokens=512)))}
    yield made
    for eng in made.values():
        eng.close()


@pytest.mark.parametrize("mode", ["sync", "async", "switch"])
def test_greedy_tokens_are_the_same_under_every_budget_and_equal_transformers(engines, tiny_reference, mode):
    prompts = random_prompts(10, 49152, 1, 300, seed=21)
    lengths = [5, 17, 9, 24, 12, 3, 30, 8, 20, 14]
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in lengths]
    tokens = {name: [o.token_ids for o in generate_in_mode(eng, prompts, params, mode)]
              for name, eng in engines.items()}
    expected = [reference_generate(tiny_reference, p, n, None) for p, n in zip(prompts, lengths)]
    for name, got in tokens.items():
        assert got == expected, name


def test_every_step_says_its_budget_and_stays_within_it(engines):
    traces = {}
    for name, eng in engines.items():
        seen = traces[name] = []
        eng.add_observer(lambda ev, seen=seen: seen.append(ev) if hasattr(ev, "budget") else None)
        eng.generate(random_prompts(8, 49152, 50, 400, seed=5), SamplingParams(max_new_tokens=12, ignore_eos=True))
    for name, seen in traces.items():
        assert seen and all(t.budget["reason"] in REASONS for t in seen), name
        assert all(t.prefill_tokens + t.decode_tokens <= t.budget["tokens"] for t in seen), name
    assert {t.budget["tokens"] for t in traces["fixed16"]} == {16}
    assert {t.budget["reason"] for t in traces["fixed2048"]} == {"fixed"}
    adaptive = traces["adaptive"]
    assert adaptive[0].budget == {"tokens": 2048, "reason": "no_decode"}      # CPU's largest step
    assert any(t.budget["reason"] == "decode_target" for t in adaptive)
    targets = [t.budget["target_ms"] for t in traces["itl"] if "target_ms" in t.budget]
    assert targets and set(targets) == {3.0}
    model = engines["adaptive"].info["budget"]["step_time_model"]
    assert model["steps_seen"] > 0 and model["buckets"], model


def test_the_budget_reaches_the_step_records_the_schema_and_the_engine_info():
    eng = Engine(EngineConfig(model="tiny-random", device="cpu", dtype="float32", num_blocks=128, seed=0))
    tel = Telemetry(eng, nvml_hz=0)
    try:
        eng.generate(random_prompts(4, 49152, 20, 200, seed=2), SamplingParams(max_new_tokens=6, ignore_eos=True))
        timeline = json.loads(json.dumps(tel.timeline()))
        jsonschema.validate(timeline, SCHEMA)
        load_timeline(json.dumps(timeline))
        reasons = {rec["budget"]["reason"] for rec in timeline["steps"]}
        assert reasons <= set(REASONS) and "no_decode" in reasons
        info = timeline["meta"]["info"]
        assert info["budget"]["mode"] == "adaptive" and info["max_batch_tokens"] == 2048
        bad = json.loads(json.dumps(timeline))
        bad["steps"][0]["budget"]["reason"] = "guessed"
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, SCHEMA)
    finally:
        tel.close()
        eng.close()


class _Recorder(StepBudget):
    """An adaptive budget that remembers what the scheduler asked it with."""

    def __init__(self, *args):
        super().__init__(*args)
        self.asked: list[tuple[int, int, float]] = []

    def choose(self, decoding, prefill_waiting, decode_left):
        self.asked.append((decoding, prefill_waiting, decode_left))
        return super().choose(decoding, prefill_waiting, decode_left)


def test_the_scheduler_weighs_decodes_waiting_prompts_and_what_decodes_have_left():
    from batchscope.engine.kv_cache import BlockAllocator
    from batchscope.engine.request import Request
    from batchscope.engine.scheduler import Scheduler

    budget = _Recorder(None, 64)
    sched = Scheduler(BlockAllocator(64), 16, budget, 2, 4096)      # room for two running requests
    params = SamplingParams(max_new_tokens=10, ignore_eos=True)
    for rid, n in (("a", 20), ("b", 30), ("c", 40)):
        sched.add(Request(rid, list(range(3, 3 + n)), params, seed=0))
    plan = sched.schedule(0, None)
    # nothing decodes yet; a and b fit max_running, c waits behind them and is not counted
    assert budget.asked[-1] == (0, 50, 0.0) and plan.budget.as_dict() == {"tokens": 64, "reason": "no_decode"}
    for seq in plan.sampled:                  # sync: both tokens known
        seq.req.pending -= 1
        seq.req.output_ids.append(7)
    sched.schedule(1, None)
    # both decode now, 9 tokens left each; no room to admit c, so no prefill counts
    assert budget.asked[-1] == (2, 0, 9.0)


def test_serve_and_bench_refuse_a_bad_itl_target_in_one_line(capsys):
    from batchscope.app import cli
    from batchscope.app.bench.flags import build_parser, complete, engine_budget, settle_workload

    assert cli.main(["serve", "--model", "tiny-random", "--itl-target-ms", "0"]) == 2
    assert "itl_target_ms must be a positive number" in capsys.readouterr().err
    assert cli.main(["serve", "--model", "tiny-random", "--max-batch-tokens", "256", "--itl-target-ms", "10"]) == 2
    assert "fixed max_batch_tokens takes neither" in capsys.readouterr().err
    parse = build_parser().parse_args
    assert engine_budget(parse(["--max-batch-tokens", "adaptive"]).max_batch_tokens, 512) is None
    assert engine_budget(parse(["--max-batch-tokens", "300"]).max_batch_tokens, 512) == 300
    assert engine_budget(parse([]).max_batch_tokens, 512) == 512
    with pytest.raises(ValueError, match="uniform workload's default is fixed"):
        settle_workload(complete(parse(["--itl-target-ms", "20"])))
    settle_workload(complete(parse(["--itl-target-ms", "20", "--max-batch-tokens", "adaptive"])))
    served = ["--workload", "served", "--rate", "2", "--itl-target-ms", "20"]
    settle_workload(complete(parse(served)))
    with pytest.raises(ValueError, match="takes no fixed"):
        settle_workload(complete(parse(served + ["--max-batch-tokens", "256"])))
    with pytest.raises(SystemExit):
        parse(["--max-batch-tokens", "lots"])
