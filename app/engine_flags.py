"""The engine's flags, declared once for every command that builds an engine (`serve`, `bench` with either
workload): `add_engine_flags` puts them on a parser, `engine_config_from` turns the parsed flags into an
EngineConfig. A command says only where it differs: a default (`defaults=`), a help text where the flag means
something more there (`helps=`), the flags it does not take (`skip=`), and, when building the config, the fields it
computes itself (`**overrides`). Each flag's `dest` is the EngineConfig field it fills, except `--no-mixed-graphs`
(`mixed_graphs`, inverted). argparse and engine/config.py only: `--help` loads nothing heavy.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from batchscope.engine.config import DTYPES, MODES, PRESETS, EngineConfig

ADAPTIVE = "adaptive"


def _int_at_least(text: str, least: int) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < least:
        raise argparse.ArgumentTypeError(f"must be >= {least}, got {v}")
    return v


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0)


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return v


def budget_tokens(text: str) -> int | str:
    """--max-batch-tokens: a positive integer (a fixed budget) or 'adaptive'."""
    if str(text).strip().lower() == ADAPTIVE:
        return ADAPTIVE
    return positive_int(text)


def engine_budget(value, default: int | None) -> int | None:
    """--max-batch-tokens as EngineConfig takes it: N is fixed, 'adaptive' is None (the adaptive budget), unset is
    `default`."""
    if value is None:
        return default
    return None if value == ADAPTIVE else int(value)


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]
    dest: str
    help: str
    options: dict = field(default_factory=dict)     # argparse's other keywords: type, default, choices, ...


ENGINE_FLAGS = (
    Flag(("--model",), "model", f"preset ({', '.join(PRESETS)}), HF folder or hub id",
         {"default": EngineConfig.model}),
    Flag(("--device",), "device", "auto, cpu, cuda or cuda:N", {"default": EngineConfig.device}),
    Flag(("--dtype",), "dtype", "the weights' and KV cache's type; auto: bfloat16 on a GPU, float32 on a CPU",
         {"default": EngineConfig.dtype, "choices": DTYPES}),
    Flag(("--mode",), "mode", "the loop to start in (switchable live)",
         {"default": EngineConfig.mode, "choices": MODES}),
    Flag(("--num-blocks",), "num_blocks", "KV cache blocks (default: from free GPU memory; 512 on a CPU)",
         {"type": positive_int, "default": EngineConfig.num_blocks}),
    Flag(("--block-size",), "block_size", "tokens per KV cache block",
         {"type": positive_int, "default": EngineConfig.block_size}),
    Flag(("--max-batch-tokens",), "max_batch_tokens",
         "a fixed per-step token budget: decodes plus prefill chunks (default: adaptive, chosen each step from "
         "measured step times; docs/budget.md)",
         {"type": budget_tokens, "default": EngineConfig.max_batch_tokens}),
    Flag(("--itl-target-ms",), "itl_target_ms",
         "adaptive budget: a step that carries prefill while requests decode stays within MS (default: 2x the "
         "current decode step)",
         # a float, not positive_float: EngineConfig.validate refuses a bad target in one line, as `serve` always did
         {"type": float, "default": EngineConfig.itl_target_ms, "metavar": "MS"}),
    Flag(("--no-mixed-graphs",), "no_mixed_graphs",
         "run the steps that carry prefill eagerly (decode steps keep their CUDA graphs)", {"action": "store_true"}),
    Flag(("--max-running",), "max_running", "requests in the batch at most",
         {"type": positive_int, "default": EngineConfig.max_running}),
    Flag(("--seed",), "seed", "random-weight presets' weights and sampling's seed",
         {"type": int, "default": EngineConfig.seed}),
    Flag(("--tensor-parallel-size", "-tp"), "tensor_parallel_size",
         "split the model over N GPUs (one process each, started here), or N CPU processes",
         {"type": positive_int, "default": EngineConfig.tensor_parallel_size}),
)
_BY_DEST = {f.dest: f for f in ENGINE_FLAGS}


def add_engine_flags(parser: argparse.ArgumentParser, *, defaults: dict | None = None, helps: dict | None = None,
                     skip: tuple[str, ...] = ()) -> None:
    """Put the engine's flags on `parser`, in one order. `defaults` and `helps` by dest replace a flag's own;
    `skip` (dests) leaves flags out."""
    defaults, helps = defaults or {}, helps or {}
    unknown = (set(defaults) | set(helps) | set(skip)) - set(_BY_DEST)
    if unknown:
        raise ValueError(f"not engine flags: {sorted(unknown)}")
    for flag in ENGINE_FLAGS:
        if flag.dest in skip:
            continue
        options = dict(flag.options)
        if flag.dest in defaults:
            options["default"] = defaults[flag.dest]
        parser.add_argument(*flag.names, dest=flag.dest, help=helps.get(flag.dest, flag.help), **options)


def engine_config_from(args: argparse.Namespace, **overrides) -> EngineConfig:
    """The EngineConfig the parsed engine flags ask for, validated; `overrides` (EngineConfig fields) win over the
    flags (a command's computed sizes); a flag the parser did not take, or left unset (None), keeps EngineConfig's
    default.
    ConfigError (a ValueError) for a combination that cannot run."""
    fields = {}
    for dest in _BY_DEST:
        value = getattr(args, dest, None)
        if value is None:
            continue
        if dest == "no_mixed_graphs":
            fields["mixed_graphs"] = not value
        elif dest == "max_batch_tokens":
            fields[dest] = engine_budget(value, EngineConfig.max_batch_tokens)
        else:
            fields[dest] = value
    fields.update(overrides)
    return EngineConfig(**fields).validate()
