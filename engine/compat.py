"""Every private name of torch, transformers, HF's `kernels` and Gradio that batchscope relies on, in one list.

A private name can change in any release without notice. Each entry says where batchscope reads it, the versions it
was last checked at, what batchscope does when it is missing (always a fallback that is said, never a crash), and a
probe that tells whether the installed versions still have it; tests/unit/test_compat.py runs every probe. Add an entry
whenever code reads a name that starts with an underscore from a package that is not ours.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class PrivateName:
    name: str                       # as batchscope's code spells it
    package: str                    # whose it is
    used_in: str                    # where batchscope reads it
    checked: str                    # the versions it was seen working at
    if_missing: str                 # what batchscope does without it
    probe: Callable[[], bool]       # whether the installed versions have it


def _attr(module: str, *path: str) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            obj = importlib.import_module(module)
        except ImportError:
            return False
        for name in path:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return probe


def _any_attr(module: str, *names: str) -> Callable[[], bool]:
    return lambda: any(_attr(module, n)() for n in names)


def _mkldnn_ops() -> bool:
    import torch
    return all(hasattr(torch.ops.mkldnn, name) for name in ("_reorder_linear_weight", "_linear_pointwise"))


def _config_experts_field() -> bool:
    from transformers import PretrainedConfig
    return hasattr(PretrainedConfig(), "_experts_implementation_internal")


def _experts_gate() -> bool:
    from transformers.integrations import moe
    return hasattr(moe, "_default_apply_gate") and "_apply_gate" in inspect.getsource(moe)


def _kernels_private_rotary() -> bool:
    """transformers' `kernels` integration still keeps each attention module's rotary object in `_kernel_funcs`,
    and the object still wraps the plain function in a closure variable `func` (engine/kernels/rotary.py)."""
    try:
        importlib.import_module("kernels")
    except ImportError:
        return True                 # without the package transformers' rotary is a plain function: nothing to read
    from transformers import LlamaConfig
    from transformers.models.llama import modeling_llama

    cfg = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    funcs = modeling_llama.LlamaAttention(cfg, 0).__dict__.get("_kernel_funcs")
    if not isinstance(funcs, dict):
        return False
    return any(inspect.getclosurevars(type(obj).forward).nonlocals.get("func") is not None for obj in funcs.values())


def _gradio_queue() -> bool:
    import gradio as gr
    queue = getattr(gr.Blocks(), "_queue", None)
    return queue is not None and hasattr(queue, "sleep_when_free") and hasattr(queue, "progress_update_sleep_when_free")


PRIVATE_NAMES: tuple[PrivateName, ...] = (
    PrivateName("torch.cuda._sleep", "torch", "engine/runner.py (ModelRunner.measure_start_kernel)",
                "torch 2.11 (H200)", "the start kernel's run time is not measured at start-up: a step whose start "
                "event ran before its launch arrived starts at the second event",
                _attr("torch.cuda", "_sleep")),
    PrivateName("torch._C._cuda_releasePool", "torch", "engine/graphs.py (a failed capture's memory pool)",
                "torch 2.11 (H200), 2.13 (CPU)", "a capture that failed keeps its pool until the engine closes",
                _attr("torch._C", "_cuda_releasePool")),
    PrivateName("torch._C._cuda_endAllocateToPool / _cuda_endAllocateCurrentStreamToPool", "torch",
                "engine/graphs.py (a failed capture's memory pool)", "torch 2.11 (H200), 2.13 (CPU)",
                "as above: the pool of a capture that failed is not handed back early",
                _any_attr("torch._C", "_cuda_endAllocateToPool", "_cuda_endAllocateCurrentStreamToPool")),
    PrivateName("torch._C._profiler._ExperimentalConfig(profile_all_threads=True)", "torch",
                "app/bench/systems.py (the profiled transformers baseline)", "torch 2.11 (H200), 2.13 (CPU)",
                "the profile records the calling thread only; transformers' loop thread shows no steps",
                _attr("torch._C._profiler", "_ExperimentalConfig")),
    PrivateName("torch.nn.modules.module._global_forward_hooks / _global_forward_pre_hooks", "torch",
                "engine/kernels/residual_norm.py", "torch 2.11 (H200), 2.13 (CPU)",
                "the import fails: residual adds are not fused with their norms (the engine loads without them)",
                lambda: _attr("torch.nn.modules.module", "_global_forward_hooks")()
                and _attr("torch.nn.modules.module", "_global_forward_pre_hooks")()),
    PrivateName("torch.ops.mkldnn._reorder_linear_weight / _linear_pointwise", "torch",
                "engine/kernels/cpu_gemm.py (linears prepacked for oneDNN on the CPU)", "torch 2.13 (CPU)",
                "CPU linears run through torch's own matmul, unpacked (slower decode on the CPU)",
                _mkldnn_ops),
    PrivateName("PretrainedConfig._experts_implementation_internal", "transformers",
                "engine/model/experts.py (the experts' forward inside CUDA graphs)",
                "transformers 5.17 (H200), 5.25 (CPU)",
                "no expert module is found to switch: MoE steps keep transformers' default experts",
                _config_experts_field),
    PrivateName("transformers.integrations.moe._default_apply_gate (and the experts' _apply_gate)", "transformers",
                "engine/kernels/moe.py, engine/model/experts.py", "transformers 5.17 (H200), 5.25 (CPU)",
                "the fused SiLU(gate)*up of the experts is not used (their gate runs unfused)",
                _experts_gate),
    PrivateName("<attention>._kernel_funcs and the closure variable `func` of kernels' Func module", "kernels",
                "engine/kernels/rotary.py (the per-model rotary swap)", "kernels 0.19 with transformers 5.25 (CPU)",
                "the fused rotary is skipped with the reason in engine.info['kernels_skipped']",
                _kernels_private_rotary),
    PrivateName("gradio.Blocks._queue (sleep_when_free, progress_update_sleep_when_free)", "gradio",
                "app/server/app.py (quiet_queue)", "gradio 6.31",
                "Gradio's queue keeps polling every millisecond: an idle server spends ~7% of a core",
                _gradio_queue),
)


def missing(names: tuple[PrivateName, ...] = PRIVATE_NAMES) -> list[PrivateName]:
    """The entries the installed versions no longer have (a probe that fails to run counts as missing)."""
    out = []
    for entry in names:
        try:
            present = entry.probe()
        except Exception:
            present = False
        if not present:
            out.append(entry)
    return out
