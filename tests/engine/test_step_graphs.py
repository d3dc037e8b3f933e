"""The step graphs' CPU-checkable parts: which buckets a config gets (through the runner's sizes, as build.py makes
it), and what a capture records and in which order, with a stand-in for torch's graph capture. The captures
themselves run on the GPU (test_engine_gpu.py)."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from batchscope.engine import runner as runner_module
from batchscope.engine.batch import GraphShape
from batchscope.engine.budget import step_token_limits
from batchscope.engine.config import EngineConfig
from batchscope.engine.graphs import Replayed, StepGraphs

DECODE_256 = [1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256]
MIXED_2048 = [32, 64, 128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048]


@pytest.mark.parametrize("max_running, max_batch_tokens, mixed, decode_buckets, mixed_tokens", [
    (256, None, True, DECODE_256, MIXED_2048),                      # adaptive: buffers 8192, graphs to 2048
    (256, 2048, True, DECODE_256, MIXED_2048),
    (8, 64, True, [1, 2, 4, 8], [32, 64]),
    (256, 48, True, [1, 2, 4, 8, 16, 32, 48], [32, 48]),            # a decode bucket holds no more rows than tokens
    (64, 300, True, [1, 2, 4, 8, 16, 32, 48, 64], [32, 64, 128, 192, 256, 300]),
    (64, 4096, True, [1, 2, 4, 8, 16, 32, 48, 64], []),             # past MAX_MIXED_TOKENS: mixed steps eager
    (256, 512, False, DECODE_256, []),
])
def test_a_config_gets_the_buckets_it_got_before_the_runner_passed_graph_sizes(
        monkeypatch, max_running, max_batch_tokens, mixed, decode_buckets, mixed_tokens):
    """From EngineConfig through step_token_limits and ModelRunner's GraphSizes to StepGraphs, the buckets are
    those of graph_buckets(min(max_running, max_batch_tokens)) and mixed_buckets(graph tokens), written out."""
    config = EngineConfig(model="tiny-random", device="cpu", max_batch_tokens=max_batch_tokens,
                          max_running=max_running, mixed_graphs=mixed)
    step_tokens, graph_tokens = step_token_limits(config, "cuda")
    step = SimpleNamespace(model=torch.nn.Linear(1, 1), device=torch.device("cpu"), penalties=None)
    monkeypatch.setattr(runner_module, "StepForward", lambda *args: step)
    kv = SimpleNamespace(block_size=config.block_size, scratch_block=3)
    runner = runner_module.ModelRunner(None, kv, torch.device("cpu"), step_tokens, config.max_running, 4,
                                       "triton", config.cuda_graphs, mixed_graphs=config.mixed_graphs,
                                       graph_tokens=graph_tokens)
    sizes = runner.graphs.sizes
    assert (sizes.max_running, sizes.block_size, sizes.max_blocks, sizes.scratch_block) == (max_running, 16, 4, 3)
    assert runner.slots[0].max_running == max_running
    graphs = StepGraphs(step, runner.slots, None, sizes, enabled=True)     # as on a GPU, with graphs on
    assert graphs.buckets == decode_buckets
    assert graphs.mixed_buckets == mixed_tokens
    assert graphs.mixed_rows == max_running
    assert not runner.graphs.mixed_buckets                          # on CPU nothing is captured


class _Mark:
    """Stands in for a CUDA event (or a graph) on CPU: what it does goes into `order`."""

    def __init__(self, order, name):
        self.order, self.name = order, name

    def record(self, stream=None):
        self.order.append(self.name)

    def replay(self):
        self.order.append("replay")

    def synchronize(self):
        self.order.append("synchronize")


@pytest.mark.parametrize("events_ok", [True, False])
def test_a_capture_records_the_start_kernel_first_and_reads_the_other_slots_output(tiny_engine, monkeypatch,
                                                                                   events_ok):
    """Warm-up outside the graph without the start kernel; inside it the graph's start event, the start kernel,
    its started event, the step (embedding first), the end event last; both read the other slot's output as the
    carry source. A replay records the caller's start event just before the graph and returns the graph's own
    events (None for a graph that records none)."""
    runner = tiny_engine.runner
    step = runner.forward
    order: list[str] = []
    marker = torch.zeros_like(step.started)

    class StartedSpy:
        def fill_(self, value):
            order.append("start kernel")
            return marker.fill_(value)

    monkeypatch.setattr(step, "started", StartedSpy())

    @contextlib.contextmanager
    def fake_capture(graph, pool=None, stream=None):
        assert stream is graphs.compute_stream
        order.append("capture begin")
        yield
        order.append("capture end")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: _Mark(order, "graph"))
    monkeypatch.setattr(torch.cuda, "graph", fake_capture)
    monkeypatch.setattr("batchscope.engine.graphs.host_sync_forbidden", contextlib.nullcontext)
    graphs = StepGraphs(step, runner.slots, _Mark(order, "compute stream"), runner.graphs.sizes, enabled=True)
    graphs.events = [SimpleNamespace(start=_Mark(order, f"graph start {i}"), started=_Mark(order, f"graph started {i}"),
                                     end=_Mark(order, f"graph end {i}")) for i in range(2)]
    graphs.events_ok = events_ok
    calls = []

    def forward(batch, prev_out, marks=None):
        calls.append((batch.slot.index, prev_out, marks))
        return step(batch, prev_out, marks)

    graphs.forward = forward
    hooks = [step.base.register_forward_pre_hook(lambda module, args: order.append("decoder")),
             step.embed.register_forward_pre_hook(lambda module, args: order.append("embedding"))]
    try:
        for index in (0, 1):
            order.clear()
            key = (index, GraphShape("decode", 2, 2), "greedy")
            graphs._capture_or_skip(key, "greedy")
            assert key in graphs.graphs and (key in graphs.timed) == events_ok
            begin, end = order.index("capture begin"), order.index("capture end")
            warm, inside = order[:begin], order[begin + 1:end]
            assert warm == ["embedding", "decoder", "synchronize"]         # no start kernel, no event
            ev = graphs.events[index]
            if events_ok:
                assert inside == [ev.start.name, "start kernel", ev.started.name, "embedding", "decoder",
                                  ev.end.name]
            else:
                assert inside == ["embedding", "decoder"]
            other = runner.slots[1 - index].out_tokens
            assert all(c[1] is other and c[0] == index for c in calls[-2:]) and len(calls) == 2 * (index + 1)
            assert calls[-2][2] is None and calls[-1][2] == ((ev.start, ev.started) if events_ok else None)

            order.clear()
            batch = SimpleNamespace(slot=runner.slots[index], graph=key[1], any_random=False, any_filter=False,
                                    extras=False)
            ran = graphs.replay(batch, _Mark(order, "caller start"))
            assert order == ["caller start", "replay"]
            assert ran == Replayed(key, ev if events_ok else None)
    finally:
        for hook in hooks:
            hook.remove()
