"""/api: timelines — the recording so far (JSON, Perfetto), named recordings, loading one for replay, and the way
from a tail request to its steps (the slowest requests, one request's waits)."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from ..schemas import RecordingBody, Recordings, RecordingStarted, RecordingStopped, ReplayLoaded
from ..timelines import TimelinesDep
from ..uploads import read_upload

router = APIRouter(prefix="/api", tags=["timelines"])


def _download(data: dict, filename: str, download: bool) -> JSONResponse:
    headers = {"Content-Disposition": f'attachment; filename="{filename}"'} if download else {}
    return JSONResponse(data, headers=headers)


# plain `def` routes: building and serialising a long timeline runs in the thread pool, not on the event loop
@router.get("/timeline.json")
def timeline(timelines: TimelinesDep, recording: str | None = None, download: bool = False):
    return _download(timelines.timeline(recording), f"batchscope-{recording or 'timeline'}.json", download)


@router.get("/trace.json")
def perfetto_trace(timelines: TimelinesDep, recording: str | None = None, download: bool = False):
    return _download(timelines.perfetto(recording), f"batchscope-{recording or 'timeline'}.trace.json", download)


@router.post("/recording/start")
def recording_start(timelines: TimelinesDep, body: RecordingBody | None = None) -> RecordingStarted:
    return timelines.start_recording(body.name if body else None)


@router.post("/recording/stop")
def recording_stop(timelines: TimelinesDep) -> RecordingStopped:
    return timelines.stop_recording()


@router.get("/recordings")
def recordings(timelines: TimelinesDep) -> Recordings:
    return timelines.recordings()


@router.post("/replay")
async def replay_upload(request: Request, timelines: TimelinesDep, name: str | None = None) -> ReplayLoaded:
    """The body, raw or as a form's one file field: a batchscope.timeline/1 JSON document, or a profiler trace
    (Chrome-trace JSON), either of them gzipped or not; `name` (else the form's file name) is what errors about
    it say."""
    raw, filename = await read_upload(request, "a batchscope.timeline/1 JSON document or a profiler trace")
    return await run_in_threadpool(timelines.load_replay, raw, name or filename)


@router.get("/history")
def history(timelines: TimelinesDep, seconds: float = 180.0):
    """The live ring's newest seconds for a viewer that joins late (at most what the server keeps)."""
    if not 0 < seconds <= 3600:
        raise ValueError(f"seconds must be in (0, 3600], got {seconds:g}")
    return timelines.history(seconds)


@router.get("/replay/trace.json")
def replay_trace(timelines: TimelinesDep, download: bool = False):
    return _download(timelines.replay_perfetto(), "batchscope-replay.trace.json", download)


@router.get("/replay.json")
def replay_download(timelines: TimelinesDep, download: bool = False):
    return _download(timelines.replay(), "batchscope-replay.json", download)


# `recording` names a recording, `replay=true` reads the loaded replay (a live server may hold one): the timeline
# the page shows. On a replay-only server the replay is the timeline either way.
@router.get("/requests/slowest")
def requests_slowest(timelines: TimelinesDep, recording: str | None = None, replay: bool = False, n: int = 10):
    """The finished requests with the longest E2E, slowest first (telemetry/request_waits.py)."""
    if not 1 <= n <= 200:
        raise ValueError(f"n must be in [1, 200], got {n}")
    return timelines.slowest_requests(n, recording, replay)


@router.get("/requests/{request_id}/waits")
def request_waits(request_id: str, timelines: TimelinesDep, recording: str | None = None, replay: bool = False):
    """A request's lifetime as queue, prefill, decode and preempted spans, its steps, and what it waited for."""
    return timelines.request_waits(request_id, recording, replay)
