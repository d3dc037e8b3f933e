"""What the importer knows of each engine lives in one profile per engine (telemetry/importers/engines/): the
registry gives every marker kind, phase table and recognition rule the generic code reads."""
from __future__ import annotations

import pytest

from batchscope.telemetry.importers import markers, phases
from batchscope.telemetry.importers.engines import ENGINE_OF_KIND, PROFILES
from batchscope.telemetry.records import HOST_PHASES


def test_the_registry_holds_one_profile_per_engine_and_every_marker_kind_once():
    assert [p.name for p in PROFILES] == ["vllm", "sglang", "transformers", "batchscope", "atom"]
    kinds = [k for p in PROFILES for k in p.markers]
    assert len({k.kind for k in kinds}) == len(kinds)
    assert len({k.preference for k in markers.MARKER_KINDS.values()}) == len(markers.MARKER_KINDS)
    # the order of preference docs/import.md lists ("How a trace becomes steps")
    assert markers.KINDS == ("batchscope", "sglang", "vllm", "atom", "transformers", "vllm_frames",
                             "profiler_step", "numbered")
    assert {ENGINE_OF_KIND[k].name for k in ("vllm", "vllm_frames")} == {"vllm"}
    assert all(phase in HOST_PHASES for p in PROFILES for _, phase in p.phases)


@pytest.mark.parametrize("name, expected", [
    ("batchscope.launch step=7 mode=async prefill=3 decode=5 requests=6",
     ("batchscope", {"phase": "launch", "step": 7, "mode": "async", "prefill": 3, "decode": 5, "requests": 6})),
    ("batchscope.schedule", ("batchscope", {"phase": "schedule", "step": None, "mode": None, "prefill": None,
                                            "decode": None, "requests": None})),
    ("execute_context_2(300)_generation_6(6)", ("vllm", {"requests": 8, "prefill": 300, "decode": 6})),
    ("execute_9_context_1(sq40sk0sqsq40)_generation_3(sq1sk80)", ("vllm", {"requests": 4, "prefill": 40,
                                                                            "decode": 1})),
    ("execute_new_2_cached_5", ("vllm", {"requests": 7})),
    ("vllm/v1/worker/gpu_model_runner.py(1900): execute_model", ("vllm_frames", {})),
    ("step[DECODE bs=12]", ("sglang", {"requests": 12, "decode": 12, "prefill": 0})),
    ("step[EXTEND bs=2 toks=512]", ("sglang", {"requests": 2, "prefill": 512, "decode": 0})),
    ("model.step.tp0.decode", ("sglang", {})),
    ("prefill[bs=3 tok=900 ctx=0]", ("atom", {"requests": 3, "prefill": 900, "decode": 0})),
    ("decode[bs=16/32 tok=16]", ("atom", {"requests": 16, "prefill": 0, "decode": 16})),
    ("transformers/generation/continuous_batching/continuous_api.py(800): _generation_loop_body",
     ("transformers", {})),
    ("ProfilerStep#12", ("profiler_step", {"step": 12})),
    ("iteration 4", ("numbered", {"step": 4})),
    ("batchscope.nothing", None),
    ("execute_something_else", None),
    ("aten::mm", None),
])
def test_every_engines_marker_names_parse_to_what_they_carry(name, expected):
    assert markers.parse(name) == expected


@pytest.mark.parametrize("name, label", [
    ("batchscope.telemetry step=3", "telemetry"),
    ("batchscope.wait step=3", "wait"),
    ("gpu_model_runner: sample", "launch"),
    ("vllm/v1/core/sched/scheduler.py(300): update_from_output", "update"),
    ("sglang/srt/managers/schedule_batch.py(1200): prepare_for_decode", "fill"),
    ("transformers/generation/continuous_batching/input_outputs.py(50): retrieve_device_outputs", "wait"),
    ("aten::copy_", "host_op"),
])
def test_each_engines_ranges_name_their_host_phase(name, label):
    assert phases.LABELS[phases.name_role(name)[1]] == label
