"""The settings a what-if may change (`--set KEY=VALUE`), parsed and checked against the recording's own.

Keys (DESIGN.md §6): mode, max_batch_tokens (N, or `adaptive`), itl_target_ms (the adaptive budget's target),
max_running, num_blocks (KV cache size), mixed_graphs (on/off), rate (a factor on the recorded arrival rate);
and a new load (new_load.py): arrival (burst/poisson/gamma), burstiness, requests, prompt_tokens and new_tokens (N or
MIN:MAX), seed.
"""
from __future__ import annotations

import dataclasses
import math

from batchscope.engine.config import MODES, EngineConfig

from .new_load import ARRIVALS, LOAD_KEYS, reshape
from .recording import Recording, WhatIfError

KEYS = ("mode", "max_batch_tokens", "itl_target_ms", "max_running", "num_blocks", "mixed_graphs", "rate") + LOAD_KEYS
MAX_REQUESTS = 100_000
_TRUE, _FALSE = ("on", "true", "1", "yes"), ("off", "false", "0", "no")


def parse(pairs: list[str]) -> dict:
    """['max_batch_tokens=512', 'rate=2'] -> {'max_batch_tokens': 512, 'rate': 2.0}; WhatIfError on a bad one."""
    out: dict = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key, text = key.strip().replace("-", "_"), text.strip()
        if not sep or not key:
            raise WhatIfError(f"--set {pair!r}: expected KEY=VALUE (keys: {', '.join(KEYS)})")
        if key not in KEYS:
            raise WhatIfError(f"--set {pair!r}: unknown setting {key!r} (known: {', '.join(KEYS)})")
        if key in out:
            raise WhatIfError(f"--set {key} given twice")
        out[key] = _value(key, text)
    return out


def _value(key: str, text: str):
    if key in ("prompt_tokens", "new_tokens"):
        return _range(key, text)
    if key == "arrival":
        if text not in ARRIVALS:
            raise WhatIfError(f"--set arrival={text}: must be one of {', '.join(ARRIVALS)}")
        return text
    if key == "mode":
        if text not in MODES:
            raise WhatIfError(f"--set mode={text}: must be one of {', '.join(MODES)}")
        return text
    if key == "mixed_graphs":
        if text.lower() not in _TRUE + _FALSE:
            raise WhatIfError(f"--set mixed_graphs={text}: must be on or off")
        return text.lower() in _TRUE
    if key == "max_batch_tokens" and text.lower() == "adaptive":
        return None
    if key in ("rate", "itl_target_ms", "burstiness"):
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise WhatIfError(f"--set {key}={text}: must be a positive number")
        return value
    least = {"num_blocks": 2, "seed": 0}.get(key, 1)
    most = MAX_REQUESTS if key == "requests" else None
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < least or (most is not None and value > most):
        raise WhatIfError(f"--set {key}={text}: must be an integer >= {least}"
                          + (f" and <= {most}" if most else "")
                          + (" (or adaptive)" if key == "max_batch_tokens" else ""))
    return value


def _range(key: str, text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    try:
        pair = (int(lo), int(hi) if sep else int(lo))
    except ValueError:
        pair = (0, 0)
    if not 1 <= pair[0] <= pair[1]:
        raise WhatIfError(f"--set {key}={text}: must be N or MIN:MAX, positive integers, MIN <= MAX")
    return pair


def apply(rec: Recording, settings: dict) -> EngineConfig:
    """The recording's engine config with the settings applied (rate and mode aside), checked as the engine
    checks it, and against the load: a request that could never fit the KV cache is impossible."""
    changes = {k: v for k, v in settings.items() if k not in ("rate", "mode") + LOAD_KEYS}
    if "itl_target_ms" in changes and "max_batch_tokens" not in changes:
        changes["max_batch_tokens"] = None          # a target asks for the adaptive budget
    if changes.get("max_batch_tokens", rec.config.max_batch_tokens) is not None:
        changes.setdefault("itl_target_ms", None)
        changes["budget_max_tokens"] = None
    if rec.config.num_blocks is None and "num_blocks" not in changes:
        changes["num_blocks"] = int(rec.info.get("num_blocks") or 0) or None
    if changes.get("num_blocks", rec.config.num_blocks) is None:
        raise WhatIfError(f"{rec.name}: the recording does not say how many KV blocks its engine had: give it "
                          f"with --set num_blocks=N")
    config = dataclasses.replace(rec.config, **changes)
    try:
        config.validate()
    except ValueError as exc:
        raise WhatIfError(f"impossible settings: {exc}") from None
    capacity = (config.num_blocks or 0) * config.block_size
    need = max(min(i.prompt_tokens + i.output_tokens, max_model_len(rec)) for s in rec.segments.values()
               for i in reshape(s.load, settings))
    if config.num_blocks is not None and need > capacity:
        raise WhatIfError(f"impossible settings: num_blocks={config.num_blocks} holds {capacity} tokens, but a "
                          f"request of the load needs {need}: it could never run")
    return config


def max_model_len(rec: Recording) -> int:
    return int(rec.info.get("max_model_len") or rec.config.max_model_len or 1 << 30)
