"""The JSON Schema of `batchscope.timeline/1`. docs/timeline.schema.json is this dict, written out by
`python -m batchscope.telemetry.schema` (a test keeps the two identical)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .records import (BUDGET_REASONS, COMPUTE_BASES, FINISH_REASONS, GPU_PHASES, HOST_PHASES, IDLE_CAUSES,
                      NVML_FIELDS, SCHEMA_ID)

_SPAN = {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2,
         "description": "[start_us, end_us] on the host clock, microseconds since the timeline's origin"}
_NUM_OR_NULL = {"type": ["number", "null"]}
_COUNT = {"type": "integer", "minimum": 0}
_CPU_TIME = {"type": "number", "minimum": 0}
_BY_CAUSE = {"type": "object", "propertyNames": {"enum": list(IDLE_CAUSES)},
             "additionalProperties": {"type": "number", "minimum": 0}}

STEP = {
    "type": "object",
    "required": ["step", "mode", "slot", "num_requests", "prefill_tokens", "decode_tokens", "request_ids",
                 "kv_blocks_used", "kv_blocks_total", "queue_depth", "cpu", "gpu_idle_before_us", "idle_cause"],
    "properties": {
        "step": _COUNT,
        "rank": _COUNT,
        "mode": {"enum": ["sync", "async"]},
        "slot": _COUNT,
        "num_requests": _COUNT,
        "prefill_tokens": _COUNT,
        "decode_tokens": _COUNT,
        "request_ids": {"type": "array", "items": {"type": "string"}},
        "kv_blocks_used": _COUNT,
        "kv_blocks_total": _COUNT,
        "queue_depth": _COUNT,
        "running": _COUNT,
        "sampled": _COUNT,
        "carried": _COUNT,
        "tokens_out": _COUNT,
        "cpu": {"type": "object", "properties": {p: _SPAN for p in HOST_PHASES}, "additionalProperties": _SPAN},
        "cpu_us": {"type": "object", "properties": {p: _CPU_TIME for p in HOST_PHASES},
                   "additionalProperties": _CPU_TIME,
                   "description": "the engine thread's CPU time in each host phase of `cpu`, microseconds: well "
                                  "below the phase's wall time when the thread was not running (the idle cause "
                                  "preempted). Absent in timelines from before it existed"},
        "gpu": {"type": "object", "properties": {p: _SPAN for p in GPU_PHASES}, "additionalProperties": False},
        "compute_us": {"anyOf": [_SPAN, {"type": "null"}]},
        "compute_basis": {"enum": list(COMPUTE_BASES)},
        "gpu_idle_before_us": {"type": ["number", "null"], "minimum": 0},
        "idle_cause": {"enum": [*IDLE_CAUSES, None]},
        "idle_by_cause_us": _BY_CAUSE,
        "built_during_step": {"type": ["integer", "null"]},
        "consumed_at_launch": {"type": ["integer", "null"]},
        "preempted": {"type": "array", "items": {"type": "string"}},
        "prefill_tokens_by_request": {"type": "object", "additionalProperties": _COUNT,
                                      "description": "whose prompt (or recompute) tokens prefill_tokens are: "
                                                     "request id -> tokens; the step's other requests decoded one "
                                                     "token each. Only on steps with prefill (absent in timelines "
                                                     "from before it existed)"},
        "error": {"type": "string"},
        "budget": {"type": "object", "required": ["tokens", "reason"],
                   "properties": {"tokens": {"type": "integer", "minimum": 1},
                                  "reason": {"enum": list(BUDGET_REASONS)},
                                  "target_ms": {"type": "number", "minimum": 0}},
                   "description": "the token budget the step was planned within and why: fixed (a fixed "
                                  "max_batch_tokens), no_decode (nothing decoding: the adaptive budget's largest "
                                  "step), decode_target (the largest chunk whose predicted step time stays within "
                                  "target_ms). Absent in timelines from before it existed (docs/budget.md)"},
        # steps imported from a profiler trace (telemetry/importers): what only a trace can show
        "marker": {"type": "string", "description": "the engine's own name for the step, as the trace has it"},
        "gpu_idle_inside_us": {"type": "number", "minimum": 0,
                               "description": "idle time of the device inside the compute span (between kernels)"},
        "idle_inside_by_cause_us": _BY_CAUSE,
        "device_busy_us": {"type": "number", "minimum": 0,
                           "description": "the compute span less the idle inside it: the union of the device's ops"},
        "idle_host_late_us": {"type": "number", "minimum": 0,
                              "description": "the part of the gap before the step that the host was late for"},
        "idle_inside_host_late_us": {"type": "number", "minimum": 0},
        "idle_host_ops_us": {"type": "object", "additionalProperties": {"type": "number", "minimum": 0},
                             "description": "the recorded ops the launching thread was in while the device "
                                            "waited for it (the largest few)"},
        "collective_us": {"type": "number", "minimum": 0,
                          "description": "collective (NCCL/RCCL) kernel time in the compute span: busy, but "
                                         "waiting for peers"},
    },
}

RANK_STEP = {
    "type": "object",
    "description": "tensor parallel: another rank's part of a step, from its own CUDA events (on CPU its launch "
                   "span as compute); the step's host spans and counts are in rank 0's step record",
    "required": ["step", "rank", "gpu"],
    "properties": {
        "step": _COUNT,
        "rank": {"type": "integer", "minimum": 1},
        "mode": {"enum": ["sync", "async", None]},
        "gpu": {"type": "object", "properties": {p: _SPAN for p in GPU_PHASES}, "additionalProperties": False},
        "compute_us": {"anyOf": [_SPAN, {"type": "null"}]},
    },
}

REQUEST = {
    "type": "object",
    "required": ["id", "arrival_us", "first_token_us", "finish_us", "prompt_tokens", "output_tokens",
                 "finish_reason", "token_us"],
    "properties": {
        "id": {"type": "string"},
        "arrival_us": _NUM_OR_NULL,
        "scheduled_us": _NUM_OR_NULL,
        "first_token_us": _NUM_OR_NULL,
        "finish_us": _NUM_OR_NULL,
        "prompt_tokens": {"type": ["integer", "null"], "minimum": 0},
        "output_tokens": _COUNT,
        "finish_reason": {"enum": [*FINISH_REASONS, None]},
        "token_us": {"type": "array", "items": {"type": "number"}},
        "sent_us": {"type": ["array", "null"], "items": {"type": "number"},
                    "description": "streamed requests: when the server wrote each token's chunk to the client, on "
                                   "token_us's clock, one per token written (fewer when the client left), never "
                                   "before token_us; sent_us[i] - token_us[i] is the delivery delay. Null when not "
                                   "streamed (or not yet known); absent in timelines from before it existed"},
        "preemptions": _COUNT,
        "output_tokens_engine": _COUNT,
    },
}

NVML_SAMPLE = {
    "type": "object",
    "required": ["t_us", *NVML_FIELDS],
    "properties": {
        "t_us": {"type": "number"},
        **{f: _NUM_OR_NULL for f in NVML_FIELDS},
        "source": {"enum": ["nvml", "psutil"]},
        "gpu": {"type": "integer", "minimum": 0, "description": "NVML index of the GPU sampled"},
        "rank": {"type": "integer", "minimum": 0, "description": "the tensor-parallel rank running on it"},
        "cpu_pct": _NUM_OR_NULL,
        "proc_cpu_pct": _NUM_OR_NULL,
        "fine": {"type": "array", "items": {"type": "array", "items": {"type": "number"}, "minItems": 2,
                                            "maxItems": 2}},
    },
}

MODE_CHANGE = {
    "type": "object",
    "required": ["t_us", "step", "from", "to"],
    "properties": {"t_us": {"type": "number"}, "step": _COUNT, "from": {"enum": ["sync", "async"]},
                   "to": {"enum": ["sync", "async"]}, "reason": {"type": "string"}},
}

SOURCE = {
    "type": "object",
    "description": "a timeline imported from a profiler trace: where it came from and what had to be inferred",
    "required": ["tool", "engine", "files", "trace_start", "steps_from", "inferred"],
    "properties": {
        "tool": {"type": "string"},
        "format": {"type": "string"},
        "engine": {"enum": ["batchscope", "vllm", "sglang", "transformers", "atom", "unknown"]},
        "engine_evidence": {"type": "string"},
        "vendor": {"type": "string"},
        "files": {"type": "array", "items": {"type": "object", "required": ["name", "rank"]}},
        "trace_start": {"type": ["string", "null"], "description": "ISO 8601 wall-clock time of the origin"},
        "steps_from": {"type": "string", "description": "the markers the steps were split by, or how inferred"},
        "inferred": {"type": "array", "items": {"type": "string"}},
        "unknown": {"type": "array", "items": {"type": "string"}},
        "notes": {"type": "array", "items": {"type": "string"}},
        "clock": {"type": "array", "items": {"type": "object"}},
        "profiler": {"type": "object"},
    },
}

KERNELS = {
    "type": "array",
    "description": "imported with kernels: every device op and named idle stretch of each device",
    "items": {
        "type": "object",
        "required": ["rank", "device", "names", "kinds", "causes", "ops", "idle"],
        "properties": {
            "rank": _COUNT, "device": {"type": "integer"},
            "names": {"type": "array", "items": {"type": "string"}},
            "kinds": {"type": "array", "items": {"type": "string"}},
            "causes": {"type": "array", "items": {"enum": list(IDLE_CAUSES)}},
            "ops": {"type": "array", "description": "[start_us, end_us, stream, name, kind, step]",
                    "items": {"type": "array", "minItems": 6, "maxItems": 6}},
            "idle": {"type": "array", "description": "[start_us, end_us, cause, step, inside (0|1)]",
                     "items": {"type": "array", "minItems": 5, "maxItems": 5}},
        },
    },
}

META = {
    "type": "object",
    "required": ["model", "device", "gpu", "dtype", "config", "created"],
    "properties": {
        "model": {"type": ["string", "null"]},
        "device": {"type": ["string", "null"]},
        "gpu": {"type": ["string", "null"]},
        "dtype": {"type": ["string", "null"]},
        "config": {"type": "object"},
        "created": {"type": "string"},
        "info": {"type": "object"},
        "origin": {"type": "object"},
        "recording": {"type": ["object", "null"]},
        "status": {"type": "object"},
        "source": SOURCE,
    },
}

SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "urn:batchscope:timeline:1",
    "title": SCHEMA_ID,
    "description": "A recorded batchscope timeline: per-step host/GPU spans, requests, NVML samples and mode "
                   "switches. Times are microseconds on one host clock since the timeline's origin. See "
                   "docs/timeline.md.",
    "type": "object",
    "required": ["schema", "meta", "steps", "requests", "nvml", "mode_changes", "summary"],
    "properties": {
        "schema": {"const": SCHEMA_ID},
        "meta": META,
        "steps": {"type": "array", "items": STEP},
        "requests": {"type": "array", "items": REQUEST},
        "nvml": {"type": "array", "items": NVML_SAMPLE},
        "mode_changes": {"type": "array", "items": MODE_CHANGE},
        "rank_steps": {"type": "array", "items": RANK_STEP},
        "kernels": KERNELS,
        "summary": {"type": "object"},
    },
}


def write(path: str | Path) -> None:
    Path(path).write_text(json.dumps(SCHEMA, indent=2) + "\n")


if __name__ == "__main__":
    write(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "docs/timeline.schema.json")
