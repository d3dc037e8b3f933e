"""SGLang. Step markers: its forward annotations `step[EXTEND bs=B toks=T]`, `step[DECODE bs=B]`,
`step[MIXED ...]`, and newer `model.step.tp0.decode` (preferred to vLLM's: profiling patches for SGLang add
vLLM-style names beside its own). Recognised also by its `sglang::scheduler` process names and `sglang/` source
paths. Host phases: its scheduler's and model runner's Python functions."""
from __future__ import annotations

import re

from .engine_profile import EngineProfile, MarkerKind

_STEP = re.compile(r"^step\[([A-Z_]+)((?:\s+\w+=[\d/]+)*)[^\]]*\]")
_MODEL_STEP = re.compile(r"^model\.step\.tp\d+\.(\w+)")
_PY = r"\.py\(\d+\): "


def _fields(mode: str, rest: str) -> dict:
    kv = dict(re.findall(r"(\w+)=(\d+)", rest))
    bs, toks = kv.get("bs"), kv.get("toks")
    bs = int(bs) if bs is not None else None
    if mode == "DECODE":
        return {"requests": bs, "decode": bs, "prefill": 0}
    return {"requests": bs, "prefill": int(toks) if toks is not None else None, "decode": 0 if toks else None}


def parse(name: str) -> dict | None:
    if m := _STEP.match(name):
        return _fields(m.group(1), m.group(2) or "")
    if _MODEL_STEP.match(name):
        return {}
    return None


PROFILE = EngineProfile(
    name="sglang",
    markers=(MarkerKind("sglang", 20, "SGLang's step[...] forward annotations", parse),),
    phases=(
        (r"sglang/srt/managers/scheduler" + _PY + r"(get_next_batch_to_run|recv_requests|process_input_requests)$",
         "schedule"),
        (r"sglang/srt/managers/schedule_batch" + _PY + r"prepare_for_(extend|decode)$", "fill"),
        (r"sglang/srt/managers/scheduler\w*" + _PY + r"process_batch_result\w*$", "update"),
        (r"sglang/srt/model_executor/model_runner" + _PY + r"forward\w*$", "launch"),
        (r"sglang/srt/model_executor/cuda_graph_runner" + _PY + r"replay$", "launch"),
    ),
    process_prefixes=("sglang::",),
    source_path=re.compile(r"(^|/)sglang/"),
)
