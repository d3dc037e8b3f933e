"""One rank's model side: load the model (its share of it under tensor parallelism), speed it up, size the KV
cache and build the runner. The engine's process (rank 0) and every other rank (peer.py) build theirs the same
way, in the same order, so the collectives inside meet. At tensor parallel size 1 it is simply the engine's build."""
from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass

import torch

from .budget import step_token_limits
from .config import ConfigError, EngineConfig
from .kv_cache import KVCache
from .model import attention
from .model.loading import LoadedModel, load_model, model_config, resolve_device, resolve_dtype
from .model.presets import SHARDED_PRESETS
from .model.speedups import attention_backend, install_speedups
from .parallel.ranks import RankGroup
from .parallel.sharding import TPLayout, measure_allreduce, plan_layout, shard_model
from .runner import ModelRunner


@dataclass
class RankModel:
    loaded: LoadedModel
    device: torch.device
    attention: str                  # attention backend: "triton" | "torch"
    merged: list[str]               # merged projections
    kernels: list[str]              # batchscope kernels installed (model/speedups.py)
    layout: TPLayout | None         # None at tensor_parallel_size 1
    kernels_skipped: list[str]      # why a kernel was left out of a module it would serve (model/speedups.py)


def rank_device(config: EngineConfig, rank: int) -> torch.device:
    """Rank r runs on the r-th GPU from the configured one (cuda:N + r); every rank of a CPU engine on the CPU."""
    base = resolve_device(config.device)
    if base.type != "cuda":
        return base
    return torch.device("cuda", (base.index or 0) + rank)


def check_tensor_parallel(config: EngineConfig) -> None:
    """Before any process starts: enough GPUs, and a model whose heads, KV heads and MLP split over the ranks."""
    size = config.tensor_parallel_size
    if size == 1:
        return
    base = resolve_device(config.device)
    if base.type == "cuda":
        visible = torch.cuda.device_count()
        first = base.index or 0
        if first + size > visible:
            raise ConfigError(f"tensor_parallel_size {size} needs GPUs {first}..{first + size - 1}, but "
                              f"{visible} GPU(s) are visible")
    elif base.type != "cpu":
        raise ConfigError(f"tensor parallel runs on CUDA (NCCL) or the CPU (gloo), not on {base.type}")
    plan_layout(model_config(config), 0, size)


def use_cpu_threads(config: EngineConfig) -> None:
    """A CPU engine's ranks share the cores: each takes its part of cpu_threads (of torch's default when unset)."""
    total = config.cpu_threads or torch.get_num_threads()
    if config.cpu_threads is not None or config.tensor_parallel_size > 1:
        torch.set_num_threads(max(1, total // config.tensor_parallel_size))


def lower_priority(config: EngineConfig) -> None:
    """The calling thread computes at `config.nice` from now on, and so do the math threads it starts (Linux keeps
    niceness per thread, and a new thread inherits it). Only on Linux: elsewhere it would be the whole process's."""
    if config.nice and sys.platform.startswith("linux"):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(config.nice, os.getpriority(os.PRIO_PROCESS, tid)))


def load_rank(config: EngineConfig, rank: int = 0) -> RankModel:
    size = config.tensor_parallel_size
    device = rank_device(config, rank)
    attn = attention.register()
    layout = None
    if size == 1:
        loaded = load_model(config, attn, device=device)
    elif config.model in SHARDED_PRESETS:
        layout = plan_layout(model_config(config), rank, size)
        loaded = load_model(config, attn, device=device, shard=layout)   # built at this rank's shapes
        shard_model(loaded.model, layout, cut=False)
    else:
        # Whole on the CPU, then cut: every rank holds the same weights as a single-GPU engine would.
        loaded = load_model(config, attn, device=torch.device("cpu"), dtype=resolve_dtype(config.dtype, device))
        layout = plan_layout(loaded.model.config, rank, size)
        shard_model(loaded.model, layout)
        loaded.kv_layout = layout.kv_share(loaded.kv_layout)
        loaded.model.to(device)
    backend = attention_backend(config.attention, device)
    merged, installed, skipped = install_speedups(loaded.model, device, backend, config.fused_kernels,
                                                  config.merge_projections)
    return RankModel(loaded, device, backend, merged, installed, layout, skipped)


def blocks_that_fit(rm: RankModel, config: EngineConfig) -> int:
    if config.num_blocks is not None:
        return config.num_blocks
    if rm.device.type != "cuda":
        return 512
    return KVCache.blocks_for_memory(rm.loaded.kv_layout, config.block_size, rm.loaded.model.dtype, rm.device,
                                     config.kv_memory_fraction)


def make_runner(rm: RankModel, config: EngineConfig, num_blocks: int, ranks: RankGroup | None = None,
                show_progress: bool = False) -> tuple[KVCache, ModelRunner]:
    """The KV cache and the runner, with every step graph captured (collectives inside, at TP > 1). `ranks` is
    rank 0's group of the other ranks (None on those ranks themselves: they relay nothing)."""
    model = rm.loaded.model
    kv = KVCache(rm.loaded.kv_layout, num_blocks, config.block_size, model.dtype, rm.device)
    max_blocks = -(-rm.loaded.max_model_len // config.block_size)
    # mixed graphs on one rank only: a capture that fails on one rank alone would leave the ranks apart
    max_batch_tokens, graph_tokens = step_token_limits(config, rm.device.type)
    runner = ModelRunner(model, kv, rm.device, max_batch_tokens, config.max_running, max_blocks,
                         rm.attention, config.cuda_graphs, ranks or RankGroup(),
                         mixed_graphs=config.mixed_graphs and rm.layout is None, graph_tokens=graph_tokens)
    if rm.layout is not None:       # what one all-reduce costs here: part of every step, and of its floor
        runner.allreduce_us = measure_allreduce(model.config.hidden_size, model.dtype, rm.device)
    if runner.graphs.enabled:
        from tqdm import tqdm
        with tqdm(total=len(runner.graphs.keys()), desc="batchscope: capturing CUDA graphs", leave=False,
                  disable=not show_progress) as bar:
            runner.graphs.capture_all(progress=bar.update)
    runner.measure_start_kernel()
    return kv, runner
