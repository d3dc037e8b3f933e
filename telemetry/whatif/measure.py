"""A what-if run for real: an Engine started in this process with the recording's model and settings plus the
changes, the recorded load replayed at its (scaled) arrival times with the same prompt and output lengths (EOS
ignored, greedy, seeded prompts), recorded by telemetry like any run, and the same figures computed from it.

`run_load` is also how a test or a script records a load to ask a what-if of."""
from __future__ import annotations

import dataclasses
import random
import time

from batchscope.engine.config import EngineConfig, SamplingParams

from ..session import Telemetry
from .measures import figures
from .recording import LoadItem, WhatIfError, from_timeline

WARMUP_REQUESTS = 8         # the first steps of a process run slower (allocations, first kernels): not measured
WARMUP_TOKENS = 8
TIMEOUT_S = 600.0


def run_load(config: EngineConfig, load: list[LoadItem], rate: float = 1.0, seed: int = 0,
             timeout_s: float = TIMEOUT_S) -> dict:
    """The batchscope.timeline/1 recording of `load` served by an Engine with `config`."""
    from batchscope.engine.engine import Engine       # torch and the model load here

    try:
        engine = Engine(config)
    except (ValueError, RuntimeError, OSError) as exc:
        raise WhatIfError(f"cannot start the engine for the run: {exc}") from None
    telemetry = Telemetry(engine, nvml_hz=10.0)
    try:
        prompts = prompts_for(load, int(engine.info.get("vocab_size") or 1000), seed)
        # shaped like the load (its first prompts at once, then a few decodes), so the shapes it runs are warm
        engine.generate(prompts[:WARMUP_REQUESTS], SamplingParams(max_new_tokens=WARMUP_TOKENS, ignore_eos=True))
        telemetry.start_recording("whatif")
        handles = replay(engine, load, prompts, rate)
        deadline = time.monotonic() + timeout_s
        for handle in handles:
            handle.result(timeout=max(1.0, deadline - time.monotonic()))
        telemetry.stop_recording()
        return telemetry.timeline("whatif")
    except TimeoutError as exc:
        raise WhatIfError(f"the run did not finish: {exc}") from None
    finally:
        telemetry.close()
        engine.close()


def prompts_for(load: list[LoadItem], vocab: int, seed: int = 0) -> list[list[int]]:
    """Seeded random prompts of the load's lengths (what a prompt says does not matter with EOS ignored)."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(item.prompt_tokens)] for item in load]


def replay(engine, load: list[LoadItem], prompts: list[list[int]], rate: float, id_prefix: str | None = None,
           stop=None) -> list:
    """Submit each request at its arrival time, scaled by `rate`, from the first arrival on (greedy, EOS ignored,
    the recorded output length). `id_prefix` names the requests `PREFIX-0`, `PREFIX-1` ... so that a shared
    engine's telemetry can tell them apart; `stop` (a threading.Event) ends the submitting early."""
    t_first = load[0].arrival_us
    start = time.perf_counter()
    handles = []
    for k, (item, prompt) in enumerate(zip(load, prompts)):
        due = start + (item.arrival_us - t_first) / rate / 1e6
        delay = due - time.perf_counter()
        if stop is None:
            time.sleep(max(0.0, delay))
        elif stop.wait(max(0.0, delay)):
            break
        params = SamplingParams(max_new_tokens=item.output_tokens, ignore_eos=True, temperature=0.0)
        rid = f"{id_prefix}-{k}" if id_prefix else None
        handles.append(engine.submit(prompt, params, request_id=rid, stream=False))
    return handles


def measure(config: EngineConfig, mode: str, load: list[LoadItem], rate: float, recording_device: str) -> dict:
    """The figures of a real run of `load` in `mode` with `config` (and the timeline they came from)."""
    import torch

    if recording_device == "cuda" and not torch.cuda.is_available():
        raise WhatIfError("the recording ran on a GPU and this machine has none: --verify runs where it was "
                          "recorded")
    # where it was recorded: a CPU recording stays on the CPU even where "auto" would pick a GPU
    config = dataclasses.replace(config, mode=mode, device="cpu" if recording_device == "cpu" else config.device)
    load = sorted(load, key=lambda i: i.arrival_us)
    timeline = run_load(config, load, rate)
    rec = from_timeline(timeline, "the verify run")
    seg = rec.segments.get(mode) or next(iter(rec.segments.values()))
    return {"mode": mode, **figures(seg.steps, seg.requests)}


def add_measured(rec, settings: dict, result: dict) -> dict:
    """--verify: each predicted loop run for real; `measured` and the prediction's `error_pct` added."""
    from .new_load import reshape
    from .settings import apply

    config = apply(rec, settings)
    rate = float(settings.get("rate", 1.0))
    for mode, entry in result["modes"].items():
        seg = rec.segments.get(mode) or next(iter(rec.segments.values()))
        score(entry, measure(config, mode, reshape(seg.load, settings), rate, rec.device_type))
    return result


def add_measured_from(result: dict, run) -> dict:
    """--against: each predicted loop scored against a run already made (a Recording of the same load served with
    the changed settings, e.g. a bench run) instead of running it again (--verify)."""
    for mode, entry in result["modes"].items():
        seg = run.segments.get(mode)
        if seg is None:
            raise WhatIfError(f"{run.name}: no {mode} steps to score the {mode} prediction against")
        measured = {"mode": mode, **figures(seg.steps, seg.requests)}
        if measured["requests"] != entry["predicted"].get("requests"):
            result.setdefault("notes", []).append(
                f"{run.name} served {measured['requests']} requests in {mode}, the prediction "
                f"{entry['predicted'].get('requests')}: not the same load, the errors compare different runs")
        score(entry, measured)
    return result


def score(entry: dict, measured: dict) -> dict:
    """One mode's entry of the result with its measurement: `measured`, the prediction's `error_pct` and whether
    each figure fell `within_interval` (the CLI's --verify and the server's verify job both end here)."""
    from .measures import error_pct

    entry["measured"] = measured
    entry["error_pct"] = error_pct(entry["predicted"], measured)
    entry["within_interval"] = _within(entry["predicted"]["interval"], measured)
    return entry


def _within(interval: dict, measured: dict) -> dict:
    """Per headline figure (and percentile): whether the measurement fell inside the predicted interval."""
    from .measures import HEADLINE

    def inside(lo, hi, m):
        return None if None in (lo, hi, m) else lo <= m <= hi

    out: dict = {}
    for name in HEADLINE:
        lo, hi, m = interval["low"].get(name), interval["high"].get(name), measured.get(name)
        if isinstance(m, dict):
            out[name] = {q: inside((lo or {}).get(q), (hi or {}).get(q), m.get(q)) for q in ("p50", "p90", "p99")}
        else:
            out[name] = inside(lo, hi, m)
    return out
