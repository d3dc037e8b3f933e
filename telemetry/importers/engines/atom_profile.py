"""ATOM (ROCm's inference engine). Step markers: `prefill[bs=B tok=T ...]`, `decode[bs=B tok=T ...]`; a trace split
by them reports `meta.source.engine` "atom"."""
from __future__ import annotations

import re

from .engine_profile import EngineProfile, MarkerKind

_STEP = re.compile(r"^(prefill|decode)\[bs=(\d+)(?:/\d+)?\s+tok=(\d+)")


def parse(name: str) -> dict | None:
    m = _STEP.match(name)
    if not m:
        return None
    stage, bs, tok = m.group(1), int(m.group(2)), int(m.group(3))
    return {"requests": bs, "prefill": tok if stage == "prefill" else 0, "decode": tok if stage == "decode" else 0}


PROFILE = EngineProfile(
    name="atom",
    markers=(MarkerKind("atom", 40, "ATOM's prefill[...]/decode[...] annotations", parse),),
)
