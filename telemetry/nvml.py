"""A sampler thread: NVML where there is a GPU to watch, host CPU % from psutil everywhere.

Each sample is a dict with the firm NVML fields (None where there is no NVML) plus host `cpu_pct` and the engine
process's `proc_cpu_pct`. On NVML machines `fine` carries the driver's own finer utilization samples since the
previous poll (`nvmlDeviceGetSamples`), mapped onto the session clock. Under tensor parallelism every poll gives
one sample per rank's GPU, each with `gpu` (its NVML index) and `rank`; the host CPU fields ride on rank 0's.

NVML utilization is the share of a 1/6 to 1 s driver window in which any kernel ran: a GPU that idles 2 ms between
10 ms steps still reads 100%. The event-based busy % (union of compute spans) sees those gaps; that is why the two
differ, and why the dashboard shows both.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

BUSY_NOTE = ("NVML utilization is the share of a 1/6-1 s driver window in which any kernel was running, so it "
             "reads near 100% even when the GPU idles for milliseconds between steps. busy_pct is measured from "
             "CUDA events (the union of compute spans over the window) and shows those gaps.")

try:   # nvidia-ml-py installs the module `pynvml`
    import pynvml
except Exception as exc:   # pragma: no cover - depends on the machine
    pynvml = None
    _IMPORT_ERROR = f"nvidia-ml-py is not importable ({exc})"
else:
    _IMPORT_ERROR = None

try:
    import psutil
except Exception:   # pragma: no cover
    psutil = None


def _device_index(device: str | None) -> int:
    if device and device.startswith("cuda:"):
        try:
            return int(device.split(":", 1)[1])
        except ValueError:
            return 0
    return 0


def _nvml_handle(device: str | None):
    """The NVML handle of the engine's GPU. CUDA and NVML number GPUs differently when CUDA_VISIBLE_DEVICES is
    set, so match by UUID through torch where we can, else by index."""
    index = _device_index(device)
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        try:
            import torch
            uuid = str(torch.cuda.get_device_properties(index).uuid)
            return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else "GPU-" + uuid)
        except Exception:
            pass
    return pynvml.nvmlDeviceGetHandleByIndex(index)


_VALUE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal")   # nvmlValueType_t 0..4


def _sample_value(value_type: int, value) -> float:
    return getattr(value, _VALUE_FIELDS[value_type] if 0 <= value_type < len(_VALUE_FIELDS) else "uiVal")


class Sampler:
    """Polls at `hz` on its own thread and hands each sample to `emit` (which must be cheap and thread-safe)."""

    def __init__(self, emit: Callable[[dict], None], now_us: Callable[[], float], device: str | None,
                 hz: float = 20.0, unix_origin_ns: int | None = None, use_nvml: bool = True,
                 rank_devices: list[str] | None = None):
        self.emit = emit
        self.now_us = now_us
        self.period = 1.0 / hz if hz and hz > 0 else None
        self.hz = hz
        self.unix_origin_ns = unix_origin_ns   # wall-clock ns of the session origin (driver samples use wall time)
        self.nvml = False
        self.reason: str | None = None
        self.gpu_name: str | None = None
        self.samples = 0
        self.errors = 0
        self.last_error: str | None = None
        self._handle = None
        self._last_driver_ts = 0
        self._ranks: list[list] = []        # tensor parallel: [rank, nvml index, handle, last driver ts]
        self._proc = psutil.Process() if psutil else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if not use_nvml:
            self.reason = "the engine runs on the CPU; no GPU to watch"
        elif pynvml is None:
            self.reason = _IMPORT_ERROR
        else:
            self._open_nvml(device)
            if self.nvml and rank_devices and len(rank_devices) > 1:
                self._open_ranks(rank_devices)
        if self._proc is not None:          # prime the "since last call" CPU counters
            psutil.cpu_percent(None)
            self._proc.cpu_percent(None)

    def _open_nvml(self, device: str | None) -> None:
        try:
            pynvml.nvmlInit()
            self._handle = _nvml_handle(device)
            name = pynvml.nvmlDeviceGetName(self._handle)
            self.gpu_name = name.decode() if isinstance(name, bytes) else name
            self.nvml = True
            # driver samples older than the session are not ours
            if self.unix_origin_ns is not None:
                self._last_driver_ts = self.unix_origin_ns // 1000
        except Exception as exc:
            self.reason = f"NVML unavailable: {exc}"
            self._handle = None

    def _open_ranks(self, devices: list[str]) -> None:
        try:
            for rank, device in enumerate(devices):
                handle = self._handle if rank == 0 else _nvml_handle(device)
                self._ranks.append([rank, pynvml.nvmlDeviceGetIndex(handle), handle, self._last_driver_ts])
        except Exception as exc:
            self._ranks = []
            self.last_error = f"NVML: the other ranks' GPUs: {exc}"

    @property
    def kind(self) -> str:
        return "nvml" if self.nvml else "psutil"

    def start(self) -> None:
        if self.period is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="batchscope-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.sample_once()

    def sample_once(self) -> dict:
        sample = {"t_us": round(self.now_us(), 1), "gpu_util": None, "mem_util": None, "mem_used_mb": None,
                  "power_w": None, "sm_clock_mhz": None, "source": self.kind}
        if self._proc is not None:
            try:
                sample["cpu_pct"] = psutil.cpu_percent(None)
                sample["proc_cpu_pct"] = self._proc.cpu_percent(None)
            except Exception:
                pass
        if self._ranks:
            for i, entry in enumerate(self._ranks):
                rank, index, handle, self._last_driver_ts = entry
                mine = sample if i == 0 else {k: v for k, v in sample.items() if k not in ("cpu_pct", "proc_cpu_pct")}
                mine.update(gpu=index, rank=rank)
                self._read_nvml_safely(mine, handle)
                entry[3] = self._last_driver_ts
                self.samples += 1
                self.emit(mine)
            return sample
        if self.nvml:
            self._read_nvml_safely(sample, self._handle)
        self.samples += 1
        self.emit(sample)
        return sample

    def _read_nvml_safely(self, sample: dict, handle) -> None:
        try:
            self._read_nvml(sample, handle)
        except Exception as exc:
            self.errors += 1
            self.last_error = str(exc)

    def _read_nvml(self, sample: dict, handle) -> None:
        h = handle
        util = pynvml.nvmlDeviceGetUtilizationRates(h)
        sample["gpu_util"] = float(util.gpu)
        sample["mem_util"] = float(util.memory)
        sample["mem_used_mb"] = round(pynvml.nvmlDeviceGetMemoryInfo(h).used / 2**20, 1)
        try:
            sample["power_w"] = round(pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0, 1)
        except Exception:            # some boards do not report power
            pass
        try:
            sample["sm_clock_mhz"] = float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
        except Exception:
            pass
        fine = self._driver_samples(h)
        if fine:
            sample["fine"] = fine

    def _driver_samples(self, handle) -> list | None:
        """The driver's own utilization samples since the last poll, as [t_us, util] on the session clock."""
        if self.unix_origin_ns is None:
            return None
        try:
            vtype, raw = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES,
                                                     self._last_driver_ts)
        except Exception:           # NOT_FOUND when nothing is new, NOT_SUPPORTED on some boards
            return None
        out = []
        for s in raw:
            if s.timeStamp <= self._last_driver_ts:
                continue
            t_us = round((s.timeStamp * 1000 - self.unix_origin_ns) / 1000.0, 1)
            out.append([t_us, float(_sample_value(vtype, s.sampleValue))])
        if raw:
            self._last_driver_ts = max(self._last_driver_ts, max(s.timeStamp for s in raw))
        out.sort()
        return out

    def status(self) -> dict:
        return {"nvml": self.nvml, "nvml_reason": self.reason, "gpu_name": self.gpu_name, "sampler": self.kind,
                "hz": self.hz, "samples": self.samples, "errors": self.errors, "last_error": self.last_error}

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None
        if self.nvml:
            try:
                pynvml.nvmlShutdown()
            except Exception:
                pass
            self.nvml = False
            self.reason = "sampler closed"


def unix_origin_ns(origin_perf_ns: int) -> int:
    """Wall-clock ns matching a perf_counter_ns origin (for the driver's wall-clock sample timestamps)."""
    return time.time_ns() - (time.perf_counter_ns() - origin_perf_ns)
