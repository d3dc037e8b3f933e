"""A synthetic engine: StepTraces with the timing shape of the real sync and async loops, on a virtual clock.

It exists so telemetry, the dashboard and their tests can run without torch, a model or a GPU. It speaks the
engine's observer contract (engine/trace.py): host spans in perf_counter ns, CUDA-like events whose device clock
has its own offset and drift, an anchor re-recorded only when the device is idle (sparser than the real engine,
which anchors every step, so the clock's drift bounds get exercised), events invalidated once their
trace was delivered (the real engine re-records them two steps later), requests that arrive, prefill, decode and
finish by length. Virtual time only moves when a step runs or `idle()` is called, so runs are deterministic.
With `realtime=True` the engine also sleeps until the wall clock catches up with it after each iteration, so its
steps arrive at the pace they claim (live demos, recordings started and stopped by the wall clock).
"""
from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass

from batchscope.engine.config import EngineConfig
from batchscope.engine.trace import ModeChange, StepTrace


class FakeEvent:
    """Stands in for torch.cuda.Event: a device time in ms; elapsed_time fails unless both ends completed."""
    __slots__ = ("t_ms",)

    def __init__(self, t_ms: float | None = None):
        self.t_ms = t_ms

    def elapsed_time(self, end: FakeEvent) -> float:
        if self.t_ms is None or end.t_ms is None:
            raise RuntimeError("CUDA error: device not ready (event not recorded or not complete)")
        return end.t_ms - self.t_ms


@dataclass
class _Req:
    id: str
    prompt: int
    max_new: int
    arrival_ns: int
    out: int = 0
    inflight: int = 0
    prefilled: bool = False


@dataclass
class _Built:
    trace: StepTrace
    reqs: list
    d2h_end: int          # ns on the host clock when the step's tokens are on the host (GPU) / 0 (CPU)
    events: list


class SyntheticEngine:
    def __init__(self, gpu: bool = True, mode: str = "async", seed: int = 0, compute_us: float = 2000.0,
                 per_token_us: float = 1.0, h2d_us: float = 30.0, d2h_us: float = 20.0, host_scale: float = 1.0,
                 clock_offset_ms: float = 5_000.0, drift_ppm: float = 0.0, anchor_error_us: float = 0.0,
                 max_running: int = 32, block_size: int = 16, num_blocks: int = 4096, realtime: bool = False):
        self.gpu = gpu
        self.realtime = realtime
        self.mode = mode
        self._next_mode = mode
        self._rng = random.Random(seed)
        self.compute_us, self.per_token_us = compute_us, per_token_us
        self.h2d_us, self.d2h_us, self.host_scale = h2d_us, d2h_us, host_scale
        self.clock_offset_ms, self.drift, self.anchor_error_us = clock_offset_ms, drift_ppm * 1e-6, anchor_error_us
        self.max_running, self.block_size, self.num_blocks = max_running, block_size, num_blocks
        self._observers: list = []
        self.t0 = self.t = time.perf_counter_ns()
        self.gpu_free = self.t          # compute stream free from (ns)
        self.copy_free = self.t         # D2H stream free from
        self.step_no = 0
        self.waiting: deque[_Req] = deque()
        self.running: list[_Req] = []
        self.pending: _Built | None = None
        self.outputs: dict[str, int] = {}       # id -> tokens delivered (what a caller would have received)
        self._anchor_events = [FakeEvent(), FakeEvent()]    # one per IO slot, like the engine's SlotEvents
        self._next_id = 0
        self.config = EngineConfig(model="synthetic", device="cuda:0" if gpu else "cpu", mode=mode,
                                   block_size=block_size, num_blocks=num_blocks, max_running=max_running)
        self.info = {"model": "synthetic", "device": self.config.device, "dtype": "bfloat16" if gpu else "float32",
                     "gpu_name": "Synthetic GPU" if gpu else None, "num_params": 1_000_000,
                     "weight_bytes": 2_000_000, "kv_bytes_per_token": 4096, "num_layers": 2, "num_kv_heads": 2,
                     "head_dim": 64, "vocab_size": 1000, "block_size": block_size, "num_blocks": num_blocks,
                     "max_batch_tokens": 2048, "max_running": max_running, "max_model_len": 4096,
                     "attention": "synthetic"}

    # ---- the engine's public surface that telemetry uses -----------------------------------------------------
    def add_observer(self, fn) -> None:
        self.t = max(self.t, time.perf_counter_ns())     # never start behind the observer's clock
        self._observers.append(fn)

    def remove_observer(self, fn) -> None:
        if fn in self._observers:
            self._observers.remove(fn)

    def set_mode(self, mode: str, reason: str | None = None) -> None:
        self._next_mode = mode

    def stats(self) -> dict:
        used = self._blocks_used()
        return {"mode": self.mode, "queue": len(self.waiting), "running": len(self.running), "kv_blocks_used": used,
                "kv_blocks_total": self.num_blocks, "kv_usage": used / self.num_blocks, "steps": self.step_no}

    # ---- load ----------------------------------------------------------------------------------------------------
    def submit(self, n: int = 1, prompt_tokens: int = 32, max_new_tokens: int = 8) -> list[str]:
        ids = []
        for _ in range(n):
            rid = f"r{self._next_id}"
            self._next_id += 1
            self.waiting.append(_Req(rid, prompt_tokens, max_new_tokens, self.t))
            ids.append(rid)
        return ids

    def idle(self, us: float) -> None:
        """Let virtual time pass with nothing to do (the engine waits for requests)."""
        self.t += int(us * 1000)
        if self.realtime:
            time.sleep(max(0, self.t - time.perf_counter_ns()) / 1e9)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.pending)

    def run(self, max_steps: int | None = None) -> int:
        """Run loop iterations until no work is left (or max_steps steps were built). Returns steps built."""
        built = 0
        while self.has_work() and (max_steps is None or built < max_steps):
            built += self.iterate()
        if max_steps is None or not self.has_work():
            self._drain()
        return built

    # ---- the loops -------------------------------------------------------------------------------------------
    def iterate(self) -> int:
        """One iteration of the current loop. Sync: build N, wait N, update N. Async: build N+1, launch it, then
        wait for and update N. Returns 1 if a step was built."""
        if self._next_mode != self.mode:
            self._drain()            # a switch drains the pipeline: nothing lost, nothing repeated
            self._emit(ModeChange(self.t, self.step_no, self.mode, self._next_mode))
            self.mode = self._next_mode
        new = self._build()
        if self.mode == "sync":
            if new is not None:
                self._consume(new, None)
        else:
            previous, self.pending = self.pending, new
            if previous is not None:
                self._consume(previous, new)
        if self.realtime:
            ahead = self.t - time.perf_counter_ns()
            if ahead > 0:
                time.sleep(ahead / 1e9)
        return int(new is not None)

    def _drain(self) -> None:
        if self.pending is not None:
            previous, self.pending = self.pending, None
            self._consume(previous, None)

    def _host(self, us: float) -> tuple[int, int]:
        start = self.t
        self.t += max(1, int(us * self.host_scale * (0.8 + 0.4 * self._rng.random()) * 1000))
        return start, self.t

    def _dev_ms(self, ns: int) -> float:
        return (ns - self.t0) * (1.0 + self.drift) / 1e6 + self.clock_offset_ms

    def _blocks_used(self) -> int:
        return sum(-(-(r.prompt + r.out + r.inflight) // self.block_size) for r in self.running)

    def _build(self) -> _Built | None:
        queue_depth = len(self.waiting)
        arrivals = []
        while self.waiting and len(self.running) < self.max_running:
            req = self.waiting.popleft()
            self.running.append(req)
            arrivals.append((req.id, req.arrival_ns, req.prompt))
        reqs = [r for r in self.running if r.out + r.inflight < r.max_new]
        if not reqs:
            return None
        prefill = sum(r.prompt for r in reqs if not r.prefilled)
        decode = sum(1 for r in reqs if r.prefilled)
        for r in reqs:
            r.prefilled = True
            r.inflight += 1
        n = self.step_no
        self.step_no += 1
        host = {"schedule": self._host(20 + 1.0 * len(reqs)), "fill": self._host(15 + 0.5 * len(reqs))}
        work_us = self.compute_us + self.per_token_us * (prefill + decode)
        in_flight = self.pending.trace.step if self.pending is not None else None
        tr = StepTrace(step=n, mode=self.mode, slot=n % 2, request_ids=[r.id for r in reqs],
                       prefill_tokens=prefill, decode_tokens=decode, sampled=len(reqs),
                       carried=decode if self.mode == "async" and self.pending else 0,
                       kv_blocks_used=self._blocks_used(), kv_blocks_total=self.num_blocks,
                       queue_depth=queue_depth, running=len(self.running), arrivals=arrivals,
                       built_during_step=in_flight)
        events, d2h_end = [], 0
        if self.gpu:
            launch = self._host(40)
            host["launch"] = launch
            if self.pending is None:          # launched on an idle device: re-anchor (sparser than the engine)
                anchor = self._anchor_events[tr.slot]
                anchor.t_ms = self._dev_ms(max(launch[0], self.gpu_free, self.copy_free)) + self.anchor_error_us / 1e3
                tr.anchor = (anchor, launch[0])
            h2d = (launch[0] + 5_000, launch[0] + 5_000 + int(self.h2d_us * 1000))
            c0 = max(h2d[1], self.gpu_free)
            compute = (c0, c0 + int(work_us * 1000))
            d0 = max(compute[1], self.copy_free)
            d2h = (d0, d0 + int(self.d2h_us * 1000))
            self.gpu_free, self.copy_free, d2h_end = compute[1], d2h[1], d2h[1]
            spans = {"h2d": h2d, "compute": compute, "d2h": d2h}
            tr.gpu_events = {p: (FakeEvent(self._dev_ms(a)), FakeEvent(self._dev_ms(b))) for p, (a, b) in spans.items()}
            events = [e for pair in tr.gpu_events.values() for e in pair]
        else:                        # CPU: the forward runs inside launch
            host["launch"] = self._host(10 + work_us / self.host_scale)
        tr.host = host
        return _Built(tr, reqs, d2h_end, events)

    def _consume(self, built: _Built, launched: _Built | None) -> None:
        tr = built.trace
        wait0 = self.t
        self.t = max(self.t + 1000, built.d2h_end + 8_000 if built.d2h_end else 0)   # wake-up after the copy
        tr.host["wait"] = (wait0, self.t)
        for r in built.reqs:
            r.inflight -= 1
            r.out += 1
            tr.tokens.append((r.id, 1))
            self.outputs[r.id] = self.outputs.get(r.id, 0) + 1
            if r.out >= r.max_new:
                tr.finished.append((r.id, "length", r.prompt, r.out))
                self.running.remove(r)
        tr.host["update"] = self._host(15 + 1.0 * len(built.reqs))
        self._emit(tr)
        for ev in built.events:      # the slot's events get re-recorded later: a late reader would fail
            ev.t_ms = None

    def _emit(self, event) -> None:
        for fn in list(self._observers):
            fn(event)
