"""Which engine a trace came from (batchscope, vllm, sglang, transformers, or unknown), and which tool and
vendor: from its step markers, its top-level keys (vLLM writes `vllm_version`), its process names
(`VLLM::EngineCore`, `sglang::scheduler`) and the source paths in its Python rows."""
from __future__ import annotations

import re

import numpy as np

from .tables import TraceTables

ENGINES = ("batchscope", "vllm", "sglang", "transformers", "unknown")
_PATHS = [("vllm", re.compile(r"(^|/)vllm/")), ("sglang", re.compile(r"(^|/)sglang/")),
          ("transformers", re.compile(r"transformers/generation/continuous_batching/")),
          ("batchscope", re.compile(r"(^|/)batchscope/engine/"))]


def recognise(t: TraceTables, marker_kind: str | None) -> tuple[str, str]:
    """(engine, the evidence)."""
    if marker_kind in ("batchscope", "vllm", "sglang", "transformers"):
        return marker_kind, "its step markers"
    if marker_kind == "vllm_frames":
        return "vllm", "its execute_model Python frames"
    if "vllm_version" in t.header:
        return "vllm", "the trace's vllm_version key"
    for name in t.processes.values():
        if name.startswith("VLLM::"):
            return "vllm", f"process name {name}"
        if name.startswith("sglang::"):
            return "sglang", f"process name {name}"
    python = np.unique(t.host.name[t.host.code == 2])
    for engine, pattern in _PATHS:
        for nid in python:
            if pattern.search(t.names[nid]):
                return engine, "the source paths of its Python functions"
    return "unknown", "no engine marker, process name or source path recognised"


def vendor(t: TraceTables) -> str:
    """"nvidia", "amd" (HIP), or "unknown"."""
    h = t.header
    if any(k in h for k in ("roctracer_version", "hip_runtime_version", "hip_driver_version")):
        return "amd"
    if any(k in h for k in ("cupti_version", "cuda_runtime_version", "cuda_driver_version")):
        return "nvidia"
    rt = np.unique(t.rt.name)
    if any(t.names[n].startswith("hip") for n in rt[:200]):
        return "amd"
    if any(t.names[n].startswith(("cuda", "cu")) for n in rt[:200]):
        return "nvidia"
    return "unknown"


def device_names(t: TraceTables) -> dict[int, str]:
    out = {}
    for props in t.header.get("deviceProperties") or []:
        if isinstance(props, dict) and isinstance(props.get("id"), int) and props.get("name"):
            out[props["id"]] = str(props["name"])
    return out


def device_name(t: TraceTables, device: int) -> str | None:
    """The device's name from deviceProperties; where its id is not listed (ids renumbered by
    CUDA_VISIBLE_DEVICES, or only some devices listed) but every listed device has one name, that name."""
    names = device_names(t)
    if device in names:
        return names[device]
    kinds = set(names.values())
    return kinds.pop() if len(kinds) == 1 else None
