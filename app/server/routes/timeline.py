"""/api: timelines — the recording so far (JSON, Perfetto), named recordings, and loading one for replay."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from ..deps import State
from ..errors import NotFoundError
from ..schemas import RecordingBody, Recordings, RecordingStarted, RecordingStopped, ReplayLoaded

router = APIRouter(prefix="/api", tags=["timelines"])


def _download(data: dict, filename: str, download: bool) -> JSONResponse:
    headers = {"Content-Disposition": f'attachment; filename="{filename}"'} if download else {}
    return JSONResponse(data, headers=headers)


# plain `def` routes: building and serialising a long timeline runs in the thread pool, not on the event loop
@router.get("/timeline.json")
def timeline(state: State, recording: str | None = None, download: bool = False):
    return _download(state.timeline(recording), f"batchscope-{recording or 'timeline'}.json", download)


@router.get("/trace.json")
def perfetto_trace(state: State, recording: str | None = None, download: bool = False):
    return _download(state.perfetto(recording), f"batchscope-{recording or 'timeline'}.trace.json", download)


@router.post("/recording/start")
def recording_start(state: State, body: RecordingBody | None = None) -> RecordingStarted:
    return state.start_recording(body.name if body else None)


@router.post("/recording/stop")
def recording_stop(state: State) -> RecordingStopped:
    return state.stop_recording()


@router.get("/recordings")
def recordings(state: State) -> Recordings:
    return state.recordings()


@router.post("/replay")
async def replay_upload(request: Request, state: State, name: str | None = None) -> ReplayLoaded:
    """The body: a batchscope.timeline/1 JSON document, or a profiler trace (Chrome-trace JSON), either of them
    gzipped or not; `name` (the file's) is what errors about it say."""
    raw = await request.body()          # BodyLimit has bounded it to MAX_REPLAY_BYTES already
    if not raw:
        raise ValueError("send a batchscope.timeline/1 JSON document or a profiler trace as the request body")
    return await run_in_threadpool(state.load_replay, raw, name)


@router.get("/history")
def history(state: State, seconds: float = 180.0):
    """The live ring's newest seconds for a viewer that joins late (at most what the server keeps)."""
    if not 0 < seconds <= 3600:
        raise ValueError(f"seconds must be in (0, 3600], got {seconds:g}")
    return state.history(seconds)


@router.get("/replay/trace.json")
def replay_trace(state: State, download: bool = False):
    return _download(state.replay_perfetto(), "batchscope-replay.trace.json", download)


@router.get("/replay.json")
def replay_download(state: State, download: bool = False):
    if state.replay is None:
        raise NotFoundError("no replay loaded: POST a timeline to /api/replay or start with `batchscope replay`")
    return _download(state.replay, "batchscope-replay.json", download)
