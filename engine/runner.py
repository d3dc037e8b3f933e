"""Tensors in, tokens out: the model forward and sampling on three CUDA streams ordered by events.

    H2D stream:      wait(slot's last compute done) -> copy packs host->device -> record h2d_end
    compute stream:  wait(h2d_end) -> gather carried tokens -> forward -> sample -> record compute_end
    D2H stream:      wait(compute_end) -> copy sampled tokens device->host -> record d2h_end
Serving, the host blocks once per step: in `wait()`, on d2h_end. Every place it can block on the device is
listed in loop.py's docstring (this module and graphs.py hold all of them); keep that list true when adding one. On
CPU there are no streams or events: `launch()` runs the step to completion and `wait()` returns at once, which keeps
both loops valid there.

Steps replay CUDA graphs (one per IO slot, padded shape and sampling path: decode steps by batch size, steps with
prefill by token count) with the carry-over gather and the sampling inside the graph (penalties and logprobs too,
on the extras path), so a step costs the host one launch instead of hundreds. All of them are captured at start-up:
a capture synchronises the device, and one met mid-serving (the first sampled request in a bucket) would stall
every request in flight. A model whose greedy decode step cannot be captured (it synchronises with the host, or the
capture fails) runs every step eagerly instead; a sampling path (random, filtered, extras) that cannot be captured
runs eagerly alone, and mixed steps that cannot be captured run eagerly while decode keeps its graphs.
`graphs.note` and `graphs.mixed_note` say why: never a crash at start-up. The graphs are a part of their own
(graphs.py, `StepGraphs`): the runner asks it for a step's shape and lets it replay. The step itself, eager or
captured, is forward.py's `StepForward`.

Under tensor parallelism the runner relays each step to the other ranks just before launching it (`ranks`, a
parallel.ranks.RankGroup; for one rank every call on it is a no-op).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch

from .batch import Batch, IoSlot, carry_source, fill_slot
from .forward import StepForward
from .graphs import GraphEvents, GraphSizes, StepGraphs
from .kv_cache import KVCache
from .parallel.ranks import RankGroup
from .scheduler import StepPlan

EVENT_NAMES = ("h2d_start", "h2d_end", "compute_start", "compute_started", "compute_end", "d2h_start", "d2h_end")
EPOCH_NS = 1_000_000_000        # a fresh clock epoch (below) this often


class SlotEvents:
    """Pre-allocated timing events of one IO slot, re-recorded every other step."""

    def __init__(self):
        for name in EVENT_NAMES:
            setattr(self, name, torch.cuda.Event(enable_timing=True))
        self.anchor = torch.cuda.Event(enable_timing=True)
        self.used = False          # whether this slot has been launched at least once
        # the timing events the last step's graph recorded inside itself (graphs.GraphEvents), None when it ran
        # eagerly or its graph records none
        self.graph: GraphEvents | None = None
        self.last_marked = False    # whether the last eager step on this slot ran the start kernel (mark_start)

    def spans(self) -> dict:
        compute = ((self.graph.start, self.graph.end) if self.graph is not None
                   else (self.compute_start, self.compute_end))
        return {"h2d": (self.h2d_start, self.h2d_end), "compute": compute, "d2h": (self.d2h_start, self.d2h_end)}

    def head(self) -> tuple | None:
        """The events just before and just after the last step's start kernel (mark_start); None when it ran none
        (a graph without timing events)."""
        if self.graph is not None:
            return self.graph.start, self.graph.started
        return (self.compute_start, self.compute_started) if self.last_marked else None


@dataclass
class Launched:
    """A step on its way through the device."""
    batch: Batch
    events: SlotEvents | None
    anchor: tuple[object, int] | None
    epoch: tuple[object, int] | None = None


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv: KVCache, device: torch.device, max_batch_tokens: int,
                 max_running: int, max_blocks: int, attention: str, cuda_graphs: bool = False,
                 ranks: RankGroup | None = None, mixed_graphs: bool = False, graph_tokens: int | None = None):
        """`max_batch_tokens`: the most tokens a step may carry (the IO slots are sized for it); `graph_tokens`:
        the largest mixed step captured as a graph (default max_batch_tokens; graphs.mixed_buckets caps it)."""
        self.model, self.kv, self.device, self.attention = model, kv, device, attention
        self.ranks = ranks or RankGroup()
        self.max_blocks = max_blocks
        self.forward = StepForward(model, kv, device, attention, max_running)
        self.penalties = self.forward.penalties
        self.block_size = kv.block_size
        self.slots = [IoSlot(i, max_batch_tokens, max_running, max_blocks, device) for i in range(2)]
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.h2d_stream = torch.cuda.Stream(device)
            self.compute_stream = torch.cuda.Stream(device)
            self.d2h_stream = torch.cuda.Stream(device)
            self.clock_stream = torch.cuda.Stream(device)   # only ever records clock anchors
            self.events = [SlotEvents(), SlotEvents()]
            self.epoch: tuple[object, int] | None = None
        else:
            self.h2d_stream = self.compute_stream = self.d2h_stream = self.clock_stream = None
            self.events = []
        # graphs need a capturable attention kernel: the torch reference loops over host-side lengths
        note = None
        if cuda_graphs and self.cuda and attention != "triton":
            note = "the torch attention path loops over host-side lengths and cannot be captured"
        self.start_kernel_ns = 0.0      # how long the start kernel runs between its events (measure_start_kernel)
        sizes = GraphSizes(max_running, max_batch_tokens, (graph_tokens or max_batch_tokens) if mixed_graphs else 0,
                           self.block_size, max_blocks, kv.scratch_block)
        self.graphs = StepGraphs(self.forward, self.slots, self.compute_stream, sizes,
                                 cuda_graphs and self.cuda and attention == "triton", note)
        self.allreduce_us: dict[int, float] = {}   # tensor parallel: one all-reduce of [rows, hidden], measured

    # -- prepare ------------------------------------------------------------------------------------------------
    def prepare(self, plan: StepPlan) -> Batch:
        """Fill the step's IO slot; a step with a graph gets the fixed layout of its shape."""
        slot = self.slot_for(plan.step)
        self.wait_slot_free(slot)
        shape = self.graphs.shape_for(plan)
        if shape is None:
            return fill_slot(plan, slot, self.block_size)
        return fill_slot(plan, slot, self.block_size, shape=shape, table_width=self.max_blocks,
                         scratch_block=self.kv.scratch_block)

    def slot_for(self, step: int) -> IoSlot:
        return self.slots[step % 2]

    def wait_slot_free(self, slot: IoSlot) -> None:
        """Write-after-read guard: the host may rewrite a slot's pinned buffers only once its H2D copy is done.
        A host wait (loop.py's list), but one that returns at once in both loops: the slot's previous step (two
        back) was consumed before this one is built, and its D2H copy ran after its H2D copy."""
        if self.cuda and self.events[slot.index].used:
            self.events[slot.index].h2d_end.synchronize()

    def carry_source(self, slot: IoSlot) -> torch.Tensor:
        """The other slot's output, which a step on `slot` gathers its carried tokens from (batch.carry_source)."""
        return carry_source(self.slots, slot)

    # -- launch -------------------------------------------------------------------------------------------------
    def launch(self, batch: Batch) -> Launched:
        slot = batch.slot
        self.ranks.send_step(batch)     # the other ranks launch the same step (its collectives need them)
        n_out = slot.out_size(batch.num_sampled, batch.extras)    # tokens, and an extras step's records
        if not self.cuda:
            self._compute(batch, self.carry_source(slot))
            slot.host_out[:n_out].copy_(slot.out[:n_out])
            return Launched(batch, None, None)

        ev = self.events[slot.index]
        n64, n32, nf = batch.sizes
        # Clock anchor: an event on a stream that never holds work completes as soon as the device sees it, even
        # while other streams are busy, so (event, host time) pins the GPU clock to the host clock every step.
        # The driver submits the record somewhere inside the call; the host time is when the call began, which
        # the device cannot have seen it before (a call can take tens of µs: under a profiler, every one does).
        anchor = (ev.anchor, time.perf_counter_ns())
        ev.anchor.record(self.clock_stream)
        # The device takes a varying while (tens of µs when it is busy) to see an anchor, so steps mapped each by
        # its own anchor jitter against each other. An epoch is an anchor kept for a second (its event is never
        # re-recorded): every step of that second is mapped through it, so the gaps between them are device time.
        if self.epoch is None or anchor[1] - self.epoch[1] >= EPOCH_NS:
            mark = torch.cuda.Event(enable_timing=True)
            self.epoch = (mark, time.perf_counter_ns())
            mark.record(self.clock_stream)
        # A start event on an idle stream completes at once, so everything between it and the first copy or
        # kernel must be device-free and short: the views are cut before it, the copies follow it directly.
        copies = [(slot.dev64[:n64], slot.host64[:n64]), (slot.dev32[:n32], slot.host32[:n32]),
                  (slot.devf[:nf], slot.hostf[:nf])]
        with torch.cuda.stream(self.h2d_stream):
            if ev.used:
                self.h2d_stream.wait_event(ev.compute_end)   # the previous step on this slot has read it
            ev.h2d_start.record()
            for dev, host in copies:
                dev.copy_(host, non_blocking=True)
            ev.h2d_end.record()
        prev_out = self.carry_source(slot)
        with torch.cuda.stream(self.compute_stream):
            self.compute_stream.wait_event(ev.h2d_end)
            if ev.used:
                self.compute_stream.wait_event(ev.d2h_end)   # this slot's output pack already copied out
            ev.graph, ev.last_marked = None, False
            self._compute(batch, prev_out, ev)
            ev.compute_end.record()
        with torch.cuda.stream(self.d2h_stream):
            self.d2h_stream.wait_event(ev.compute_end)
            ev.d2h_start.record()
            slot.host_out[:n_out].copy_(slot.out[:n_out], non_blocking=True)
            ev.d2h_end.record()
        ev.used = True
        return Launched(batch, ev, anchor, self.epoch)

    def _compute(self, batch: Batch, prev_out: torch.Tensor, ev: SlotEvents | None = None) -> None:
        """Runs on the compute stream: a graph replay for a step with a shape, else the eager forward (also for
        a sampling path whose graphs could not be captured). `ev`: the slot's events, whose compute start is
        recorded just before the step's first kernel, and which keep the graph's own events when it has them."""
        ran = None
        if batch.graph is not None:
            ran = self.graphs.replay(batch, ev.compute_start if ev is not None else None)
        if ran is None:
            self._forward(batch, prev_out, ev)
        elif ev is not None:
            ev.graph = ran.events

    def free_cached_memory(self) -> None:
        """After a step ran out of device memory: its tensors are gone, hand their cached blocks back so the next
        steps can allocate. An error path, so the device sync inside empty_cache is acceptable here."""
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    def mark_start(self, before, after) -> None:
        """A step's start kernel between two events (forward.StepForward.mark_start says why)."""
        self.forward.mark_start(before, after)

    def measure_start_kernel(self, repeats: int = 21) -> float:
        """How long the start kernel runs between its two events (ns, the median of `repeats`), on a stream kept
        busy so that the first event completes as the kernel starts. Start-up only: it synchronises."""
        sleep = getattr(torch.cuda, "_sleep", None)     # private to torch (engine/compat.py)
        if not self.cuda or sleep is None:
            return 0.0                                  # unmeasured: a late start event is not moved
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
        with torch.cuda.stream(self.compute_stream):
            for before, after in pairs:
                sleep(20_000)                           # ~10 µs of device work ahead of the events
                self.mark_start(before, after)
        self.compute_stream.synchronize()
        self.start_kernel_ns = sorted(b.elapsed_time(a) for b, a in pairs)[repeats // 2] * 1e6
        return self.start_kernel_ns

    def _forward(self, batch: Batch, prev_out: torch.Tensor, ev: SlotEvents | None = None) -> None:
        """An eager step: the step's forward, its start kernel between the slot's compute events (`ev`)."""
        if ev is None:
            self.forward(batch, prev_out)
            return
        ev.last_marked = True
        self.forward(batch, prev_out, (ev.compute_start, ev.compute_started))

    # -- wait ---------------------------------------------------------------------------------------------------
    def wait(self, launched: Launched) -> list[int]:
        """The host's one wait per step in steady state: until the step's sampled tokens are in host memory."""
        if launched.events is not None:
            launched.events.d2h_end.synchronize()
        S = launched.batch.num_sampled
        return launched.batch.slot.host_out[:S].tolist()     # pinned host memory the copy already filled

    def compute_ms(self, launched: Launched | None) -> float | None:
        """A consumed step's device compute time in ms, from its compute events: complete once `wait` returned
        (the D2H copy waited on them), so this reads two timestamps and waits for nothing. None on CPU or when
        the events cannot be read."""
        if launched is None or launched.events is None:
            return None
        start, end = launched.events.spans()["compute"]
        try:
            return start.elapsed_time(end)
        except RuntimeError:
            return None

    def logprobs(self, launched: Launched):
        """After `wait`: an extras step's logprobs records ([S, RECORD_WORDS] float32 numpy, batch.py says the
        layout), read from the same copy as its tokens; None for any other step."""
        batch = launched.batch
        return batch.slot.host_records(batch.num_sampled) if batch.extras else None

    def went_idle(self) -> None:
        """No step to run: the other ranks may report the spans of their last steps now."""
        self.ranks.went_idle()

    def peer_spans(self) -> list:
        """The other ranks' steps' GPU spans reported since the last call (trace.RankSpans says their form)."""
        return self.ranks.take_spans()

    def stream_context(self):
        return torch.cuda.stream(self.compute_stream) if self.cuda else contextlib.nullcontext()
