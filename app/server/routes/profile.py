"""/api/profile: a torch.profiler window over the engine's next N steps, on demand (app/server/profiles.py), its
Kineto trace for download and, where this build has the trace importer, opened back as the replay."""
from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from ..profiler import ProfilerDep
from ..schemas import ProfileBody, ProfileStatus, ReplayLoaded

router = APIRouter(prefix="/api", tags=["profile"])


@router.post("/profile", responses={409: {"description": "a window is open already, or no engine (replay-only)"}})
def start_profile(body: ProfileBody, profiler: ProfilerDep) -> ProfileStatus:
    return profiler.start(body.steps)


@router.get("/profile")
def profile_status(profiler: ProfilerDep) -> ProfileStatus:
    return profiler.status()


@router.get("/profile/trace.json.gz", response_class=FileResponse)
def profile_trace(profiler: ProfilerDep) -> FileResponse:
    path = profiler.trace_path()
    status = profiler.status()
    name = f"batchscope-profile-{status.id}-steps-{status.first_step}-{status.last_step}.pt.trace.json.gz"
    return FileResponse(path, media_type="application/gzip", filename=name)


@router.post("/profile/open", responses={501: {"description": "this build has no trace importer"}})
async def open_profile(profiler: ProfilerDep) -> ReplayLoaded:
    return await run_in_threadpool(profiler.open)
