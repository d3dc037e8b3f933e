"""CUDA graphs for decode steps: which graphs exist (slot x batch bucket x sampling path), capturing them all at
start-up, replaying them, and giving up cleanly when a step cannot be captured (then it runs eagerly and `note`
says why).

`DecodeGraphs` owns all of it: the buckets, the captured graphs and their memory pool, which of them time
themselves, which sampling paths run eagerly, and the expert dispatch the graphs were captured with. The runner
(runner.py) asks it which bucket a step gets and lets it replay; it hands over its slots, their events, the compute
stream and its forward at construction, and nothing of the runner is reached from here otherwise.
"""
from __future__ import annotations

import contextlib
import gc
import sys
from typing import Callable

import torch

from .batch import Batch, IoSlot, fill_slot
from .model.experts import GRAPH_SAFE_EXPERTS, experts_configs, experts_implementation, fused_experts_fit
from .sampler import SAMPLE_PATHS, sample_path
from .scheduler import StepPlan

GraphKey = tuple[int, int, str]     # (slot, bucket, sampling path)


class GraphCaptureError(RuntimeError):
    """A decode step could not be captured as a CUDA graph; the runner then runs it eagerly."""


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


class DecodeGraphs:
    """The decode graphs of one runner: bucket choice, capture at start-up, replay."""

    def __init__(self, model: torch.nn.Module, device: torch.device, slots: list[IoSlot], events: list,
                 compute_stream, forward: Callable, carry_source: Callable, block_size: int, max_blocks: int,
                 scratch_block: int, max_rows: int, enabled: bool, note: str | None = None):
        self.model, self.device = model, device
        self.slots, self.events, self.compute_stream = slots, events, compute_stream
        self._forward, self._carry_source = forward, carry_source      # the runner's: (batch, prev_out), (slot)
        self.block_size, self.max_blocks, self.scratch_block = block_size, max_blocks, scratch_block
        self.enabled = enabled
        self.buckets = graph_buckets(max_rows)
        self.graphs: dict[GraphKey, torch.cuda.CUDAGraph] = {}
        self.timed: set[GraphKey] = set()           # graphs that record their own compute events
        self.captures = 0                           # captures attempted: all at start-up (a test holds it there)
        self.pool = torch.cuda.graph_pool_handle() if enabled else None
        self.note = note                            # why decode runs eagerly although graphs were asked for
        self.eager_paths: set[str] = set()          # sampling paths whose decode graphs could not be captured
        self.events_ok: bool | None = None          # whether timing events can be recorded inside a graph
        self.experts = experts_configs(model)
        self.experts_impl: str | None = None        # the experts implementation the graphs were captured with

    # -- serving ------------------------------------------------------------------------------------------------
    def bucket_for(self, plan: StepPlan) -> int | None:
        """The graph bucket of a decode-only step (every row one sampled token), None for an eager step."""
        if not self.enabled or not all(s.num_tokens == 1 and s.sample for s in plan.seqs):
            return None
        return next((b for b in self.buckets if b >= len(plan.seqs)), None)

    def replay(self, batch: Batch, start=None) -> bool:
        """Replay the batch's graph on the compute stream (`start` recorded just before it); False when its
        sampling path runs eagerly (the caller then runs the forward). Never captures: a capture mid-serving would
        stall every request in flight."""
        key = (batch.slot.index, batch.graph_bucket, sample_path(batch.any_random, batch.any_filter, batch.extras))
        graph = self.graphs.get(key)
        if graph is None:
            if key[2] in self.eager_paths:
                return False
            raise RuntimeError(f"no decode graph for {key}: capture_all must run before serving")
        if start is not None:
            start.record()
        graph.replay()
        self.events[batch.slot.index].last_in_graph = key in self.timed
        return True

    # -- start-up -----------------------------------------------------------------------------------------------
    def keys(self) -> list[GraphKey]:
        """Every decode graph serving can ask for. Greedy first, so that a sampling path that cannot be captured
        never costs the greedy graphs; within a path the largest bucket first, so later captures reuse the shared
        pool's blocks instead of growing it."""
        return [(slot.index, b, path) for path in SAMPLE_PATHS for b in sorted(self.buckets, reverse=True)
                for slot in self.slots]

    def capture_all(self, progress=None) -> None:
        """At start-up, the only time graphs are captured: every key, so that no request met later (the first one
        with a temperature or a top-k in its bucket) makes the host wait for a capture mid-serving. The graphs
        share one memory pool and replay one at a time on the compute stream, so the pool holds what the largest
        capture needs, not the sum. A model that cannot be captured is left to run eagerly (see `note`)."""
        if not self.enabled:
            return
        greedy = next(iter(SAMPLE_PATHS))          # "greedy": without it graphs are not worth keeping
        try:
            with torch.cuda.stream(self.compute_stream):
                for key in self.keys():
                    if key[2] not in self.eager_paths:
                        self._capture_or_skip(key, greedy)
                    if progress is not None:
                        progress()
        except GraphCaptureError as exc:
            self.disable(str(exc))
        torch.cuda.synchronize(self.device)

    def _capture_or_skip(self, key: GraphKey, greedy: str) -> None:
        slot_index, bucket, path = key
        slot = self.slots[slot_index]
        empty = StepPlan(step=-1, seqs=[], queue_depth=0, running=0)
        any_random, any_filter, extras = SAMPLE_PATHS[path]
        batch = fill_slot(empty, slot, self.block_size, pad_to=bucket, table_width=self.max_blocks,
                          scratch_block=self.scratch_block, extras=extras)
        batch.graph_bucket = bucket
        batch.any_random, batch.any_filter = any_random, any_filter    # padding rows stay greedy
        n64, n32, nf = batch.sizes
        slot.dev64[:n64].copy_(slot.host64[:n64])
        slot.dev32[:n32].copy_(slot.host32[:n32])
        slot.devf[:nf].copy_(slot.hostf[:nf])
        try:
            self._capture(key, batch)
        except GraphCaptureError as exc:
            if path == greedy:
                raise
            # A sampling path that cannot be captured runs eagerly; greedy decode keeps its graphs.
            self.eager_paths.add(path)
            self.note = f"{path} sampling runs eagerly: {exc}"
            for k in [k for k in self.graphs if k[2] == path]:
                del self.graphs[k]

    def _capture(self, key: GraphKey, batch: Batch) -> None:
        """Record one decode graph. The batch's views sit at the bucket's fixed offsets; the carry source is
        always the other slot's output. Raises GraphCaptureError (with the allocator left consistent) when the
        step cannot be captured."""
        self.captures += 1
        other = self._carry_source(batch.slot)
        ev = self.events[batch.slot.index]
        # warm-up outside the graph (kernel compilation, library handles), with host syncs made errors: a sync
        # inside a capture invalidates it, and a failed capture is far harder to undo than a failed warm-up
        self._warm_up_capturable(batch, other)
        self.compute_stream.synchronize()
        if self.events_ok is None:
            self.events_ok = self._graph_events_work()
        graph = torch.cuda.CUDAGraph()
        try:
            with experts_implementation(self.experts, self.experts_impl), \
                    torch.cuda.graph(graph, pool=self.pool, stream=self.compute_stream):
                if self.events_ok:
                    ev.graph_start.record()
                self._forward(batch, other)
                if self.events_ok:
                    ev.graph_end.record()
        except Exception as exc:
            self._abandon_capture(graph, self.pool)
            raise GraphCaptureError(f"capturing the decode step failed ({type(exc).__name__}: "
                                    f"{str(exc).splitlines()[0] if str(exc) else ''})") from exc
        if self.events_ok:
            self.timed.add(key)
        self.graphs[key] = graph

    def _warm_up_capturable(self, batch: Batch, other: torch.Tensor) -> None:
        """One eager decode forward that must not synchronise with the host. An MoE whose expert dispatch
        syncs gets the capture-safe one for its graphs (eager steps keep the model's own)."""
        from .kernels.moe import NAME as FUSED
        tries = [self.experts_impl]
        if self.experts and self.experts_impl is None:
            if fused_experts_fit(self.model):
                tries.insert(0, FUSED)
            tries.append(GRAPH_SAFE_EXPERTS)
        for impl in tries:
            try:
                with experts_implementation(self.experts, impl), host_sync_forbidden():
                    self._forward(batch, other)
                self.experts_impl = impl
                return
            except Exception as exc:        # whatever it is, the step runs eagerly rather than crash start-up
                cause = exc
                # the fused experts are only the faster choice: any failure moves on; the others only on a sync
                if impl != FUSED and "synchroniz" not in str(exc):
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

    def disable(self, reason: str) -> None:
        """Give up on CUDA graphs: free every captured graph and its memory; all steps run eagerly from now.
        Start-up only (a failed capture); synchronises the device."""
        self.enabled = False
        self.note = reason
        self.graphs.clear()
        self.timed.clear()
        self.pool = None
        self.experts_impl = None
        for ev in self.events:
            ev.last_in_graph = False
        gc.collect()
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        print(f"batchscope: CUDA graphs are off for this model, decode runs eagerly: {reason}",
              file=sys.stderr, flush=True)
