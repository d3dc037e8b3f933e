"""vLLM (v1). Step markers: its execute_* annotations, `execute_context_C(CT)_generation_G(GT)`,
`execute_T_context_C(sqCT...)_generation_G(sqGT...)`, older `execute_new_N_cached_M`; where they are missing, its
`gpu_model_runner.py(N): execute_model` Python frames (with_stack), one per step. Recognised also by the trace's
`vllm_version` key, its `VLLM::EngineCore` process names and `vllm/` source paths. Host phases: its optional
scopes (VLLM_CUSTOM_SCOPES_FOR_PROFILING=1) and, with with_stack, its scheduler's and model runner's functions."""
from __future__ import annotations

import re

from .engine_profile import EngineProfile, MarkerKind

_CURRENT = re.compile(r"^execute_context_(\d+)\((\d+)[^)]*\)_generation_(\d+)\((\d+)[^)]*\)")
_DETAILED = re.compile(r"^execute_(\d+)_context_(\d+)\(sq(\d+)[^)]*\)_generation_(\d+)\(sq(\d+)[^)]*\)")
_OLD = re.compile(r"^execute_new_(\d+)_cached_(\d+)")
_FRAME = re.compile(r"vllm/.*gpu_model_runner\.py\(\d+\): execute_model$")
_PY = r"\.py\(\d+\): "


def parse(name: str) -> dict | None:
    if not name.startswith("execute_"):
        return None
    if m := _CURRENT.match(name):
        c, ct, g, gt = map(int, m.groups())
        return {"requests": c + g, "prefill": ct, "decode": gt}
    if m := _DETAILED.match(name):
        _, c, ct, g, gt = map(int, m.groups())
        return {"requests": c + g, "prefill": ct, "decode": gt}
    if m := _OLD.match(name):
        new, cached = map(int, m.groups())
        return {"requests": new + cached}
    return None


def parse_frame(name: str) -> dict | None:
    return {} if _FRAME.search(name) else None


PROFILE = EngineProfile(
    name="vllm",
    markers=(MarkerKind("vllm", 30, "vLLM's execute_* step annotations", parse),
             MarkerKind("vllm_frames", 60, "vLLM's gpu_model_runner execute_model Python frames", parse_frame,
                        python_frames=True, evidence="its execute_model Python frames")),
    phases=(
        (r"^gpu_model_runner: preprocess$", "fill"),
        (r"^gpu_model_runner: (forward|sample|draft)$", "launch"),
        (r"^gpu_model_runner: (postprocess|bookkeep|eplb|ModelRunnerOutput|AsyncGPUModelRunnerOutput|"
         r"set_async_sampled_token_ids)$", "update"),
        (r"^schedule: ", "schedule"),
        (r"vllm/v1/core/sched/scheduler" + _PY + r"schedule$", "schedule"),
        (r"vllm/v1/core/sched/scheduler" + _PY + r"update_from_output$", "update"),
        (r"vllm/v1/worker/gpu_model_runner" + _PY + r"(_update_states|_prepare_inputs|_prepare_input_ids)$", "fill"),
        (r"vllm/v1/worker/gpu_model_runner" + _PY + r"(_bookkeeping_sync|_to_list)$", "update"),
    ),
    header_keys=("vllm_version",),
    process_prefixes=("VLLM::",),
    source_path=re.compile(r"(^|/)vllm/"),
)
