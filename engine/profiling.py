"""Profiling the engine from inside: its host phases as named ranges a profiler shows, and a torch.profiler window
over the next N steps, run on the engine thread.

Ranges. While a profiler runs, every step's host phases appear as `record_function` ranges (Kineto/torch.profiler)
and NVTX ranges (Nsight Systems), named so that `batchscope import` needs no inference:
    batchscope.schedule
    batchscope.fill step=12
    batchscope.launch step=12 mode=async prefill=0 decode=32 requests=32
    batchscope.wait step=12
    batchscope.update step=12
The kernels a step runs are those launched inside its `launch` range (the runtime calls' correlation ids). A range
costs about 10 µs of host time even with no profiler listening, so they are made only while one is known to run:
the engine's own window below, or `BATCHSCOPE_ANNOTATE=1` for a profiler started elsewhere (torch.profiler records
another thread's ranges only with `profile_all_threads`; Nsight Systems sees every thread).

Window. `Engine.profile(steps=N)` asks for a torch.profiler window: the engine thread starts the profiler before it
builds its next step and stops it once N steps have been consumed, so CPU ops, these ranges and the device's
kernels of exactly those steps are recorded (a profiler started on another thread sees none of the engine
thread's ops). Starting and stopping the profiler hold the engine thread for a moment: that time shows in the
timeline as GPU idle. The trace is written (Chrome trace JSON, gzipped) on a thread of its own.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time

import torch

log = logging.getLogger(__name__)

MAX_WINDOW_STEPS = 1000
_NULL = contextlib.nullcontext()


class _Range:
    __slots__ = ("name", "nvtx", "_rf")

    def __init__(self, name: str, nvtx: bool):
        self.name, self.nvtx, self._rf = name, nvtx, None

    def __enter__(self):
        self._rf = torch.profiler.record_function(self.name)
        self._rf.__enter__()
        if self.nvtx:
            torch.cuda.nvtx.range_push(self.name)
        return self

    def __exit__(self, *exc):
        if self.nvtx:
            torch.cuda.nvtx.range_pop()
        self._rf.__exit__(*exc)
        return False


class ProfileCapture:
    """One requested window, as its requester follows it: state "pending" -> "running" -> "writing" -> "done"
    (or "error"), the steps it covers, the file it wrote."""

    def __init__(self, steps: int, path: str):
        self.steps, self.path = steps, path
        self.state = "pending"
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.started_ns: int | None = None
        self.stopped_ns: int | None = None
        self.start_ms: float | None = None        # what starting the profiler held the engine thread for
        self.stop_ms: float | None = None         # and stopping it
        self.error: str | None = None
        self._done = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def as_dict(self) -> dict:
        return {"state": self.state, "steps": self.steps, "first_step": self.first_step,
                "last_step": self.last_step, "path": self.path if self.state == "done" else None,
                "start_ms": self.start_ms, "stop_ms": self.stop_ms, "error": self.error}

    def _finish(self, state: str, error: str | None = None) -> None:
        self.state, self.error = state, error
        self._done.set()


class Profiling:
    """The engine core's side: the ranges, and the window's start and stop at step boundaries."""

    def __init__(self):
        self.outside = os.environ.get("BATCHSCOPE_ANNOTATE", "0") == "1"
        self.nvtx = self.outside and torch.cuda.is_available()
        self.capture: ProfileCapture | None = None
        self._prof = None
        self._lock = threading.Lock()

    # -- ranges -------------------------------------------------------------------------------------------------
    @property
    def annotating(self) -> bool:
        return self.outside or self._prof is not None

    def range(self, phase: str, plan=None, mode: str | None = None):
        """A context manager: a named range while a profiler runs, else nothing (and no string is built)."""
        if not (self.outside or self._prof is not None):
            return _NULL
        name = f"batchscope.{phase}"
        if plan is not None:
            name += f" step={plan.step}"
            if mode is not None:
                decode = sum(1 for s in plan.seqs if s.is_decode)
                name += (f" mode={mode} prefill={plan.num_tokens - decode} decode={decode} "
                         f"requests={len(plan.seqs)}")
        return _Range(name, self.nvtx)

    # -- the window (request from any thread; start and stop on the engine thread) ----------------------------
    def request(self, steps: int, path: str) -> ProfileCapture:
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_WINDOW_STEPS:
            raise ValueError(f"steps must be an integer from 1 to {MAX_WINDOW_STEPS}, got {steps!r}")
        with self._lock:
            if self.capture is not None and self.capture.state in ("pending", "running", "writing"):
                raise RuntimeError(f"a profiler window is already {self.capture.state} "
                                   f"({self.capture.steps} steps); one at a time")
            self.capture = ProfileCapture(steps, path)
            return self.capture

    def before_build(self) -> None:
        cap = self.capture
        if cap is None or cap.state != "pending":
            return
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        t0 = time.perf_counter_ns()
        try:
            prof = profile(activities=activities, record_shapes=False, with_stack=False)
            prof.start()
        except Exception as exc:                 # a profiler that will not start must not stop the engine
            cap._finish("error", f"{type(exc).__name__}: {exc}")
            return
        self._prof = prof
        cap.started_ns = t0
        cap.start_ms = round((time.perf_counter_ns() - t0) / 1e6, 2)
        cap.state = "running"

    def built(self, step: int) -> None:
        cap = self.capture
        if cap is not None and cap.state == "running" and cap.first_step is None:
            cap.first_step = step

    def consumed(self, step: int) -> None:
        cap = self.capture
        if cap is None or cap.state != "running" or cap.first_step is None:
            return
        if step - cap.first_step + 1 >= cap.steps:
            cap.last_step = step
            self._stop()

    def close(self) -> None:
        """The engine is closing: a window still open ends with the steps it saw."""
        if self._prof is not None:
            self._stop()
        elif self.capture is not None and self.capture.state == "pending":
            self.capture._finish("error", "the engine closed before the window started")

    def _stop(self) -> None:
        cap, prof = self.capture, self._prof
        self._prof = None
        t0 = time.perf_counter_ns()
        try:
            prof.stop()
        except Exception as exc:
            cap._finish("error", f"{type(exc).__name__}: {exc}")
            return
        cap.stopped_ns = time.perf_counter_ns()
        cap.stop_ms = round((cap.stopped_ns - t0) / 1e6, 2)
        cap.state = "writing"
        threading.Thread(target=_write, args=(prof, cap), name="batchscope-profile-writer", daemon=True).start()


def _write(prof, cap: ProfileCapture) -> None:
    try:
        os.makedirs(os.path.dirname(os.path.abspath(cap.path)), exist_ok=True)
        prof.export_chrome_trace(cap.path)
    except Exception as exc:
        log.exception("writing the profiler's trace failed")
        cap._finish("error", f"writing the trace failed: {type(exc).__name__}: {exc}")
        return
    cap._finish("done")
