"""CUDA graphs for decode steps: which graphs exist (slot x batch bucket x sampling path), capturing them all at
start-up, and giving up cleanly when a step cannot be captured (then it runs eagerly and `graphs_note` says why).

`DecodeGraphs` is a part of `ModelRunner` (runner.py), kept here so that the runner reads as streams, slots and
events; it uses the runner's slots, events, streams, `carry_source` and `_forward`.
"""
from __future__ import annotations

import contextlib
import gc
import sys

import torch

from .batch import Batch, fill_slot
from .sampler import SAMPLE_PATHS
from .scheduler import StepPlan


class GraphCaptureError(RuntimeError):
    """A decode step could not be captured as a CUDA graph; the runner then runs it eagerly."""


# Capture-safe expert dispatch for MoE decoders built on transformers' experts interface: one batched GEMM over
# the gathered weights of each (token, expert) pair, no host sync and no data-dependent shape. The default,
# grouped_mm, is used wherever it is capture-safe itself (bf16 on Hopper); in float32 it falls back to a loop
# over the host-side group offsets (a device-to-host copy), which ends any capture. In bf16/fp16 the decode
# graphs first try batchscope's fused expert GEMMs (moe_triton.py), which read each touched expert once.
GRAPH_SAFE_EXPERTS = "batched_mm"


def fused_experts_fit(model: torch.nn.Module) -> bool:
    """Whether the decode graphs may use moe_triton's fused experts: CUDA, bf16/fp16, Triton, and every experts
    module in the layout the fused forward reproduces."""
    from . import moe_triton

    experts = [m for m in model.modules() if hasattr(m, "has_gate") and hasattr(m, "is_concatenated")]
    dtype = next(model.parameters()).dtype
    return (bool(experts) and moe_triton.available() and dtype in (torch.bfloat16, torch.float16)
            and all(m.gate_up_proj.is_cuda and moe_triton.supports(m) for m in experts if hasattr(m, "gate_up_proj"))
            and all(hasattr(m, "gate_up_proj") for m in experts) and moe_triton.register())


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


class DecodeGraphs:
    """Capture and bookkeeping of the decode graphs (mixed into ModelRunner)."""

    def _capture(self, key: tuple[int, int, str], batch: Batch) -> torch.cuda.CUDAGraph:
        """Record one decode graph. The batch's views sit at the bucket's fixed offsets; the carry source is
        always the other slot's output (`carry_source`). Called on the compute stream, at start-up only.
        Raises GraphCaptureError (with the allocator left consistent) when the step cannot be captured."""
        self.captures += 1
        other = self.carry_source(batch.slot)
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
        from .moe_triton import NAME as FUSED
        tries = [self.graph_experts]
        if self.experts and self.graph_experts is None:
            if fused_experts_fit(self.model):
                tries.insert(0, FUSED)
            tries.append(GRAPH_SAFE_EXPERTS)
        for impl in tries:
            try:
                with experts_implementation(self.experts, impl), host_sync_forbidden():
                    self._forward(batch, other)
                self.graph_experts = impl
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

    def disable_graphs(self, reason: str) -> None:
        """Give up on CUDA graphs: free every captured graph and its memory; all steps run eagerly from now.
        Start-up only (a failed capture); synchronises the device."""
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

    def graph_keys(self) -> list[tuple[int, int, str]]:
        """Every decode graph serving can ask for: (slot, bucket, sample path). Greedy first, so that a sampling
        path that cannot be captured (see `capture_decode_graphs`) never costs the greedy graphs; within a path
        the largest bucket first, so later captures reuse the shared pool's blocks instead of growing it."""
        return [(slot.index, b, path) for path in SAMPLE_PATHS for b in sorted(self.buckets, reverse=True)
                for slot in self.slots]

    def capture_decode_graphs(self, progress=None) -> None:
        """At start-up, the only time graphs are captured: every key of `graph_keys`, so that no request met
        later (the first one with a temperature or a top-k in its bucket) makes the host wait for a capture
        mid-serving. The graphs share one memory pool and replay one at a time on the compute stream, so the
        pool holds what the largest capture needs, not the sum. A model that cannot be captured is left to run
        eagerly (see `graphs_note`)."""
        if not self.use_graphs:
            return
        empty = StepPlan(step=-1, seqs=[], queue_depth=0, running=0)
        greedy = next(iter(SAMPLE_PATHS))          # "greedy": without it graphs are not worth keeping
        try:
            with torch.cuda.stream(self.compute_stream):
                for slot_index, bucket, path in self.graph_keys():
                    if path in self.eager_paths:
                        continue
                    slot = self.slots[slot_index]
                    batch = fill_slot(empty, slot, self.block_size, pad_to=bucket, table_width=self.max_blocks,
                                      scratch_block=self.kv.scratch_block)
                    batch.graph_bucket = bucket
                    batch.any_random, batch.any_filter = SAMPLE_PATHS[path]    # padding rows stay greedy
                    n64, n32, nf = batch.sizes
                    slot.dev64[:n64].copy_(slot.host64[:n64])
                    slot.dev32[:n32].copy_(slot.host32[:n32])
                    slot.devf[:nf].copy_(slot.hostf[:nf])
                    try:
                        self._capture((slot_index, bucket, path), batch)
                    except GraphCaptureError as exc:
                        if path == greedy:
                            raise
                        # A sampling path that cannot be captured runs eagerly; greedy decode keeps its graphs.
                        self.eager_paths.add(path)
                        self.graphs_note = f"{path} sampling runs eagerly: {exc}"
                        for key in [k for k in self.graphs if k[2] == path]:
                            del self.graphs[key]
                    if progress is not None:
                        progress()
        except GraphCaptureError as exc:
            self.disable_graphs(str(exc))
        torch.cuda.synchronize(self.device)
