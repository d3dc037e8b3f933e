"""The systems `batchscope bench` times on one workload: batchscope's own engine (sync or async, telemetry
recording each run) and transformers' continuous batching (`generate_batch`) on the same weights.

Each runner's `run` returns one run's metrics under the names in METRICS (None where it cannot measure one).
Imports only engine, telemetry, torch, transformers and tqdm (the last three where they are used), so it runs
where the server's packages (gradio, fastapi, ...) are not installed.
"""
from __future__ import annotations

import dataclasses
import gc
import math
import os
import statistics
import threading
import time

import torch

from batchscope.engine import Engine, EngineConfig, SamplingParams, StepTrace

from .steps import budget_figures

TF_VARIANTS = {"transformers-sync": False, "transformers-async": True}   # label -> use_async_batching
# per-run metrics; a run that could not measure one reports None (e.g. busy % without telemetry)
METRICS = ("wall_s", "output_tokens", "tokens_per_s", "decode_ms_per_step", "floor_ms_per_step", "floor_pct",
           "roofline_ms_per_step", "x_roofline", "roofline_held_ms_per_step", "x_roofline_held",
           "gpu_busy_pct", "nvml_util_pct", "sm_clock_mhz", "power_w", "speedup")


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
            self._await_rank_spans()
            self.tel.stop_recording()
            timeline = self.tel.timeline(label)
            m.update(_decode_metrics(timeline, self.tel.bandwidth_gbps))
            m["budget"] = budget_figures(timeline["steps"])     # the budgets its steps ran with, by reason
        return m, timeline

    def _await_rank_spans(self, timeout_s: float = 5.0) -> None:
        """Tensor parallel: the other ranks report their last steps once rank 0 is idle; let them land in the
        recording before it stops, so every GPU's busy % covers the same steps."""
        ranks = self.engine.config.tensor_parallel_size
        if ranks == 1:
            return
        rec = self.tel.recorder
        last = rec.steps[-1]["step"] if rec.steps else None
        deadline = time.monotonic() + timeout_s
        while last is not None and time.monotonic() < deadline:
            seen = {r["rank"] for r in list(rec.rank_steps)[-4 * ranks:] if r["step"] == last}
            if len(seen) == ranks - 1:
                return
            time.sleep(0.01)

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
                  t0, t1, rank_steps=timeline.get("rank_steps") or ())
    # a short window may hold no NVML sample (they come every 50 ms): fall back to the whole run's
    util = s.get("gpu_util_mean") if s.get("nvml_samples") else whole.get("gpu_util_mean")
    cpu = s.get("cpu_pct_mean") if s.get("nvml_samples") else whole.get("cpu_pct_mean")
    return {**out, "decode_steps": len(decode), "decode_ms_per_step": s.get("decode_ms_p50"),
            "decode_ms_basis": "median period between decode steps' compute starts (step records)",
            "decode_window_s": round((t1 - t0) / 1e6, 6), "gpu_busy_pct": s.get("busy_pct"),
            "busy_basis": s.get("busy_basis"), "nvml_util_pct": util, "host_cpu_pct": cpu,
            "sm_clock_mhz": s.get("sm_clock_mhz_mean"), "power_w": s.get("power_w_mean"),
            "itl_ms_p50": (whole.get("itl_ms") or {}).get("p50"),
            # tensor parallel: every GPU's busy % (its own events) and NVML mean over the same window
            "ranks": s.get("ranks")}


# ---------------------------------------------------------------------------------------------- transformers runs

class TransformersRunner:
    """transformers' own continuous batching (`generate_batch`) on the same weights, attention "sdpa".
    Its options go in a ContinuousBatchingConfig: options passed to generate_batch directly are ignored."""

    def __init__(self, config: EngineConfig, max_batch_tokens: int, tokens_per_request: int, requests: int,
                 progress: bool, engine_model: torch.nn.Module):
        import transformers
        from transformers import ContinuousBatchingConfig, GenerationConfig

        from batchscope.engine.model.loading import load_model

        from batchscope.engine.model.speedups import batchscope_patches

        self.version = transformers.__version__
        self.model = load_model(config, "sdpa").model
        # batchscope's kernels go into the engine's model only (per module): this one must run transformers' code
        self.patches = batchscope_patches(self.model)
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
        return self._metrics(label, list(out.values()), [new_tokens] * len(prompts), call_s)

    def run_each(self, label: str, prompts, new_tokens: list[int]) -> dict:
        """Every request with its own output length, all submitted at once. generate_batch gives every request
        one max_new_tokens, so this runs its loop itself: the same context manager (warm-up, start, stop), every
        request added at once with its own max_new_tokens, results collected as they finish."""
        gen, cb = self._configs(label, max(new_tokens))
        hints = _workload_hints(max(len(p) for p in prompts), max(new_tokens), len(prompts))
        t0 = time.perf_counter()
        with self.model.continuous_batching_context_manager(generation_config=gen, continuous_batching_config=cb,
                                                            block=True, timeout=5, **hints) as manager:
            ids = [manager.add_request(p, request_id=f"req_{i}", max_new_tokens=n, record_timestamps=True)
                   for i, (p, n) in enumerate(zip(prompts, new_tokens))]
            done: dict = {}
            while len(done) < sum(i is not None for i in ids):      # None: a request it refused to take
                r = manager.get_result(timeout=1)
                if r is None and not manager.is_running():
                    break                            # its loop died: the missing requests show as wrong lengths
                if r is not None and r.is_finished():
                    done[r.request_id] = r
        call_s = time.perf_counter() - t0
        return self._metrics(label, [done[i] for i in ids if i in done], list(new_tokens), call_s)

    def profiled_pass(self, label: str, prompts, steps: int, trace_path: str) -> tuple[dict | None, dict]:
        """transformers' steps, recorded: the same prompts again, `steps` new tokens each (all requests start
        together, so that is `steps` steps when the prompts fit one prefill step), under torch.profiler with Python
        stacks of every thread, the trace imported by batchscope's importer. The profiler starts once the manager's
        loop thread exists (its Python stacks, which hold the step markers, are recorded only for threads that
        existed when it started) and stops after the last result. Returns (timeline or None, facts); where the
        trace cannot be imported, facts["error"] says why and there is no timeline."""
        from batchscope.telemetry.importers import TraceImportError, import_trace

        gen, cb = self._configs(label, steps)
        hints = _workload_hints(max(len(p) for p in prompts), steps, len(prompts))
        prof = _profiler(self.cuda)
        with self.model.continuous_batching_context_manager(generation_config=gen, continuous_batching_config=cb,
                                                            block=True, timeout=5, **hints) as manager:
            prof.start()
            try:
                t0 = time.perf_counter()
                ids = [manager.add_request(p, request_id=f"req_{i}", max_new_tokens=steps)
                       for i, p in enumerate(prompts)]
                _collect(manager, [i for i in ids if i is not None])
                wall_s = time.perf_counter() - t0
            finally:
                prof.stop()
        t0 = time.perf_counter()
        prof.export_chrome_trace(trace_path)
        facts = {"new_tokens": steps, "wall_s": round(wall_s, 6), "trace": trace_path,
                 "trace_bytes": os.path.getsize(trace_path), "export_s": round(time.perf_counter() - t0, 3)}
        t0 = time.perf_counter()
        try:
            timeline = import_trace(trace_path)
        except TraceImportError as exc:
            return None, {**facts, "error": str(exc)}
        facts["import_s"] = round(time.perf_counter() - t0, 3)
        return timeline, facts

    def _metrics(self, label: str, outs: list, wanted: list[int], call_s: float) -> dict:
        """One run's metrics from transformers' outputs (in request order) and the lengths each should have."""
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
                "expected_tokens": sum(wanted),
                "lengths_ok": len(outs) == len(wanted) and lengths == list(wanted),
                "errors": [str(o.error) for o in outs if o.error is not None],
                "tokens_per_s": sum(lengths) / wall_s if wall_s > 0 else None,
                "decode_ms_per_step": statistics.median(gaps) if gaps else None,
                "decode_ms_basis": "median gap between a request's consecutive token timestamps",
                "decode_window": (min(stamps), max(stamps)) if stamps else None,
                "token_ids": [list(o.generated_tokens) for o in outs],
                # modules of transformers' model running batchscope code: [] (its own code) is the only fair baseline
                "batchscope_patches": self.patches}

    def close(self) -> None:
        self.model = None
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()


def _profiler(cuda: bool):
    """torch.profiler over every thread (transformers' loop runs in its own), with Python stacks: its loop's
    functions are the only step markers it leaves."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    extra = {}
    try:
        extra["experimental_config"] = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    except (AttributeError, TypeError):     # an older torch: the loop thread's ops are missing, its steps too
        pass
    return profile(activities=activities, with_stack=True, record_shapes=False, **extra)


def _collect(manager, ids: list, timeout_s: float = 1.0) -> None:
    """Wait until every request in `ids` has finished (or the loop died)."""
    done: set = set()
    while len(done) < len(ids):
        r = manager.get_result(timeout=timeout_s)
        if r is None and not manager.is_running():
            return
        if r is not None and r.is_finished():
            done.add(r.request_id)


def _workload_hints(max_prompt: int, max_new: int, requests: int) -> dict:
    """generate_batch's sizing hints for its manager, where this transformers has them."""
    try:
        from transformers.generation.continuous_batching.utils import WorkloadHints
    except ImportError:
        return {}
    return {"workload_hints": WorkloadHints(max_prompt_length=max_prompt, max_generated_length=max_new,
                                            num_requests=requests)}


def nvml_window(tel, label: str, window) -> tuple[dict, dict]:
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
            "host_cpu_pct": _mean(s.get("cpu_pct") for s in samples),
            "sm_clock_mhz": _mean(s.get("sm_clock_mhz") for s in samples),
            "power_w": _mean(s.get("power_w") for s in samples)}, timeline


# ---------------------------------------------------------------------------------------------- helpers

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
