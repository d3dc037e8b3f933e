"""batchscope's own engine: with BATCHSCOPE_ANNOTATE=1 every step phase is a range,
`batchscope.schedule`, `batchscope.fill step=N`, `batchscope.launch step=N mode=M prefill=P decode=D requests=R`,
`batchscope.wait step=N`, `batchscope.update step=N` (and `batchscope.telemetry` around handing a step to its
observers): the ranges are the phases, so they are never seen through, and they time a CPU-only trace."""
from __future__ import annotations

import re

from .engine_profile import EngineProfile, MarkerKind

_RANGE = re.compile(r"^batchscope\.(schedule|fill|launch|wait|update)(?: step=(\d+))?"
                    r"(?: mode=(sync|async))?(?: prefill=(\d+))?(?: decode=(\d+))?(?: requests=(\d+))?")


def _num(v: str | None) -> int | None:
    return int(v) if v is not None else None


def parse(name: str) -> dict | None:
    if not name.startswith("batchscope."):
        return None
    m = _RANGE.match(name)
    if not m:
        return None
    phase, step, mode, pre, dec, req = m.groups()
    return {"phase": phase, "step": _num(step), "mode": mode, "prefill": _num(pre), "decode": _num(dec),
            "requests": _num(req)}


PROFILE = EngineProfile(
    name="batchscope",
    markers=(MarkerKind("batchscope", 10, "batchscope's own ranges (batchscope.launch step=N ...)", parse,
                        per_phase=True, host_timed=True),),
    own_phases=re.compile(r"^batchscope\.(schedule|fill|launch|wait|update|telemetry)\b"),
    source_path=re.compile(r"(^|/)batchscope/engine/"),
)
