"""Small Kineto (torch.profiler Chrome trace) files built event by event, for tests whose answers are worked out
by hand: CPU threads with annotations, ops and runtime calls; device streams with kernels, copies and memsets;
correlation ids and `ac2g` flows joining each launch to its device ops, as torch.profiler writes them.

    tr = KinetoTrace()
    tr.annotation("batchscope.launch step=0 mode=sync prefill=4 decode=0 requests=1", 100, 50)
    tr.launch(110, 5, kernel_at=120, kernel_dur=20)          # cudaLaunchKernel at 110 µs, its kernel at 120 µs
    tr.write(tmp_path / "t.pt.trace.json.gz")

Times are µs on the trace's clock (offset by `BASE_TS` so they look like Kineto's relative timestamps). With
`hip=True` runtime calls and header keys are ROCm's. Metadata rows go last, as Kineto writes them;
`write(..., metadata=False)` leaves them out, as trimmed excerpts do.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

BASE_TS = 5_311_380_000_000.0              # Kineto's relative timestamps are this large
BASE_NS = 1_790_857_026_000_000_000        # and baseTimeNanoseconds puts them on the wall clock
PID, TID = 4242, 4242

_CUDA = {"launch": "cudaLaunchKernel", "graph": "cudaGraphLaunch", "memcpy": "cudaMemcpyAsync",
         "sync": "cudaStreamSynchronize", "event_sync": "cudaEventSynchronize", "wait_event": "cudaStreamWaitEvent",
         "memset": "cudaMemsetAsync"}
_HIP = {"launch": "hipLaunchKernel", "graph": "hipGraphLaunch", "memcpy": "hipMemcpyAsync",
        "sync": "hipStreamSynchronize", "event_sync": "hipEventSynchronize", "wait_event": "hipStreamWaitEvent",
        "memset": "hipMemsetAsync"}
_COPY_NAMES = {"HtoD": "Memcpy HtoD (Pinned -> Device)", "DtoH": "Memcpy DtoH (Device -> Pinned)",
               "DtoD": "Memcpy DtoD (Device -> Device)"}


class KinetoTrace:
    def __init__(self, hip: bool = False, pid: int = PID, tid: int = TID, device: int = 0, rank: int | None = None,
                 base_ns: int | None = BASE_NS, gpu_name: str = "NVIDIA H200"):
        self.hip, self.pid, self.tid, self.device = hip, pid, tid, device
        self.calls = _HIP if hip else _CUDA
        self.events: list[dict] = []
        self.threads: set[int] = {tid}
        self.streams: set[int] = set()
        self._corr = 1000
        self.header: dict = {"schemaVersion": 1,
                             "deviceProperties": [{"id": device, "name": gpu_name, "totalGlobalMem": 1 << 37}]}
        self.header.update({"roctracer_version": 4.1, "hip_runtime_version": 70253211} if hip else
                           {"cupti_version": 130001, "cuda_runtime_version": 13000})
        if rank is not None:
            self.header["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
        if base_ns is not None:
            self.header["baseTimeNanoseconds"] = base_ns

    # ---- host side ---------------------------------------------------------------------------------------------
    def _x(self, cat: str, name: str, ts: float, dur: float, pid: int, tid, args: dict | None = None) -> dict:
        ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": BASE_TS + ts, "dur": dur}
        if args is not None:
            ev["args"] = args
        self.events.append(ev)
        return ev

    def annotation(self, name: str, ts: float, dur: float, tid: int | None = None) -> None:
        self.threads.add(tid or self.tid)
        self._x("user_annotation", name, ts, dur, self.pid, tid or self.tid, {"External id": 1, "Ev Idx": 0})

    def cpu_op(self, name: str, ts: float, dur: float, tid: int | None = None) -> None:
        self.threads.add(tid or self.tid)
        self._x("cpu_op", name, ts, dur, self.pid, tid or self.tid, {"External id": 2, "Ev Idx": 0})

    def python(self, name: str, ts: float, dur: float, tid: int | None = None) -> None:
        self.threads.add(tid or self.tid)
        self._x("python_function", name, ts, dur, self.pid, tid or self.tid, {"Python id": 1, "Ev Idx": 0})

    def runtime(self, call: str, ts: float, dur: float, tid: int | None = None, flow: bool = False) -> int:
        """A runtime call (a key of the CUDA/HIP name table, or a literal name); returns its correlation id."""
        self._corr += 1
        tid = tid or self.tid
        self.threads.add(tid)
        name = self.calls.get(call, call)
        args = {"cid": 1, "correlation": self._corr} if self.hip else {"cbid": 211, "correlation": self._corr}
        self._x("cuda_runtime", name, ts, dur, self.pid, tid, args)
        if flow:
            self.events.append({"ph": "s", "id": self._corr, "pid": self.pid, "tid": tid, "ts": BASE_TS + ts,
                                "cat": "ac2g", "name": "ac2g"})
        return self._corr

    def sync(self, ts: float, dur: float, call: str = "sync", tid: int | None = None) -> int:
        return self.runtime(call, ts, dur, tid)

    # ---- device side -------------------------------------------------------------------------------------------
    def _device(self, cat: str, name: str, ts: float, dur: float, corr: int | None, stream: int,
                extra: dict | None = None) -> None:
        self.streams.add(stream)
        args = {"device": self.device, "stream": stream, "correlation": corr if corr is not None else 0}
        if self.hip and cat == "kernel":
            args["kind"] = "Dispatch Kernel"
        args.update(extra or {})
        self._x(cat, name, ts, dur, self.device, stream, args)
        if corr is not None:
            self.events.append({"ph": "f", "id": corr, "pid": self.device, "tid": stream, "ts": BASE_TS + ts,
                                "cat": "ac2g", "name": "ac2g", "bp": "e"})

    def kernel(self, name: str, ts: float, dur: float, corr: int | None, stream: int = 7) -> None:
        self._device("kernel", name, ts, dur, corr, stream, {"grid": [1, 1, 1], "block": [128, 1, 1]})

    def launch(self, ts: float, call_dur: float, kernel_at: float, kernel_dur: float, name: str = "gemm_kernel",
               stream: int = 7, tid: int | None = None) -> int:
        corr = self.runtime("launch", ts, call_dur, tid, flow=True)
        self.kernel(name, kernel_at, kernel_dur, corr, stream)
        return corr

    def copy(self, direction: str, ts: float, call_dur: float, copy_at: float, copy_dur: float, stream: int = 9,
             tid: int | None = None, call: str = "memcpy") -> int:
        corr = self.runtime(call, ts, call_dur, tid, flow=True)
        self._device("gpu_memcpy", _COPY_NAMES[direction], copy_at, copy_dur, corr, stream, {"bytes": 4096})
        return corr

    def graph(self, ts: float, call_dur: float, kernels: list[tuple[float, float]], stream: int = 7,
              tid: int | None = None) -> int:
        """A graph launch: every kernel of the graph carries the launch's correlation id."""
        corr = self.runtime("graph", ts, call_dur, tid, flow=True)
        for i, (at, dur) in enumerate(kernels):
            self.kernel(f"graph_kernel_{i}", at, dur, corr, stream)
        return corr

    def gpu_annotation(self, name: str, ts: float, dur: float, stream: int = 7) -> None:
        self.streams.add(stream)
        self._x("gpu_user_annotation", name, ts, dur, self.device, stream, {"External id": 1})

    def stream_wait_record(self, ts: float, dur: float, stream: int, waits_on: int) -> None:
        """The device-side record CUPTI writes when a stream waits on another stream's event."""
        self._x("cuda_sync", "Wait Event", ts, dur, self.device, stream,
                {"cuda_sync_kind": "Wait Event", "stream": stream, "wait_on_stream": waits_on,
                 "device": self.device, "correlation": 0})

    # ---- output ------------------------------------------------------------------------------------------------
    def metadata(self) -> list[dict]:
        rows = [{"name": "process_name", "ph": "M", "pid": self.pid, "tid": 0, "args": {"name": "python3"}},
                {"name": "process_labels", "ph": "M", "pid": self.pid, "tid": 0, "args": {"labels": "CPU"}},
                {"name": "process_name", "ph": "M", "pid": self.device, "tid": 0, "args": {"name": "python3"}},
                {"name": "process_labels", "ph": "M", "pid": self.device, "tid": 0,
                 "args": {"labels": f"GPU {self.device}"}}]
        rows += [{"name": "thread_name", "ph": "M", "pid": self.pid, "tid": t, "args": {"name": f"thread {t} (python3)"}}
                 for t in sorted(self.threads)]
        rows += [{"name": "thread_name", "ph": "M", "pid": self.device, "tid": s, "args": {"name": f"stream {s} "}}
                 for s in sorted(self.streams)]
        return rows

    def to_dict(self, metadata: bool = True, keys_after: bool = False) -> dict:
        events = self.events + (self.metadata() if metadata else [])
        if keys_after:                  # as re-saved files have it: every key after the events
            return {"traceEvents": events, **self.header, "traceName": "/tmp/x.json"}
        return {**self.header, "traceEvents": events, "traceName": "/tmp/x.json"}

    def write(self, path, gz: bool | None = None, metadata: bool = True, keys_after: bool = False,
              array: bool = False) -> Path:
        path = Path(path)
        doc = self.events if array else self.to_dict(metadata, keys_after)
        text = json.dumps(doc, indent=1).encode()
        gz = path.name.endswith(".gz") if gz is None else gz
        path.write_bytes(gzip.compress(text) if gz else text)
        return path
