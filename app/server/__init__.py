"""The HTTP server: one FastAPI app (app.py) made of one router per concern (routes/), each taking what it needs
as a dependency (deps.py lists them) rather than through a facade:

    state.py         AppState: lifecycle, the engine, telemetry, limits, requests in flight, health and status
    load_lab.py      bursts, A/B comparisons, continuous loads, the mode switch an A/B or a sweep locks
    sweep_lab.py     sweeps and the foreign reports laid over them
    timelines.py     timelines, named recordings, the replay (uploaded, from a file, or a profile opened back)
    profiler.py      torch.profiler windows on demand (profiles.py keeps the windows and their traces)
    analysis_lab.py  compare two recordings, a what-if on one, and its verify job (whatif_verify.py)

Beside them: typed bodies and responses (schemas.py), errors, middleware, streaming, prompt limits and replay
intake. It uses app/loadtest to run load tests and mounts app/ui as its page.

`from batchscope.app.server import ServerThread, create_app, check_bind` is the way in (tests and scripts use it).
"""
from .app import MAX_BODY_BYTES, MAX_REPLAY_BYTES, ServerThread, check_bind, create_app, mount_ui, uvicorn_config

__all__ = ["create_app", "mount_ui", "check_bind", "uvicorn_config", "ServerThread", "MAX_BODY_BYTES",
           "MAX_REPLAY_BYTES"]
