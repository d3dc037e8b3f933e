"""The HTTP server: one FastAPI app (app.py) made of one router per concern (routes/), the state they share
(state.py), its typed bodies and responses (schemas.py), errors, middleware, streaming, prompt limits and replay
intake. It uses app/loadtest to run load tests and mounts app/ui as its page.

`from batchscope.app.server import ServerThread, create_app, check_bind` is the way in (tests and scripts use it).
"""
from .app import MAX_BODY_BYTES, MAX_REPLAY_BYTES, ServerThread, check_bind, create_app, mount_ui, uvicorn_config

__all__ = ["create_app", "mount_ui", "check_bind", "uvicorn_config", "ServerThread", "MAX_BODY_BYTES",
           "MAX_REPLAY_BYTES"]
