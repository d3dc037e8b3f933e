"""The per-step token budget (engine/budget.py): a fixed budget stays fixed, the adaptive one opens up when
nothing decodes and sizes its chunk from measured step times when something does, and no budget changes a
greedy token."""
from __future__ import annotations

import json
import math
import random

import jsonschema
import pytest
from batchscope.engine import Engine, EngineConfig, SamplingParams
from batchscope.engine.budget import (
    BACKLOG_EXIT_STEPS,
    COLD_TOKENS,
    DECODE_FACTOR,
    MIN_CHUNK,
    REASONS,
    StepBudget,
    step_token_limits,
)
from batchscope.engine.step_time import TERMS, StepShape, StepTimeModel
from batchscope.engine.config import ConfigError
from batchscope.engine.scheduler import ScheduledSeq
from batchscope.telemetry import Telemetry, load_timeline
from batchscope.telemetry.schema import SCHEMA
from helpers import generate_in_mode, random_prompts, reference_generate

GRAPHS = [32, 64, 128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048]   # graphs.py's
# an 8B model on an H200, roughly (the fit of the 2026-12-04 runs): ms, per decode row, per prefill token, per
# thousand prefill query-key pairs, per thousand decode KV tokens
H200 = (4.4, 0.014, 0.019, 0.003, 0.042)


def _ms(shape: StepShape, coef=H200) -> float:
    return sum(c * f for c, f in zip(coef, shape.features()))


def _random_steps(n: int, seed: int, coef=H200, noise: float = 0.03) -> list[tuple[StepShape, float]]:
    """Steps like a served run's: decode-only steps of 1-64 rows over 100-4000 tokens of context, and mixed steps
    that add a 16-2048-token chunk of a prompt 0-4000 tokens in; each step's time off the truth by up to `noise`."""
    rng = random.Random(seed)
    steps = []
    for _ in range(n):
        rows = rng.randint(1, 64)
        kv = sum(rng.randint(100, 4000) for _ in range(rows))
        if rng.random() < 0.4:
            chunk, cached = rng.choice([16, 64, 128, 256, 320, 512, 1024, 2048]), rng.randint(0, 4000)
            shape = StepShape.with_chunk(rows, kv, [(cached, chunk)], chunk)
        else:
            shape = StepShape(rows, kv)
        steps.append((shape, _ms(shape, coef) * (1 + rng.uniform(-noise, noise))))
    return steps


def _taught(budget: StepBudget, coef=H200, n: int = 400) -> StepBudget:
    for shape, ms in _random_steps(n, 1, coef):
        budget.observe(shape.decode_rows + shape.prefill_tokens, ms, not shape.prefill_tokens, shape)
    return budget


def test_the_model_learns_what_a_chunk_costs_at_its_context_and_predicts_unseen_steps():
    model = StepTimeModel()
    for shape, ms in _random_steps(400, 1):
        model.observe(shape, ms)
    errors = [abs(model.predict(shape) - ms) / ms for shape, ms in _random_steps(300, 2, noise=0.0)]
    assert max(errors) < 0.04 and sorted(errors)[150] < 0.015          # held out: within 4%, median 1.5%
    coef = model.coefficients()
    for got, true, name in zip(coef, H200, TERMS):
        assert got == pytest.approx(true, rel=0.15), name
    # the failure it fixes: a 227-token chunk at the end of a 4000-token prompt beside 29 decodes costs more
    # than one at its start, by the chunk's attention over the cached prompt
    tail = StepShape.with_chunk(29, 116_000, [(3700, 300)], 227)
    head = StepShape.with_chunk(29, 116_000, [(0, 4000)], 227)
    assert model.predict(tail) - model.predict(head) == pytest.approx(_ms(tail) - _ms(head), rel=0.15)
    assert model.describe()["ready"] and model.describe()["error_pct"] < 3


def test_the_fit_keeps_every_term_non_negative_and_shrugs_off_a_stall():
    model = StepTimeModel()
    for shape, ms in _random_steps(300, 3, coef=(4.4, 0.0, 0.019, 0.0, 0.042)):    # rows and attention free
        model.observe(shape, ms)
    assert all(c >= 0 for c in model.coefficients())
    probe = StepShape.with_chunk(32, 64_000, [(1000, 512)], 512)
    before = model.predict(probe)
    model.observe(probe, 10 * before)                         # one step 10x slow (a GC pause, a busy host)
    for _ in range(8):                                        # ... and the steps until the fit is solved again
        model.observe(StepShape(16, 16_000), _ms(StepShape(16, 16_000), (4.4, 0.0, 0.019, 0.0, 0.042)))
    assert model.predict(probe) == pytest.approx(before, rel=0.02)


def test_a_step_shape_is_read_from_the_planned_rows():
    class Req:
        prompt_ids = tuple(range(100))

    seqs = [ScheduledSeq(Req(), 120, 1, True), ScheduledSeq(Req(), 130, 1, True),       # decodes at 120, 130
            ScheduledSeq(Req(), 40, 60, True), ScheduledSeq(Req(), 0, 30, False)]       # prompt chunks
    assert StepShape.of(seqs) == StepShape(2, 121 + 131, 90, 60 * (40 + 30) + 30 * 15)
    assert StepShape.with_chunk(2, 252, [(40, 60), (0, 100)], 90) == StepShape.of(seqs)


def test_a_fixed_budget_is_the_same_for_every_step_and_says_so():
    budget = _taught(StepBudget(256, 256))
    for decoding, waiting in ((0, 0), (30, 50_000), (5, 10)):
        chosen = budget.choose(decoding, waiting, 10.0)
        assert (chosen.tokens, chosen.reason) == (256, "fixed")
    assert budget.snapshot["mode"] == "fixed" and budget.snapshot["fixed_tokens"] == 256


def test_with_nothing_decoding_the_adaptive_budget_opens_to_its_largest_step():
    budget = StepBudget(None, 8192)
    assert budget.choose(0, 4000, 0.0).as_dict() == {"tokens": 8192, "reason": "no_decode"}


def test_before_the_model_has_seen_prefill_decodes_get_the_cold_budget():
    budget = StepBudget(None, 8192)
    budget.observe(32, 5.0, decode_only=True)
    budget.observe(300, 12.0, decode_only=False)          # one prefill step: not enough to size chunks
    chosen = budget.choose(32, 500, 100.0)
    assert (chosen.tokens, chosen.reason) == (COLD_TOKENS, "decode_target")


def test_with_decodes_the_chunk_is_the_largest_whose_step_stays_within_twice_the_decode_step():
    budget = _taught(StepBudget(None, 8192))
    rows, kv, prompt = 32, 32 * 2000, [(0, 600)]         # a target well past the knee
    decode_ms = _ms(StepShape(rows, kv))
    chosen = budget.choose(rows, 600, 300.0, kv, prompt)
    assert chosen.reason == "decode_target" and chosen.target_ms == pytest.approx(DECODE_FACTOR * decode_ms, rel=0.02)
    step = _ms(StepShape.with_chunk(rows, kv, prompt, chosen.tokens - rows))
    past = _ms(StepShape.with_chunk(rows, kv, prompt, chosen.tokens - rows + 8))
    assert step <= chosen.target_ms * 1.02 and past > chosen.target_ms * 0.98


def test_the_chunk_shrinks_where_attention_to_the_cached_prompt_dominates_and_grows_where_it_is_small():
    slow_attention = (4.4, 0.014, 0.019, 0.03, 0.042)       # 10x the attention per pair: a slow prefill kernel
    for coef, shrinks in ((slow_attention, True), ((4.4, 0.014, 0.019, 0.0001, 0.042), False)):
        budget = _taught(StepBudget(None, 8192, itl_target_ms=25.0), coef)
        early = budget.choose(29, 4000, 50.0, 116_000, [(0, 4000)]).tokens
        late = budget.choose(29, 800, 50.0, 116_000, [(3200, 800)]).tokens
        if shrinks:
            assert late < 0.7 * early, (early, late)
        else:
            assert late == pytest.approx(early, rel=0.05), (early, late)
    # a token-count-only view of the same steps (no shapes) cannot tell the two apart
    blind = StepBudget(None, 8192, itl_target_ms=25.0)
    for shape, ms in _random_steps(400, 1, slow_attention):
        blind.observe(shape.decode_rows + shape.prefill_tokens, ms, not shape.prefill_tokens)
    assert blind.choose(29, 4000, 50.0).tokens == blind.choose(29, 800, 50.0).tokens


def test_an_itl_target_sizes_the_chunk_and_is_never_raised_for_a_backlog():
    budget = _taught(StepBudget(None, 8192, itl_target_ms=20.0))
    chosen = budget.choose(32, 100_000, 2.0, 32 * 1000, [(0, 4000)] * 25)      # a huge backlog: still 20 ms
    assert chosen.target_ms == 20.0 and not budget.backlog
    assert _ms(StepShape.with_chunk(32, 32_000, [(0, 4000)], chosen.tokens - 32)) <= 20.0 * 1.02
    tight = _taught(StepBudget(None, 8192, itl_target_ms=7.0))                  # below the knee: the user's word
    chunk = tight.choose(32, 600, 300.0, 32 * 1000, [(0, 600)]).tokens - 32
    assert MIN_CHUNK <= chunk < tight.model.knee_tokens() / 2
    assert _ms(StepShape.with_chunk(32, 32_000, [(0, 600)], chunk)) <= 7.0 * 1.02


def test_a_prefill_backlog_takes_the_cheapest_steps_per_prompt_token_until_little_is_left():
    budget = _taught(StepBudget(None, 8192))
    budget.limit_decode_steps(GRAPHS)
    # the H200 prefill-heavy run after its first steps: 28 decoding over 4000-token prompts, ~14k prompt tokens
    # waiting; target-sized chunks would need ~40 steps of ~19 ms (0.06 ms a prompt token), one 8192-token step
    # takes ~210 ms (0.026)
    waiting = [(2506, 1494), (0, 4000), (0, 4000), (0, 4000)]
    chosen = budget.choose(28, 13_494, 50.0, 112_000, waiting)
    assert budget.backlog and chosen.tokens == 8192 and chosen.reason == "decode_target"
    assert chosen.target_ms == pytest.approx(_ms(StepShape.with_chunk(28, 112_000, waiting, 8192 - 28)), rel=0.05)
    # it stays on while more than BACKLOG_EXIT_STEPS target-sized steps are waiting, then the target holds
    assert budget.choose(30, 2500, 50.0, 120_000, [(1500, 2500)]).tokens > 2048 and budget.backlog
    small = budget.choose(30, 300, 50.0, 120_000, [(3700, 300)])
    assert not budget.backlog and small.target_ms == pytest.approx(DECODE_FACTOR * _ms(StepShape(30, 120_000)), rel=0.03)
    # served: one prompt arriving among decodes is no backlog; the step holds the knee's graph (256 here)
    served = budget.choose(19, 600, 300.0, 19 * 700, [(0, 600)])
    assert not budget.backlog and served.tokens == 256
    # one long prompt (or a few) among decodes is served at the target too: no step of thousands of tokens
    for prompts in ([(0, 8192)], [(0, 6000), (0, 6000), (0, 6000)]):
        assert budget.choose(19, 18_000, 300.0, 19 * 700, prompts).tokens <= 512 and not budget.backlog
    assert budget.choose(19, 24_000, 300.0, 19 * 700, [(0, 6000)] * 4).tokens == 8192 and budget.backlog
    assert BACKLOG_EXIT_STEPS < 16


def test_a_cheap_step_base_needs_no_giant_steps_to_clear_a_backlog():
    # a model whose steps cost little besides their tokens: a mid-size chunk is as cheap per token as the largest
    budget = _taught(StepBudget(None, 8192), (0.2, 0.001, 0.019, 0.003, 0.002))
    budget.limit_decode_steps(GRAPHS)
    chosen = budget.choose(8, 40_000, 50.0, 8000, [(0, 4000)] * 10)
    assert budget.backlog and 8 + MIN_CHUNK < chosen.tokens <= 2048


def test_steps_that_carry_decodes_stay_within_the_mixed_graphs_and_always_move_prefill_on():
    budget = _taught(StepBudget(None, 8192))
    budget.limit_decode_steps([32, 64, 128, 256, 320, 384, 2048])
    assert budget.choose(16, 600, 300.0, 8000, [(0, 600)]).tokens in (256, 320, 384)    # ends on a graph bucket
    budget.itl_target_ms = 1000.0                              # a target past the graphs: still within them
    assert budget.choose(16, 6000, 300.0, 8000, [(0, 6000)]).tokens == 2048
    capped = _taught(StepBudget(None, 8192))
    capped.limit_decode_steps(300)                             # a cap alone: no bucket to end on
    capped.itl_target_ms = 1000.0
    assert capped.choose(16, 600, 300.0, 8000, [(0, 600)]).tokens == 300
    slow = _taught(StepBudget(None, 8192, itl_target_ms=5.0))   # even the decodes alone miss the target
    assert slow.choose(32, 600, 300.0, 32_000, [(0, 600)]).tokens == 32 + MIN_CHUNK


def test_the_knee_floor_rounds_up_only_while_the_step_stays_within_the_target():
    # the H200 served run at 12 req/s: a knee of ~270 tokens; rounding it up to the 320-token graph made steps of
    # 10.4-11.1 ms against a 9.3 ms target (ITL p99 2.06x its median), where 256 tokens stay within it
    coef = (5.2, 0.014, 0.019, 0.003, 0.042)
    budget = _taught(StepBudget(None, 8192), coef)
    budget.limit_decode_steps(GRAPHS)
    assert 255 < budget.model.knee_tokens() < 288        # nearer 256 than 320
    rows, kv = 16, 16 * 700
    chosen = budget.choose(rows, 600, 300.0, kv, [(0, 600)])
    predict = budget.model.predict
    target = DECODE_FACTOR * predict(StepShape(rows, kv))
    assert predict(StepShape.with_chunk(rows, kv, [(0, 600)], 320 - rows)) > target    # 320 would overshoot
    assert chosen.tokens == 256 and chosen.target_ms == pytest.approx(target)
    # with room in the target (many decodes over long contexts) the bucket past the knee is taken
    assert budget.choose(48, 600, 300.0, 48 * 3000, [(0, 600)]).tokens >= 320


def test_a_decode_target_budget_ends_on_a_graph_bucket_so_no_step_pays_for_padding():
    budget = _taught(StepBudget(None, 8192))
    free = budget.choose(16, 600, 300.0, 8000, [(0, 600)]).tokens
    budget.limit_decode_steps(GRAPHS)
    assert free not in GRAPHS and budget.choose(16, 600, 300.0, 8000, [(0, 600)]).tokens in GRAPHS


def test_without_shapes_the_budget_still_works_from_token_counts():
    budget = StepBudget(None, 8192)
    for _ in range(50):
        budget.observe(32, 5.0 + 0.025 * 32, decode_only=True)
    for tokens in (256, 8192, 1024):
        budget.observe(tokens, 5.0 + 0.025 * tokens, decode_only=False)
    chosen = budget.choose(32, 500, 300.0)
    assert chosen.reason == "decode_target" and 200 < chosen.tokens - 32 < 300      # (2 x 5.8 - 5.8) / 0.025 = 232


def test_the_snapshot_keeps_its_keys_and_shows_the_fit():
    budget = _taught(StepBudget(None, 8192))
    snap = budget.snapshot
    assert {"mode", "fixed_tokens", "max_tokens", "decode_max_tokens", "itl_target_ms", "decode_factor",
            "step_time_model", "last", "backlog"} <= set(snap)
    model = snap["step_time_model"]
    assert {"intercept_ms", "ms_per_token", "decode_ms", "decode_ms_by_rows", "steps_seen", "buckets",
            "coefficients", "ready", "error_pct", "knee_tokens"} <= set(model)
    assert set(model["coefficients"]) == set(TERMS) and model["ms_per_token"] == pytest.approx(0.019, rel=0.15)
    assert budget.max_batch_tokens == 8192 and json.dumps(snap)


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
        self.shapes: list[tuple] = []           # (decode_kv, prefill_rows) of each ask

    def choose(self, decoding, prefill_waiting, decode_left, *shape):
        self.asked.append((decoding, prefill_waiting, decode_left))
        self.shapes.append(shape)
        return super().choose(decoding, prefill_waiting, decode_left, *shape)


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
    assert budget.shapes[-1] == (0, [(0, 20), (0, 30)])        # (cached, to compute) per prompt, in fill order
    for seq in plan.sampled:                  # sync: both tokens known
        seq.req.pending -= 1
        seq.req.output_ids.append(7)
    sched.schedule(1, None)
    # both decode now, 9 tokens left each; no room to admit c, so no prefill counts
    assert budget.asked[-1] == (2, 0, 9.0)
    assert budget.shapes[-1] == (21 + 31, [])                  # the KV each decode row attends to, summed


def test_the_engine_teaches_the_budget_each_step_with_its_shape():
    """The step-time model learns from the planned rows (decode KV, prefill chunks at their context), not from
    token counts alone: every observed step comes with its shape, and the prefill steps carry their context."""
    seen: list[StepShape | None] = []
    eng = Engine(EngineConfig(model="tiny-random", device="cpu", dtype="float32", num_blocks=128,
                              max_batch_tokens=64, seed=0))
    observe = eng.scheduler.budget.observe
    eng.scheduler.budget.observe = lambda *a, **k: (seen.append(a[3] if len(a) > 3 else k.get("shape")),
                                                          observe(*a, **k))
    try:
        eng.generate(random_prompts(3, 49152, 100, 150, seed=4), SamplingParams(max_new_tokens=4, ignore_eos=True))
    finally:
        eng.close()
    assert seen and all(isinstance(s, StepShape) for s in seen)
    assert any(s.prefill_tokens and s.prefill_pairs > s.prefill_tokens ** 2 / 2 for s in seen)   # a later chunk
    assert any(s.decode_rows and s.decode_kv > 100 * s.decode_rows for s in seen)


def test_serve_and_bench_refuse_a_bad_itl_target_in_one_line(capsys):
    from batchscope.app import cli
    from batchscope.app.bench.flags import (
        build_parser,
        complete,
        engine_budget,
        settle_workload,
    )

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
