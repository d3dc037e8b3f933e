"""The Engine: loads a model, owns the background thread that runs the loops, and takes requests."""
from __future__ import annotations

import gc
import itertools
import logging
import os
import random
import tempfile
import threading
import time
from typing import Sequence

import torch

from .budget import make_budget
from .build import (blocks_that_fit, check_tensor_parallel, load_rank, lower_priority, make_runner, rank_device,
                    use_cpu_threads)
from .config import ConfigError, EngineConfig, EngineUnavailable, SamplingParams
from .core import EngineCore
from .kv_cache import BlockAllocator
from .loop import LOOPS
from .model.loading import preflight, weight_bytes
from .parallel.ranks import start_ranks
from .profiling import ProfileCapture
from .request import IncrementalDetokenizer, Request, RequestHandle, RequestOutput
from .runner import ModelRunner
from .scheduler import Scheduler

Prompt = str | Sequence[int]

log = logging.getLogger(__name__)


class Engine:
    """Continuous batching on a paged KV cache, in sync or async mode, switchable live."""

    def __init__(self, config: EngineConfig | None = None, observer=None):
        self.config = config = (config or EngineConfig()).validate()
        preflight(config.model)
        check_tensor_parallel(config)
        # Ranks 1..N-1 (if any) start first and load their shares while this process loads its own (peer.py).
        self._ranks = start_ranks(config)
        try:
            self._ranks.join(rank_device(config, 0))
            if rank_device(config, 0).type == "cpu":
                use_cpu_threads(config)
            rm = load_rank(config, 0)
            num_blocks = self._ranks.agree_blocks(blocks_that_fit(rm, config))
            self.device, self.attention = rm.device, rm.attention
            self.merged, self.kernels, self.tp_layout = rm.merged, rm.kernels, rm.layout
            self.kernels_skipped = rm.kernels_skipped
            loaded = rm.loaded
            self.model, self.tokenizer = loaded.model, loaded.tokenizer
            self.eos_token_ids = loaded.eos_token_ids
            self.support = loaded.support
            self.max_model_len = loaded.max_model_len
            self.kv, runner = make_runner(rm, config, num_blocks, self._ranks, show_progress=True)
            self.ranks = [{"rank": 0, "device": str(rm.device), "cuda_graphs": runner.graphs.enabled},
                          *self._ranks.ready()]
            self._ranks.serve()
        except BaseException:
            self._ranks.close()
            raise
        self.allocator = BlockAllocator(num_blocks)
        budget = make_budget(config, self.device.type)
        if runner.graphs.mixed_buckets:     # steps that carry decodes stay within the mixed-step graphs
            budget.limit_decode_steps(runner.graphs.mixed_buckets)
        scheduler = Scheduler(self.allocator, config.block_size, budget, config.max_running, self.max_model_len)
        self._core = EngineCore(scheduler, runner, self.eos_token_ids, self._detokenize, self._stop_at)
        self._core.requested_mode = config.mode
        self._rng = random.Random(config.seed)
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self.info = self._describe(num_blocks)
        if observer is not None:
            self.add_observer(observer)
        # What start-up made (the model, its graphs, transformers' modules) lives as long as the engine. Left to the
        # cyclic collector, each full collection would walk it all, tens of milliseconds with the GIL held: the
        # engine thread stops, and once its queued steps drain, so does the GPU. Frozen, it is never walked.
        gc.collect()
        gc.freeze()
        self._thread = threading.Thread(target=self._run, name="batchscope-engine", daemon=True)
        self._thread.start()

    # -- public API ---------------------------------------------------------------------------------------------
    @property
    def mode(self) -> str:
        return self._core.requested_mode

    def set_mode(self, mode: str, reason: str | None = None) -> None:
        """Takes effect at the next step boundary (the async loop drains its in-flight step first). `reason`
        travels with the switch to the observers (an A/B's halves say so on the timeline)."""
        if mode not in LOOPS:
            raise ConfigError(f"mode must be one of {tuple(LOOPS)}, got {mode!r}")
        self._core.request_mode(mode, reason)

    # -- read-only views, for tools and tests that look inside ----------------------------------------------------
    @property
    def runner(self) -> ModelRunner:
        """The model side: streams, IO slots, the decode graphs (`runner.graphs`)."""
        return self._core.runner

    @property
    def scheduler(self) -> Scheduler:
        """Who runs next: the queue, the running requests, the KV block allocator."""
        return self._core.scheduler

    @property
    def observers(self) -> tuple:
        return tuple(self._core.observers)

    def add_observer(self, fn) -> None:
        self._core.add_observer(fn)

    def remove_observer(self, fn) -> None:
        self._core.remove_observer(fn)

    def submit(self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None,
               stream: bool = True) -> RequestHandle:
        """Queue a request from any thread. Raises ConfigError at once for a request that can never run."""
        req, handle = self._new_request(prompt, params, request_id, stream)
        self._enqueue([(req, handle)])
        return handle

    def _new_request(self, prompt: Prompt, params: SamplingParams | None, request_id: str | None,
                     stream: bool) -> tuple[Request, RequestHandle]:
        if self._core.closing:
            raise EngineUnavailable("engine is closed")
        if self._ranks.lost:
            raise EngineUnavailable(f"{self._ranks.lost}: the engine cannot run steps; restart it")
        params = (params or SamplingParams()).validate()
        ids = self._prompt_ids(prompt)
        need = min(len(ids) + params.max_new_tokens, self.max_model_len)
        capacity = self.kv.num_blocks * self.kv.block_size
        if need > capacity:
            raise ConfigError(f"prompt ({len(ids)} tokens) plus max_new_tokens ({params.max_new_tokens}) needs "
                              f"{need} KV slots, but the cache holds {capacity}: it could never run")
        with self._lock:
            rid = request_id or f"req-{next(self._ids)}"
            seed = params.seed if params.seed is not None else self._rng.getrandbits(31)
        return Request(rid, ids, params, seed), RequestHandle(rid, self, streaming=stream,
                                                              detokenize=self._detokenize)

    def _enqueue(self, batch: list[tuple[Request, RequestHandle]]) -> None:
        self._core.submit(batch)

    def cancel(self, request_id: str) -> None:
        self._core.cancel(request_id)

    def profile(self, steps: int, path: str | None = None) -> ProfileCapture:
        """Run torch.profiler over the next `steps` steps, on the engine thread (profiling.py); the trace (Chrome
        trace JSON, gzipped) goes to `path`. One window at a time: ValueError for a bad count, RuntimeError while
        one is open. Follow the returned capture's `state`, or `wait()` for it."""
        if path is None:
            folder = os.path.join(tempfile.gettempdir(), "batchscope-profiles")
            path = os.path.join(folder, f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.pt.trace.json.gz")
        capture = self._core.profiling.request(steps, path)
        self._core.wakeup.set()
        return capture

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[RequestOutput]:
        """Batch use: submit all prompts, wait, return outputs in input order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ConfigError(f"{len(prompts)} prompts but {len(plist)} SamplingParams")
        # One inbox item for all: the engine sees them together, so the first step's batch (and with it every
        # GEMM shape, hence the rounding in bf16) is the same run after run.
        made = [self._new_request(p, sp, None, False) for p, sp in zip(prompts, plist)]
        self._enqueue(made)
        return [handle.result() for _req, handle in made]

    def stats(self) -> dict:
        s = self._core.scheduler
        used, total = self.allocator.num_used, self.allocator.num_blocks
        return {"mode": self.mode, "queue": len(s.queue), "running": len(s.running), "kv_blocks_used": used,
                "kv_blocks_total": total, "kv_usage": used / total, "steps": self._core.step_counter}

    def close(self) -> None:
        self._core.request_close()
        self._thread.join(timeout=30)
        self._ranks.close()
        gc.unfreeze()       # this engine's cycles may be collected again (a frozen object never is)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- the engine thread --------------------------------------------------------------------------------------
    def _run(self) -> None:
        lower_priority(self.config)
        core = self._core
        mode = core.requested_mode
        with torch.inference_mode(), core.runner.stream_context():
            while not core.closing:
                if core.requested_mode != mode:
                    core.mode_changed(mode, core.requested_mode)
                    mode = core.requested_mode
                try:
                    LOOPS[mode](core)
                except Exception:       # a bug outside any step: report it and keep serving
                    log.exception("the engine loop failed outside any step; it keeps serving")
                    time.sleep(0.01)
        core.shutdown()

    # -- helpers ------------------------------------------------------------------------------------------------
    def _prompt_ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ConfigError("this checkpoint has no tokenizer: pass token ids")
            ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        else:
            try:
                ids = [int(t) for t in prompt]
            except (TypeError, ValueError):
                raise ConfigError("a prompt is a string or a list of token ids") from None
        if not ids:
            raise ConfigError("prompt is empty")
        vocab = self.model.get_input_embeddings().weight.shape[0]
        if any(t < 0 or t >= vocab for t in ids):
            raise ConfigError(f"prompt token ids must be in [0, {vocab})")
        if len(ids) >= self.max_model_len:
            raise ConfigError(f"prompt has {len(ids)} tokens; the model takes at most {self.max_model_len - 1}")
        return ids

    def _detokenize(self, ids: list[int], cut: int | None = None) -> str:
        if self.tokenizer is None:
            return ""
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return text if cut is None else text[:cut]

    def _stop_at(self, req: Request) -> int | None:
        """Where a stop string starts in the output text, once the latest tokens complete one; else None.
        Decodes only the text of the tokens new since the last call (with a few before them as context), never the
        whole output: on the engine loop that would grow with every token of every request that has stops."""
        if not req.params.stop or self.tokenizer is None:
            return None
        if req.stop_scan is None:
            req.stop_scan = IncrementalDetokenizer(self._detokenize)
        scan = req.stop_scan
        seen = len(scan.emitted)
        scan.push(req.output_ids[len(scan.ids):])
        # earlier text held no stop string (or this request would have stopped): look where the new text can reach
        start = max(0, seen - max(len(s) for s in req.params.stop) + 1)
        hits = [h for h in (scan.emitted.find(s, start) for s in req.params.stop) if h >= 0]
        return min(hits) if hits else None

    def _describe(self, num_blocks: int) -> dict:
        mcfg = self.model.config
        return {
            "model": self.config.model, "device": str(self.device),
            "dtype": str(self.model.dtype).replace("torch.", ""),
            "gpu_name": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None,
            "cpu_threads": torch.get_num_threads() if self.device.type == "cpu" else None, "nice": self.config.nice,
            "num_params": sum(p.numel() for p in self.model.parameters()),
            "weight_bytes": weight_bytes(self.model),
            "kv_bytes_per_token": self.kv.layout.bytes_per_token(self.model.dtype),
            "num_layers": mcfg.num_hidden_layers, "num_kv_heads": self.kv.kv_heads, "head_dim": self.kv.head_dim,
            "v_head_dim": self.kv.v_head_dim,
            "vocab_size": self.model.get_input_embeddings().weight.shape[0],
            "block_size": self.config.block_size, "num_blocks": num_blocks,
            # the most tokens one step may carry (a fixed budget's value), and the budget policy with its step-time
            # model: a dict the engine thread refreshes in place (budget.py), so readers see it live
            "max_batch_tokens": self.scheduler.max_batch_tokens, "budget": self.scheduler.budget.snapshot,
            "max_running": self.config.max_running,
            "max_model_len": self.max_model_len, "attention": self.attention,
            # how many of batchscope's kernels were swapped into the model (model/speedups.py)
            "cuda_graphs": self.runner.graphs.enabled, "fused_kernels": len(self.kernels),
            "kernels_skipped": list(self.kernels_skipped),   # and why one was not, where its code differs
            # whether those kernels start while the kernel before them finishes (kernels/dependent_launch.py)
            "dependent_launch": self.attention == "triton" and _launches_early(self.device),
            # why steps run eagerly although graphs were asked for (None when they run), and how experts run
            "cuda_graphs_note": self.runner.graphs.note, "graph_experts": self.runner.graphs.experts_impl,
            # the token buckets of the steps with prefill that replay graphs ([]: they run eagerly), and why not
            "mixed_graph_tokens": list(self.runner.graphs.mixed_buckets),
            "mixed_graphs_note": self.runner.graphs.mixed_note,
            # the device's token counts for penalties (penalties.py): a row per request that may run at once
            "penalty_counts_bytes": self.runner.penalties.nbytes,
            "support": self.support,
            "merged_projections": len(self.merged),
            # tensor parallel: weight_bytes, num_kv_heads and num_params above are one rank's share
            "tensor_parallel_size": self.config.tensor_parallel_size, "ranks": self.ranks,
            # all-reduces per step (after attention and after the MLP of every layer) and what one costs by rows
            "allreduces_per_step": 2 * mcfg.num_hidden_layers if self.config.tensor_parallel_size > 1 else 0,
            "allreduce_us": {str(k): v for k, v in self.runner.allreduce_us.items()},
        }


def _launches_early(device: torch.device) -> bool:
    from .kernels.dependent_launch import supported     # lazy: imports Triton, present only where the kernels run
    return supported(device)
