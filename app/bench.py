"""`batchscope bench`: batchscope's sync and async loops (and transformers' own continuous batching) on one fixed
workload, each set against the memory-bandwidth floor of a decode step.

    python -m batchscope.app.bench --model llama3-8b-random --requests 32 --prompt-tokens 256 --new-tokens 512 \
        --modes sync,async --baseline transformers --out bench.json

What it does, in order (docs/BENCHMARKS.md has the method in full):
  1. times a large device-to-device copy (bytes read + written) -> the copy bandwidth;
  2. loads one Engine, attaches telemetry, warms every mode up on the real prompts (a few tokens, not timed);
  3. loads the same weights once more for transformers' `generate_batch` (sdpa) and warms each variant up;
  4. runs every system once per repeat, the order reversed on every other repeat, on the same seeded prompts
     (`--prompt-tokens` random ids each, `--new-tokens` greedy tokens with EOS ignored, so lengths are fixed);
  5. writes the JSON (`--out`) and one batchscope.timeline/1 file per run next to it, and prints a table of medians.

This module imports only engine, telemetry, torch, transformers and tqdm, so it runs where the server's
packages (gradio, fastapi, ...) are not installed.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import gc
import hashlib
import json
import math
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

from batchscope.engine import Engine, EngineConfig, SamplingParams, StepTrace
from batchscope.engine.config import DTYPES, MODES

BENCH_SCHEMA = "batchscope.bench/1"
TF_VARIANTS = {"transformers-sync": False, "transformers-async": True}   # label -> use_async_batching
# per-run metrics; a run that could not measure one reports None (e.g. busy % without telemetry)
METRICS = ("wall_s", "output_tokens", "tokens_per_s", "decode_ms_per_step", "floor_ms_per_step", "floor_pct",
           "gpu_busy_pct", "nvml_util_pct", "speedup")


# ---------------------------------------------------------------------------------------------- command line

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m",
                   help="preset (smollm2-135m, tiny-random, llama3-8b-random), HF folder or hub id")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="auto", choices=DTYPES)
    p.add_argument("--requests", type=positive_int, default=32)
    p.add_argument("--prompt-tokens", type=positive_int, default=256, help="random token ids per prompt")
    p.add_argument("--new-tokens", type=positive_int, default=512, help="generated per request, EOS ignored")
    p.add_argument("--modes", type=_modes, default=list(MODES), help="comma-separated, e.g. sync,async")
    p.add_argument("--baseline", default="none", choices=["none", "transformers"],
                   help="also time transformers' continuous batching (generate_batch, async off and on)")
    p.add_argument("--repeats", type=positive_int, default=1,
                   help="timed rounds; the order reverses every other round; the table shows medians")
    p.add_argument("--seed", type=int, default=0, help="seeds the prompts and the random presets' weights")
    p.add_argument("--warmup-tokens", type=positive_int, default=8, help="new tokens of the untimed warm-up")
    p.add_argument("--max-batch-tokens", type=positive_int, default=None,
                   help="per-step token budget, for both systems (default: enough to prefill all prompts at "
                        "once, between 2048 and 8192)")
    p.add_argument("--num-blocks", type=positive_int, default=None,
                   help="batchscope KV blocks (default: exactly enough for the workload, plus one per request)")
    p.add_argument("--bandwidth-mib", type=positive_int, default=None,
                   help="size of the copy that measures bandwidth (default: 1024 on CUDA, 128 on CPU)")
    p.add_argument("--no-telemetry", action="store_true",
                   help="run batchscope with no observer attached: wall and tokens/s only, no timelines")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--out", default="bench.json", help="results JSON; timelines go next to it")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="batchscope bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(p)
    return p


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise argparse.ArgumentTypeError(f"modes are a comma-separated subset of {','.join(MODES)}, got {text!r}")
    return list(dict.fromkeys(modes))


def _complete(args) -> argparse.Namespace:
    """Fill what another parser (app/cli.py) did not define with our defaults, and normalise a few values."""
    defaults = vars(build_parser().parse_args([]))
    ns = argparse.Namespace(**{**defaults, **{k: v for k, v in vars(args).items() if v is not None}})
    if isinstance(ns.modes, str):
        ns.modes = _modes(ns.modes)
    if ns.baseline in (None, "none"):
        ns.baseline = None
    return ns


def _say(msg: str) -> None:
    print(f"batchscope bench: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- measurements

def measure_bandwidth(device: torch.device, mib: int | None = None, trials: int = 5) -> dict:
    """Copy bandwidth in GB/s (1e9 B/s), counting bytes read plus bytes written: the rate a memory-bound decode
    step can at best stream its weights and KV. CUDA: a same-dtype contiguous copy (a device-to-device memcpy)
    timed with CUDA events. CPU: the same copy timed with the host clock. The median of `trials` is reported."""
    cuda = device.type == "cuda"
    nbytes = (mib or (1024 if cuda else 128)) * 2**20
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    iters = 10 if cuda else 3
    for _ in range(3):                   # first touches page in memory and warm the copy engine
        dst.copy_(src)
    times_ms = []
    for _ in range(trials):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                dst.copy_(src)
            end.record()
            end.synchronize()
            times_ms.append(start.elapsed_time(end) / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                dst.copy_(src)
            times_ms.append((time.perf_counter() - t0) * 1e3 / iters)
    ms = statistics.median(times_ms)
    del src, dst
    if cuda:
        torch.cuda.empty_cache()
    moved = 2 * nbytes
    return {"gbps": round(moved / (ms * 1e-3) / 1e9, 2), "bytes_moved": moved, "ms_per_copy": round(ms, 4),
            "trials": trials, "method": "cuda events, device-to-device copy" if cuda else "host clock, tensor copy"}


def make_prompts(requests: int, prompt_tokens: int, vocab: int, seed: int) -> list[list[int]]:
    """Random token ids, the same for every run of a given seed."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(prompt_tokens)] for _ in range(requests)]


def decode_floor(info: dict, requests: int, prompt_tokens: int, new_tokens: int, gbps: float) -> dict:
    """The fastest a decode step of this workload could run if it only had to stream its bytes once: weights
    (minus the embedding table) plus every request's KV, over the copy bandwidth. Lengths are fixed, so the mean
    context of a decode step is known exactly: the step producing token j (j = 2..new) reads prompt + j - 1
    positions, whose mean over the decode is prompt + new/2."""
    if new_tokens < 2 or not gbps:
        return {"mean_context_tokens": None, "bytes_per_step": None, "ms_per_step": None}
    context = requests * (prompt_tokens + new_tokens / 2)
    nbytes = info["weight_bytes"] + info["kv_bytes_per_token"] * context
    return {"mean_context_tokens": context, "bytes_per_step": int(nbytes),
            "ms_per_step": round(nbytes / (gbps * 1e9) * 1e3, 4)}


# ---------------------------------------------------------------------------------------------- batchscope runs

class BatchscopeRunner:
    """One Engine for the whole benchmark; modes switch between runs. Telemetry records each run by name."""

    def __init__(self, config: EngineConfig, telemetry: bool, bandwidth_gbps: float, progress: bool):
        self.engine = Engine(config)
        self.progress = progress
        self.tel = None
        if telemetry:
            from batchscope.telemetry import Telemetry
            self.tel = Telemetry(self.engine, bandwidth_gbps=bandwidth_gbps)

    def set_mode(self, mode: str) -> None:
        self.engine.set_mode(mode)
        # the switch happens at the engine thread's next loop turn; an idle engine gets there within
        # microseconds of the wakeup, and the steps' own mode is checked after each run
        time.sleep(0.1)

    def warm_up(self, mode: str, prompts, tokens: int) -> None:
        self.set_mode(mode)
        self.engine.generate(prompts, SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True))

    def run(self, mode: str, label: str, prompts, new_tokens: int) -> tuple[dict, dict | None]:
        """One timed run. Returns (metrics, timeline or None)."""
        self.set_mode(mode)
        params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        expected = len(prompts) * new_tokens
        if self.tel is not None:
            self.tel.start_recording(label)
        with _progress(label, expected, self.progress, self.engine, counted=self.tel is not None):
            t0 = time.perf_counter()
            outs = self.engine.generate(prompts, params)
            call_s = time.perf_counter() - t0
        # the engine-side span, as for transformers below: first arrival to last finish
        wall_s = (max(o.finish_ns for o in outs) - min(o.arrival_ns for o in outs)) / 1e9
        lengths = [len(o.token_ids) for o in outs]
        m = {**dict.fromkeys(METRICS), "system": "batchscope", "mode": mode, "wall_s": wall_s, "call_s": call_s,
             "output_tokens": sum(lengths), "expected_tokens": expected,
             "lengths_ok": all(n == new_tokens for n in lengths),
             "finish_reasons": _count(o.finish_reason for o in outs),
             "errors": [o.error for o in outs if o.error],
             "tokens_per_s": sum(lengths) / wall_s if wall_s > 0 else None,
             "token_ids": [o.token_ids for o in outs]}
        timeline = None
        if self.tel is not None:
            self.tel.stop_recording()
            timeline = self.tel.timeline(label)
            m.update(_decode_metrics(timeline, self.tel.bandwidth_gbps))
        return m, timeline

    def close(self) -> None:
        if self.tel is not None:
            self.tel.close()
        self.engine.close()


def _decode_metrics(timeline: dict, bandwidth_gbps: float) -> dict:
    """Step metrics over the decode window: from the first decode-only step's compute start to the last step's
    compute end (prefill and the idle tail excluded). ms/step is the median period between consecutive decode
    steps' compute starts, which is what a user waits per token."""
    from batchscope.telemetry import summarize

    steps = timeline["steps"]
    decode = [r for r in steps if r["prefill_tokens"] == 0 and r["decode_tokens"] > 0 and r.get("compute_us")]
    whole = timeline["summary"]
    out = {"steps": whole.get("steps"), "step_modes": whole.get("modes"),
           "telemetry_floor_ms_per_step": whole.get("floor_ms_per_step")}
    if not decode:
        return {**out, "decode_ms_per_step": None, "gpu_busy_pct": None, "busy_basis": None,
                "nvml_util_pct": whole.get("gpu_util_mean"), "host_cpu_pct": whole.get("cpu_pct_mean")}
    t0, t1 = decode[0]["compute_us"][0], max(r["compute_us"][1] for r in decode)
    s = summarize(steps, timeline["requests"], timeline["nvml"], timeline["meta"].get("info"), bandwidth_gbps,
                  t0, t1)
    # a short window may hold no NVML sample (they come every 50 ms): fall back to the whole run's
    util = s.get("gpu_util_mean") if s.get("nvml_samples") else whole.get("gpu_util_mean")
    cpu = s.get("cpu_pct_mean") if s.get("nvml_samples") else whole.get("cpu_pct_mean")
    return {**out, "decode_steps": len(decode), "decode_ms_per_step": s.get("decode_ms_p50"),
            "decode_ms_basis": "median period between decode steps' compute starts (step records)",
            "decode_window_s": round((t1 - t0) / 1e6, 6), "gpu_busy_pct": s.get("busy_pct"),
            "busy_basis": s.get("busy_basis"), "nvml_util_pct": util, "host_cpu_pct": cpu,
            "itl_ms_p50": (whole.get("itl_ms") or {}).get("p50")}


# ---------------------------------------------------------------------------------------------- transformers runs

class TransformersRunner:
    """transformers' own continuous batching (`generate_batch`) on the same weights, attention "sdpa".
    Its options go in a ContinuousBatchingConfig: options passed to generate_batch directly are ignored."""

    def __init__(self, config: EngineConfig, max_batch_tokens: int, tokens_per_request: int, requests: int,
                 progress: bool, engine_model: torch.nn.Module):
        import transformers
        from transformers import ContinuousBatchingConfig, GenerationConfig

        from batchscope.engine.models import load_model

        self.version = transformers.__version__
        self.model = load_model(config, "sdpa").model
        # the same config and seed must give the very weights the engine runs, or the comparison is void
        theirs = dict(engine_model.named_parameters())
        self.same_weights = all(n in theirs and torch.equal(p, theirs[n]) for n, p in self.model.named_parameters())
        self.cuda = self.model.device.type == "cuda"
        self.progress = progress
        self._GenerationConfig = GenerationConfig
        self._cb_config = ContinuousBatchingConfig
        fields = {f.name: f for f in dataclasses.fields(ContinuousBatchingConfig)}
        self._fields = set(fields)
        # a block holds `page_size` (>= 5.17) or `block_size` (older) tokens of every layer
        size = next((fields[n].default for n in ("page_size", "block_size")
                     if n in fields and isinstance(fields[n].default, int)), 256)
        self.num_blocks = requests * (math.ceil(tokens_per_request / size) + 1)
        self.max_batch_tokens = max_batch_tokens

    def skip_reason(self, label: str) -> str | None:
        if TF_VARIANTS[label] and "use_async_batching" not in self._fields:
            return f"transformers {self.version} has no use_async_batching"
        if TF_VARIANTS[label] and not self.cuda:
            return "transformers' async batching needs a CUDA (or XPU) device"
        return None

    def _configs(self, label: str, new_tokens: int):
        want = {"num_blocks": self.num_blocks, "max_batch_tokens": self.max_batch_tokens,
                "use_cuda_graph": self.cuda,                     # graphs exist only on CUDA
                "use_async_batching": TF_VARIANTS[label],
                "auto_switch_to_flash": False}                   # stay on sdpa, as documented
        cb = self._cb_config(**{k: v for k, v in want.items() if k in self._fields})
        # eos_token_id=-1 can never be sampled: every request produces exactly max_new_tokens
        gen = self._GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
        return gen, cb

    def run(self, label: str, prompts, new_tokens: int) -> dict:
        gen, cb = self._configs(label, new_tokens)
        t0 = time.perf_counter()
        out = self.model.generate_batch(inputs=prompts, generation_config=gen, continuous_batching_config=cb,
                                        record_timestamps=True, progress_bar=self.progress)
        call_s = time.perf_counter() - t0
        outs = list(out.values())
        lengths = [len(o.generated_tokens) for o in outs]
        # the requests' own span (first created to last finished) leaves out the manager's set-up and CUDA
        # graph capture, which generate_batch redoes on every call; call_s keeps the whole call
        finishes = [o.lifespan[1] for o in outs if o.lifespan and o.lifespan[1] > 0]
        created = [o.created_time for o in outs]
        wall_s = (max(finishes) - min(created)) if outs and len(finishes) == len(outs) else call_s
        # in continuous batching all requests decode in the same step, so the median gap between a request's
        # consecutive tokens is the decode step period
        gaps = [(b - a) * 1e3 for o in outs for a, b in zip(o.timestamps or [], (o.timestamps or [])[1:])]
        stamps = [t for o in outs for t in (o.timestamps or [])[1:]]
        mode = "async" if TF_VARIANTS[label] else "sync"
        return {**dict.fromkeys(METRICS), "system": "transformers", "mode": mode,
                "wall_s": wall_s, "call_s": call_s, "output_tokens": sum(lengths),
                "expected_tokens": len(prompts) * new_tokens,
                "lengths_ok": len(outs) == len(prompts) and all(n == new_tokens for n in lengths),
                "errors": [str(o.error) for o in outs if o.error is not None],
                "tokens_per_s": sum(lengths) / wall_s if wall_s > 0 else None,
                "decode_ms_per_step": statistics.median(gaps) if gaps else None,
                "decode_ms_basis": "median gap between a request's consecutive token timestamps",
                "decode_window": (min(stamps), max(stamps)) if stamps else None,
                "token_ids": [list(o.generated_tokens) for o in outs]}

    def close(self) -> None:
        self.model = None
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()


def _nvml_window(tel, label: str, window) -> tuple[dict, dict]:
    """NVML utilization (and host CPU %) over a transformers run, from the samples telemetry's sampler took while
    it ran (recorded under `label`), and that recording's timeline. `window` is the (first, last) decode token
    time in perf_counter seconds; recording times are µs since the recording started."""
    timeline = tel.timeline(label)
    samples = timeline["nvml"]
    if window is not None:
        lo = window[0] * 1e6 - tel.origin_ns / 1e3 - timeline["meta"]["origin"]["session_offset_us"]
        hi = lo + (window[1] - window[0]) * 1e6
        inside = [s for s in samples if lo <= s["t_us"] <= hi]
        samples = inside or samples
    return {"nvml_util_pct": _mean(s.get("gpu_util") for s in samples),
            "host_cpu_pct": _mean(s.get("cpu_pct") for s in samples)}, timeline


# ---------------------------------------------------------------------------------------------- the benchmark

def plan_order(labels: list[str], repeats: int) -> list[tuple[int, str]]:
    """(repeat, label) in run order: forward on even repeats, reversed on odd ones, so no system always goes
    first (or always runs on a GPU warmed by the one before)."""
    return [(r, label) for r in range(repeats) for label in (labels if r % 2 == 0 else labels[::-1])]


def default_max_batch_tokens(requests: int, prompt_tokens: int) -> int:
    """Enough to prefill every prompt in one step (plus decodes), kept within [2048, 8192]."""
    return min(max(2048, requests * (prompt_tokens + 1)), 8192)


def run_benchmark(args) -> dict:
    args = _complete(args)
    from batchscope.engine.models import resolve_device

    device = resolve_device(args.device)
    show = not args.no_progress
    _say(f"measuring copy bandwidth on {device}")
    bandwidth = measure_bandwidth(device, args.bandwidth_mib)
    _say(f"copy bandwidth {bandwidth['gbps']:.1f} GB/s (read + write)")

    per_request = args.prompt_tokens + args.new_tokens
    block_size = EngineConfig.block_size
    max_batch_tokens = args.max_batch_tokens or default_max_batch_tokens(args.requests, args.prompt_tokens)
    num_blocks = args.num_blocks or args.requests * (math.ceil(per_request / block_size) + 1)
    config = EngineConfig(model=args.model, device=args.device, dtype=args.dtype, mode=args.modes[0],
                          block_size=block_size, num_blocks=num_blocks, max_batch_tokens=max_batch_tokens,
                          max_running=args.requests, seed=args.seed).validate()
    _say(f"loading {args.model} on {device}")
    bs = BatchscopeRunner(config, not args.no_telemetry, bandwidth["gbps"], show)
    tf = None
    try:
        info = bs.engine.info
        if per_request > info["max_model_len"]:
            raise ValueError(f"prompt + new tokens ({per_request}) exceed the model's {info['max_model_len']}")
        prompts = make_prompts(args.requests, args.prompt_tokens, info["vocab_size"], args.seed)
        floor = decode_floor(info, args.requests, args.prompt_tokens, args.new_tokens, bandwidth["gbps"])
        labels = list(args.modes)
        skipped = {}
        if args.baseline == "transformers":
            _say("loading the same weights for transformers' generate_batch (sdpa)")
            tf = TransformersRunner(config, max_batch_tokens, per_request, args.requests, show, bs.engine.model)
            if not tf.same_weights:
                _say("warning: transformers' copy of the model has different weights from the engine's")
            for label in TF_VARIANTS:
                reason = tf.skip_reason(label)
                if reason:
                    skipped[label] = reason
                    _say(f"skipping {label}: {reason}")
                else:
                    labels.append(label)

        warm = min(args.warmup_tokens, args.new_tokens)
        _say(f"warming up ({warm} new tokens per request, not timed): {', '.join(labels)}")
        for label in labels:
            if label in MODES:
                bs.warm_up(label, prompts, warm)
            else:
                tf.run(label, prompts, warm)

        runs = []
        order = plan_order(labels, args.repeats)
        for i, (rep, label) in enumerate(order):
            _say(f"run {i + 1}/{len(order)}: {label}" + (f" (repeat {rep + 1})" if args.repeats > 1 else ""))
            name = label if args.repeats == 1 else f"{label}.r{rep + 1}"
            if label in MODES:
                m, timeline = bs.run(label, name, prompts, args.new_tokens)
            else:
                if bs.tel is not None:       # the sampler keeps sampling NVML while transformers runs
                    bs.tel.start_recording(name)
                m = tf.run(label, prompts, args.new_tokens)
                timeline = None
                if bs.tel is not None:
                    bs.tel.stop_recording()
                    nv, timeline = _nvml_window(bs.tel, name, m.pop("decode_window"))
                    m.update(nv)
                else:
                    m.pop("decode_window")
            m.update(label=label, repeat=rep, floor_ms_per_step=floor["ms_per_step"])
            if timeline is not None:
                m["timeline"] = str(_write_json(_timeline_path(args.out, name), timeline))
            runs.append(m)

        result = _assemble(args, bandwidth, floor, info, config, runs, skipped, order, tf)
    finally:
        if tf is not None:
            tf.close()
        bs.close()
    return result


def _assemble(args, bandwidth, floor, info, config, runs, skipped, order, tf) -> dict:
    """Per-run metrics plus medians per label, floor % and speedups, token agreement, and the set-up."""
    reference = runs[0]["token_ids"]     # the first timed run, for the agreement check
    for m in runs:
        same = sum(a == b for a, b in zip(m["token_ids"], reference))
        m["tokens_agree_with_first_run"] = same / len(reference) if reference else None
        m["tokens_digest"] = _digest(m["token_ids"])
    results = {}
    for label in dict.fromkeys(m["label"] for m in runs):
        mine = [m for m in runs if m["label"] == label]
        med = {k: _median(m.get(k) for m in mine) for k in METRICS if k != "speedup"}
        med.update(system=mine[0]["system"], mode=mine[0]["mode"], repeats=len(mine),
                   lengths_ok=all(m["lengths_ok"] for m in mine))
        results[label] = med
    for m in list(runs) + list(results.values()):
        ms, fl = m.get("decode_ms_per_step"), m.get("floor_ms_per_step")
        # % of floor: the share of the bandwidth limit reached (100 = a step as fast as streaming its bytes once)
        m["floor_pct"] = round(100.0 * fl / ms, 2) if ms and fl else None
    slowest = max(results, key=lambda k: results[k]["wall_s"])
    for label, med in results.items():
        med["speedup"] = results[slowest]["wall_s"] / med["wall_s"] if med["wall_s"] else None
    for m in runs:
        m["speedup"] = results[slowest]["wall_s"] / m["wall_s"] if m["wall_s"] else None
        m.pop("token_ids")
    return {
        "schema": BENCH_SCHEMA,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "args": {k: v for k, v in vars(args).items() if k != "func"},
        "device": info["device"], "gpu_name": info.get("gpu_name"),
        "versions": {"torch": torch.__version__, "transformers": _transformers_version(),
                     "cuda": torch.version.cuda},
        "engine_info": info, "engine_config": dataclasses.asdict(config),
        "transformers_config": {"num_blocks": tf.num_blocks, "max_batch_tokens": tf.max_batch_tokens,
                                "attn_implementation": "sdpa", "use_cuda_graph": tf.cuda,
                                "same_weights": tf.same_weights} if tf else None,
        "workload": {"requests": args.requests, "prompt_tokens": args.prompt_tokens,
                     "new_tokens": args.new_tokens, "seed": args.seed, "ignore_eos": True, "greedy": True,
                     "warmup_tokens": min(args.warmup_tokens, args.new_tokens)},
        "bandwidth": bandwidth, "floor": floor,
        "telemetry": not args.no_telemetry,
        "order": [label if args.repeats == 1 else f"{label}.r{rep + 1}" for rep, label in order],
        "speedup_vs": slowest,
        "results": results, "runs": runs, "skipped": skipped,
        "notes": {
            "wall_s": "first request's arrival to last request's finish, inside each engine",
            "floor_pct": "floor_ms_per_step / decode_ms_per_step x 100 (100 = at the memory-bandwidth limit)",
            "gpu_busy_pct": "union of the decode steps' compute spans (CUDA events; host launch spans on CPU) "
                            "over the decode window; none for transformers, whose loop records no events",
            "nvml_util_pct": "NVML utilization: the share of a 1/6-1 s window in which any kernel ran; it cannot "
                             "see sub-millisecond gaps between steps",
        },
    }


def _timeline_path(out: str, name: str) -> Path:
    out = Path(out)
    return out.with_name(f"{out.stem}.{name}.timeline.json")


def _write_json(path: Path, obj) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, separators=(",", ":"))   # compact: a long run's timeline has tens of thousands of steps
    return path


def _transformers_version() -> str | None:
    try:
        import transformers
        return transformers.__version__
    except Exception:
        return None


# ---------------------------------------------------------------------------------------------- output

COLUMNS = (("run", None, "s"), ("wall s", "wall_s", ".2f"), ("out tok/s", "tokens_per_s", ".1f"),
           ("ms/step", "decode_ms_per_step", ".2f"), ("floor ms", "floor_ms_per_step", ".2f"),
           ("% of floor", "floor_pct", ".1f"), ("GPU busy %", "gpu_busy_pct", ".1f"),
           ("NVML util %", "nvml_util_pct", ".1f"), ("speedup", "speedup", ".2f"))


def format_table(result: dict) -> str:
    rows = [[h for h, _, _ in COLUMNS]]
    for label, med in result["results"].items():
        name = label if med.get("lengths_ok", True) else f"{label} (LENGTHS WRONG)"
        rows.append([name] + [("-" if med.get(k) is None else format(med[k], f)) for _, k, f in COLUMNS[1:]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    w = result["workload"]
    repeats = max(m["repeats"] for m in result["results"].values())
    head = (f"{result['engine_info']['model']} on {result['gpu_name'] or result['device']}: {w['requests']} requests"
            f" x {w['prompt_tokens']} prompt + {w['new_tokens']} new tokens; copy bandwidth "
            f"{result['bandwidth']['gbps']:.1f} GB/s; medians of {repeats} run(s); speedup vs {result['speedup_vs']}")
    tail = [f"skipped {k}: {v}" for k, v in result["skipped"].items()]
    if not result["telemetry"]:
        tail.append("telemetry off: batchscope's ms/step, busy % and NVML are not measured")
    return "\n".join([head, ""] + lines + ([""] + tail if tail else []))


class _progress:
    """A tqdm bar over a batchscope run. With telemetry on, an observer counts the tokens each step delivers;
    with it off (no observer may be attached) a thread polls the engine's step counter instead."""

    def __init__(self, label: str, total_tokens: int, enabled: bool, engine, counted: bool):
        self.enabled, self.engine, self.counted = enabled, engine, counted
        self.label, self.total = label, total_tokens
        self.done = threading.Event()

    def __enter__(self):
        if not self.enabled:
            return self
        from tqdm import tqdm

        if self.counted:
            self.bar = tqdm(total=self.total, desc=self.label, unit="tok", leave=False)
            self.engine.add_observer(self._observe)
        else:
            self.bar = tqdm(desc=f"{self.label} (steps)", unit="step", leave=False)
            threading.Thread(target=self._poll, daemon=True).start()
        return self

    def _observe(self, event) -> None:
        if isinstance(event, StepTrace):
            self.bar.update(sum(n for _, n in event.tokens))

    def _poll(self) -> None:
        first = self.engine.stats()["steps"]
        while not self.done.wait(0.5):
            self.bar.update(self.engine.stats()["steps"] - first - self.bar.n)

    def __exit__(self, *exc):
        if not self.enabled:
            return
        self.done.set()
        if self.counted:
            self.engine.remove_observer(self._observe)
        self.bar.close()


def _count(items) -> dict:
    out: dict = {}
    for x in items:
        out[str(x)] = out.get(str(x), 0) + 1
    return out


def _mean(values):
    vals = [v for v in values if v is not None]
    return round(sum(vals) / len(vals), 2) if vals else None


def _median(values):
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _digest(token_ids: list[list[int]]) -> str:
    """One short fingerprint of every output token of a run, in request order."""
    return hashlib.sha256(json.dumps(token_ids, separators=(",", ":")).encode()).hexdigest()[:16]


def disagreeing_runs(result: dict) -> list[str]:
    """batchscope's own runs that gave other tokens than its first: the same prompts, greedy, must give the same
    tokens run after run and mode after mode."""
    ours = [r for r in result["runs"] if r["system"] == "batchscope"]
    return [f"{r['label']}#{r['repeat']}" for r in ours if r["tokens_digest"] != ours[0]["tokens_digest"]]


def main(args=None) -> int:
    """Entry point for `batchscope bench` (app/cli.py passes its Namespace) and for `python -m batchscope.app.bench`."""
    if args is None or isinstance(args, (list, tuple)):
        args = build_parser().parse_args(args)
    args = _complete(args)
    try:
        result = run_benchmark(args)
    except (ValueError, MemoryError) as exc:     # ConfigError is a ValueError: a bad setting, said plainly
        _say(f"error: {exc}")
        return 2
    _write_json(Path(args.out), result)
    _say(f"wrote {args.out}" + ("" if result["telemetry"] else " (no timelines: telemetry off)"))
    bad = [k for k, m in result["results"].items() if not m["lengths_ok"]]
    print(format_table(result), flush=True)
    if bad:
        _say(f"outputs of {', '.join(bad)} did not have the requested lengths")
        return 1
    differ = disagreeing_runs(result)
    if differ:
        _say(f"runs {', '.join(differ)} gave other tokens than the first batchscope run (tokens_digest)")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
