"""Profiler windows on demand: the server's side of `Engine.profile(steps)` (engine/profiling.py).

The engine runs torch.profiler over its next N steps, on its own thread, and writes the Kineto trace (Chrome trace
JSON, gzipped) on a thread of its own. Here: one window at a time (a second is a 409 while one is pending, running
or being written), N from 1 to the engine's maximum, traces in a folder of this server's own of which only the
latest is kept (a new window deletes the previous trace), and what the page and the API show while it runs.

A window asked for while the engine is idle waits for the next step ("pending"). Opening the trace back in the
timeline goes through the trace importer (`batchscope.telemetry.importers`) where this build has it: the trace
becomes a timeline loaded as the replay. Without it the trace is for Perfetto (ui.perfetto.dev opens .json.gz).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import threading
import time

from batchscope.engine.profiling import MAX_WINDOW_STEPS

from .errors import Conflict, NotFoundError, NotInThisBuild

TRACE_URL = "/api/profile/trace.json.gz"
OPEN_URL = "/api/profile/open"
IMPORTER = "batchscope.telemetry.importers"
ACTIVE = ("pending", "running", "writing")


def importer_available() -> bool:
    if IMPORTER in sys.modules:
        return True
    try:
        return importlib.util.find_spec(IMPORTER) is not None
    except (ModuleNotFoundError, ValueError):
        return False


class ProfileWindows:
    def __init__(self, engine, folder: str | None = None):
        self.engine = engine
        self._own_folder = folder is None
        self.folder = folder or tempfile.mkdtemp(prefix="batchscope-profiles-")
        self.capture = None
        self.count = 0
        self.requested_at: float | None = None
        self._lock = threading.Lock()

    @property
    def max_steps(self) -> int:
        return MAX_WINDOW_STEPS

    def start(self, steps: int) -> dict:
        """Ask the engine for a window over its next `steps` steps. Raises ValueError for a count out of range,
        Conflict while another window is open."""
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_WINDOW_STEPS:
            raise ValueError(f"steps must be an integer from 1 to {MAX_WINDOW_STEPS}, got {steps!r}")
        with self._lock:
            cap = self.capture
            if cap is not None and cap.state in ACTIVE:
                raise Conflict(f"a profiler window of {cap.steps} steps is {cap.state}; one at a time (GET "
                               "/api/profile follows it)")
            path = os.path.join(self.folder, f"profile-{self.count + 1}.pt.trace.json.gz")
            try:
                new = self.engine.profile(steps, path)
            except RuntimeError as e:    # a window asked for outside this server (Engine.profile)
                raise Conflict(str(e)) from None
            self.count += 1
            self.capture, self.requested_at = new, time.time()
        if cap is not None and cap.path != path:
            _remove(cap.path)            # only the latest trace is kept
        return self.status()

    def status(self) -> dict:
        cap = self.capture
        base = {"max_steps": MAX_WINDOW_STEPS, "importer": importer_available()}
        if cap is None:
            return {**base, "state": "idle", "id": None, "steps": None, "first_step": None, "last_step": None,
                    "start_ms": None, "stop_ms": None, "error": None, "requested_at": None, "trace_url": None,
                    "trace_bytes": None, "open_url": None}
        d = cap.as_dict()
        done = d["state"] == "done" and os.path.isfile(cap.path)
        return {**base, "state": d["state"], "id": self.count, "steps": d["steps"], "first_step": d["first_step"],
                "last_step": d["last_step"], "start_ms": d["start_ms"], "stop_ms": d["stop_ms"],
                "error": d["error"], "requested_at": self.requested_at,
                "trace_url": TRACE_URL if done else None,
                "trace_bytes": os.path.getsize(cap.path) if done else None,
                "open_url": OPEN_URL if done and base["importer"] else None}

    def trace_path(self) -> str | None:
        cap = self.capture
        if cap is None or cap.state != "done" or not os.path.isfile(cap.path):
            return None
        return cap.path

    def import_trace(self) -> dict:
        """The latest trace as a batchscope.timeline/1 (through the trace importer). Raises NotFoundError without
        a finished trace, NotInThisBuild where this build has no importer."""
        path = self.trace_path()
        if path is None:
            raise NotFoundError("no finished profiler trace: POST /api/profile first, then wait for state 'done'")
        if not importer_available():
            raise NotInThisBuild(f"this build has no trace importer ({IMPORTER}); download {TRACE_URL} and "
                                      "open it in ui.perfetto.dev instead")
        from batchscope.telemetry.importers import import_trace

        return import_trace(path, workers=1)

    def close(self) -> None:
        """After the engine closed (which ends a window still open): let its trace be written, then remove the
        folder this server made."""
        cap = self.capture
        if cap is not None and cap.state in ACTIVE:
            cap.wait(30)
        if self._own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
