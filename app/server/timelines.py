"""Timelines and replays: the live timeline and its named recordings (JSON, Perfetto), the late viewer's history,
the way from a tail request to its steps, and the replay — a recorded timeline, or a profiler trace imported as
one, loaded for the page (an upload, `batchscope replay FILE`, or a profiler window opened back).

The replay itself is `state.replay`, which health, status and the websocket read too; this room loads it.
NotFoundError (404) for a recording, request or replay that is not there; NoEngineError (409) for recording
on a replay-only server; telemetry.TimelineError (400) for a malformed timeline; BusyError (429) while another
replay is being loaded.
"""
from __future__ import annotations

import re
import threading
import time
from typing import Annotated

from fastapi import Depends

from .deps import app_state
from .errors import BusyError, NotFoundError
from .replay import accept_timeline
from .schemas import RecordingCaps, RecordingInfo, Recordings, RecordingStarted, RecordingStopped, ReplayLoaded

RECORDING_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
NO_REPLAY = "no replay loaded: POST a timeline to /api/replay or start with `batchscope replay`"


class Timelines:
    """`state` is the AppState: its telemetry (None on a replay-only server), its replay, need_engine()."""

    def __init__(self, state):
        self.state = state
        self.recording: str | None = None       # the name of the recording running now
        self._lock = threading.Lock()
        self._replay_lock = threading.Lock()

    # -- reading timelines
    def timeline(self, recording: str | None = None) -> dict:
        tel = self.state.telemetry
        if tel is None:
            if recording is not None:
                raise NotFoundError(f"no recording {recording!r}: this server is replay-only")
            if self.state.replay is None:
                raise NotFoundError("no timeline: nothing recorded or loaded")
            return self.state.replay
        if recording is not None and recording not in tel.recordings():
            raise NotFoundError(f"no recording named {recording!r}")
        return tel.timeline(recording=recording)

    def perfetto(self, recording: str | None = None) -> dict:
        from batchscope.telemetry import to_perfetto

        return to_perfetto(self.timeline(recording))

    def replay(self) -> dict:
        if self.state.replay is None:
            raise NotFoundError(NO_REPLAY)
        return self.state.replay

    def replay_perfetto(self) -> dict:
        """The loaded replay as a Perfetto trace: what a replay-only server (or a page showing a replay) exports."""
        from batchscope.telemetry import to_perfetto

        return to_perfetto(self.replay())

    def shown(self, recording: str | None, replay: bool) -> dict:
        """The timeline a page shows: the loaded replay (also on a live server that has one), a named recording,
        or the live ring."""
        return self.replay() if replay else self.timeline(recording)

    def request_waits(self, request_id: str, recording: str | None = None, replay: bool = False) -> dict:
        """One request's spans, steps and waits in that timeline (telemetry/request_waits.py); NotFoundError when
        it holds no request with that id."""
        from batchscope.telemetry.request_waits import request_waits

        tl = self.shown(recording, replay)
        found = request_waits(tl.get("steps", []), tl.get("requests", []), request_id)
        if found is None:
            where = "the replay" if replay or self.state.telemetry is None else (
                f"recording {recording!r}" if recording else "the live timeline")
            raise NotFoundError(f"no request {request_id!r} in {where} (GET /api/requests/slowest lists some)")
        return found

    def slowest_requests(self, n: int, recording: str | None = None, replay: bool = False) -> dict:
        from batchscope.telemetry.request_waits import slowest_requests

        tl = self.shown(recording, replay)
        return {"requests": slowest_requests(tl.get("steps", []), tl.get("requests", []), n),
                "finished": sum(r.get("finish_us") is not None for r in tl.get("requests", []))}

    def history(self, seconds: float) -> dict:
        """The live ring's newest `seconds` (steps, requests, NVML, every mode switch), for a viewer that joins
        late: the page's windows then hold what the server kept, not only what this viewer saw."""
        return self._live().history(seconds)

    # -- named recordings
    def _live(self):
        self.state.need_engine()
        return self.state.telemetry

    def start_recording(self, name: str | None = None) -> RecordingStarted:
        tel = self._live()
        taken = set(tel.recordings())
        if not name:
            name = base = time.strftime("rec-%Y%m%d-%H%M%S")
            n = 1
            while name in taken:
                n += 1
                name = f"{base}-{n}"
        elif name in taken:
            raise ValueError(f"a recording named {name!r} exists already; choose another name")
        if not RECORDING_NAME.match(name):
            raise ValueError("recording name must be 1-64 letters, digits, '.', '_' or '-', starting with a letter "
                             f"or digit; got {name!r}")
        with self._lock:
            if self.recording is not None:
                raise ValueError(f"recording {self.recording!r} is already running; stop it first")
            started = tel.start_recording(name)
            self.recording = name
        return RecordingStarted(recording=name, **started)

    def stop_recording(self) -> RecordingStopped:
        tel = self._live()
        with self._lock:
            if self.recording is None:
                raise ValueError("no recording is running")
            name, self.recording = self.recording, None
            summary = tel.stop_recording()
        # `stored` says whether it hit its caps (truncated) and what it dropped
        return RecordingStopped(recording=name, summary=summary, stored=tel.recording_info(name))

    def recordings(self) -> Recordings:
        tel = self.state.telemetry
        if tel is None:
            return Recordings(recordings=[], active=None, details=[], limits=None)
        details = []
        for name in tel.recordings():
            try:
                details.append(RecordingInfo(**tel.recording_info(name)))
            except KeyError:            # dropped meanwhile
                pass
        return Recordings(recordings=[d.name for d in details], active=self.recording, details=details,
                          limits=RecordingCaps(**tel.status()["recordings"]))

    # -- the replay
    def load_replay(self, obj, name: str | None = None) -> ReplayLoaded:
        """Validate a timeline (or import a profiler trace as one) and keep it for the UI's replay view (replay.py
        says what `obj` may be; `name` is what its errors call it). Raises telemetry.TimelineError saying where and
        why, BusyError while another replay is being loaded."""
        # one at a time: each holds its text and parsed records (~5x the text) until it is done
        if not self._replay_lock.acquire(blocking=False):
            raise BusyError("another timeline is being loaded for replay; retry when it is done")
        try:
            replay = with_board(accept_timeline(obj, name))
            self.state.replay = replay
        finally:
            self._replay_lock.release()
        return ReplayLoaded(loaded=True, steps=len(replay.get("steps", [])), requests=len(replay.get("requests", [])),
                            meta=replay.get("meta", {}), board=replay["summary"].get("board"))


def with_board(timeline: dict) -> dict:
    """A timeline's summary with the scoreboard in it: recordings made before the board existed get it computed
    here, once, so the page never computes figures itself."""
    summary = timeline.setdefault("summary", {})
    if not isinstance(summary.get("board"), dict):
        from batchscope.telemetry.figures import board

        summary["board"] = board(timeline.get("steps", []), live=False, nvml=timeline.get("nvml", []))
    return timeline


def timelines(state=Depends(app_state)) -> Timelines:
    return state.timelines


TimelinesDep = Annotated[Timelines, Depends(timelines)]
