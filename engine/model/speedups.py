"""batchscope's kernels swapped into a loaded model, each only where the model's code is, op for op, what the
kernel reproduces (kernels/common.same_code): merged q/k/v and gate/up projections everywhere; on CUDA with
Triton, fused RMSNorm, rotary, residual adds with their norms, the MoE router and few-row GEMMs; on the CPU,
linears prepacked for oneDNN. EngineConfig.fused_kernels turns all but the merged projections off."""
from __future__ import annotations

import torch

from ..kernels.projections import merge_projections


def attention_backend(asked: str, device: torch.device) -> str:
    """"triton" (the paged attention kernels, CUDA graphs possible) or "torch" (the reference): what `asked`
    ("auto", "torch", "triton") comes to on this device."""
    if asked != "auto":
        return asked
    return "triton" if device.type == "cuda" and _triton_available() else "torch"


def install_speedups(model: torch.nn.Module, device: torch.device, attention: str, kernels: bool,
                     merge: bool) -> tuple[list[str], list[str], list[str]]:
    """(merged projections, installed kernels, skipped): what was swapped in, by module, and why a kernel was left
    out where the model's code is not what it reproduces."""
    fast = kernels and attention == "triton"
    merged = merge_projections(model, fused_silu=fast) if merge else []
    installed: list[str] = []
    skipped: list[str] = []
    if fast:
        from ..kernels.moe import install_fused_router          # lazy: Triton compiles only where it runs
        from ..kernels.residual_norm import install_residual_norms
        from ..kernels.rms_norm import install_rms_norms
        from ..kernels.rotary import install_rotary
        installed = install_rms_norms(model) + install_rotary(model, skipped) + install_fused_router(model)
        installed += [f"{name} (residual adds with the norms)" for name in install_residual_norms(model)]
        if device.type == "cuda":
            from ..kernels.skinny_gemm import install_skinny_gemms
            installed += [f"{name} (few-row GEMM)" for name in install_skinny_gemms(model)]
    elif kernels and device.type == "cpu":
        from ..kernels.cpu_gemm import pack_linears             # the CPU's counterpart: weights prepacked for oneDNN
        installed = [f"packed {name}" for name in pack_linears(model)]
    return merged, installed, skipped


def batchscope_patches(model: torch.nn.Module) -> list[str]:
    """The modules of `model` that run any of batchscope's code instead of transformers' own: every kernel above
    goes in per module (an instance `forward`, or the attention's private rotary object), so a model batchscope did
    not install into reports none, whatever else the process loaded."""
    found = []
    for name, module in model.named_modules():
        private = getattr(module, "__dict__", {}).get("_kernel_funcs")
        patched_private = isinstance(private, dict) and any("forward" in vars(obj) for obj in private.values())
        if "forward" in vars(module) or patched_private:
            found.append(f"{name or '(root)'} ({type(module).__name__})")
    return found


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401

        from ..kernels import paged_attention  # noqa: F401
        return True
    except Exception:
        return False
