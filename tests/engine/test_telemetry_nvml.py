"""The sampler: NVML fields and the driver's finer samples where NVML exists, a clear status and CPU % where not."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from batchscope.telemetry import Telemetry
from batchscope.telemetry import nvml as nvml_mod
from batchscope.telemetry.nvml import Sampler
from synthetic import SyntheticEngine

FIRM = ("t_us", "gpu_util", "mem_util", "mem_used_mb", "power_w", "sm_clock_mhz")


class FakeNVML:
    """Just enough of nvidia-ml-py's pynvml for the sampler."""
    NVML_CLOCK_SM = 1
    NVML_GPU_UTILIZATION_SAMPLES = 1

    def __init__(self, unix_origin_ns, fail_init=None):
        self.origin_us = unix_origin_ns // 1000
        self.fail_init = fail_init
        self.shutdown = False
        self.sample_calls = []

    def nvmlInit(self):
        if self.fail_init:
            raise RuntimeError(self.fail_init)

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("gpu", index)

    def nvmlDeviceGetIndex(self, handle):
        return handle[1]

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H200"

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=87, memory=41)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=3 * 2**30, total=141 * 2**30)

    def nvmlDeviceGetPowerUsage(self, handle):
        return 412_345                      # mW

    def nvmlDeviceGetClockInfo(self, handle, clock):
        assert clock == self.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetSamples(self, handle, kind, last_seen):
        self.sample_calls.append(last_seen)
        # the driver's ring: one sample before the session started, then two after (µs of wall time)
        raw = [(self.origin_us - 5_000, 10), (self.origin_us + 1_000, 50), (self.origin_us + 2_000, 100)]
        return 1, [SimpleNamespace(timeStamp=t, sampleValue=SimpleNamespace(uiVal=v)) for t, v in raw
                   if t > last_seen]


def test_on_a_cpu_engine_the_status_says_so_and_cpu_percent_is_sampled():
    tel = Telemetry(SyntheticEngine(gpu=False), nvml_hz=0)
    status = tel.status()
    assert status["nvml"] is False and status["sampler"] == "psutil"
    assert "CPU" in status["nvml_reason"]
    assert "NVML" in status["busy_note"] and "busy_pct" in status["busy_note"]
    sample = tel.sampler.sample_once()
    assert set(FIRM) <= set(sample)
    assert all(sample[k] is None for k in FIRM[1:])
    assert isinstance(sample["cpu_pct"], float) and sample["source"] == "psutil"
    assert tel.timeline()["nvml"][-1] is sample
    tel.close()


def test_nvml_fields_and_the_driver_samples_on_the_session_clock(monkeypatch):
    origin = time.time_ns()
    fake = FakeNVML(origin)
    monkeypatch.setattr(nvml_mod, "pynvml", fake)
    got = []
    sampler = Sampler(got.append, lambda: 123.0, "cuda:0", hz=20.0, unix_origin_ns=origin)
    assert sampler.status()["nvml"] is True and sampler.kind == "nvml" and sampler.gpu_name == "NVIDIA H200"
    s = sampler.sample_once()
    assert s == got[0]
    assert (s["t_us"], s["gpu_util"], s["mem_util"], s["mem_used_mb"], s["power_w"], s["sm_clock_mhz"]) == \
        (123.0, 87.0, 41.0, 3072.0, 412.3, 1980.0)
    # the sample from before the session is not ours; the others land on the session clock
    assert [v for _, v in s["fine"]] == [50.0, 100.0]
    assert [t for t, _ in s["fine"]] == pytest.approx([1000.0, 2000.0], abs=1.0)
    again = sampler.sample_once()
    assert "fine" not in again                                  # nothing new since the last poll
    assert fake.sample_calls[-1] == fake.origin_us + 2_000
    sampler.close()
    assert fake.shutdown and sampler.status()["nvml"] is False


def test_tensor_parallel_samples_every_rank_gpu_with_its_rank(monkeypatch):
    """One sample per rank's GPU per poll, each naming its NVML index and rank; host CPU % only on rank 0's.
    Each GPU keeps its own driver-sample cursor."""
    origin = time.time_ns()
    fake = FakeNVML(origin)
    monkeypatch.setattr(nvml_mod, "pynvml", fake)
    got = []
    sampler = Sampler(got.append, lambda: 5.0, "cuda:0", hz=20.0, unix_origin_ns=origin,
                      rank_devices=["cuda:0", "cuda:1"])
    sampler.sample_once()
    assert [(s["rank"], s["gpu"]) for s in got] == [(0, 0), (1, 1)]
    assert all(s["gpu_util"] == 87.0 and s["t_us"] == 5.0 for s in got)
    assert "cpu_pct" in got[0] and "cpu_pct" not in got[1]
    assert [v for _, v in got[1]["fine"]] == [50.0, 100.0]     # rank 1's cursor did not move with rank 0's
    got.clear()
    sampler.sample_once()
    assert len(got) == 2 and not any("fine" in s for s in got)
    sampler.close()


def test_a_failing_nvml_falls_back_to_psutil_with_the_reason(monkeypatch):
    monkeypatch.setattr(nvml_mod, "pynvml", FakeNVML(time.time_ns(), fail_init="NVML Shared Library Not Found"))
    sampler = Sampler(lambda s: None, lambda: 0.0, "cuda:0", hz=20.0)
    status = sampler.status()
    assert status["nvml"] is False and status["sampler"] == "psutil"
    assert status["nvml_reason"] == "NVML unavailable: NVML Shared Library Not Found"
    assert sampler.sample_once()["gpu_util"] is None


def test_a_missing_nvidia_ml_py_is_reported(monkeypatch):
    monkeypatch.setattr(nvml_mod, "pynvml", None)
    monkeypatch.setattr(nvml_mod, "_IMPORT_ERROR", "nvidia-ml-py is not importable (No module named 'pynvml')")
    sampler = Sampler(lambda s: None, lambda: 0.0, "cuda:0", hz=20.0)
    assert sampler.status()["nvml_reason"].startswith("nvidia-ml-py is not importable")


def test_the_sampler_thread_feeds_the_ring_until_closed():
    tel = Telemetry(SyntheticEngine(gpu=False), nvml_hz=100.0)
    deadline = time.monotonic() + 10
    while len(tel.recorder.nvml) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(tel.recorder.nvml) >= 3
    times = [s["t_us"] for s in tel.recorder.nvml]
    assert times == sorted(times)
    tel.close()
    assert tel.sampler._thread is None
    n = len(tel.recorder.nvml)
    time.sleep(0.05)
    assert len(tel.recorder.nvml) == n


@pytest.mark.parametrize("hz", [0, None])
def test_a_zero_rate_samples_only_on_demand(hz):
    tel = Telemetry(SyntheticEngine(gpu=False), nvml_hz=hz or 0)
    assert tel.sampler._thread is None
    tel.close()
