"""One rank's model side: load the model (its share of it under tensor parallelism), speed it up, size the KV
cache and build the runner. The engine's process (rank 0) and every other rank (peers.py) build theirs the same
way, in the same order, so the collectives inside meet."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import attention
from .config import ConfigError, EngineConfig
from .kv_cache import KVCache, KVLayout, kv_layout, remember_layout
from .models import PRESETS, SHARDED_PRESETS, LoadedModel, load_model, random_preset_config, resolve_device
from .projections import merge_projections
from .runner import ModelRunner
from .tensor_parallel import TPLayout, measure_allreduce, plan_layout, shard_model


@dataclass
class RankModel:
    loaded: LoadedModel
    device: torch.device
    kernel: str                     # attention kernel: "triton" | "torch"
    merged: list[str]
    fused: list[str]
    layout: TPLayout | None         # None at tensor_parallel_size 1


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


def model_config(config: EngineConfig):
    """The transformers config of the model, read without loading a weight."""
    name = config.model
    if name in PRESETS and name != "smollm2-135m":
        return random_preset_config(name, 49152)       # vocabulary size aside, the shapes are the preset's
    from transformers import AutoConfig

    from .models import smollm2_checkpoint
    path = str(smollm2_checkpoint()) if name == "smollm2-135m" else name
    try:
        return AutoConfig.from_pretrained(path)
    except Exception as exc:
        raise ConfigError(f"cannot read the config of {name!r} ({type(exc).__name__}: {exc})") from None


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
        from .models import resolve_dtype
        loaded = load_model(config, attn, device=torch.device("cpu"), dtype=resolve_dtype(config.dtype, device))
        layout = plan_layout(loaded.model.config, rank, size)
        full = kv_layout(loaded.model.config)
        shard_model(loaded.model, layout)
        remember_layout(loaded.model.config, KVLayout(full.num_layers, layout.kv_heads, full.k_dim, full.v_dim))
        loaded.model.to(device)
    kernel = config.attention
    if kernel == "auto":
        kernel = "triton" if device.type == "cuda" and _triton_available() else "torch"
    fused = config.fused_kernels and kernel == "triton"
    merged = merge_projections(loaded.model, fused_silu=fused) if config.merge_projections else []
    installed: list[str] = []
    if fused:
        from .fused import install_fused_kernels    # lazy: Triton kernels compile only where they run
        from .moe_triton import install_fused_router
        from .residual_norm import install_residual_norms
        installed = install_fused_kernels(loaded.model) + install_fused_router(loaded.model)
        installed += [f"{name} (residual adds with the norms)" for name in install_residual_norms(loaded.model)]
        if device.type == "cuda":
            from .skinny_gemm import install_skinny_gemms
            installed += [f"{name} (few-row GEMM)" for name in install_skinny_gemms(loaded.model)]
    elif config.fused_kernels and device.type == "cpu":
        from .cpu_gemm import pack_linears           # the CPU's counterpart: weights prepacked for oneDNN
        installed = [f"packed {name}" for name in pack_linears(loaded.model)]
    return RankModel(loaded, device, kernel, merged, installed, layout)


def blocks_that_fit(rm: RankModel, config: EngineConfig) -> int:
    if config.num_blocks is not None:
        return config.num_blocks
    if rm.device.type != "cuda":
        return 512
    return KVCache.blocks_for_memory(rm.loaded.model.config, config.block_size, rm.loaded.model.dtype, rm.device,
                                     config.kv_memory_fraction)


def make_runner(rm: RankModel, config: EngineConfig, num_blocks: int,
                show_progress: bool = False) -> tuple[KVCache, ModelRunner]:
    """The KV cache and the runner, with every decode graph captured (collectives inside, at TP > 1)."""
    model = rm.loaded.model
    kv = KVCache(model.config, num_blocks, config.block_size, model.dtype, rm.device)
    max_blocks = -(-rm.loaded.max_model_len // config.block_size)
    runner = ModelRunner(model, kv, rm.device, config.max_batch_tokens, config.max_running, max_blocks, rm.kernel,
                         config.cuda_graphs)
    if rm.layout is not None:       # what one all-reduce costs here: part of every step, and of its floor
        runner.allreduce_us = measure_allreduce(model.config.hidden_size, model.dtype, rm.device)
    if runner.use_graphs:
        from tqdm import tqdm
        with tqdm(total=len(runner.graph_keys()), desc="batchscope: capturing decode CUDA graphs", leave=False,
                  disable=not show_progress) as bar:
            runner.capture_decode_graphs(progress=bar.update)
    return kv, runner


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
        from . import attention_triton  # noqa: F401
        return True
    except Exception:
        return False
