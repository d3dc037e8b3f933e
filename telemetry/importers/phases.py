"""What a host range means as an idle cause: batchscope's own phase ranges, the phases other engines' functions and
scopes stand for, and the runtime calls that block the host. The engine-by-engine table is documented in
docs/import.md; a name not in it is plain host work (`host_op`, named in the step's `idle_host_ops_us`).

At any instant the launching thread's cause comes from the ranges open on it, by priority: a batchscope phase
range (its own vocabulary, exactly); else a blocking CUDA/HIP call (the host waiting on the device); else the
innermost range that maps to an engine phase; else any recorded op (`host_op`); else nothing was recorded there
(`host_other`, "host work outside any recorded op").
"""
from __future__ import annotations

import re

import numpy as np

from ..records import HOST_PHASES
from . import names as N

# labels a sweep gives (indices into LABELS); the gap module turns BLOCKING into `wait` or `host_sync`
# (`telemetry`: batchscope's range around handing a step to its observers, its own idle cause too)
LABELS = HOST_PHASES + ("telemetry", "blocking", "host_op", "host_other")
BLOCKING, HOST_OP, HOST_OTHER = LABELS.index("blocking"), LABELS.index("host_op"), LABELS.index("host_other")
PRIO_NONE, PRIO_ENGINE, PRIO_BLOCKING, PRIO_BATCHSCOPE = 0, 1, 2, 3

_BATCHSCOPE = re.compile(r"^batchscope\.(schedule|fill|launch|wait|update|telemetry)\b")
_PY = r"\.py\(\d+\): "
ENGINE_PHASES = [
    # vLLM: its optional scopes (VLLM_CUSTOM_SCOPES_FOR_PROFILING=1) and, with with_stack, its Python functions
    (r"^gpu_model_runner: preprocess$", "fill"),
    (r"^gpu_model_runner: (forward|sample|draft)$", "launch"),
    (r"^gpu_model_runner: (postprocess|bookkeep|eplb|ModelRunnerOutput|AsyncGPUModelRunnerOutput|"
     r"set_async_sampled_token_ids)$", "update"),
    (r"^schedule: ", "schedule"),
    (r"vllm/v1/core/sched/scheduler" + _PY + r"schedule$", "schedule"),
    (r"vllm/v1/core/sched/scheduler" + _PY + r"update_from_output$", "update"),
    (r"vllm/v1/worker/gpu_model_runner" + _PY + r"(_update_states|_prepare_inputs|_prepare_input_ids)$", "fill"),
    (r"vllm/v1/worker/gpu_model_runner" + _PY + r"(_bookkeeping_sync|_to_list)$", "update"),
    # SGLang: its scheduler's and model runner's Python functions
    (r"sglang/srt/managers/scheduler" + _PY + r"(get_next_batch_to_run|recv_requests|process_input_requests)$",
     "schedule"),
    (r"sglang/srt/managers/schedule_batch" + _PY + r"prepare_for_(extend|decode)$", "fill"),
    (r"sglang/srt/managers/scheduler\w*" + _PY + r"process_batch_result\w*$", "update"),
    (r"sglang/srt/model_executor/model_runner" + _PY + r"forward\w*$", "launch"),
    (r"sglang/srt/model_executor/cuda_graph_runner" + _PY + r"replay$", "launch"),
    # transformers continuous batching (5.x)
    (r"continuous_batching/continuous_api" + _PY + r"prepare_next_batch$", "schedule"),
    (r"continuous_batching/scheduler" + _PY + r"schedule_batch$", "schedule"),
    (r"continuous_batching/input_outputs" + _PY + r"prepare_batch_tensors$", "fill"),
    (r"continuous_batching/continuous_api" + _PY + r"_generation_step$", "launch"),
    (r"continuous_batching/model_runner" + _PY + r"compute_batch$", "launch"),
    (r"continuous_batching/input_outputs" + _PY + r"retrieve_device_outputs$", "wait"),
    (r"continuous_batching/continuous_api" + _PY + r"update_batch$", "update"),
]
_ENGINE = [(re.compile(p), HOST_PHASES.index(phase)) for p, phase in ENGINE_PHASES]


def name_role(name: str) -> tuple[int, int]:
    """(priority, label) of a host range's name."""
    if m := _BATCHSCOPE.match(name):
        return PRIO_BATCHSCOPE, LABELS.index(m.group(1))
    for pattern, label in _ENGINE:
        if pattern.search(name):
            return PRIO_ENGINE, label
    return PRIO_NONE, HOST_OP


def host_roles(names: list[str], ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(priority, label) arrays for host rows with these name ids."""
    prio, label = np.zeros(len(names), np.int8), np.full(len(names), HOST_OP, np.int8)
    for nid in np.unique(ids):
        prio[nid], label[nid] = name_role(names[nid])
    return prio[ids], label[ids]


def runtime_roles(kinds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(priority, label) arrays for runtime calls: blocking ones wait on the device, the rest are host ops."""
    blocking = (kinds == N.RT_BLOCKING) | (kinds == N.RT_MEMCPY_SYNC)
    return (np.where(blocking, PRIO_BLOCKING, PRIO_NONE).astype(np.int8),
            np.where(blocking, BLOCKING, HOST_OP).astype(np.int8))
