"""Sweeps: a synchronous run, a throughput run and rising rates in each mode (app/loadtest/sweep), and other
tools' reports (GuideLLM, `vllm bench serve`, batchscope.sweep/1) read to lay over them.

A sweep runs on the load lab's manager and takes the engine for itself, so it is started through the lab's
admission (NoEngineError on a replay-only server, ShuttingDownError while the server goes down); an unknown
sweep or report id is a NotFoundError (404).
"""
from __future__ import annotations

import threading
from typing import Annotated

from fastapi import Depends

from ..loadtest.sweep.progress import SweepList, SweepStarted, SweepStatus
from ..loadtest.sweep.spec import SLO, SweepSpec
from ..loadtest.sweep.sweeps import SweepRun, Sweeps
from .deps import app_state
from .errors import BusyError, unknown_id_not_found
from .load_lab import LoadLab


class SweepLab:
    def __init__(self, state, lab: LoadLab):
        self.state = state
        self.lab = lab
        self.sweeps = Sweeps(lab.runs) if lab.runs is not None else None
        self._import_lock = threading.Lock()

    def start(self, spec: SweepSpec) -> SweepStarted:
        self.lab.admit()
        info = self.state.engine.info
        meta = {"model": self.state.model_name, "device": info.get("device"), "dtype": info.get("dtype"),
                "gpu": info.get("gpu_name"), "mode_before": self.state.engine.mode}
        return self.sweeps.start(spec, meta)

    def run(self, sweep_id: str) -> SweepRun:
        """A sweep by id, running or kept (NotFoundError if neither): its status(), document(), values."""
        self.state.need_engine()
        with unknown_id_not_found():
            return self.sweeps.get(sweep_id)

    def status(self, sweep_id: str) -> SweepStatus:
        return self.run(sweep_id).status()

    def stop(self, sweep_id: str) -> SweepStatus:
        self.state.need_engine()
        with unknown_id_not_found():
            return self.sweeps.stop(sweep_id)

    def list(self) -> SweepList:
        return self.sweeps.list() if self.sweeps is not None else SweepList(sweeps=[], imports=[])

    def running(self) -> str | None:
        return self.sweeps.running() if self.sweeps is not None else None

    def import_report(self, raw, slo: SLO | None = None) -> dict:
        """Read a GuideLLM, vllm bench serve or batchscope.sweep/1 report (loadtest/foreign/reports.py) and keep it
        to overlay; ReportError (400) when it is not what it claims. One at a time, like a replay upload."""
        from ..loadtest.foreign.reports import read_report

        self.state.need_engine()
        if not self._import_lock.acquire(blocking=False):
            raise BusyError("another report is being read; retry when it is done")
        try:
            report = read_report(raw, slo or SLO())
        finally:
            self._import_lock.release()
        return {**report, "id": self.sweeps.add_import(report)}

    def imported(self, import_id: str) -> dict:
        self.state.need_engine()
        with unknown_id_not_found():
            return self.sweeps.get_import(import_id)


def sweep_lab(state=Depends(app_state)) -> SweepLab:
    return state.sweep_lab


SweepLabDep = Annotated[SweepLab, Depends(sweep_lab)]
