"""Prometheus exposition of a telemetry session (prometheus-client), for `GET /metrics`.

    registry = prometheus_registry(telemetry, model_name)     # once per server
    body = generate_latest(registry)                         # at each scrape; serve as CONTENT_TYPE

`TelemetryCollector.collect` runs on the scraping thread and only reads what telemetry already keeps: the running
totals (totals.py, added up on the engine's observer path as records are made), the engine's own counters
(`engine.stats()`: a few `len()`s), the last second of the step ring and the latest NVML sample. A scrape adds
nothing to the engine loop and no synchronisation, and its size is fixed: every label value comes from a fixed
set (modes, host phases, idle causes, finish reasons, ranks); nothing is labelled per request.

Names: vLLM's (`vllm:*`, with the `model_name` and `engine` labels its Grafana dashboards filter on, vLLM's types
and bucket boundaries) for what both measure, and batchscope's own (`batchscope_*`) for what vLLM does not:
event-based busy time, idle time by cause, host phases, decode steps against their floor, the mode, the delay
from a streamed token's making to its chunk's write. A figure
batchscope cannot measure here is absent, never a placeholder: NVML figures on a machine without NVML, the
floor ratio without a measured bandwidth. docs/metrics.md lists every name.

Serve it with `CONTENT_TYPE` (text format 0.0.4): Prometheus 2.x asks for OpenMetrics first, and
prometheus-client >= 0.23 would then escape the colons of `vllm:` names into underscores (`vllm_...`).
"""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

try:
    from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
except ImportError:         # before 0.23 the text format's only version was 0.0.4
    CONTENT_TYPE_PLAIN_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"

from .records import HOST_PHASES, IDLE_CAUSES
from .summary import union_length
from .totals import MODES

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
BUSY_WINDOW_S = 1.0             # the busy-ratio gauge's window: the wall-clock second before the scrape
FLOOR_WINDOW_S = 10.0           # the floor-ratio gauge's window
NVML_RATIOS = (("gpu_util", "batchscope_nvml_gpu_utilization_ratio",
                "NVML GPU utilization (share of the driver's 1/6-1 s window with any kernel running), 0-1"),
               ("mem_util", "batchscope_nvml_memory_utilization_ratio",
                "NVML memory-controller utilization over the driver's window, 0-1"))
NVML_VALUES = (("power_w", "batchscope_nvml_power_watts", "board power draw (NVML)", 1.0),
               ("sm_clock_mhz", "batchscope_nvml_sm_clock_hertz", "SM clock (NVML)", 1e6),
               ("mem_used_mb", "batchscope_nvml_memory_used_bytes", "device memory in use (NVML)", float(1 << 20)))

__all__ = ["TelemetryCollector", "prometheus_registry", "generate_latest", "CONTENT_TYPE"]


def prometheus_registry(telemetry, model_name: str | None = None) -> CollectorRegistry:
    """A private registry holding only this session's collector (no process or GC collectors)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TelemetryCollector(telemetry, model_name))
    return registry


def histogram_family(name: str, doc: str, labels: list[str], items) -> HistogramMetricFamily:
    """A histogram family from (label values, totals.Histogram) pairs: cumulative buckets, `le` formatted as
    prometheus-client formats its own ("0.001", "1.0", "+Inf")."""
    fam = HistogramMetricFamily(name, doc, labels=labels)
    for values, hist in items:
        counts, total = hist.snapshot()
        cum, buckets = 0, []
        for bound, n in zip(hist.bounds, counts):
            cum += n
            buckets.append((floatToGoString(bound), cum))
        buckets.append(("+Inf", cum + counts[-1]))
        fam.add_metric(values, buckets, sum_value=total)
    return fam


def _one(family, values: list, value: float):
    family.add_metric(values, value)
    return family


class TelemetryCollector:
    def __init__(self, telemetry, model_name: str | None = None):
        self.tel = telemetry
        self.model_name = str(model_name or telemetry.info.get("model") or "unknown")
        ranks = [r.get("rank", i) for i, r in enumerate(telemetry.info.get("ranks") or [])]
        self.ranks = sorted(set(ranks) | {0})

    def collect(self):
        yield from self._vllm_gauges()
        yield from self._vllm_counters()
        yield from self._vllm_histograms()
        yield from self._busy_and_idle()
        yield from self._steps_and_mode()
        yield from self._samples()
        yield from self._delivery()

    # ---- vLLM's names ------------------------------------------------------------------------------------
    def _vllm_gauges(self):
        try:
            stats = self.tel.engine.stats()
        except Exception:               # an engine that cannot say: its gauges are absent, not zero
            return
        labels, values = ["model_name", "engine"], [self.model_name, "0"]
        for name, doc, key in (("vllm:num_requests_running", "Number of requests in model execution batches.",
                                "running"),
                               ("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                                "queue"),
                               ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                                "kv_usage")):
            if stats.get(key) is not None:
                yield _one(GaugeMetricFamily(name, doc, labels=labels), values, float(stats[key]))

    def _vllm_counters(self):
        t = self.tel.totals
        labels, values = ["model_name", "engine"], [self.model_name, "0"]
        for name, doc, value in (
                ("vllm:prompt_tokens", "Number of prefill tokens processed (each request's prompt, once).",
                 t.prompt_tokens),
                ("vllm:generation_tokens", "Number of generation tokens processed.", t.generation_tokens),
                ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", t.preemptions)):
            yield _one(CounterMetricFamily(name, doc, labels=labels), values, value)
        fam = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                  labels=[*labels, "finished_reason"])
        for reason, n in list(t.finished.items()):
            fam.add_metric([*values, reason], n)
        yield fam

    def _vllm_histograms(self):
        t = self.tel.totals
        labels, values = ["model_name", "engine"], [self.model_name, "0"]
        for name, doc, hist in (
                ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", t.ttft),
                ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", t.itl),
                ("vllm:request_time_per_output_token_seconds",
                 "Histogram of time_per_output_token_seconds per request.", t.tpot),
                ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", t.e2e),
                ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                 t.queue),
                ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
                 t.inference),
                ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
                 t.prefill),
                ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
                 t.decode),
                ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", t.request_prompt),
                ("vllm:request_generation_tokens", "Number of generation tokens processed.",
                 t.request_generation),
                # one sequence per request (n=1): its maximum is its own count
                ("vllm:request_max_num_generation_tokens",
                 "Histogram of maximum number of requested generation tokens.", t.request_generation),
                ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                 t.iteration_tokens)):
            yield histogram_family(name, doc, labels, [(values, hist)])

    # ---- batchscope's own --------------------------------------------------------------------------------
    def _busy_ratios(self) -> dict[int, float]:
        """Per rank, the union of its compute spans in the last BUSY_WINDOW_S over the window (rank 0 exactly as
        the page's header computes it)."""
        tel = self.tel
        now = tel.now_us()
        out = {0: tel.busy_ratio(BUSY_WINDOW_S, now)}
        if len(self.ranks) > 1:
            lo = now - BUSY_WINDOW_S * 1e6
            spans: dict[int, list] = {r: [] for r in self.ranks if r}
            for rec in list(tel.recorder.rank_steps)[-8000:]:
                c = rec.get("compute_us")
                if c and c[1] >= lo and rec["rank"] in spans:
                    spans[rec["rank"]].append(c)
            for rank, s in spans.items():
                out[rank] = union_length(s, lo, now) / (BUSY_WINDOW_S * 1e6)
        return out

    def _busy_and_idle(self):
        t, m = self.tel.totals, self.model_name
        fam = GaugeMetricFamily("batchscope_gpu_busy_ratio",
                                "Event-based busy share of the last second (union of compute spans from CUDA "
                                "events, host launch spans on CPU), 0-1; the page header's busy %",
                                labels=["model_name", "rank", "window"])
        for rank, ratio in self._busy_ratios().items():
            fam.add_metric([m, str(rank), f"{BUSY_WINDOW_S:g}s"], ratio)
        yield fam
        busy = dict(t.busy_s)
        fam = CounterMetricFamily("batchscope_gpu_busy_seconds", "Seconds the compute stream ran steps (CUDA "
                                  "events; host launch spans on CPU): rate() is the busy ratio over any window",
                                  labels=["model_name", "rank"])
        for rank in sorted(set(self.ranks) | set(busy)):
            fam.add_metric([m, str(rank)], busy.get(rank, 0.0))
        yield fam
        fam = CounterMetricFamily("batchscope_gpu_idle_seconds", "Seconds the compute stream sat idle between "
                                  "steps, by what the host was doing then (docs/timeline.md, idle causes)",
                                  labels=["model_name", "rank", "cause"])
        for cause in IDLE_CAUSES:
            fam.add_metric([m, "0", cause], t.idle_s[cause])
        yield fam
        yield histogram_family("batchscope_host_phase_seconds", "Host time of each step's phase",
                               ["model_name", "mode", "phase"],
                               [([m, mode, p], t.phases[mode, p]) for mode in MODES for p in HOST_PHASES])
        yield histogram_family("batchscope_decode_step_seconds", "Decode step period: compute start to the next "
                               "step's compute start, steps with decodes and no prefill",
                               ["model_name", "mode"], [([m, mode], t.decode_step[mode]) for mode in MODES])
        if t.floor is not None:
            fam = CounterMetricFamily("batchscope_decode_floor_seconds", "Sum of the memory-bandwidth floors of "
                                      "the decode steps in batchscope_decode_step_seconds (weights + KV in use "
                                      "over the measured bandwidth)", labels=["model_name", "mode"])
            for mode in MODES:
                fam.add_metric([m, mode], t.decode_floor_s[mode])
            yield fam
            ratios = t.floor_ratio(self.tel.now_us(), FLOOR_WINDOW_S)
            if ratios:
                fam = GaugeMetricFamily("batchscope_decode_floor_ratio", "Decode step time over its floor, for "
                                        "the decode steps of the last 10 s (1 = at the floor)",
                                        labels=["model_name", "mode", "window"])
                for mode, ratio in ratios.items():
                    fam.add_metric([m, mode, f"{FLOOR_WINDOW_S:g}s"], ratio)
                yield fam

    def _steps_and_mode(self):
        tel, t, m = self.tel, self.tel.totals, self.model_name
        fam = CounterMetricFamily("batchscope_steps", "Engine steps run, by loop", labels=["model_name", "mode"])
        for mode in MODES:
            fam.add_metric([m, mode], t.steps[mode])
        yield fam
        yield _one(CounterMetricFamily("batchscope_prefill_tokens", "Prompt tokens the steps computed, "
                                       "recomputation after a preemption included", labels=["model_name"]),
                   [m], t.prefill_tokens)
        mode = getattr(tel.engine, "mode", None)
        if mode in MODES:
            fam = GaugeMetricFamily("batchscope_mode", "The loop the engine runs: 1 for the current mode",
                                    labels=["model_name", "mode"])
            for x in MODES:
                fam.add_metric([m, x], 1.0 if x == mode else 0.0)
            yield fam
        yield _one(CounterMetricFamily("batchscope_mode_switches", "Live switches between the sync and async "
                                       "loops", labels=["model_name"]), [m], t.mode_switches)
        rec = tel.recorder
        yield _one(CounterMetricFamily("batchscope_telemetry_observer_seconds", "Engine-thread time spent in "
                                       "telemetry's step callback", labels=["model_name"]), [m],
                   rec.observer_ns / 1e9)
        info = tel.info
        fam = GaugeMetricFamily("batchscope_info", "What is served: fixed at 1",
                                labels=["model_name", "device", "dtype", "gpu", "tensor_parallel_size"])
        fam.add_metric([m, str(tel.device), str(info.get("dtype")), str(info.get("gpu_name") or ""),
                        str(len(self.ranks))], 1.0)
        yield fam

    def _delivery(self):
        """Streamed tokens: the chunk's write time less the token's time (telemetry/delivery.py), per token."""
        delivery = getattr(self.tel.recorder, "delivery", None)
        if delivery is not None:
            yield histogram_family("batchscope_delivery_delay_seconds", "Streamed tokens: from the end of the "
                                   "engine's update that made a token to the server writing its chunk to the "
                                   "client (the server's share of the client's inter-token latency)",
                                   ["model_name"], [([self.model_name], delivery.delay)])

    def _samples(self):
        """The latest NVML sample of each rank's GPU and the host CPU, where they were measured."""
        latest: dict[int, dict] = {}
        for s in reversed(list(self.tel.recorder.nvml)[-64:]):
            latest.setdefault(s.get("rank", 0), s)
        if not latest:
            return
        m = self.model_name
        nvml = {r: s for r, s in latest.items() if s.get("source") == "nvml"}
        for key, name, doc in NVML_RATIOS:
            fam = GaugeMetricFamily(name, doc, labels=["model_name", "rank", "gpu"])
            for rank, s in sorted(nvml.items()):
                if s.get(key) is not None:
                    fam.add_metric([m, str(rank), str(s.get("gpu", rank))], s[key] / 100.0)
            if fam.samples:
                yield fam
        for key, name, doc, scale in NVML_VALUES:
            fam = GaugeMetricFamily(name, doc, labels=["model_name", "rank", "gpu"])
            for rank, s in sorted(nvml.items()):
                if s.get(key) is not None:
                    fam.add_metric([m, str(rank), str(s.get("gpu", rank))], s[key] * scale)
            if fam.samples:
                yield fam
        host = latest.get(0, {})
        if host.get("cpu_pct") is not None:
            yield _one(GaugeMetricFamily("batchscope_host_cpu_ratio", "Host CPU use over all cores (psutil), 0-1",
                                         labels=["model_name"]), [m], host["cpu_pct"] / 100.0)
        if host.get("proc_cpu_pct") is not None:
            yield _one(GaugeMetricFamily("batchscope_process_cpu_cores", "CPU cores this server process used "
                                         "(psutil)", labels=["model_name"]), [m], host["proc_cpu_pct"] / 100.0)

