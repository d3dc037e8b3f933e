"""Steps as the compare reads them: each step's shape bucket and the figures it is compared on.

A step's shape decides most of its time: how many requests decode, how many prompt tokens it computes, how much
KV the attention reads. Steps are compared only with steps of the same bucket (docs/compare.md):

    mode           sync | async; dropped from the key when each side ran one mode and they differ (the mode is
                   then the change under test)
    decode batch   exact up to 16 requests; above, quarter octaves (16-19, 20-23, 24-27, 28-31, 32-39, ...)
    prefill tokens 0, then octaves (1, 2-3, 4-7, ..., 256-511, ...)
    KV tokens      half octaves (kv_blocks_used x block_size: 64-90, 91-127, 128-180, ...); `?` where the
                   recording does not know it (most imported traces)

Figures per step, in ms: `step` (the device's time for the step: the idle gap before it plus its compute span),
`compute`, `idle` (the gap, less any part of it when no request existed), each host phase, and the idle by cause.
"""
from __future__ import annotations

import math

HOST_PHASES = ("schedule", "fill", "launch", "wait", "update")
UNKNOWN = "?"
EXACT_DECODE_UP_TO = 16
# a pause in the load is nobody's step time: the idle a recording books to it is left out of every figure
NOT_STEP_TIME = ("empty_queue",)


def decode_bucket(n: int) -> str:
    if n <= EXACT_DECODE_UP_TO:
        return str(n)
    low = 1 << (n.bit_length() - 1)
    width = low // 4
    start = low + (n - low) // width * width
    return f"{start}-{start + width - 1}"


def prefill_bucket(n: int) -> str:
    if n <= 0:
        return "0"
    low = 1 << (n.bit_length() - 1)
    return str(low) if low == 1 else f"{low}-{2 * low - 1}"


def kv_bucket(tokens: int) -> str:
    if tokens <= 0:
        return "0"
    k = math.floor(2 * math.log2(tokens))
    low, high = math.ceil(2 ** (k / 2)), math.ceil(2 ** ((k + 1) / 2)) - 1
    while low > tokens:                 # float edges: keep the bucket holding the value
        k -= 1
        low, high = math.ceil(2 ** (k / 2)), math.ceil(2 ** ((k + 1) / 2)) - 1
    return str(low) if high <= low else f"{low}-{high}"


def recording_facts(timeline: dict) -> dict:
    """What a recording knows about its steps' shapes: the fields an import could not read are unknown, and
    KV tokens need a block size."""
    meta = timeline.get("meta") or {}
    unknown = set((meta.get("source") or {}).get("unknown") or ())
    block = (meta.get("config") or {}).get("block_size") or (meta.get("info") or {}).get("block_size")
    return {"shape_known": not {"decode_tokens", "prefill_tokens"} & unknown,
            "kv_known": "kv_blocks_used" not in unknown,
            "block_size": block}


def step_key(step: dict, facts: dict, with_mode: bool) -> tuple:
    """The bucket a step belongs to: (mode, decode batch, prefill tokens, KV tokens)."""
    mode = step.get("mode") if with_mode else "any"
    if not facts["shape_known"]:
        return (mode, UNKNOWN, UNKNOWN, UNKNOWN)
    if facts["kv_known"] and step.get("kv_blocks_total"):
        kv = kv_bucket(step.get("kv_blocks_used", 0) * (facts["block_size"] or 1))
        if not facts["block_size"]:
            kv += " blocks"
    else:
        kv = UNKNOWN
    return (mode, decode_bucket(step.get("decode_tokens", 0)), prefill_bucket(step.get("prefill_tokens", 0)), kv)


def key_label(key: tuple) -> str:
    mode, decode, prefill, kv = key
    return f"{mode} decode {decode} prefill {prefill} kv {kv}"


def step_figures(step: dict) -> dict | None:
    """A step's figures in ms, or None for a step that cannot be timed (no compute span, no gap before it: the
    first step of a recording, or an error)."""
    compute, gap = step.get("compute_us"), step.get("gpu_idle_before_us")
    if not compute or gap is None or step.get("error"):
        return None
    by_cause = {c: us for c, us in (step.get("idle_by_cause_us") or {}).items() if c not in NOT_STEP_TIME}
    left_out = sum(us for c, us in (step.get("idle_by_cause_us") or {}).items() if c in NOT_STEP_TIME)
    idle = max(0.0, gap - left_out) / 1e3
    out = {"compute": (compute[1] - compute[0]) / 1e3, "idle": idle}
    out["step"] = out["compute"] + idle
    cpu = step.get("cpu") or {}
    for phase in HOST_PHASES:
        span = cpu.get(phase)
        out[f"host.{phase}"] = (span[1] - span[0]) / 1e3 if span else None
    if step.get("gpu_idle_inside_us") is not None:
        out["idle_inside"] = step["gpu_idle_inside_us"] / 1e3
    out["causes"] = {c: us / 1e3 for c, us in by_cause.items()}
    return out
