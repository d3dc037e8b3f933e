"""CUDA graphs for steps: which graphs exist (slot x shape x sampling path), capturing them all at start-up,
replaying them, and giving up cleanly when a step cannot be captured (then it runs eagerly and `note` says why).

Two kinds of shape. Decode steps (every request one sampled token) pad their rows to a batch-size bucket. Mixed
steps (prefill chunks with or without decodes) pad their tokens to a token bucket and their rows to all of the
slot's rows: an eager mixed step costs the host a launch per op, ~50 ms for an 8B model, about what the device
needs for a 2048-token chunk, so without graphs the host cannot get ahead of the device on the steps that carry
prefill. The padded tokens belong to no request and the padded rows hold no tokens: the attention kernel gives
the real rows exactly what it gives them unpadded (every other op works row by row), the padded tokens write only
the scratch block, and the host reads back only the real rows. Mixed graphs run on one rank only (tensor parallel
keeps its mixed steps eager).

`StepGraphs` owns all of it: the shapes (`GraphSizes`), the captured graphs and their memory pool, the timing
events recorded inside them, which sampling paths run eagerly, and the expert dispatch the graphs were captured
with. It is given the step it captures (forward.py's `StepForward`), the IO slots whose buffers the graphs read and
write, and the compute stream. The runner (runner.py) asks it which shape a step gets and lets it replay;
`replay` returns what ran with the graph's own timing events, and the runner records the step's span from them:
nothing of the runner is reached from here.
"""
from __future__ import annotations

import contextlib
import gc
import logging
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .batch import Batch, GraphShape, IoSlot, carry_source, fill_slot
from .forward import StepForward
from .model.experts import GRAPH_SAFE_EXPERTS, experts_configs, experts_implementation, fused_experts_fit
from .sampler import SAMPLE_PATHS, sample_path
from .scheduler import StepPlan

log = logging.getLogger(__name__)

MAX_MIXED_TOKENS = 2048     # a larger budget keeps its mixed steps eager (they are long and compute-bound)


GraphKey = tuple[int, GraphShape, str]     # (slot, shape, sampling path)


class GraphCaptureError(RuntimeError):
    """A step could not be captured as a CUDA graph; the runner then runs it eagerly."""


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


def graph_buckets(max_running: int) -> list[int]:
    """Decode batch sizes."""
    sizes = [1, 2, 4, 8] + list(range(16, 129, 16)) + list(range(160, 1025, 32))
    return [b for b in sizes if b < max_running] + [max_running]


def mixed_buckets(max_batch_tokens: int) -> list[int]:
    """Mixed-step token counts. From 256 tokens on a step pads to at most a quarter more (there the device's time
    grows with the tokens); below, steps are bound by reading the weights and coarser buckets cost little. None
    past MAX_MIXED_TOKENS: a budget that large is for long compute-bound prefill steps, which hide their
    launches."""
    sizes = [32, 64, 128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048]
    if max_batch_tokens > MAX_MIXED_TOKENS:
        return []
    return [t for t in sizes if t < max_batch_tokens] + [max_batch_tokens]


@dataclass(frozen=True)
class GraphSizes:
    """What the step graphs are captured for: the IO slots' sizes, and where a padded step's padding goes."""
    max_running: int            # the slots' rows: decode buckets up to it, every mixed step padded to it
    max_batch_tokens: int       # the most tokens a step carries: a decode bucket holds no more rows than this
    mixed_tokens: int = 0       # the largest mixed step captured (mixed_buckets caps it); 0: mixed steps eager
    block_size: int = 16
    max_blocks: int = 1         # a block table's width in a graph's fixed layout
    scratch_block: int = 0      # the KV block padding tokens write, which no request owns


class GraphEvents:
    """The timing events one slot's graphs record inside themselves, around their first and last kernel: the
    device needs time to start a graph of ~1000 kernels, and that delay is GPU idle time, not compute."""

    def __init__(self):
        self.start = torch.cuda.Event(enable_timing=True, external=True)
        self.started = torch.cuda.Event(enable_timing=True, external=True)     # behind the start kernel
        self.end = torch.cuda.Event(enable_timing=True, external=True)


class Replayed(NamedTuple):
    """A step graph that ran, and the timing events it recorded inside itself (None: it records none)."""
    key: GraphKey
    events: GraphEvents | None


class StepGraphs:
    """The step graphs of one runner: shape choice, capture at start-up, replay."""

    def __init__(self, forward: StepForward, slots: list[IoSlot], compute_stream, sizes: GraphSizes,
                 enabled: bool, note: str | None = None):
        self.forward, self.slots, self.compute_stream, self.sizes = forward, slots, compute_stream, sizes
        self.model, self.device = forward.model, forward.device
        self.enabled = enabled
        self.buckets = graph_buckets(min(sizes.max_running, sizes.max_batch_tokens))
        # mixed steps: every row of the slot, so any plan the scheduler makes fits
        self.mixed_rows = sizes.max_running
        self.mixed_buckets = mixed_buckets(sizes.mixed_tokens) if sizes.mixed_tokens and enabled else []
        self.mixed_note: str | None = None         # why mixed steps run eagerly although graphs were asked for
        self.graphs: dict[GraphKey, torch.cuda.CUDAGraph] = {}
        self.events: list[GraphEvents] = []         # per slot, made by capture_all
        self.timed: set[GraphKey] = set()           # graphs that record their own compute events
        self.captures = 0                           # captures attempted: all at start-up (a test holds it there)
        self.pool = None                            # the graphs' shared memory pool, made by capture_all
        self.note = note                            # why every step runs eagerly although graphs were asked for
        self.eager_paths: set[str] = set()          # sampling paths whose decode graphs could not be captured
        self.events_ok: bool | None = None          # whether timing events can be recorded inside a graph
        self.experts = experts_configs(self.model)
        self.experts_impl: str | None = None        # the experts implementation the graphs were captured with

    # -- serving ------------------------------------------------------------------------------------------------
    def shape_for(self, plan: StepPlan) -> GraphShape | None:
        """The graph shape of a step: a decode bucket when every row is one sampled token, else a mixed one
        when its tokens fit one; None for an eager step."""
        if not self.enabled:
            return None
        if all(s.num_tokens == 1 and s.sample for s in plan.seqs):
            rows = next((b for b in self.buckets if b >= len(plan.seqs)), None)
            if rows is not None:
                return GraphShape("decode", rows, rows)
        if len(plan.seqs) <= self.mixed_rows:
            tokens = next((t for t in self.mixed_buckets if t >= plan.num_tokens), None)
            if tokens is not None:
                return GraphShape("mixed", tokens, self.mixed_rows)
        return None

    def shapes(self) -> list[GraphShape]:
        """Every shape a graph is captured for: decode first (its captures choose the expert dispatch, which the
        mixed ones then reuse), each kind the most tokens first."""
        return ([GraphShape("decode", b, b) for b in sorted(self.buckets, reverse=True)]
                + [GraphShape("mixed", t, self.mixed_rows) for t in sorted(self.mixed_buckets, reverse=True)])

    def replay(self, batch: Batch, start=None) -> Replayed | None:
        """Replay the batch's graph on the compute stream, `start` (the caller's event) recorded just before it.
        None when its sampling path runs eagerly (the caller then runs the forward); else what ran, with the
        timing events the graph recorded inside itself (None when it records none: then the caller's events
        around the launch time it). Never captures: a capture mid-serving would stall every request in flight."""
        key = (batch.slot.index, batch.graph, sample_path(batch.any_random, batch.any_filter, batch.extras))
        graph = self.graphs.get(key)
        if graph is None:
            if key[2] in self.eager_paths or (key[1].kind == "mixed" and not self.mixed_buckets):
                return None
            raise RuntimeError(f"no step graph for {key}: capture_all must run before serving")
        if start is not None:
            start.record()
        graph.replay()
        return Replayed(key, self.events[key[0]] if key in self.timed else None)

    # -- start-up -----------------------------------------------------------------------------------------------
    def keys(self) -> list[GraphKey]:
        """Every step graph serving can ask for. Greedy first, so that a sampling path that cannot be captured
        never costs the greedy graphs; within a path the most tokens first, so later captures reuse the shared
        pool's blocks instead of growing it."""
        return [(slot.index, shape, path) for path in SAMPLE_PATHS for shape in self.shapes()
                for slot in self.slots]

    def capture_all(self, progress=None) -> None:
        """At start-up, the only time graphs are captured: every key, so that no request met later (the first one
        with a temperature or a top-k in its bucket) makes the host wait for a capture mid-serving. The graphs
        share one memory pool and replay one at a time on the compute stream, so the pool holds what the largest
        capture needs, not the sum. A model that cannot be captured is left to run eagerly (see `note`)."""
        if not self.enabled:
            return
        greedy = next(iter(SAMPLE_PATHS))          # "greedy": without it graphs are not worth keeping
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        if not self.events:
            self.events = [GraphEvents() for _ in self.slots]
        try:
            with torch.cuda.stream(self.compute_stream):
                for key in self.keys():
                    if key[2] not in self.eager_paths and (key[1].kind == "decode" or self.mixed_buckets):
                        self._capture_or_skip(key, greedy)
                    if progress is not None:
                        progress()
        except GraphCaptureError as exc:
            self.disable(str(exc))
        torch.cuda.synchronize(self.device)

    def _capture_or_skip(self, key: GraphKey, greedy: str) -> None:
        slot_index, shape, path = key
        slot = self.slots[slot_index]
        empty = StepPlan(step=-1, seqs=[], queue_depth=0, running=0)
        any_random, any_filter, extras = SAMPLE_PATHS[path]
        sizes = self.sizes
        batch = fill_slot(empty, slot, sizes.block_size, shape=shape, table_width=sizes.max_blocks,
                          scratch_block=sizes.scratch_block, extras=extras)
        batch.any_random, batch.any_filter = any_random, any_filter    # padding rows stay greedy
        n64, n32, nf = batch.sizes
        slot.dev64[:n64].copy_(slot.host64[:n64])
        slot.dev32[:n32].copy_(slot.host32[:n32])
        slot.devf[:nf].copy_(slot.hostf[:nf])
        try:
            self._capture(key, batch)
        except GraphCaptureError as exc:
            if shape.kind == "mixed":
                # the steps with prefill run eagerly, as they did before mixed graphs; decode keeps its graphs
                self.mixed_note = f"mixed steps run eagerly: {exc}"
                self.mixed_buckets = []
                for k in [k for k in self.graphs if k[1].kind == "mixed"]:
                    del self.graphs[k]
                    self.timed.discard(k)
                log.warning("%s", self.mixed_note)
                return
            if path == greedy:
                raise
            # A sampling path that cannot be captured runs eagerly; greedy decode keeps its graphs.
            self.eager_paths.add(path)
            self.note = f"{path} sampling runs eagerly: {exc}"
            for k in [k for k in self.graphs if k[2] == path]:
                del self.graphs[k]
                self.timed.discard(k)

    def _capture(self, key: GraphKey, batch: Batch) -> None:
        """Record one step graph. The batch's views sit at the shape's fixed offsets; the carry source is
        always the other slot's output. Raises GraphCaptureError (with the allocator left consistent) when the
        step cannot be captured."""
        self.captures += 1
        other = carry_source(self.slots, batch.slot)
        ev = self.events[batch.slot.index]
        # warm-up outside the graph (kernel compilation, library handles), with host syncs made errors: a sync
        # inside a capture invalidates it, and a failed capture is far harder to undo than a failed warm-up
        self._warm_up_capturable(batch, other, key[1].kind)
        self.compute_stream.synchronize()
        if self.events_ok is None:
            self.events_ok = self._graph_events_work()
        graph = torch.cuda.CUDAGraph()
        try:
            with experts_implementation(self.experts, self.experts_impl), \
                    torch.cuda.graph(graph, pool=self.pool, stream=self.compute_stream):
                self.forward(batch, other, (ev.start, ev.started) if self.events_ok else None)
                if self.events_ok:
                    ev.end.record()
        except Exception as exc:
            self._abandon_capture(graph, self.pool)
            raise GraphCaptureError(f"capturing the {key[1].kind} step failed ({type(exc).__name__}: "
                                    f"{str(exc).splitlines()[0] if str(exc) else ''})") from exc
        if self.events_ok:
            self.timed.add(key)
        self.graphs[key] = graph

    def _warm_up_capturable(self, batch: Batch, other: torch.Tensor, kind: str) -> None:
        """One eager forward of the step that must not synchronise with the host. An MoE whose expert dispatch
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
                    self.forward(batch, other)
                self.experts_impl = impl
                return
            except Exception as exc:        # whatever it is, the step runs eagerly rather than crash start-up
                cause = exc
                # the fused experts are only the faster choice: any failure moves on; the others only on a sync
                if impl != FUSED and "synchroniz" not in str(exc):
                    break
        first = str(cause).splitlines()[0] if str(cause) else ""
        if "synchroniz" in str(cause):
            raise GraphCaptureError(f"the {kind} step synchronises with the host ({first})") from cause
        raise GraphCaptureError(f"the {kind} warm-up failed ({type(cause).__name__}: {first})") from cause

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
        self.mixed_buckets = []
        self.graphs.clear()
        self.timed.clear()
        self.pool = None
        self.experts_impl = None
        gc.collect()
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        log.warning("CUDA graphs are off for this model, every step runs eagerly: %s", reason)
