"""Evidence for telemetry's done-criteria, measured on a GPU in one run (about three minutes on an H200).

    python benchmarks/telemetry_gpu_check.py                       # llama3-8b-random on cuda, bf16
    python benchmarks/telemetry_gpu_check.py --model tiny-random --device cpu --requests 4 --new-tokens 8

1. profile   GPU spans vs torch.profiler: the engine runs the same steps (async, then sync) with telemetry
             attached under torch.profiler; each launch is wrapped in record_function("batchscope.step.N"), so
             kernels map to steps through their launching runtime call's correlation id (CUDA graph replays:
             every kernel of a graph shares the cudaGraphLaunch's id). Per step, the profiler's compute span
             [first start, last end of the step's work on the compute stream] is set against the step record's
             compute span after one global clock offset (the median start difference), and again after the
             offset the two clocks predict (a perf_counter/wall-clock pair; it owes nothing to the spans). For
             graph replays it also reports how long the host's cudaGraphLaunch call took and when the first
             kernel ran: under CUPTI a graph launched onto an idle GPU (sync) runs its own start event at the
             start of that call and its first kernel at its end.
2. overhead  telemetry on vs off: runs in ABBA order (off, on, on, off, ...) of a fixed workload; decode tokens/s
             from the requests' own first-token and finish times (no observer needed); the verdict is on the
             median of each neighbouring pair's change.
3. idle      gpu_idle_before_us of decode steps in sync and async, idle time by cause, event busy %, and the
             decode compute span in each mode without a profiler (a graph's span must not depend on whether it
             was launched onto an idle GPU).
4. nvml      NVML gpu_util over each run of (3) beside the event-based busy % of the same window.

Sections run in the order 2, 3+4, 1 (the profiler last, so its CUPTI state cannot touch the other timings); a
failing section prints its traceback and the others still report. Output: a compact report on stdout (last),
$OUT/telemetry_check.json (every number), $OUT/{async,sync}.timeline.json (telemetry's exports of the runs of
3) and $OUT/async.profile.json.gz (the profiler's chrome trace of the async run, kept when under 10 MB).
Sections that need CUDA report SKIPPED on a CPU, after running what they can (the plumbing).
"""
from __future__ import annotations

import argparse
import bisect
import gzip
import json
import os
import random
import shutil
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batchscope.engine import Engine, EngineConfig, SamplingParams
from batchscope.telemetry import Telemetry, summarize

LIMIT_US = 20.0              # criterion 1: spans agree within 20 µs (p99)
OVERHEAD_PCT = 1.0           # criterion 2: telemetry costs at most 1% of decode throughput
ASYNC_IDLE_US = 20.0         # criterion 3: async decode steps idle at most this long (median)
SYNC_IDLE_US = 100.0         # ... while sync decode steps show a seesaw of at least this (median)
STEP_PREFIX = "batchscope.step."
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime", "driver"}
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}
PROFILE_KEEP_BYTES = 10 * 2**20
SECTIONS = ("overhead", "idle", "nvml", "profile")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama3-8b-random")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="auto", help="auto: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=96, help="per request in the profiled runs (1)")
    p.add_argument("--overhead-tokens", type=int, default=None,
                   help="per request in the on/off runs (2); default 256 on CUDA, 2 x --new-tokens elsewhere")
    p.add_argument("--window-tokens", type=int, default=None,
                   help="per request in the idle/NVML runs (3, 4); default 384 on CUDA, 2 x --new-tokens elsewhere")
    p.add_argument("--pairs", type=int, default=3, help="off/on pairs per mode in (2)")
    p.add_argument("--overhead-modes", default="async,sync")
    p.add_argument("--num-blocks", type=int, default=4096)
    p.add_argument("--max-batch-tokens", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-cuda-graphs", action="store_true",
                   help="eager decode steps (under CUPTI, a graph launched onto an idle GPU starts late: see (1))")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"subset of {','.join(SECTIONS)}")
    p.add_argument("--budget-s", type=float, default=210.0,
                   help="(2) starts no new pair past half of this many seconds since start")
    p.add_argument("--out", default=None, help="output folder (default: $OUT, else ./out)")
    args = p.parse_args(argv)
    cuda = args.device.startswith("cuda")
    args.overhead_tokens = args.overhead_tokens or (256 if cuda else 2 * args.new_tokens)
    args.window_tokens = args.window_tokens or (384 if cuda else 2 * args.new_tokens)
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        p.error(f"unknown sections {sorted(unknown)}; known: {SECTIONS}")
    return args


# ------------------------------------------------------------------------------------------------ small helpers

def rnd(x, nd: int = 2):
    return None if x is None else round(float(x), nd)


def dist(values, limit: float | None = LIMIT_US) -> dict:
    """p50/p99/max of |values| and the share within `limit`."""
    v = np.abs(np.asarray([x for x in values if x is not None], dtype=float))
    if not v.size:
        return {"n": 0}
    out = {"n": int(v.size), "p50": rnd(np.percentile(v, 50)), "p99": rnd(np.percentile(v, 99)),
           "max": rnd(v.max())}
    if limit is not None:
        out["within_pct"] = rnd(100.0 * np.mean(v <= limit), 1)
    return out


def pcts(values) -> dict:
    v = np.asarray([x for x in values if x is not None], dtype=float)
    if not v.size:
        return {"n": 0, "p50": None, "p90": None, "mean": None, "max": None}
    return {"n": int(v.size), "p50": rnd(np.percentile(v, 50), 1), "p90": rnd(np.percentile(v, 90), 1),
            "mean": rnd(v.mean(), 1), "max": rnd(v.max(), 1)}


def is_decode(rec: dict) -> bool:
    return rec["prefill_tokens"] == 0 and rec["decode_tokens"] > 0


def versions() -> dict:
    out = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("transformers", "triton", "pynvml"):
        try:
            out[name] = getattr(__import__(name), "__version__", "present")
        except Exception:
            out[name] = None
    return out


# ------------------------------------------------------------------------------------------------ the workload

class Workload:
    """One engine for the whole check; every run is `requests` random prompts, greedy, EOS ignored."""

    def __init__(self, args):
        self.args = args
        config = EngineConfig(model=args.model, device=args.device, dtype=args.dtype, mode="async",
                              num_blocks=args.num_blocks, max_batch_tokens=args.max_batch_tokens,
                              max_running=args.requests, seed=args.seed, cuda_graphs=not args.no_cuda_graphs)
        self.engine = Engine(config)
        self.cuda = self.engine.device.type == "cuda"
        vocab = self.engine.info["vocab_size"]
        rng = random.Random(args.seed)
        self.prompts = [[rng.randrange(vocab) for _ in range(args.prompt_tokens)] for _ in range(args.requests)]

    def set_mode(self, mode: str) -> None:
        self.engine.set_mode(mode)
        time.sleep(0.05)       # the idle loop switches at its next turn

    def run(self, mode: str, new_tokens: int) -> dict:
        """One run; throughput from the requests' own engine-side times, so it needs no observer."""
        self.set_mode(mode)
        params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        outs = self.engine.generate(self.prompts, params)
        errors = [o.error for o in outs if o.error]
        if errors:
            raise RuntimeError(f"{len(errors)} requests failed, first: {errors[0]}")
        tokens = sum(len(o.token_ids) for o in outs)
        arrival = min(o.arrival_ns for o in outs)
        first = max(o.first_token_ns for o in outs)      # every request has its first token (prefill done)
        last = max(o.finish_ns for o in outs)
        decode_s = (last - first) / 1e9
        return {"mode": mode, "tokens": tokens, "lengths_ok": all(len(o.token_ids) == new_tokens for o in outs),
                "wall_s": rnd((last - arrival) / 1e9, 4), "decode_s": rnd(decode_s, 4),
                "decode_tok_s": rnd((tokens - len(outs)) / decode_s, 1) if decode_s > 0 else None}


class Check:
    def __init__(self, args, out: Path):
        self.args, self.out = args, out
        self.t0 = time.perf_counter()
        self.work: Workload | None = None
        self.tel: Telemetry | None = None       # shared by sections 1, 3, 4 (section 2 makes its own)
        self.windows: dict = {}                  # mode -> timeline of the runs of (3), shared with (4)
        self.result = {"schema": "batchscope.telemetry_check/1", "command": " ".join(sys.argv),
                       "args": {k: v for k, v in vars(args).items()}, "versions": versions(), "sections": {}}

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def say(self, msg: str) -> None:
        print(f"[{self.elapsed():6.1f}s] {msg}", file=sys.stderr, flush=True)

    def telemetry(self) -> Telemetry:
        if self.tel is None:
            self.tel = Telemetry(self.work.engine)
        return self.tel

    def section(self, name: str, fn) -> None:
        start = time.perf_counter()
        self.say(f"section {name}")
        try:
            res = fn(self)
        except Exception as exc:
            traceback.print_exc()
            res = {"status": "ERROR", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        res["seconds"] = rnd(time.perf_counter() - start, 1)
        self.result["sections"][name] = res
        self.save()

    def save(self) -> None:
        self.result["elapsed_s"] = rnd(self.elapsed(), 1)
        path = self.out / "telemetry_check.json"
        path.write_text(json.dumps(self.result, indent=1, default=str))

    def close(self) -> None:
        if self.tel is not None:
            self.tel.close()
        if self.work is not None:
            self.work.engine.close()


def setup(ck: Check) -> dict:
    args = ck.args
    ck.say(f"loading {args.model} on {args.device}")
    ck.work = Workload(args)
    info = ck.work.engine.info
    ck.say("warming up both modes (not timed)")
    for mode in ("async", "sync", "async"):
        ck.work.run(mode, 8)
    keys = ("model", "device", "dtype", "gpu_name", "attention", "cuda_graphs", "num_blocks", "max_batch_tokens",
            "max_running", "num_layers")
    return {"status": "ok", "info": {k: info.get(k) for k in keys}}


# ------------------------------------------------------------------------------------------------ (2) overhead

def section_overhead(ck: Check) -> dict:
    args, work = ck.args, ck.work
    modes = [m.strip() for m in args.overhead_modes.split(",") if m.strip()]
    res = {"status": "ok",
           "workload": f"{args.requests} x {args.prompt_tokens} prompt x {args.overhead_tokens} new",
           "metric": "decode tokens/s = (tokens - first tokens) / (last finish - last first token); runs in "
                     "ABBA order; verdict on the median of each pair's change (medians of each side beside it)",
           "note": "off = no Telemetry object at all (no observer, sampler or hub); the engine's CUDA events "
                   "are recorded either way", "modes": {}}
    for mode in modes:
        try:
            res["modes"][mode] = overhead_mode(ck, mode, res)
        except Exception as exc:
            traceback.print_exc()
            res["modes"][mode] = {"verdict": "ERROR", "error": f"{type(exc).__name__}: {exc}",
                                  "traceback": traceback.format_exc()}
    verdicts = [m["verdict"] for m in res["modes"].values()]
    res["verdict"] = "FAIL" if "FAIL" in verdicts else "ERROR" if "ERROR" in verdicts else "PASS"
    if not work.cuda:
        res["verdict"] = f"SKIPPED (ran on {work.engine.device}: not evidence for a GPU)"
    return res


def overhead_mode(ck: Check, mode: str, res: dict) -> dict:
    """Alternating off/on runs in one mode (a warm-up run first); medians and the change."""
    args, work = ck.args, ck.work
    work.run(mode, 16)                   # settle in this mode
    runs = []
    for pair in range(max(1, args.pairs)):
        if pair and ck.elapsed() > args.budget_s / 2:
            res["budget_note"] = f"stopped after {pair} pairs in {mode} (time budget)"
            break
        for on in ((False, True) if pair % 2 == 0 else (True, False)):   # ABBA: a steady drift cancels
            tel = Telemetry(work.engine) if on else None
            try:
                if tel:
                    tel.start_recording("overhead")
                run = work.run(mode, args.overhead_tokens)
                if tel:
                    summary = tel.stop_recording()
                    status = tel.status()
                    run.update(observer_us_mean=status["observer_us_mean"],
                               observer_us_max=status["observer_us_max"],
                               idle_telemetry_us=summary.get("idle_us_by_cause", {}).get("telemetry", 0.0),
                               steps=summary.get("steps"))
            finally:
                if tel:
                    tel.close()
            run["telemetry"] = on
            runs.append(run)
            ck.say(f"  {mode} telemetry {'on ' if on else 'off'}: {run['decode_tok_s']} decode tok/s")
    off = [r["decode_tok_s"] for r in runs if not r["telemetry"]]
    on = [r["decode_tok_s"] for r in runs if r["telemetry"]]
    off_med, on_med = float(np.median(off)), float(np.median(on))
    change = 100.0 * (on_med - off_med) / off_med
    # each on-run against the off-run next to it: the host and the GPU clocks drift by several % over a minute,
    # far more than telemetry's cost, and neighbours share most of that drift
    pairs = [sorted(runs[i:i + 2], key=lambda r: not r["telemetry"]) for i in range(0, len(runs) - 1, 2)]
    paired = [100.0 * (on_run["decode_tok_s"] - off_run["decode_tok_s"]) / off_run["decode_tok_s"]
              for on_run, off_run in pairs]
    paired_change = float(np.median(paired))
    return {
        "off_tok_s": rnd(off_med, 1), "on_tok_s": rnd(on_med, 1), "change_pct": rnd(change, 3),
        "paired_change_pct": rnd(paired_change, 3), "paired_changes_pct": [rnd(v, 3) for v in paired],
        "off_spread_pct": rnd(100.0 * (max(off) - min(off)) / off_med, 3),
        "on_spread_pct": rnd(100.0 * (max(on) - min(on)) / on_med, 3),
        "off_wall_s": rnd(np.median([r["wall_s"] for r in runs if not r["telemetry"]]), 4),
        "on_wall_s": rnd(np.median([r["wall_s"] for r in runs if r["telemetry"]]), 4),
        "observer_us_mean": rnd(np.mean([r["observer_us_mean"] or 0 for r in runs if r["telemetry"]]), 1),
        "idle_telemetry_us_per_run": rnd(np.mean([r["idle_telemetry_us"] for r in runs if r["telemetry"]]), 1),
        "pairs": len(off), "verdict": "PASS" if -paired_change <= OVERHEAD_PCT else "FAIL", "runs": runs}


# ------------------------------------------------------------------------------------------------ (3) idle, (4) nvml

def window_runs(ck: Check) -> dict:
    """One telemetry-recorded run per mode (shared by sections 3 and 4); timelines are written to $OUT."""
    if ck.windows:
        return ck.windows
    tel = ck.telemetry()
    for mode in ("sync", "async"):
        tel.start_recording(mode)
        run = ck.work.run(mode, ck.args.window_tokens)
        tel.stop_recording()
        timeline = tel.timeline(mode)
        path = ck.out / f"{mode}.timeline.json"
        path.write_text(json.dumps(timeline, separators=(",", ":"), default=str))
        ck.windows[mode] = {"timeline": timeline, "run": run, "file": str(path),
                            "file_mb": rnd(path.stat().st_size / 2**20, 2)}
        ck.say(f"  {mode}: {run['decode_tok_s']} decode tok/s, timeline {path} "
               f"({ck.windows[mode]['file_mb']} MB)")
    return ck.windows


def decode_window(timeline: dict) -> tuple[list, float | None, float | None]:
    dec = [r for r in timeline["steps"] if is_decode(r) and r.get("compute_us")]
    if not dec:
        return dec, None, None
    return dec, dec[0]["compute_us"][0], max(r["compute_us"][1] for r in dec)


def window_summary(timeline: dict, t0, t1) -> dict:
    return summarize(timeline["steps"], timeline["requests"], timeline["nvml"], timeline["meta"].get("info"),
                     None, t0, t1)


def section_idle(ck: Check) -> dict:
    res = {"status": "ok", "workload": f"{ck.args.requests} x {ck.args.prompt_tokens} prompt x "
                                       f"{ck.args.window_tokens} new", "modes": {}}
    for mode, w in window_runs(ck).items():
        tl = w["timeline"]
        dec, t0, t1 = decode_window(tl)
        gaps = [r["gpu_idle_before_us"] for r in dec]
        causes: dict[str, float] = {}
        for r in dec:
            for cause, us in (r.get("idle_by_cause_us") or {}).items():
                causes[cause] = causes.get(cause, 0.0) + us
        total = sum(causes.values())
        dsum = window_summary(tl, t0, t1) if dec else {}
        res["modes"][mode] = {
            "decode_steps": len(dec), "steps": len(tl["steps"]),
            "step_modes": tl["summary"].get("modes"),
            "compute_basis": tl["summary"].get("busy_basis"),
            "gpu_idle_before_us": pcts(gaps),
            "idle_by_cause_us": {k: rnd(v, 1) for k, v in sorted(causes.items(), key=lambda kv: -kv[1])},
            "idle_by_cause_pct": {k: rnd(100.0 * v / total, 1) for k, v in sorted(causes.items(),
                                                                                  key=lambda kv: -kv[1])}
            if total else {},
            "idle_us_per_decode_step": rnd(total / len(dec), 1) if dec else None,
            # without a profiler: a graph's span should not depend on whether it was launched onto an idle GPU
            "compute_us": pcts([r["compute_us"][1] - r["compute_us"][0] for r in dec]),
            "host_launch_us": pcts([r["cpu"]["launch"][1] - r["cpu"]["launch"][0] for r in dec]),
            "busy_pct_run": tl["summary"].get("busy_pct"),
            "busy_pct_decode": dsum.get("busy_pct"),
            "decode_ms_p50": dsum.get("decode_ms_p50"),
            "decode_tok_s": w["run"]["decode_tok_s"],
            "timeline": w["file"], "timeline_mb": w["file_mb"]}
    spans = [res["modes"].get(m, {}).get("compute_us", {}).get("p50") for m in ("sync", "async")]
    if None not in spans:
        res["decode_compute_p50_sync_minus_async_us"] = rnd(spans[0] - spans[1], 1)
    a = res["modes"].get("async", {}).get("gpu_idle_before_us", {}).get("p50")
    s = res["modes"].get("sync", {}).get("gpu_idle_before_us", {}).get("p50")
    res["rule"] = f"async p50 <= {ASYNC_IDLE_US:g} us and sync p50 >= {SYNC_IDLE_US:g} us (decode steps)"
    if not ck.work.cuda:
        res["verdict"] = "SKIPPED (CPU: compute spans are host launch spans, no device to idle)"
    elif a is None or s is None:
        res["verdict"] = "FAIL (no decode steps)"
    else:
        res["verdict"] = "PASS" if a <= ASYNC_IDLE_US and s >= SYNC_IDLE_US else "FAIL"
    return res


def section_nvml(ck: Check) -> dict:
    status = ck.telemetry().status()
    res = {"status": "ok", "nvml": status["nvml"], "nvml_reason": status["nvml_reason"],
           "sampler_hz": status["sampler_hz"], "gpu": status["gpu_name"], "note": status["busy_note"], "modes": {}}
    for mode, w in window_runs(ck).items():
        tl = w["timeline"]
        _, d0, d1 = decode_window(tl)
        row = {}
        for label, (t0, t1) in (("run", (tl["summary"]["t0_us"], tl["summary"]["t1_us"])), ("decode", (d0, d1))):
            if t0 is None or t1 is None:
                continue
            s = window_summary(tl, t0, t1)
            fine = [v for x in tl["nvml"] for t, v in (x.get("fine") or []) if t0 <= t <= t1]
            row[label] = {"window_s": rnd((t1 - t0) / 1e6, 3), "nvml_gpu_util_mean": s.get("gpu_util_mean"),
                          "nvml_samples": s.get("nvml_samples"),
                          "driver_util_mean": rnd(np.mean(fine), 2) if fine else None,
                          "driver_samples": len(fine), "event_busy_pct": s.get("busy_pct"),
                          "event_busy_any_stream_pct": s.get("busy_pct_any_stream"),
                          "host_cpu_pct_mean": s.get("cpu_pct_mean")}
        res["modes"][mode] = row
    res["verdict"] = "reported" if status["nvml"] else f"SKIPPED (NVML: {status['nvml_reason']})"
    return res


# ------------------------------------------------------------------------------------------------ (1) profiler

def profiler_config():
    """profile_all_threads: the engine runs on its own thread, which the profiler skips by default.
    trace_only (newer torch): skip building Python event objects; only the exported trace is read."""
    try:
        from torch._C._profiler import _ExperimentalConfig
    except Exception as exc:
        return None, f"no _ExperimentalConfig ({exc}); step annotations may be missing"
    try:
        return _ExperimentalConfig(profile_all_threads=True, trace_only=True), "profile_all_threads, trace_only"
    except TypeError:
        pass
    try:
        return _ExperimentalConfig(profile_all_threads=True), "profile_all_threads"
    except TypeError as exc:
        return None, f"profile_all_threads unavailable ({exc}); step annotations may be missing"


def profiled_run(ck: Check, mode: str, trace_path: Path) -> dict:
    """Run the profiled workload with telemetry recording `prof.<mode>`; returns the run and the records."""
    from torch.profiler import ProfilerActivity, profile, record_function

    work, tel = ck.work, ck.telemetry()
    runner = work.engine.runner
    original = runner.launch

    def launch(batch):
        with record_function(f"{STEP_PREFIX}{batch.plan.step}"):
            return original(batch)

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if work.cuda else [])
    config, note = profiler_config()
    kwargs = {"experimental_config": config} if config is not None else {}
    work.set_mode(mode)
    name = f"prof.{mode}"
    clock0 = dict(tel.recorder.clock.status())
    tel.start_recording(name)
    runner.launch = launch                       # this run only: the instance attribute shadows the method
    try:
        with profile(activities=activities, **kwargs) as prof:
            run = work.run(mode, ck.args.new_tokens)
    finally:
        runner.__dict__.pop("launch", None)
        tel.stop_recording()
    # perf_counter -> wall clock, to predict the profiler's (wall-based) timestamps from telemetry's
    clock_pair_ns = time.perf_counter_ns() - time.time_ns()
    t = time.perf_counter()
    prof.export_chrome_trace(str(trace_path))
    run["export_s"] = rnd(time.perf_counter() - t, 1)
    _, parts = tel.recorder.recording_snapshot(name)
    clock = tel.recorder.clock.status()
    run["telemetry_clock"] = {k: clock[k] - clock0[k] for k in ("anchors", "corrections", "failures")}
    return {"run": run, "records": parts["steps"], "profiler_config": note, "config_ok": config is not None,
            "clock_pair_ns": clock_pair_ns, "origin_ns": tel.origin_ns}


def load_profile(path: Path) -> dict:
    """Step spans from a chrome trace: step annotations -> runtime calls inside them -> device work with the
    same correlation id (from the events' "correlation" arg, else from the ac2g flow events)."""
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    marks, runtime, device = [], [], []
    flow_start, flow_end = {}, {}
    for e in events:
        ph, cat = e.get("ph"), str(e.get("cat", "")).lower()
        if ph in ("s", "f") and cat == "ac2g":
            (flow_start if ph == "s" else flow_end)[(e.get("pid"), e.get("tid"), e.get("ts"))] = e.get("id")
            continue
        if ph != "X" or "ts" not in e:
            continue
        name, args = str(e.get("name", "")), e.get("args") or {}
        ts = float(e["ts"])
        te = ts + float(e.get("dur") or 0.0)
        key = (e.get("pid"), e.get("tid"), e.get("ts"))
        if cat == "user_annotation" and name.startswith(STEP_PREFIX):
            marks.append((ts, te, int(name[len(STEP_PREFIX):])))
        elif cat in RUNTIME_CATS:
            runtime.append([ts, args.get("correlation"), key, name, te])
        elif cat in DEVICE_CATS:
            device.append({"ts": ts, "te": te, "corr": args.get("correlation"), "key": key, "cat": cat,
                           "stream": args.get("stream", e.get("tid")), "name": name.lower()})
    from_flows = 0
    for r in runtime:
        if r[1] is None and r[2] in flow_start:
            r[1], from_flows = flow_start[r[2]], from_flows + 1
    for d in device:
        if d["corr"] is None and d["key"] in flow_end:
            d["corr"], from_flows = flow_end[d["key"]], from_flows + 1

    # A runtime call belongs to the last step annotation that began before it: only the engine thread
    # launches device work, and only inside launch. Device work launched after that annotation's end is
    # counted (expected: none).
    marks.sort()
    starts = [m[0] for m in marks]
    corr_step, graph_launches, outside, launch_calls = {}, Counter(), set(), {}
    for ts, corr, _, name, te in runtime:
        i = bisect.bisect_right(starts, ts) - 1
        if corr is None or i < 0:
            continue
        corr_step[corr] = marks[i][2]
        if ts > marks[i][1]:
            outside.add(corr)
        if "graphlaunch" in name.lower():
            graph_launches[marks[i][2]] += 1
            launch_calls[marks[i][2]] = [ts, te]
    mine = [(corr_step[d["corr"]], d) for d in device if d["corr"] in corr_step]
    streams = Counter(d["stream"] for _, d in mine if d["cat"] == "kernel")
    compute_stream = streams.most_common(1)[0][0] if streams else None

    steps: dict[int, dict] = {}
    for step, d in mine:
        if d["stream"] == compute_stream:
            phase = "compute"
        elif "htod" in d["name"]:
            phase = "h2d"
        elif "dtoh" in d["name"]:
            phase = "d2h"
        else:
            phase = "other"
        rec = steps.setdefault(step, {"kernels": 0})
        span = rec.get(phase)
        rec[phase] = [d["ts"], d["te"]] if span is None else [min(span[0], d["ts"]), max(span[1], d["te"])]
        rec["kernels"] += d["cat"] == "kernel"
    for step, call in launch_calls.items():
        if step in steps:
            steps[step]["graph_launch_call"] = call
    return {"steps": steps, "marks": {m[2]: [m[0], m[1]] for m in marks}, "events": len(events),
            "annotations": len(marks), "runtime_calls": len(runtime), "device_events": len(device),
            "attributed_device_events": len(mine), "correlations_from_flows": from_flows,
            "device_events_launched_past_annotation": sum(1 for d in device if d["corr"] in outside),
            "graph_launches": sum(graph_launches.values()), "compute_stream": compute_stream,
            "streams": {str(k): v for k, v in streams.items()},
            "base_time_ns": data.get("baseTimeNanoseconds") if isinstance(data, dict) else None}


def compare_spans(records: list, prof: dict, device: bool, offset: float | None = None) -> dict:
    """Per-step agreement after one global offset: the median start difference unless `offset` is given.
    device=False (CPU plumbing): the step annotation (the wrapped launch) against the record's host launch
    span."""
    recs = {r["step"]: r for r in records}
    pairs = {}
    for step, rec in recs.items():
        if device:
            p = prof["steps"].get(step, {})
            tel = {"compute": rec.get("compute_us"), **{k: v for k, v in (rec.get("gpu") or {}).items()
                                                        if k != "compute"}}
        else:
            p = {"compute": prof["marks"].get(step)}
            tel = {"compute": rec["cpu"].get("launch")}
        if tel.get("compute") and p.get("compute") and rec.get("compute_basis") != "none":
            pairs[step] = (rec, tel, p)
    if not pairs:
        return {"matched": 0, "unmatched_records": len(recs)}
    if offset is None:
        offset = float(np.median([t["compute"][0] - p["compute"][0] for _, t, p in pairs.values()]))
    out = {"matched": len(pairs), "unmatched_records": len(recs) - len(pairs), "offset_us": rnd(offset),
           "kinds": dict(Counter("decode" if is_decode(r) else "prefill" for r, _, _ in pairs.values()))}
    per_step = []
    for phase in ("compute", "h2d", "d2h"):
        ds, de, dd, kinds = [], [], [], []
        for step, (rec, t, p) in sorted(pairs.items()):
            if not t.get(phase) or not p.get(phase):
                continue
            (t0, t1), (p0, p1) = t[phase], p[phase]
            ds.append(t0 - p0 - offset)
            de.append(t1 - p1 - offset)
            dd.append((t1 - t0) - (p1 - p0))
            kinds.append("decode" if is_decode(rec) else "prefill")
            if phase == "compute":
                per_step.append([step, kinds[-1], rnd(ds[-1]), rnd(de[-1]), rnd(dd[-1]), rnd(p1 - p0),
                                 p.get("kernels")])
        if not ds:
            continue
        out[phase] = {"start": dist(ds), "end": dist(de), "duration": dist(dd),
                      "start_mean_signed": rnd(np.mean(ds)), "end_mean_signed": rnd(np.mean(de)),
                      "duration_mean_signed": rnd(np.mean(dd))}
        if phase == "compute":
            for kind in ("prefill", "decode"):
                sel = [i for i, k in enumerate(kinds) if k == kind]
                if sel:
                    out[phase][kind] = {"start": dist([ds[i] for i in sel]), "end": dist([de[i] for i in sel]),
                                        "duration": dist([dd[i] for i in sel])}
    # gaps: telemetry's gpu_idle_before_us against the profiler's gap between consecutive steps' spans
    tel_gaps, prof_gaps, dg = [], [], []
    for step, (rec, t, p) in sorted(pairs.items()):
        prev = pairs.get(step - 1)
        if prev is None or rec.get("gpu_idle_before_us") is None:
            continue
        pg = max(0.0, p["compute"][0] - prev[2]["compute"][1])
        tel_gaps.append(rec["gpu_idle_before_us"])
        prof_gaps.append(pg)
        dg.append(rec["gpu_idle_before_us"] - pg)
    out["gap"] = {"delta": dist(dg), "telemetry_us": pcts(tel_gaps), "profiler_us": pcts(prof_gaps),
                  "mean_signed": rnd(np.mean(dg)) if dg else None}
    worst = sorted(per_step, key=lambda r: -max(abs(r[2] or 0), abs(r[3] or 0)))[:5]
    out["worst_steps"] = [dict(zip(("step", "kind", "d_start", "d_end", "d_dur", "prof_dur", "kernels"), w))
                          for w in worst]
    out["per_step"] = {"columns": ["step", "kind", "d_start_us", "d_end_us", "d_dur_us", "prof_dur_us",
                                   "kernels"], "rows": per_step}
    c = out["compute"]
    worst_p99 = max(c["start"]["p99"], c["end"]["p99"], c["duration"]["p99"],
                    out["gap"]["delta"].get("p99") or 0.0)
    out["worst_p99_us"] = worst_p99
    out["verdict"] = "PASS" if worst_p99 <= LIMIT_US else "FAIL"
    return out


def brief(cmp: dict) -> dict:
    """The compute rows of a comparison, per step kind."""
    c = cmp.get("compute") or {}
    return {"offset_us": cmp.get("offset_us"),
            **{kind: {key: {"p50": c[kind][key].get("p50"), "p99": c[kind][key].get("p99"),
                            "within_pct": c[kind][key].get("within_pct")} for key in ("start", "end", "duration")}
               for kind in ("prefill", "decode") if kind in c}}


def graph_launch_latency(prof: dict) -> dict:
    """For graph-replayed steps: how long the host's cudaGraphLaunch call took, and when the graph's first
    kernel started relative to that call. Under CUPTI a launch onto an idle GPU can run its first node (the
    graph's own start event) long before its first kernel."""
    call, after_start, after_end = [], [], []
    for rec in prof["steps"].values():
        if "graph_launch_call" in rec and "compute" in rec:
            (c0, c1), k0 = rec["graph_launch_call"], rec["compute"][0]
            call.append(c1 - c0)
            after_start.append(k0 - c0)
            after_end.append(k0 - c1)
    return {"steps": len(call), "call_us": pcts(call), "first_kernel_after_call_start_us": pcts(after_start),
            "first_kernel_after_call_end_us": pcts(after_end)}


def section_profile(ck: Check) -> dict:
    res = {"status": "ok", "workload": f"{ck.args.requests} x {ck.args.prompt_tokens} prompt x "
                                       f"{ck.args.new_tokens} new",
           "method": "kernels -> steps by correlation id of runtime calls inside record_function("
                     f"'{STEP_PREFIX}N') around runner.launch; compute span = first start .. last end of the "
                     "step's device work on the compute stream; one global offset (median start difference)",
           "limit_us": LIMIT_US, "modes": {}}
    for mode in ("async", "sync"):
        try:
            res["modes"][mode] = profile_mode(ck, mode)
        except Exception as exc:
            traceback.print_exc()
            res["modes"][mode] = {"verdict": "ERROR", "error": f"{type(exc).__name__}: {exc}",
                                  "traceback": traceback.format_exc()}
        ck.say(f"  {mode}: {res['modes'][mode].get('matched', 0)} steps matched, "
               f"verdict {res['modes'][mode].get('verdict')}")
    verdicts = [m.get("verdict", "ERROR") for m in res["modes"].values()]
    res["verdict"] = next((w for w in ("FAIL", "ERROR", "SKIPPED") if any(v.startswith(w) for v in verdicts)),
                          "PASS")
    return res


def profile_mode(ck: Check, mode: str) -> dict:
    work = ck.work
    trace = ck.out / f"{mode}.profile.json"
    try:
        got = profiled_run(ck, mode, trace)
        prof = load_profile(trace)
        row = {"run": got["run"], "profiler_config": got["profiler_config"],
               "warning": None if got["config_ok"] else got["profiler_config"],
               "trace": {k: v for k, v in prof.items() if k not in ("steps", "marks")},
               "trace_mb": rnd(trace.stat().st_size / 2**20, 1), "records": len(got["records"])}
        device = work.cuda and prof["attributed_device_events"] > 0
        row["basis"] = ("device work on the compute stream vs gpu.compute" if device else
                        "step annotation vs host launch span (CPU plumbing check)")
        row.update(compare_spans(got["records"], prof, device))
        if prof.get("base_time_ns") is not None and row.get("offset_us") is not None:
            # profiler ts = wall µs - base; telemetry µs = perf µs - origin: the offset the clocks predict
            pair = (got["clock_pair_ns"] - got["origin_ns"] + prof["base_time_ns"]) / 1000.0
            row["offset_clock_pair_us"] = rnd(pair)
            row["offset_fit_minus_clock_pair_us"] = rnd(row["offset_us"] - pair)
            if device:      # the same comparison on an offset that owes nothing to the spans themselves
                row["by_clock_pair"] = brief(compare_spans(got["records"], prof, device, offset=pair))
        if device:
            row["graph_launch"] = graph_launch_latency(prof)
        row["host_launch_us"] = pcts([r["cpu"]["launch"][1] - r["cpu"]["launch"][0] for r in got["records"]
                                      if "launch" in r["cpu"]])
        if not device:
            why = ("no CUDA device: no kernels or CUDA events" if not work.cuda else
                   "no device work attributed to steps (see the trace counts)")
            row["verdict"] = f"SKIPPED ({why}); {prof['annotations']} step annotations seen"
        if mode == "async" and work.cuda:          # keep this trace, gzipped, when small enough
            gz = trace.with_suffix(".json.gz")
            with open(trace, "rb") as src, gzip.open(gz, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst)
            size = gz.stat().st_size
            if size <= PROFILE_KEEP_BYTES:
                row["trace_file"] = str(gz)
            else:
                gz.unlink()
                row["trace_file"] = f"dropped ({size / 2**20:.1f} MB gzipped, over 10 MB)"
        return row
    finally:
        trace.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------------ the report

def _d(d: dict) -> str:
    if not d or not d.get("n"):
        return "n/a"
    return f"p50 {d['p50']} p99 {d['p99']} max {d['max']}"


def report(ck: Check) -> str:
    r, lines = ck.result, []
    setup_info = r["sections"].get("setup", {}).get("info", {})
    v = r["versions"]
    lines.append("=" * 100)
    where = setup_info.get("gpu_name") or setup_info.get("device")
    lines.append(f"batchscope telemetry check | {ck.args.model} on {where} "
                 f"({setup_info.get('device')}, {setup_info.get('dtype')}, attention {setup_info.get('attention')}, "
                 f"graphs {setup_info.get('cuda_graphs')}) | {r.get('elapsed_s')} s")
    lines.append(f"torch {v['torch']} (cuda {v['cuda']}) transformers {v['transformers']} triton {v['triton']} "
                 f"pynvml {v['pynvml']} | {' '.join(sys.argv[1:]) or '(defaults)'}")
    sec = r["sections"]
    if sec.get("setup", {}).get("status") == "ERROR":
        lines.append(f"setup failed: {sec['setup']['error']} (traceback above and in the JSON)")

    def head(num, name, title):
        s = sec.get(name)
        if s is None:
            lines.append(f"[{num}] {title}: not run")
            return None
        if s.get("status") == "ERROR":
            lines.append(f"[{num}] {title}: ERROR {s['error']} (traceback in the JSON)")
            return None
        lines.append(f"[{num}] {title}: {s.get('verdict')}  ({s.get('seconds')} s)")
        return s

    s = head(1, "profile", f"GPU spans vs torch.profiler, limit {LIMIT_US:g} us at p99")
    if s:
        configs = {m.get("profiler_config") for m in s["modes"].values() if m.get("profiler_config")}
        lines.append(f"    workload {s['workload']} | profiler options: {', '.join(sorted(configs)) or 'none'}")
        for mode, m in s["modes"].items():
            if m.get("verdict") == "ERROR":
                lines.append(f"    {mode}: ERROR {m['error']} (traceback in the JSON)")
                continue
            t = m["trace"]
            lines.append(f"    {mode}: {m.get('matched', 0)}/{m['records']} steps {m.get('kinds')} | "
                         f"{m['basis']} | trace {m['trace_mb']} MB, {t['annotations']} annotations, "
                         f"{t['attributed_device_events']}/{t['device_events']} device events attributed, "
                         f"{t['graph_launches']} graph launches, ids from flows {t['correlations_from_flows']}, "
                         f"launched past annotation {t['device_events_launched_past_annotation']}")
            if m.get("warning"):
                lines.append(f"      warning: {m['warning']}")
            if "compute" in m:
                c = m["compute"]
                lines.append(f"      offset {m['offset_us']} us (clock pair predicts {m.get('offset_clock_pair_us')}) "
                             f"| telemetry clock {m['run'].get('telemetry_clock')} "
                             f"| verdict {m.get('verdict')} (worst p99 {m.get('worst_p99_us')} us)")
                for key in ("start", "end", "duration"):
                    signed = c.get(f"{key}_mean_signed")
                    lines.append(f"      |d{key:<8}| {_d(c[key])} | within {LIMIT_US:g}us {c[key].get('within_pct')}%"
                                 + (f" | signed mean {signed}" if signed is not None else ""))
                for kind in ("prefill", "decode"):
                    if kind in c:
                        k = c[kind]
                        lines.append(f"        {kind:<7} p99 start {k['start'].get('p99')} end {k['end'].get('p99')} "
                                     f"dur {k['duration'].get('p99')} (n {k['start']['n']})")
                g = m["gap"]
                lines.append(f"      |d gap    | {_d(g['delta'])} | within {g['delta'].get('within_pct')}% | "
                             f"signed mean {g['mean_signed']} | idle p50 telemetry {g['telemetry_us']['p50']} "
                             f"profiler {g['profiler_us']['p50']} us")
                for kind, k in (m.get("by_clock_pair") or {}).items():
                    if kind != "offset_us":
                        lines.append(f"      by clock pair, {kind:<7}: |dstart| p50 {k['start']['p50']} p99 "
                                     f"{k['start']['p99']} | |dend| p50 {k['end']['p50']} p99 {k['end']['p99']} "
                                     f"| within {LIMIT_US:g}us start {k['start']['within_pct']}% "
                                     f"end {k['end']['within_pct']}%")
                gl = m.get("graph_launch") or {}
                if gl.get("steps"):
                    lines.append(f"      graph launches ({gl['steps']}): call p50 {gl['call_us']['p50']} us; "
                                 f"first kernel after call start p50 {gl['first_kernel_after_call_start_us']['p50']}"
                                 f", after call end p50 {gl['first_kernel_after_call_end_us']['p50']} us | "
                                 f"host launch span p50 {m['host_launch_us']['p50']} us")
                for phase in ("h2d", "d2h"):
                    if phase in m:
                        lines.append(f"      {phase}: |dstart| {_d(m[phase]['start'])}; |dend| {_d(m[phase]['end'])}")
                if m.get("worst_steps"):
                    w = m["worst_steps"][0]
                    lines.append(f"      worst step {w['step']} ({w['kind']}): dstart {w['d_start']} dend "
                                 f"{w['d_end']} ddur {w['d_dur']} us over {w['prof_dur']} us")
            if m.get("trace_file"):
                lines.append(f"      profiler trace: {m['trace_file']}")

    s = head(2, "overhead", f"telemetry on vs off, decode tokens/s, limit -{OVERHEAD_PCT:g}%")
    if s:
        lines.append(f"    workload {s['workload']}" + (f"; {s['budget_note']}" if s.get("budget_note") else ""))
        for mode, m in s["modes"].items():
            if m.get("verdict") == "ERROR":
                lines.append(f"    {mode}: ERROR {m['error']} (traceback in the JSON)")
                continue
            lines.append(f"    {mode}: paired change {m['paired_change_pct']:+.2f}% [{m['verdict']}] | medians off "
                         f"{m['off_tok_s']} on {m['on_tok_s']} tok/s ({m['change_pct']:+.2f}%) | "
                         f"spread off {m['off_spread_pct']}% on {m['on_spread_pct']}% | "
                         f"{m['pairs']} pairs | observer {m['observer_us_mean']} us/step, "
                         f"idle blamed on telemetry {m['idle_telemetry_us_per_run']} us/run")

    s = head(3, "idle", "gpu_idle_before_us on decode steps")
    if s:
        lines.append(f"    rule: {s['rule']}; workload {s['workload']}")
        for mode, m in s["modes"].items():
            g = m["gpu_idle_before_us"]
            causes = ", ".join(f"{k} {v}%" for k, v in list(m["idle_by_cause_pct"].items())[:4])
            lines.append(f"    {mode:<5}: p50 {g['p50']} p90 {g['p90']} mean {g['mean']} us "
                         f"({m['decode_steps']} steps) | busy run {m['busy_pct_run']}% "
                         f"decode {m['busy_pct_decode']}% | {m['decode_ms_p50']} ms/step | "
                         f"idle by cause: {causes or 'none'}")
            lines.append(f"           decode compute span p50 {m['compute_us']['p50']} us, host launch p50 "
                         f"{m['host_launch_us']['p50']} us")
        if "decode_compute_p50_sync_minus_async_us" in s:
            lines.append(f"    decode compute span, sync minus async (no profiler): "
                         f"{s['decode_compute_p50_sync_minus_async_us']} us at p50")

    s = head(4, "nvml", "NVML gpu_util vs event busy %")
    if s:
        for mode, m in s["modes"].items():
            parts = []
            for label, w in m.items():
                parts.append(f"{label} {w['window_s']} s: NVML {w['nvml_gpu_util_mean']}% "
                             f"({w['nvml_samples']} samples; driver {w['driver_util_mean']}% of "
                             f"{w['driver_samples']}) vs events {w['event_busy_pct']}%")
            lines.append(f"    {mode:<5}: " + " | ".join(parts))
        lines.append("    why they differ: NVML counts a 1/6-1 s window busy if any kernel ran; events see "
                     "the sub-ms gaps")
    files = [ck.out / "telemetry_check.json"] + [ck.out / f"{m}.timeline.json" for m in ("async", "sync")]
    lines.append("files: " + ", ".join(str(f) for f in files if f.exists()))
    lines.append("=" * 100)
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out or os.environ.get("OUT") or "out")
    out.mkdir(parents=True, exist_ok=True)
    ck = Check(args, out)
    ck.section("setup", setup)
    try:
        if ck.work is not None:
            plan = {"overhead": section_overhead, "idle": section_idle, "nvml": section_nvml,
                    "profile": section_profile}
            for name in ("overhead", "idle", "nvml", "profile"):       # the profiler last (see the docstring)
                if name in args.sections:
                    ck.section(name, plan[name])
    finally:
        try:
            ck.close()
        except Exception:
            traceback.print_exc()
        ck.save()
    print(report(ck), flush=True)
    failed = [n for n, s in ck.result["sections"].items() if s.get("status") == "ERROR"
              or str(s.get("verdict", "")).startswith(("FAIL", "ERROR"))]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
