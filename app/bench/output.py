"""What every bench workload shares: its messages, the order its runs go in, which transformers variants it can
run, the head of its result and how its files are written (command.py's uniform workload, served/procedure.py's served
one)."""
from __future__ import annotations

import dataclasses
import datetime as _dt
import importlib.metadata
import json
import shlex
import sys
from pathlib import Path

import torch

from .systems import TF_VARIANTS, TransformersRunner

TP_BASELINE_SKIPPED = ("transformers' tensor-parallel path (tp_plan='auto') runs under torchrun, one process per "
                       "GPU, from a checkpoint on disk: benchmarks/transformers_tp.py measures it on its own")


def say(msg: str) -> None:
    print(f"batchscope bench: {msg}", file=sys.stderr, flush=True)


def plan_order(labels: list[str], repeats: int) -> list[tuple[int, str]]:
    """(repeat, label) in run order: forward on even repeats, reversed on odd ones, so no system always goes
    first (or always runs on a GPU warmed by the one before)."""
    return [(r, label) for r in range(repeats) for label in (labels if r % 2 == 0 else labels[::-1])]


def baseline_labels(tf: TransformersRunner, skipped: dict) -> list[str]:
    """The transformers variants this install and device can run; the others go into `skipped` with why."""
    if not tf.same_weights:
        say("warning: transformers' copy of the model has different weights from the engine's")
    if tf.patches:
        say(f"warning: transformers' model runs batchscope code in {len(tf.patches)} modules: not its own baseline")
    labels = []
    for label in TF_VARIANTS:
        reason = tf.skip_reason(label)
        if reason:
            skipped[label] = reason
            say(f"skipping {label}: {reason}")
        else:
            labels.append(label)
    return labels


def report_head(args, info, config, tf) -> dict:
    """What every bench result starts with: when, how it was called, on what, with which settings."""
    return {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command_line(),
        "args": {k: v for k, v in vars(args).items() if k != "func"},
        "device": info["device"], "gpu_name": info.get("gpu_name"),
        "versions": {"torch": torch.__version__, "transformers": importlib.metadata.version("transformers"),
                     "cuda": torch.version.cuda},
        "engine_info": info, "engine_config": dataclasses.asdict(config),
        "transformers_config": {"num_blocks": tf.num_blocks, "max_batch_tokens": tf.max_batch_tokens,
                                "attn_implementation": "sdpa", "use_cuda_graph": tf.cuda,
                                "same_weights": tf.same_weights,
                                # transformers' own code: batchscope's kernels are swapped into the engine's model only
                                "batchscope_patches": tf.patches} if tf else None,
    }


def command_line() -> str:
    """As a user would type it again, whatever path the script ran from (the CLI's own `bench` word dropped)."""
    args = sys.argv[1:]
    return shlex.join(["batchscope", "bench", *(args[1:] if args[:1] == ["bench"] else args)])


def timeline_path(out: str, name: str) -> Path:
    out = Path(out)
    return out.with_name(f"{out.stem}.{name}.timeline.json")


def write_json(path: Path, obj) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, separators=(",", ":"))   # compact: a long run's timeline has tens of thousands of steps
    return path
