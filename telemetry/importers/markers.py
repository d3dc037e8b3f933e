"""Engine step markers: the names engines give their steps, parsed into what they carry.

In order of preference (the first kind a trace holds is the one steps are split by):
  batchscope    `batchscope.launch step=N mode=M prefill=P decode=D requests=R`, and its schedule/fill/wait/update
  sglang        `step[EXTEND bs=B toks=T]`, `step[DECODE bs=B]`, `step[MIXED ...]`, `model.step.tp0.decode`
                (before vLLM's: profiling patches for SGLang add vLLM-style names beside its own)
  vllm          `execute_context_C(CT)_generation_G(GT)`, `execute_T_context_C(sqCT...)_generation_G(sqGT...)`,
                older `execute_new_N_cached_M`
  atom          `prefill[bs=B tok=T ...]`, `decode[bs=B tok=T ...]`
  transformers  the continuous-batching loop's Python function `_generation_loop_body` (older `_inner_generation_loop`),
                present with `with_stack=True` when the loop's thread existed before the profiler started
  vllm_frames   vLLM's `gpu_model_runner.py(N): execute_model` Python frames (with_stack), one per step, where its
                execute_* annotations are missing
  profiler_step `ProfilerStep#N` (torch.profiler with a schedule)
  numbered      a user annotation `step_N`, `iteration N`, `iter#N`
CUDA-graph capture annotations (`capture_32_DECODE`) mark a capture trace, whose kernels never ran.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .tables import TraceTables

KINDS = ("batchscope", "sglang", "vllm", "atom", "transformers", "vllm_frames", "profiler_step", "numbered")
ENGINE_OF_KIND = {"batchscope": "batchscope", "vllm": "vllm", "sglang": "sglang", "atom": "atom",
                  "transformers": "transformers", "vllm_frames": "vllm"}
PYTHON_FRAME_KINDS = ("transformers", "vllm_frames")     # Python function rows, not same-named ops
DESCRIPTION = {
    "batchscope": "batchscope's own ranges (batchscope.launch step=N ...)",
    "vllm": "vLLM's execute_* step annotations",
    "sglang": "SGLang's step[...] forward annotations",
    "atom": "ATOM's prefill[...]/decode[...] annotations",
    "transformers": "transformers' continuous-batching loop (_generation_loop_body Python function rows)",
    "vllm_frames": "vLLM's gpu_model_runner execute_model Python frames",
    "profiler_step": "torch.profiler's ProfilerStep#N annotations",
    "numbered": "numbered step annotations",
}

_BATCHSCOPE = re.compile(r"^batchscope\.(schedule|fill|launch|wait|update)(?: step=(\d+))?"
                         r"(?: mode=(sync|async))?(?: prefill=(\d+))?(?: decode=(\d+))?(?: requests=(\d+))?")
_VLLM = re.compile(r"^execute_context_(\d+)\((\d+)[^)]*\)_generation_(\d+)\((\d+)[^)]*\)")
_VLLM_DETAILED = re.compile(r"^execute_(\d+)_context_(\d+)\(sq(\d+)[^)]*\)_generation_(\d+)\(sq(\d+)[^)]*\)")
_VLLM_OLD = re.compile(r"^execute_new_(\d+)_cached_(\d+)")
_SGLANG = re.compile(r"^step\[([A-Z_]+)((?:\s+\w+=[\d/]+)*)[^\]]*\]")
_SGLANG_NEW = re.compile(r"^model\.step\.tp\d+\.(\w+)")
_ATOM = re.compile(r"^(prefill|decode)\[bs=(\d+)(?:/\d+)?\s+tok=(\d+)")
_TRANSFORMERS = re.compile(r"continuous_batching/.*: (_generation_loop_body|_inner_generation_loop)$")
_VLLM_FRAME = re.compile(r"vllm/.*gpu_model_runner\.py\(\d+\): execute_model$")
_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_NUMBERED = re.compile(r"^(?:step|iteration|iter)[\s_#:-]?(\d+)$", re.IGNORECASE)
CAPTURE = re.compile(r"^capture_\d+_\w+$")


@dataclass
class Marker:
    kind: str
    name: str
    start: float
    end: float
    pid: int
    tid: int
    step: int | None = None           # the engine's own step number, when the marker has one
    phase: str | None = None          # batchscope: the host phase this range is
    mode: str | None = None
    prefill: int | None = None
    decode: int | None = None
    requests: int | None = None
    on_device: bool = False           # a device-side annotation (pid = device, tid = stream)


def _sglang_fields(mode: str, rest: str) -> dict:
    kv = dict(re.findall(r"(\w+)=(\d+)", rest))
    bs, toks = kv.get("bs"), kv.get("toks")
    bs = int(bs) if bs is not None else None
    if mode == "DECODE":
        return {"requests": bs, "decode": bs, "prefill": 0}
    return {"requests": bs, "prefill": int(toks) if toks is not None else None, "decode": 0 if toks else None}


def parse(name: str) -> tuple[str, dict] | None:
    """(kind, fields) of a step-marker name, or None."""
    if name.startswith("batchscope."):
        m = _BATCHSCOPE.match(name)
        if not m:
            return None
        phase, step, mode, pre, dec, req = m.groups()
        num = lambda v: int(v) if v is not None else None      # noqa: E731
        return "batchscope", {"phase": phase, "step": num(step), "mode": mode, "prefill": num(pre),
                              "decode": num(dec), "requests": num(req)}
    if name.startswith("execute_"):
        if m := _VLLM.match(name):
            c, ct, g, gt = map(int, m.groups())
            return "vllm", {"requests": c + g, "prefill": ct, "decode": gt}
        if m := _VLLM_DETAILED.match(name):
            _, c, ct, g, gt = map(int, m.groups())
            return "vllm", {"requests": c + g, "prefill": ct, "decode": gt}
        if m := _VLLM_OLD.match(name):
            new, cached = map(int, m.groups())
            return "vllm", {"requests": new + cached}
        return None
    if m := _SGLANG.match(name):
        return "sglang", _sglang_fields(m.group(1), m.group(2) or "")
    if m := _SGLANG_NEW.match(name):
        return "sglang", {}
    if m := _ATOM.match(name):
        stage, bs, tok = m.group(1), int(m.group(2)), int(m.group(3))
        return "atom", {"requests": bs, "prefill": tok if stage == "prefill" else 0,
                        "decode": tok if stage == "decode" else 0}
    if _TRANSFORMERS.search(name):
        return "transformers", {}
    if _VLLM_FRAME.search(name):
        return "vllm_frames", {}
    if m := _PROFILER_STEP.match(name):
        return "profiler_step", {"step": int(m.group(1))}
    if m := _NUMBERED.match(name):
        return "numbered", {"step": int(m.group(1))}
    return None


def _parsed_names(t: TraceTables, ids: np.ndarray) -> dict[int, tuple[str, dict]]:
    out = {}
    for nid in np.unique(ids):
        got = parse(t.names[nid])
        if got is not None:
            out[int(nid)] = got
    return out


def find_markers(t: TraceTables) -> tuple[str | None, list[Marker]]:
    """The preferred kind of step marker in the trace and its markers in time order (host-side ones, or the
    device-side twins where the host side is missing, as in a GPU-only trace)."""
    host_rows = np.flatnonzero(t.host.code >= 1)          # annotations and Python functions
    for on_device, table, rows in ((False, t.host, host_rows), (True, t.gann, np.arange(len(t.gann)))):
        parsed = _parsed_names(t, table.name[rows])
        kinds = {k for k, _ in parsed.values()}
        for kind in KINDS:
            if kind not in kinds:
                continue
            ids = np.array([nid for nid, (k, _) in parsed.items() if k == kind])
            chosen = rows[np.isin(table.name[rows], ids)]
            if kind in PYTHON_FRAME_KINDS and not on_device:     # a Python function row, not a same-named op
                chosen = chosen[t.host.code[chosen] == 2]
            return kind, [_marker(t, table, i, kind, parsed[int(table.name[i])][1], on_device) for i in chosen]
    return None, []


def _marker(t: TraceTables, table, i: int, kind: str, fields: dict, on_device: bool) -> Marker:
    pid = int(table.device[i]) if on_device else int(table.pid[i])
    tid = int(table.stream[i]) if on_device else int(table.tid[i])
    return Marker(kind=kind, name=t.names[table.name[i]], start=float(table.start[i]), end=float(table.end[i]),
                  pid=pid, tid=tid, on_device=on_device, **fields)


def capture_annotations(t: TraceTables) -> int:
    rows = np.flatnonzero(t.host.code == 1)
    ids = [nid for nid in np.unique(t.host.name[rows]) if CAPTURE.match(t.names[nid])]
    return int(np.isin(t.host.name[rows], ids).sum()) if ids else 0


def step_marker_names(t: TraceTables, kind: str | None) -> set[int]:
    """Name ids of the step markers (of `kind`, and torch.profiler's ProfilerStep#N), for the host sweep to see
    through: batchscope's ranges are phases, not markers, and stay."""
    out = set()
    for nid, name in enumerate(t.names):
        got = parse(name) if name else None
        if got is not None and got[0] != "batchscope" and (got[0] == kind or got[0] == "profiler_step"):
            out.add(nid)
    return out
