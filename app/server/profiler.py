"""Profiling on demand: a torch.profiler window over the engine's next N steps (profiles.py keeps the windows),
its Kineto trace, and that trace opened back in the timeline as the replay.

Every call needs an engine (NoEngineError, 409, on a replay-only server); a new window is refused while the
server shuts down (ShuttingDownError, 503); the trace is a NotFoundError (404) until a window is done.
"""
from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from .deps import app_state
from .errors import NotFoundError
from .profiles import ProfileWindows
from .schemas import ProfileStatus, ReplayLoaded
from .timelines import Timelines


class Profiler:
    """`state` is the AppState; `windows` None on a replay-only server; `timelines` loads an opened trace."""

    def __init__(self, state, windows: ProfileWindows | None, timelines: Timelines):
        self.state = state
        self.windows = windows
        self.timelines = timelines

    def _windows(self) -> ProfileWindows:
        self.state.need_engine()
        return self.windows

    def start(self, steps: int) -> ProfileStatus:
        """A window over the engine's next `steps` steps: ValueError out of range, Conflict while one is open."""
        windows = self._windows()
        self.state.refuse_when_shutting_down()
        return ProfileStatus(**windows.start(steps))

    def status(self) -> ProfileStatus:
        return ProfileStatus(**self._windows().status())

    def trace_path(self) -> str:
        """The latest window's trace file (NotFoundError until one is done)."""
        path = self._windows().trace_path()
        if path is None:
            raise NotFoundError("no profiler trace yet: POST /api/profile, then wait for state 'done'")
        return path

    def open(self) -> ReplayLoaded:
        """The latest trace imported as a timeline and loaded as the replay (NotInThisBuild without the importer)."""
        return self.timelines.load_replay(self._windows().import_trace())


def profiler(state=Depends(app_state)) -> Profiler:
    return state.profiler


ProfilerDep = Annotated[Profiler, Depends(profiler)]
