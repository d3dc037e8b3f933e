"""The padded layout of a mixed step (prefill chunks with or without decodes), which its CUDA graph replays: every
field at a fixed address whatever the plan, the real rows' fields exactly as unpadded, and a forward over the
padded layout giving the real rows what the unpadded one gives them. On the GPU the same steps replay graphs
(test_engine_gpu.py); here the padded layout runs eagerly."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from batchscope.engine import Engine, SamplingParams
from batchscope.engine.batch import GraphShape, IoSlot, PackLayout, fill_slot
from batchscope.engine.config import EngineConfig
from batchscope.engine.graphs import MAX_MIXED_TOKENS, GraphSizes, StepGraphs, mixed_buckets
from batchscope.engine.request import Request
from batchscope.engine.scheduler import ScheduledSeq, StepPlan
from helpers import generate_in_mode, random_prompts, reference_generate

BLOCK = 4
SCRATCH = 9


def _request(rid: str, prompt: list[int], blocks: list[int], output: list[int] = ()) -> Request:
    return Request(rid, list(prompt), SamplingParams(max_new_tokens=8), seed=5, output_ids=list(output),
                   blocks=list(blocks))


def _plan() -> StepPlan:
    """A decode carried from the step before, a decode fed from the host, a prefill chunk that samples and
    one that does not."""
    a = _request("a", [5, 6, 7], [0, 1], output=[8, 9])
    b = _request("b", [11, 12], [2], output=[13])
    c = _request("c", list(range(20, 26)), [3, 4])
    d = _request("d", list(range(30, 40)), [5, 6, 7])
    seqs = [ScheduledSeq(a, 4, 1, True, carry_row=0), ScheduledSeq(b, 2, 1, True),
            ScheduledSeq(c, 0, 6, True), ScheduledSeq(d, 4, 5, False)]
    return StepPlan(step=3, seqs=seqs, queue_depth=0, running=4)


def _fields(batch) -> dict:
    out = {}
    for layout, buf in ((batch.layout.i64(), batch.slot.np64), (batch.layout.i32(), batch.slot.np32),
                        (batch.layout.f32(), batch.slot.npf)):
        out.update({name: buf[a:b].tolist() for name, (a, b) in layout.items()})
    return out


@pytest.mark.parametrize("extras", [False, True])
def test_a_mixed_shape_pads_tokens_rows_and_sampled_rows_and_keeps_the_real_ones(extras):
    slot = IoSlot(0, max_batch_tokens=64, max_running=8, max_blocks=6, device=torch.device("cpu"))
    plan = _plan()
    plain = _fields(fill_slot(plan, slot, BLOCK, table_width=6, scratch_block=SCRATCH, extras=extras))
    shape = GraphShape("mixed", 32, 8)
    batch = fill_slot(plan, slot, BLOCK, shape=shape, table_width=6, scratch_block=SCRATCH, extras=extras)
    padded = _fields(batch)
    T, B, S = plan.num_tokens, len(plan.seqs), len(plan.sampled)
    assert (T, B, S) == (13, 4, 3)
    assert (batch.layout.T, batch.layout.B, batch.layout.S) == (32, 8, 8) and batch.graph == shape
    assert batch.num_sampled == S                      # the host reads back the real rows only
    per_token = ["input_ids", "positions", "slot_mapping", "carry_rows"] + (["prompt_rows", "output_rows"]
                                                                            if extras else [])
    for name in per_token:
        assert padded[name][:T] == plain[name][:T], name
    for name in ["seq_lens"] + (["reset_rows"] if extras else []):
        assert padded[name][:B] == plain[name][:B], name
    for name in ["sample_idx", "seeds", "sample_pos", "top_k", "temperature", "top_p"] + (
            ["penalty_rows", "repetition", "frequency", "presence"] if extras else []):
        assert padded[name][:S] == plain[name][:S], name
    assert padded["block_tables"][:B * 6] == plain["block_tables"][:B * 6]
    # padding tokens: a dummy at position 0 into the scratch block, in no row (past the last query start)
    assert padded["slot_mapping"][T:] == [SCRATCH * BLOCK] * (32 - T)
    assert padded["positions"][T:] == [0] * (32 - T) and padded["carry_rows"][T:] == [-1] * (32 - T)
    assert padded["query_start_loc"] == plain["query_start_loc"] + [T] * (8 - B)
    # padding rows: no tokens, no context, only the scratch block in their table
    assert padded["seq_lens"][B:] == [0] * (8 - B)
    assert padded["block_tables"][B * 6:] == [SCRATCH] * ((8 - B) * 6)
    # padding samples: greedy, from a token that exists
    assert padded["temperature"][S:] == [0.0] * (8 - S) and padded["sample_idx"][S:] == [0] * (8 - S)
    if extras:                      # and everything counted in the scratch row (slot.max_running), penalties neutral
        assert padded["prompt_rows"][T:] == padded["output_rows"][T:] == [8] * (32 - T)
        assert padded["reset_rows"][B:] == [8] * (8 - B) and padded["penalty_rows"][S:] == [8] * (8 - S)
        assert padded["repetition"][S:] == [1.0] * (8 - S) and padded["presence"][S:] == [0.0] * (8 - S)


def test_every_plan_of_a_shape_has_the_same_addresses():
    """A graph reads its fields where they were at capture: the layout depends on the shape alone."""
    slot = IoSlot(0, max_batch_tokens=64, max_running=8, max_blocks=6, device=torch.device("cpu"))
    shape = GraphShape("mixed", 32, 8)
    empty = StepPlan(step=-1, seqs=[], queue_depth=0, running=0)
    captured = fill_slot(empty, slot, BLOCK, shape=shape, table_width=6, scratch_block=SCRATCH, extras=False)
    served = fill_slot(_plan(), slot, BLOCK, shape=shape, table_width=6, scratch_block=SCRATCH, extras=False)
    assert captured.layout == served.layout == PackLayout(32, 8, 8, 6, False)
    assert captured.sizes == served.sizes


def test_mixed_buckets_cover_the_budget_and_stop_at_the_cap():
    assert mixed_buckets(512)[-1] == 512 and all(t < 512 for t in mixed_buckets(512)[:-1])
    assert mixed_buckets(300)[-1] == 300 and mixed_buckets(32) == [32]
    assert mixed_buckets(MAX_MIXED_TOKENS)[-1] == MAX_MIXED_TOKENS and mixed_buckets(MAX_MIXED_TOKENS + 1) == []
    # from 256 tokens on, where the device's time grows with them, a step pads to at most a quarter more
    buckets = mixed_buckets(2048)
    for lo, hi in zip(buckets, buckets[1:]):
        assert hi <= (1.25 if lo >= 256 else 2) * lo, (lo, hi)


def test_a_step_gets_a_decode_shape_a_mixed_shape_or_none():
    slot = IoSlot(0, max_batch_tokens=64, max_running=8, max_blocks=6, device=torch.device("cpu"))
    step = SimpleNamespace(model=torch.nn.Linear(1, 1), device=torch.device("cpu"))    # what StepGraphs reads
    sizes = GraphSizes(max_running=8, max_batch_tokens=64, mixed_tokens=64, block_size=BLOCK, max_blocks=6,
                       scratch_block=SCRATCH)
    graphs = StepGraphs(step, [slot, slot], None, sizes, enabled=True)
    assert graphs.shape_for(_plan()) == GraphShape("mixed", 32, 8)
    decode = StepPlan(step=0, seqs=[s for s in _plan().seqs[:2]], queue_depth=0, running=2)
    assert graphs.shape_for(decode) == GraphShape("decode", 2, 2)
    big = _request("e", list(range(100)), list(range(25)))
    too_many = StepPlan(step=0, seqs=[ScheduledSeq(big, 0, 65, False)], queue_depth=0, running=1)
    assert graphs.shape_for(too_many) is None                       # past the largest bucket: eager
    off = StepGraphs(step, [slot, slot], None, replace(sizes, mixed_tokens=0), enabled=True)
    assert off.shape_for(_plan()) is None and off.shape_for(decode) == GraphShape("decode", 2, 2)
    assert [k[1].kind for k in graphs.keys()].count("mixed") == 2 * 4 * len(mixed_buckets(64))
    assert graphs.shapes()[0].kind == "decode"          # decode first: its captures choose the expert dispatch


@pytest.fixture(scope="module")
def padded_engine():
    """tiny-random on CPU whose every step (decode ones too) runs the mixed padded layout, eagerly."""
    eng = Engine(EngineConfig(model="tiny-random", device="cpu", dtype="float32", mode="async", num_blocks=200,
                              max_batch_tokens=48, max_running=8, seed=0))
    graphs = eng.runner.graphs
    graphs.mixed_buckets = mixed_buckets(48)
    graphs.mixed_rows = eng.runner.slots[0].max_running
    graphs.enabled = True              # shapes only: on CPU nothing was captured, so every replay runs eagerly
    shapes = []
    original = graphs.shape_for

    def mixed_always(plan):
        tokens = next(t for t in graphs.mixed_buckets if t >= plan.num_tokens)
        shape = GraphShape("mixed", tokens, graphs.mixed_rows)
        shapes.append((plan.num_tokens, shape))
        return shape
    graphs.shape_for = mixed_always
    graphs.replay = lambda batch, start=None: None        # nothing to replay: the padded batch runs eagerly
    yield eng, shapes
    graphs.shape_for = original
    eng.close()


@pytest.mark.parametrize("mode", ["sync", "async", "switch"])
def test_the_padded_layout_gives_transformers_greedy_tokens(padded_engine, tiny_reference, mode):
    eng, shapes = padded_engine
    shapes.clear()
    prompts = random_prompts(6, 49152, 3, 60, seed=11)      # chunked over a 48-token budget, decodes mixed in
    outs = generate_in_mode(eng, prompts, SamplingParams(max_new_tokens=12, ignore_eos=True), mode)
    for prompt, out in zip(prompts, outs):
        assert out.finish_reason == "length", out.error
        assert out.token_ids == reference_generate(tiny_reference, prompt, 12, None)
    padded = [(real, shape) for real, shape in shapes if shape.tokens > real]
    assert len(padded) > 5 and any(real > len(prompts) for real, _ in padded)   # prefill steps were padded too


def test_the_runner_times_a_step_from_what_its_graph_replay_returns():
    """StepGraphs writes nothing of the runner's: replay returns the events its graph recorded inside itself, the
    runner keeps them on the slot's events and reads the compute span from them; an eager step keeps its own."""
    from batchscope.engine.graphs import Replayed
    from batchscope.engine.runner import ModelRunner, SlotEvents

    class Event:
        def __init__(self, name):
            self.name = name

        def record(self):
            recorded.append(self.name)

    recorded, eager = [], []
    inside = SimpleNamespace(start=Event("graph start"), started=Event("graph started"), end=Event("graph end"))
    runner = SimpleNamespace(graphs=SimpleNamespace(), _forward=lambda batch, prev, ev=None: eager.append(batch))
    ev = SimpleNamespace(compute_start=Event("start"), compute_started=Event("started"), compute_end=Event("end"),
                         h2d_start=None, h2d_end=None, d2h_start=None, d2h_end=None, graph=None, last_marked=False)
    batch = SimpleNamespace(graph=GraphShape("decode", 2, 2))

    def replay(b, start=None):
        start.record()
        return Replayed((0, b.graph, "greedy"), inside)
    runner.graphs.replay = replay
    ModelRunner._compute(runner, batch, None, ev)
    assert recorded == ["start"] and not eager and ev.graph is inside
    assert SlotEvents.spans(ev)["compute"] == (inside.start, inside.end)
    assert SlotEvents.head(ev) == (inside.start, inside.started)

    ev.graph = None
    runner.graphs.replay = lambda b, start=None: None            # a sampling path that runs eagerly
    ModelRunner._compute(runner, batch, None, ev)
    assert eager == [batch] and ev.graph is None
    assert SlotEvents.spans(ev)["compute"] == (ev.compute_start, ev.compute_end)
