"""The engines whose traces the importer knows: one file per engine, each an `EngineProfile` (engine_profile.py)
holding how its traces are recognised, its step markers and the host phases its ranges and functions stand for.

Adding an engine: write `<name>_profile.py` with its PROFILE, and add it to PROFILES below. The order of PROFILES
is the order recognition tries source paths in; marker kinds are tried by their own `preference`.
(If its name is new to `meta.source.engine`, the timeline schema must list it, or set `reported=False`.)
"""
from __future__ import annotations

from . import atom_profile, batchscope_profile, sglang_profile, transformers_profile, vllm_profile
from .engine_profile import EngineProfile, MarkerKind

PROFILES: tuple[EngineProfile, ...] = (
    vllm_profile.PROFILE,
    sglang_profile.PROFILE,
    transformers_profile.PROFILE,
    batchscope_profile.PROFILE,
    atom_profile.PROFILE,
)

ENGINE_OF_KIND: dict[str, EngineProfile] = {k.kind: p for p in PROFILES for k in p.markers}

__all__ = ["PROFILES", "ENGINE_OF_KIND", "EngineProfile", "MarkerKind"]
