"""The load lab: bursts of synthetic requests, the same burst A/B in sync then async, continuous loads, and the
mode switch (which goes through here because an A/B or a sweep holds the mode while it runs).

The runs themselves live in app/loadtest (BurstManager); this room adds what only the server knows: a
replay-only server has no engine (NoEngineError, 409, though its lists read empty), a server going down starts
nothing (ShuttingDownError, 503), and an id the manager does not know is a NotFoundError (404).
"""
from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from ..loadtest.manager import BurstManager
from ..loadtest.specs import BurstSpec, LoadSpec, Mode
from ..loadtest.statuses import ABStatus, BurstList, BurstStatus, LoadStatus
from .deps import app_state
from .errors import unknown_id_not_found
from .schemas import ModeChanged, ModeLock


class LoadLab:
    """`state` is the AppState (its need_engine() and refuse_when_shutting_down()); `runs` the manager, None on
    a replay-only server."""

    def __init__(self, state, runs: BurstManager | None):
        self.state = state
        self.runs = runs

    def manager(self) -> BurstManager:
        """The load tests' manager (NoEngineError on a replay-only server, which has none)."""
        self.state.need_engine()
        return self.runs

    def admit(self) -> BurstManager:
        """The manager, to start a run with: refused while the server shuts down."""
        runs = self.manager()
        self.state.refuse_when_shutting_down()
        return runs

    # -- starting runs and reading them
    def start_burst(self, spec: BurstSpec) -> str:
        return self.admit().start_burst(spec)

    def start_ab(self, spec: BurstSpec) -> str:
        return self.admit().start_ab(spec)

    def start_load(self, spec: LoadSpec) -> str:
        return self.admit().start_load(spec)

    def burst(self, burst_id: str) -> BurstStatus:
        runs = self.manager()
        with unknown_id_not_found():
            return runs.burst(burst_id)

    def ab(self, ab_id: str) -> ABStatus:
        runs = self.manager()
        with unknown_id_not_found():
            return runs.ab(ab_id)

    def load(self, load_id: str) -> LoadStatus:
        runs = self.manager()
        with unknown_id_not_found():
            return runs.load(load_id)

    def stop_load(self, load_id: str) -> LoadStatus:
        runs = self.manager()
        with unknown_id_not_found():
            return runs.stop_load(load_id)

    def running_load(self) -> str | None:
        return self.runs.running_load() if self.runs is not None else None

    def list(self) -> BurstList:
        if self.runs is None:
            return BurstList(bursts=[], ab=[], kept=0, dropped={})
        return self.runs.list()

    def latest_values(self) -> dict:
        """The raw latencies of the newest burst, A/B and load (BurstManager.latest_values), for CDFs."""
        return self.runs.latest_values() if self.runs is not None else {}

    # -- the mode
    def set_mode(self, mode: Mode) -> ModeChanged:
        """Switch loops at the next step boundary (the engine refuses a mode it does not have). Raises
        ModeLocked while an A/B or a sweep runs."""
        previous = self.manager().set_mode(mode)
        return ModeChanged(mode=mode, previous=previous)

    def mode_lock(self) -> ModeLock:
        if self.runs is None:
            return ModeLock(mode=None, locked=True, reason="replay-only: no engine to switch")
        reason = self.runs.mode_lock()
        return ModeLock(mode=self.state.engine.mode, locked=reason is not None, reason=reason)


def load_lab(state=Depends(app_state)) -> LoadLab:
    return state.load_lab


LoadLabDep = Annotated[LoadLab, Depends(load_lab)]
