"""transformers' continuous batching (5.x). Step markers: the loop's Python function `_generation_loop_body` (older
`_inner_generation_loop`), present with `with_stack=True` when the loop's thread existed before the profiler
started. Recognised also by its `transformers/generation/continuous_batching/` source paths. Host phases: the
loop's functions; a CPU-only trace is timed from them, each turn's phases from its first call of each."""
from __future__ import annotations

import re

from .engine_profile import EngineProfile, MarkerKind

_LOOP = re.compile(r"continuous_batching/.*: (_generation_loop_body|_inner_generation_loop)$")
_PY = r"\.py\(\d+\): "
_CB = r"continuous_batching/"


def parse(name: str) -> dict | None:
    return {} if _LOOP.search(name) else None


PROFILE = EngineProfile(
    name="transformers",
    markers=(MarkerKind("transformers", 50, "transformers' continuous-batching loop (_generation_loop_body Python "
                        "function rows)", parse, python_frames=True, host_timed=True),),
    phases=(
        (r"continuous_batching/continuous_api" + _PY + r"prepare_next_batch$", "schedule"),
        (r"continuous_batching/scheduler" + _PY + r"schedule_batch$", "schedule"),
        (r"continuous_batching/input_outputs" + _PY + r"prepare_batch_tensors$", "fill"),
        (r"continuous_batching/continuous_api" + _PY + r"_generation_step$", "launch"),
        (r"continuous_batching/model_runner" + _PY + r"compute_batch$", "launch"),
        (r"continuous_batching/input_outputs" + _PY + r"retrieve_device_outputs$", "wait"),
        (r"continuous_batching/continuous_api" + _PY + r"update_batch$", "update"),
    ),
    source_path=re.compile(r"transformers/generation/continuous_batching/"),
    # one loop turn, in loop order (`launch` is the forward and sampling; `_generation_step` stands in where a
    # version has no `compute_batch`)
    loop_functions=(("schedule", re.compile(_CB + r"continuous_api\.py\(\d+\): prepare_next_batch$")),
                    ("fill", re.compile(_CB + r"input_outputs\.py\(\d+\): prepare_batch_tensors$")),
                    ("launch", re.compile(_CB + r"model_runner\.py\(\d+\): compute_batch$")),
                    ("wait", re.compile(_CB + r"input_outputs\.py\(\d+\): retrieve_device_outputs$")),
                    ("update", re.compile(_CB + r"continuous_api\.py\(\d+\): update_batch$"))),
    loop_forward=re.compile(_CB + r"continuous_api\.py\(\d+\): _generation_step$"),
    loop_name="transformers' loop",
)
