"""A recording opened for a what-if: the file read and checked, the load it served (arrivals, prompt and output
lengths), the engine settings it ran with, and its steps and requests split by the loop they ran in.

Every failure is a WhatIfError: one line naming the file and what is wrong with it.
"""
from __future__ import annotations

import bisect
import dataclasses
import gzip
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from batchscope.engine.config import EngineConfig

from ..export import TimelineError, load_timeline

GZIP_MAGIC = b"\x1f\x8b"


class WhatIfError(ValueError):
    """A recording or a setting cannot be used for a what-if; the message says which and why."""


@dataclass(frozen=True)
class LoadItem:
    """One request of the load: when it arrived (µs from the recording's start), its prompt and output lengths."""
    id: str
    arrival_us: float
    prompt_tokens: int
    output_tokens: int


@dataclass
class Segment:
    """The part of a recording that ran in one loop: its load, its steps and its finished requests."""
    mode: str
    load: list[LoadItem]
    steps: list[dict]
    requests: list[dict]


@dataclass
class Recording:
    name: str
    timeline: dict
    config: EngineConfig
    info: dict
    segments: dict[str, Segment] = field(default_factory=dict)
    left_out: int = 0           # requests not replayed: unfinished, or no output token

    @property
    def device_type(self) -> str:
        return "cuda" if str(self.info.get("device") or self.config.device).startswith("cuda") else "cpu"

    @property
    def block_size(self) -> int:
        return int(self.info.get("block_size") or self.config.block_size)


def read_file(path: str) -> dict:
    """A batchscope.timeline/1 file, plain or gzipped, validated by telemetry's own reader."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise WhatIfError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if raw.startswith(GZIP_MAGIC):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise WhatIfError(f"{path}: a broken gzip file ({exc})") from None
    try:
        return load_timeline(raw)
    except TimelineError as exc:
        raise WhatIfError(f"{path}: not a batchscope timeline: {str(exc).removeprefix('timeline: ')}") from None


def open_recording(path: str) -> Recording:
    return from_timeline(read_file(path), path)


def from_timeline(tl: dict, name: str) -> Recording:
    """Check that the timeline is a recording of batchscope's own engine serving requests, and split it."""
    meta = tl.get("meta") or {}
    if meta.get("source"):
        src = meta["source"] if isinstance(meta["source"], dict) else {"engine": meta["source"]}
        engine = src.get("engine") or "unknown"
        whose = "of another engine" if engine != "batchscope" else "imported from a profiler"
        raise WhatIfError(f"{name}: a trace {whose} ({engine}, {src.get('tool') or 'a profiler'}): a what-if "
                          f"replays requests through batchscope's scheduler with its recorded host phases, so it "
                          f"needs batchscope's own recording (batchscope serve or bench)")
    if not tl.get("requests"):
        raise WhatIfError(f"{name}: the recording holds no requests: record while a load runs "
                          f"(POST /api/recording/start, a burst, then stop)")
    steps = [s for s in tl.get("steps") or [] if s.get("compute_us") and (s.get("rank") or 0) == 0]
    if len(steps) < 3:
        raise WhatIfError(f"{name}: the recording holds {len(steps)} timed steps, too few to fit a step time")
    if not isinstance(meta.get("config"), dict):
        raise WhatIfError(f"{name}: the recording's meta has no engine config: its settings are unknown")
    known = {f.name for f in dataclasses.fields(EngineConfig)}
    try:
        config = EngineConfig(**{k: v for k, v in meta["config"].items() if k in known}).validate()
    except (TypeError, ValueError) as exc:
        raise WhatIfError(f"{name}: the recording's engine config is not valid: {exc}") from None
    if (config.tensor_parallel_size or 1) > 1:
        raise WhatIfError(f"{name}: a tensor-parallel recording: a what-if models one rank's steps only")
    rec = Recording(name, tl, config, dict(meta.get("info") or {}))
    _split(rec, steps)
    if not rec.segments:
        raise WhatIfError(f"{name}: none of the recording's {len(tl['requests'])} requests finished with an "
                          f"output token: there is no load to replay")
    return rec


def _split(rec: Recording, steps: list[dict]) -> None:
    """Each finished request belongs to the loop of the first step after its arrival (an A/B's halves run one
    after the other, so each half's load lands in its own loop)."""
    starts = [s["compute_us"][0] for s in steps]
    by_mode: dict[str, list[dict]] = {}
    for req in rec.timeline["requests"]:
        if req.get("finish_us") is None or not req.get("output_tokens") or req.get("arrival_us") is None:
            rec.left_out += 1
            continue
        i = min(bisect.bisect_left(starts, req["arrival_us"]), len(steps) - 1)
        by_mode.setdefault(steps[i]["mode"], []).append(req)
    for mode, reqs in by_mode.items():
        t0 = min(r["arrival_us"] for r in reqs)
        t1 = max(r["finish_us"] for r in reqs)
        seg_steps = [s for s in steps if s["mode"] == mode and t0 <= s["compute_us"][1] and s["compute_us"][0] <= t1]
        load = sorted((LoadItem(str(r["id"]), float(r["arrival_us"]), int(r.get("prompt_tokens") or 1),
                                int(r["output_tokens"])) for r in reqs), key=lambda x: (x.arrival_us, x.id))
        rec.segments[mode] = Segment(mode, load, seg_steps, reqs)
