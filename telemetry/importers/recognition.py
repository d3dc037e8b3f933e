"""Which engine a trace came from (an engine of engines/'s registry, or unknown), and which vendor's device ran
it. The engine: from its step markers, else its top-level keys (vLLM writes `vllm_version`), its process names
(`VLLM::EngineCore`, `sglang::scheduler`) or the source paths in its Python rows, each as its profile lists them."""
from __future__ import annotations

import numpy as np

from .engines import ENGINE_OF_KIND, PROFILES
from .tables import TraceTables

_REPORTED = tuple(p for p in PROFILES if p.reported)


def recognise(t: TraceTables, marker_kind: str | None) -> tuple[str, str]:
    """(engine, the evidence)."""
    profile = ENGINE_OF_KIND.get(marker_kind) if marker_kind is not None else None
    if profile is not None and profile.reported:
        evidence = next(k.evidence for k in profile.markers if k.kind == marker_kind)
        if evidence is not None:
            return profile.name, evidence
    for p in _REPORTED:
        for key in p.header_keys:
            if key in t.header:
                return p.name, f"the trace's {key} key"
    for name in t.processes.values():
        for p in _REPORTED:
            if p.process_prefixes and name.startswith(p.process_prefixes):
                return p.name, f"process name {name}"
    python = np.unique(t.host.name[t.host.code == 2])
    for p in _REPORTED:
        if p.source_path is None:
            continue
        for nid in python:
            if p.source_path.search(t.names[nid]):
                return p.name, "the source paths of its Python functions"
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
