"""Running totals since the session started: what a Prometheus scrape reads (telemetry/prometheus.py).

The ring of step and request records forgets old records; a counter must not. So the recorder hands every step
record and every request event to `Totals` as it makes them, on the engine's observer path, and `Totals` adds them
up: counters (seconds, tokens, steps, requests by finish reason) and histograms with fixed buckets (vLLM's
bucket boundaries for vLLM's names). The cost is a few additions and one `bisect` per histogram per step, plus
one per delivered token (the inter-token latency): measured in tests/server/test_metrics.py and reported in
docs/metrics.md. Nothing here grows with the run: the histograms are lists of fixed length, label values come
from fixed sets (modes, host phases, idle causes, finish reasons, tensor-parallel ranks).

Other threads read while the engine thread adds: `list(counts)` is one C call under the GIL, so a reader sees a
histogram's buckets and its count agree (its sum may be one observation ahead or behind), and every figure only
ever grows.

Definitions (times in seconds; request times from the request records, recorder.py):
  busy           the step's compute span (CUDA events on a GPU, the host launch span on CPU), per rank
  idle           the step's `idle_by_cause_us` (idle.py): the gap before its compute, split by cause
  queue time     scheduled_us - arrival_us      (scheduled: the end of the schedule span of its first step)
  prefill time   first_token_us - scheduled_us
  decode time    last token - first_token_us
  inference time last token - scheduled_us
  TTFT           first_token_us - arrival_us, observed when the first token comes
  ITL            every gap between two tokens of a request, observed as the later one comes
  TPOT           (last token - first token) / (output tokens - 1), per finished request of 2 tokens or more
  E2E            finish_us - arrival_us
  decode step    compute start to the next step's compute start (same mode, consecutive), less any empty-queue
                 gap before the next one, for steps with decodes and no prefill (summary.py's `run_periods`)
  iteration      prefill + decode tokens the step's forward computed
"""
from __future__ import annotations

from bisect import bisect_left
from collections import deque

from .records import FINISH_REASONS, HOST_PHASES, IDLE_CAUSES

MODES = ("sync", "async")

# vLLM's default bucket boundaries (vllm/v1/metrics/buckets.py), so that its dashboards' quantiles read the same
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# batchscope's own: host phases take microseconds to milliseconds, a decode step tenths of a millisecond up
PHASE_BUCKETS = (5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25,
                 1.0)
DECODE_STEP_BUCKETS = (1e-4, 2.5e-4, 5e-4, 7.5e-4, 1e-3, 1.5e-3, 2e-3, 3e-3, 4e-3, 5e-3, 7.5e-3, 1e-2, 1.5e-2,
                       2e-2, 3e-2, 5e-2, 7.5e-2, 0.1, 0.25, 0.5, 1.0)

# batchscope's finish reasons under vLLM's `finished_reason` label values
VLLM_FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
TO_VLLM_REASON = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "abort", "error": "error"}
assert set(TO_VLLM_REASON) == set(FINISH_REASONS)

RECENT_DECODE_STEPS = 4096      # decode steps kept (time, period, floor) for the floor-ratio gauge's window


def request_token_buckets(max_model_len: int | None) -> tuple:
    """vLLM's 1-2-5 series up to the model's context length (vllm build_1_2_5_buckets)."""
    top = max_model_len or 8192
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > top:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


class Histogram:
    """Cumulative-free bucket counts (the last one is +Inf) and the sum; `le` semantics like Prometheus."""
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def snapshot(self) -> tuple[list[int], float]:
        return list(self.counts), self.sum


class Totals:
    def __init__(self, info: dict | None = None, bandwidth_gbps: float | None = None):
        info = info or {}
        self.steps = dict.fromkeys(MODES, 0)
        self.prefill_tokens = 0          # prompt tokens the steps computed (recomputation after preemption too)
        self.prompt_tokens = 0           # vLLM's: each request's prompt, counted once, when its first token comes
        self.generation_tokens = 0
        self.preemptions = 0
        self.mode_switches = 0
        self.busy_s: dict[int, float] = {0: 0.0}            # rank -> seconds of compute
        self.idle_s = dict.fromkeys(IDLE_CAUSES, 0.0)       # rank 0's idle gaps by cause
        self.finished = dict.fromkeys(VLLM_FINISHED_REASONS, 0)
        self.phases = {(m, p): Histogram(PHASE_BUCKETS) for m in MODES for p in HOST_PHASES}
        self.decode_step = {m: Histogram(DECODE_STEP_BUCKETS) for m in MODES}
        self.decode_floor_s = dict.fromkeys(MODES, 0.0)
        self.recent_decode: deque = deque(maxlen=RECENT_DECODE_STEPS)   # (t_us, period_s, floor_s, mode)
        self.iteration_tokens = Histogram(ITERATION_TOKEN_BUCKETS)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.tpot = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(REQUEST_LATENCY_BUCKETS)
        self.queue = Histogram(REQUEST_LATENCY_BUCKETS)
        self.prefill = Histogram(REQUEST_LATENCY_BUCKETS)
        self.decode = Histogram(REQUEST_LATENCY_BUCKETS)
        self.inference = Histogram(REQUEST_LATENCY_BUCKETS)
        tokens = request_token_buckets(info.get("max_model_len"))
        self.request_prompt = Histogram(tokens)
        self.request_generation = Histogram(tokens)
        self._prev: dict | None = None   # the previous step record, for its period
        # the decode floor per step: (weight bytes + KV bytes per block x blocks in use) / bandwidth
        weights, per_token, block = info.get("weight_bytes"), info.get("kv_bytes_per_token"), info.get("block_size")
        self.floor = ((weights, (per_token or 0) * (block or 0), bandwidth_gbps * 1e9)
                      if bandwidth_gbps and weights else None)

    # ---- the engine thread -------------------------------------------------------------------------------
    def on_step(self, rec: dict) -> None:
        mode = rec["mode"]
        if mode in self.steps:
            self.steps[mode] += 1
        self.prefill_tokens += rec["prefill_tokens"]
        self.generation_tokens += rec["tokens_out"]
        tokens = rec["prefill_tokens"] + rec["decode_tokens"]
        if tokens:
            self.iteration_tokens.observe(tokens)
        if "preempted" in rec:
            self.preemptions += len(rec["preempted"])
        compute = rec["compute_us"]
        if compute:
            self.busy_s[0] += (compute[1] - compute[0]) / 1e6
        idle = self.idle_s
        for cause, us in rec["idle_by_cause_us"].items():
            if cause in idle:
                idle[cause] += us / 1e6
        phases = self.phases
        for phase, (a, b) in rec["cpu"].items():
            h = phases.get((mode, phase))
            if h is not None:           # Histogram.observe, inlined: five of these a step
                v = (b - a) / 1e6
                h.counts[bisect_left(h.bounds, v)] += 1
                h.sum += v
        prev, self._prev = self._prev, rec
        if (prev is not None and compute and prev["compute_us"] and prev["mode"] == mode
                and prev["step"] + 1 == rec["step"] and prev["prefill_tokens"] == 0 and prev["decode_tokens"]
                and mode in self.decode_step):
            self._decode_period(prev, rec, mode)

    def _decode_period(self, prev: dict, rec: dict, mode: str) -> None:
        period = (rec["compute_us"][0] - prev["compute_us"][0]
                  - rec["idle_by_cause_us"].get("empty_queue", 0.0)) / 1e6
        self.decode_step[mode].observe(period)
        if self.floor is not None:
            weights, per_block, bandwidth = self.floor
            floor = (weights + per_block * prev["kv_blocks_used"]) / bandwidth
            self.decode_floor_s[mode] += floor
            self.recent_decode.append((rec["compute_us"][0], period, floor, mode))

    def on_rank_busy(self, rank: int, compute: list | None) -> None:
        if compute:
            self.busy_s[rank] = self.busy_s.get(rank, 0.0) + (compute[1] - compute[0]) / 1e6

    def on_mode_change(self) -> None:
        self.mode_switches += 1

    def on_first_token(self, req: dict) -> None:
        if req["prompt_tokens"]:
            self.prompt_tokens += req["prompt_tokens"]
        if req["arrival_us"] is not None:
            self.ttft.observe((req["first_token_us"] - req["arrival_us"]) / 1e6)

    def on_finished(self, req: dict) -> None:
        self.finished[TO_VLLM_REASON.get(req["finish_reason"], "error")] += 1
        arrival, scheduled, first = req["arrival_us"], req.get("scheduled_us"), req["first_token_us"]
        times = req["token_us"]
        last = times[-1] if times else None
        if arrival is not None and req["finish_us"] is not None:
            self.e2e.observe((req["finish_us"] - arrival) / 1e6)
        if scheduled is not None:
            if arrival is not None:
                self.queue.observe(max(0.0, scheduled - arrival) / 1e6)
            if first is not None:
                self.prefill.observe(max(0.0, first - scheduled) / 1e6)
                self.inference.observe(max(0.0, last - scheduled) / 1e6)
        if first is not None:
            self.decode.observe((last - first) / 1e6)
            if len(times) > 1:
                self.tpot.observe((last - first) / 1e6 / (len(times) - 1))
        if req["prompt_tokens"] is not None:
            self.request_prompt.observe(req["prompt_tokens"])
        self.request_generation.observe(req["output_tokens"])

    # ---- other threads -----------------------------------------------------------------------------------
    def floor_ratio(self, now_us: float, window_s: float) -> dict[str, float]:
        """Per mode: the decode steps' period over their floor, summed over the steps that started in the last
        `window_s` seconds ({} without a known bandwidth or without such steps)."""
        since = now_us - window_s * 1e6
        period = dict.fromkeys(MODES, 0.0)
        floor = dict.fromkeys(MODES, 0.0)
        for t, p, f, mode in reversed(list(self.recent_decode)):
            if t < since:
                break
            period[mode] += p
            floor[mode] += f
        return {m: period[m] / floor[m] for m in MODES if floor[m] > 0}

    def snapshot(self) -> dict:
        """The counters as /api/status shows them (seconds, tokens, counts)."""
        return {"steps": dict(self.steps), "busy_s": {str(r): round(s, 6) for r, s in sorted(self.busy_s.items())},
                "idle_s_by_cause": {c: round(s, 6) for c, s in self.idle_s.items()},
                "prefill_tokens": self.prefill_tokens, "prompt_tokens": self.prompt_tokens,
                "generation_tokens": self.generation_tokens, "preemptions": self.preemptions,
                "mode_switches": self.mode_switches, "requests_finished": dict(self.finished)}
