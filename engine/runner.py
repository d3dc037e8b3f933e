"""Tensors in, tokens out: the model forward and sampling on three CUDA streams ordered by events.

    H2D stream:      wait(slot's last compute done) -> copy packs host->device -> record h2d_end
    compute stream:  wait(h2d_end) -> gather carried tokens -> forward -> sample -> record compute_end
    D2H stream:      wait(compute_end) -> copy sampled tokens device->host -> record d2h_end
The host blocks in exactly one place, `wait()`, on d2h_end. On CPU there are no streams or events: `launch()`
runs the step to completion and `wait()` returns at once, which keeps both loops valid there.

Decode-only steps replay CUDA graphs (one per IO slot, batch-size bucket and sampling variant) with the
carry-over gather and the sampling inside the graph, so a step costs the host one launch instead of hundreds.
A model whose decode step cannot be captured (it synchronises with the host, or the capture fails) runs every
step eagerly instead, and `graphs_note` says why: never a crash at start-up.
"""
from __future__ import annotations

import contextlib
import gc
import sys
import time
from dataclasses import dataclass

import torch

from .attention import AttentionMetadata, use_metadata
from .batch import Batch, IoSlot, fill_slot
from .kv_cache import KVCache
from .patching import embeds_only, logits_epilogue
from .sampler import sample
from .scheduler import StepPlan

EVENT_NAMES = ("h2d_start", "h2d_end", "compute_start", "compute_end", "d2h_start", "d2h_end")


class SlotEvents:
    """Pre-allocated timing events of one IO slot, re-recorded every other step."""

    def __init__(self):
        for name in EVENT_NAMES:
            setattr(self, name, torch.cuda.Event(enable_timing=True))
        self.anchor = torch.cuda.Event(enable_timing=True)
        # Recorded by the decode graphs themselves, around their first and last kernel: the device needs time
        # to start a graph of ~1000 kernels, and that delay is GPU idle time, not compute.
        self.graph_start = torch.cuda.Event(enable_timing=True, external=True)
        self.graph_end = torch.cuda.Event(enable_timing=True, external=True)
        self.used = False          # whether this slot has been launched at least once
        self.last_in_graph = False  # whether the last step on this slot recorded graph_start/graph_end

    def spans(self) -> dict:
        compute = ((self.graph_start, self.graph_end) if self.last_in_graph
                   else (self.compute_start, self.compute_end))
        return {"h2d": (self.h2d_start, self.h2d_end), "compute": compute, "d2h": (self.d2h_start, self.d2h_end)}


@dataclass
class Launched:
    """A step on its way through the device."""
    batch: Batch
    events: SlotEvents | None
    anchor: tuple[object, int] | None


class GraphCaptureError(RuntimeError):
    """A decode step could not be captured as a CUDA graph; the runner then runs it eagerly."""


# Capture-safe expert dispatch for MoE decoders built on transformers' experts interface: one batched GEMM over
# the gathered weights of each (token, expert) pair, no host sync and no data-dependent shape. The default,
# grouped_mm, is used wherever it is capture-safe itself (bf16 on Hopper); in float32 it falls back to a loop
# over the host-side group offsets (a device-to-host copy), which ends any capture.
GRAPH_SAFE_EXPERTS = "batched_mm"


def experts_configs(model: torch.nn.Module) -> list:
    """The configs whose `_experts_implementation` picks the forward of the model's expert modules (those
    wrapped by transformers' `use_experts_implementation`)."""
    seen: dict[int, object] = {}
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(m, "has_gate") and hasattr(m, "is_concatenated") \
                and hasattr(type(m), "_apply_gate") and hasattr(cfg, "_experts_implementation_internal"):
            seen.setdefault(id(cfg), cfg)
    return list(seen.values())


@contextlib.contextmanager
def experts_implementation(configs: list, name: str | None):
    """Run the experts with `name` for the duration (None: leave them alone)."""
    if name is None or not configs:
        yield
        return
    before = [cfg._experts_implementation_internal for cfg in configs]
    for cfg in configs:
        cfg._experts_implementation_internal = name
    try:
        yield
    finally:
        for cfg, impl in zip(configs, before):
            cfg._experts_implementation_internal = impl


@contextlib.contextmanager
def host_sync_forbidden():
    """Turn any host synchronisation into an error (torch's sync debug mode). Process-wide while it lasts:
    used only around one warm-up forward before a capture, where a sync would otherwise invalidate it."""
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(before)


def graph_buckets(max_seqs: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, 129, 16)) + list(range(160, 1025, 32))
    return [b for b in sizes if b < max_seqs] + [max_seqs]


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv: KVCache, device: torch.device, max_tokens: int,
                 max_seqs: int, max_blocks: int, kernel: str, cuda_graphs: bool = False):
        self.model, self.kv, self.device, self.kernel = model, kv, device, kernel
        self.max_blocks = max_blocks
        self.base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        # Where the decoder only looks its ids up, the runner does the lookup itself (see _forward)
        self.embed = self.base.embed_tokens if embeds_only(self.base) else None
        self.lm_head = model.get_output_embeddings()
        # what the model's own forward does to the logits after its lm_head (final soft-capping, scaling)
        self.logits_steps = logits_epilogue(model)
        self.vocab = self.lm_head.weight.shape[0]
        self.block_size = kv.block_size
        self.slots = [IoSlot(i, max_tokens, max_seqs, max_blocks, device) for i in range(2)]
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.h2d_stream = torch.cuda.Stream(device)
            self.compute_stream = torch.cuda.Stream(device)
            self.d2h_stream = torch.cuda.Stream(device)
            self.clock_stream = torch.cuda.Stream(device)   # only ever records clock anchors
            self.events = [SlotEvents(), SlotEvents()]
        self.last_out: torch.Tensor | None = None    # device output of the last launched step (carry source)
        # graphs need a capturable attention kernel: the torch reference loops over host-side lengths
        self.use_graphs = cuda_graphs and self.cuda and kernel == "triton"
        self.buckets = graph_buckets(min(max_seqs, max_tokens))
        self.graphs: dict[tuple[int, int, int], torch.cuda.CUDAGraph] = {}
        self.timed_graphs: set[tuple[int, int, int]] = set()   # graphs that record their own compute events
        self.graph_pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self.graphs_note: str | None = None        # why decode runs eagerly although graphs were asked for
        self.graph_events_ok: bool | None = None   # whether timing events can be recorded inside a graph
        self.experts = experts_configs(model)
        self.graph_experts: str | None = None      # the experts implementation the graphs were captured with
        if cuda_graphs and self.cuda and kernel != "triton":
            self.graphs_note = "the torch attention path loops over host-side lengths and cannot be captured"

    # -- prepare ------------------------------------------------------------------------------------------------
    def prepare(self, plan: StepPlan) -> Batch:
        """Fill the step's IO slot; decode-only steps get the fixed layout of their graph bucket."""
        slot = self.slot_for(plan.step)
        self.wait_slot_free(slot)
        bucket = None
        if self.use_graphs and all(s.num_tokens == 1 and s.sample for s in plan.seqs):
            bucket = next((b for b in self.buckets if b >= len(plan.seqs)), None)
        if bucket is None:
            return fill_slot(plan, slot, self.block_size)
        batch = fill_slot(plan, slot, self.block_size, pad_to=bucket, table_width=self.max_blocks,
                          scratch_block=self.kv.scratch_block)
        batch.graph_bucket = bucket
        return batch

    def slot_for(self, step: int) -> IoSlot:
        return self.slots[step % 2]

    def wait_slot_free(self, slot: IoSlot) -> None:
        """Write-after-read guard: the host may rewrite a slot's pinned buffers only once its H2D copy is done."""
        if self.cuda and self.events[slot.index].used:
            self.events[slot.index].h2d_end.synchronize()

    # -- launch -------------------------------------------------------------------------------------------------
    def launch(self, batch: Batch) -> Launched:
        slot = batch.slot
        S = len(batch.plan.sampled)
        if not self.cuda:
            self._compute(batch, self.last_out)
            slot.host_out[:S].copy_(slot.out_tokens[:S])
            self.last_out = slot.out_tokens
            return Launched(batch, None, None)

        ev = self.events[slot.index]
        n64, n32, nf = batch.sizes
        # Clock anchor: an event on a stream that never holds work completes as soon as the device sees it, even
        # while other streams are busy, so (event, host time) pins the GPU clock to the host clock every step.
        # The driver submits the record somewhere inside the call: its midpoint is the host time.
        before = time.perf_counter_ns()
        ev.anchor.record(self.clock_stream)
        anchor = (ev.anchor, (before + time.perf_counter_ns()) // 2)
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
        prev_out = self.last_out
        with torch.cuda.stream(self.compute_stream):
            self.compute_stream.wait_event(ev.h2d_end)
            if ev.used:
                self.compute_stream.wait_event(ev.d2h_end)   # out_tokens of this slot already copied out
            ev.last_in_graph = False
            self._compute(batch, prev_out, ev.compute_start)
            ev.compute_end.record()
        with torch.cuda.stream(self.d2h_stream):
            self.d2h_stream.wait_event(ev.compute_end)
            ev.d2h_start.record()
            slot.host_out[:S].copy_(slot.out_tokens[:S], non_blocking=True)
            ev.d2h_end.record()
        ev.used = True
        self.last_out = slot.out_tokens
        return Launched(batch, ev, anchor)

    def _compute(self, batch: Batch, prev_out: torch.Tensor | None, start=None) -> None:
        """Runs on the compute stream: a graph replay for bucketed decode steps, else the eager forward.
        `start` (an event) is recorded just before the step's first kernel."""
        if batch.graph_bucket is None:
            return self._forward(batch, prev_out, start)
        key = (batch.slot.index, batch.graph_bucket, 2 if batch.any_filter else int(batch.any_random))
        graph = self.graphs.get(key)
        if graph is None:
            try:
                graph = self._capture(key, batch)
            except GraphCaptureError as exc:
                # a sampling variant met for the first time mid-serving: this step and all later ones go eager
                self.disable_graphs(str(exc))
                return self._forward(batch, prev_out, start)
        if start is not None:
            start.record()
        graph.replay()
        self.events[batch.slot.index].last_in_graph = key in self.timed_graphs

    def _capture(self, key: tuple[int, int, int], batch: Batch) -> torch.cuda.CUDAGraph:
        """Record one decode graph. The batch's views sit at the bucket's fixed offsets; the carry source is
        always the other slot's output (consecutive steps alternate slots). Called on the compute stream.
        Raises GraphCaptureError (with the allocator left consistent) when the step cannot be captured."""
        other = self.slots[1 - batch.slot.index].out_tokens
        ev = self.events[batch.slot.index]
        # warm-up outside the graph (kernel compilation, library handles), with host syncs made errors: a sync
        # inside a capture invalidates it, and a failed capture is far harder to undo than a failed warm-up
        self._warm_up_capturable(batch, other)
        self.compute_stream.synchronize()
        if self.graph_events_ok is None:
            self.graph_events_ok = self._graph_events_work()
        graph = torch.cuda.CUDAGraph()
        try:
            with experts_implementation(self.experts, self.graph_experts), \
                    torch.cuda.graph(graph, pool=self.graph_pool, stream=self.compute_stream):
                if self.graph_events_ok:
                    ev.graph_start.record()
                self._forward(batch, other)
                if self.graph_events_ok:
                    ev.graph_end.record()
        except Exception as exc:
            self._abandon_capture(graph, self.graph_pool)
            raise GraphCaptureError(f"capturing the decode step failed ({type(exc).__name__}: "
                                    f"{str(exc).splitlines()[0] if str(exc) else ''})") from exc
        if self.graph_events_ok:
            self.timed_graphs.add(key)
        self.graphs[key] = graph
        return graph

    def _warm_up_capturable(self, batch: Batch, other: torch.Tensor) -> None:
        """One eager decode forward that must not synchronise with the host. An MoE whose expert dispatch
        syncs gets the capture-safe one for its graphs (eager steps keep the model's own)."""
        tries = [self.graph_experts]
        if self.experts and self.graph_experts is None:
            tries.append(GRAPH_SAFE_EXPERTS)
        for impl in tries:
            try:
                with experts_implementation(self.experts, impl), host_sync_forbidden():
                    self._forward(batch, other)
                self.graph_experts = impl
                return
            except Exception as exc:        # whatever it is, the step runs eagerly rather than crash start-up
                cause = exc
                if "synchroniz" not in str(exc):
                    break
        first = str(cause).splitlines()[0] if str(cause) else ""
        if "synchroniz" in str(cause):
            raise GraphCaptureError(f"the decode step synchronises with the host ({first})") from cause
        raise GraphCaptureError(f"the decode warm-up failed ({type(cause).__name__}: {first})") from cause

    def _graph_events_work(self) -> bool:
        """Whether this driver takes timing-event nodes in graphs, tried on a one-kernel graph in its own pool
        (so that a failure there cannot disturb the model's graphs). Without them the launch is timed."""
        start, end = torch.cuda.Event(enable_timing=True, external=True), torch.cuda.Event(enable_timing=True,
                                                                                          external=True)
        x = torch.zeros(1, device=self.device)
        pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=pool, stream=self.compute_stream):
                start.record()
                x.add_(1)
                end.record()
            return True
        except Exception:
            self._abandon_capture(graph, pool)
            return False
        finally:
            del graph

    def _abandon_capture(self, graph: torch.cuda.CUDAGraph, pool) -> None:
        """After a capture raised: if torch never registered its end (cudaStreamEndCapture failed on an
        invalidated capture), stop routing allocations to the pool and give back the pool reference that
        capture_begin took, so that the pool's use count stays right when later graphs are freed."""
        with torch.cuda.stream(self.compute_stream):
            if torch.cuda.is_current_stream_capturing():
                with contextlib.suppress(Exception):
                    graph.capture_end()
        try:
            graph.pool()            # only a capture that ended (torch will release its pool itself) has one
            return
        except RuntimeError:
            pass
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        for name in ("_cuda_endAllocateToPool", "_cuda_endAllocateCurrentStreamToPool"):
            fn = getattr(torch._C, name, None)
            if fn is not None:
                with contextlib.suppress(Exception):
                    fn(index, pool)
                break
        release = getattr(torch._C, "_cuda_releasePool", None)
        if release is not None:
            with contextlib.suppress(Exception):
                release(index, pool)

    def disable_graphs(self, reason: str) -> None:
        """Give up on CUDA graphs: free every captured graph and its memory; all steps run eagerly from now."""
        self.use_graphs = False
        self.graphs_note = reason
        self.graphs.clear()
        self.timed_graphs.clear()
        self.graph_pool = None
        self.graph_experts = None
        for ev in self.events:
            ev.last_in_graph = False
        gc.collect()
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        print(f"batchscope: CUDA graphs are off for this model, decode runs eagerly: {reason}",
              file=sys.stderr, flush=True)

    def capture_decode_graphs(self, progress=None) -> None:
        """Warm-up at start: record the greedy decode graph of every bucket for both slots. A model that cannot
        be captured is left to run eagerly (see `graphs_note`)."""
        if not self.use_graphs:
            return
        empty = StepPlan(step=-1, seqs=[], queue_depth=0, running=0)
        todo = [(slot, b) for b in sorted(self.buckets, reverse=True) for slot in self.slots]
        try:
            with torch.cuda.stream(self.compute_stream):
                for slot, bucket in todo:
                    batch = fill_slot(empty, slot, self.block_size, pad_to=bucket, table_width=self.max_blocks,
                                      scratch_block=self.kv.scratch_block)
                    batch.graph_bucket = bucket
                    n64, n32, nf = batch.sizes
                    slot.dev64[:n64].copy_(slot.host64[:n64])
                    slot.dev32[:n32].copy_(slot.host32[:n32])
                    slot.devf[:nf].copy_(slot.hostf[:nf])
                    self._capture((slot.index, bucket, 0), batch)
                    if progress is not None:
                        progress()
        except GraphCaptureError as exc:
            self.disable_graphs(str(exc))
        torch.cuda.synchronize(self.device)

    def _forward(self, batch: Batch, prev_out: torch.Tensor | None, start=None) -> None:
        """Carry-over gather first, then the model forward and sampling. The host-side set-up (views, metadata)
        comes before `start` is recorded, so the device is not counted busy while the host prepares."""
        input_ids = batch.view("input_ids")
        carry = batch.num_carried or batch.graph_bucket is not None
        rows = batch.view("carry_rows") if carry else None
        positions = batch.view("positions")[None]
        B = batch.layout.B
        meta = AttentionMetadata(
            slot_mapping=batch.view("slot_mapping"),
            query_start_loc=batch.view("query_start_loc"),
            seq_lens=batch.view("seq_lens"),
            block_tables=batch.view("block_tables").view(B, batch.layout.max_blocks),
            query_start_host=batch.query_start_host,
            seq_lens_host=batch.seq_lens_host,
            max_query_len=batch.max_query_len,
            max_seq_len=batch.max_seq_len,
            kv_caches=self.kv.layers,
            kernel=self.kernel,
        )
        with torch.inference_mode():
            if start is not None:
                start.record()
            if carry:
                # Placeholders become the tokens sampled by the previous step, still on the device.
                input_ids = torch.where(rows >= 0, prev_out[rows.clamp(min=0)], input_ids)
            # Looking the embedding up here puts the first kernel right after `start`, where the profiler sees
            # the step begin; inside the decoder it would follow its own Python (~0.3 ms for an eager 8B
            # prefill). That Python still runs on an idle device, now inside the span: a span cannot see the
            # host gaps between an eager step's kernels.
            ids = input_ids[None]
            inputs = {"inputs_embeds": self.embed(ids)} if self.embed is not None else {"input_ids": ids}
            with use_metadata(meta):
                hidden = self.base(**inputs, position_ids=positions, use_cache=False).last_hidden_state[0]
            S = batch.layout.S
            if S:
                logits = self.lm_head(hidden.index_select(0, batch.view("sample_idx")))
                for step in self.logits_steps:
                    logits = step(logits)
                tokens = sample(logits, batch.view("temperature"), batch.view("top_p"), batch.view("top_k"),
                                batch.view("seeds"), batch.view("sample_pos"), batch.any_random, batch.any_filter)
                batch.slot.out_tokens[:S].copy_(tokens)

    # -- wait ---------------------------------------------------------------------------------------------------
    def wait(self, launched: Launched) -> list[int]:
        """The one place the host blocks on the device."""
        if launched.events is not None:
            launched.events.d2h_end.synchronize()
        S = len(launched.batch.plan.sampled)
        return launched.batch.slot.host_out[:S].tolist()     # pinned host memory the copy already filled

    def stream_context(self):
        return torch.cuda.stream(self.compute_stream) if self.cuda else contextlib.nullcontext()
