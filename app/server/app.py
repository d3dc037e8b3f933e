"""The batchscope server: one FastAPI app on one port, put together from one router per concern.

    /api/...            routes/control.py (health, status, mode, generate), routes/load.py (bursts, A/B,
                        continuous loads), routes/sweep.py (sweeps, their export, foreign reports),
                        routes/timeline.py (timelines, recordings, replay), routes/profile.py (a torch.profiler
                        window on demand)
    /v1/...             routes/openai.py: OpenAI-compatible completions and chat completions (SSE when streaming)
    /metrics            routes/metrics.py: Prometheus' text format, vLLM's names and batchscope's
    /ws/telemetry       routes/ws.py: live steps, NVML samples, requests, mode changes and stats
    /batchscope-static/ assets/ and plotly.min.js from the installed plotly package (no network at page load)
    /                   the Gradio UI (app/ui), mounted last so that it never shadows the routes above

Errors become JSON reasons (errors.py); bodies are bounded before any route reads them (middleware.py).
This module builds the app (`create_app`) and serves it (`check_bind`, `uvicorn_config`, `ServerThread`).
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import signal
import threading
import time
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from .errors import install_error_handlers
from .middleware import MAX_BODY_BYTES, BodyLimit, TokenAuth
from .replay import MAX_REPLAY_BYTES
from .routes import ROUTERS
from .served_model import check_model
from .state import AppState

__all__ = ["create_app", "mount_ui", "check_bind", "uvicorn_config", "ServerThread", "MAX_BODY_BYTES",
           "MAX_REPLAY_BYTES"]

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")   # before mount_ui imports gradio

ASSETS_DIR = Path(str(resources.files("batchscope.assets")))   # package data, wherever it was installed


def create_app(state: AppState, token: str | None = None, ui: bool = True, close_state: bool = False) -> FastAPI:
    """The whole server. `ui=False` leaves out Gradio (an API-only server that starts faster);
    `close_state=True` closes the engine and telemetry when the server shuts down."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if close_state:
            chain_shutdown_signals(state)
        yield
        if close_state:
            await run_in_threadpool(state.close)

    app = FastAPI(title="batchscope", lifespan=lifespan, docs_url="/api/docs", openapi_url="/api/openapi.json",
                  redoc_url=None)
    app.state.batchscope = state
    install_error_handlers(app)
    for router in ROUTERS:        # /v1 requests name their model; a wrong one is a 404 before any work
        app.include_router(router, dependencies=[Depends(check_model)] if router.prefix == "/v1" else None)
    app.add_api_route("/health", state.health, include_in_schema=False)   # where load balancers look
    mount_static(app)
    if ui:
        mount_ui(app, state)
    # the middleware added last runs first: auth before anything reads a body
    app.add_middleware(BodyLimit)
    if token:
        app.add_middleware(TokenAuth, token=token)
    return app


def plotly_js_path() -> Path:
    import plotly

    return Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"


def mount_static(app: FastAPI) -> None:
    """assets/ and the plotly bundle, under a prefix Gradio leaves alone (it keeps /static and /assets).
    plotly is looked up when the page asks for it, so an API-only server starts without it."""

    def plotly_bundle():
        return FileResponse(plotly_js_path(), media_type="text/javascript", headers={"Cache-Control": "max-age=86400"})

    app.add_api_route("/batchscope-static/plotly.min.js", plotly_bundle, include_in_schema=False)
    app.mount("/batchscope-static", StaticFiles(directory=ASSETS_DIR, check_dir=False), name="batchscope-static")


QUEUE_POLL_S = 0.02             # how often Gradio's idle event queue looks for work (its own default: 1 ms)
PROGRESS_POLL_S = 0.1           # and for progress to send (10 ms)


def mount_ui(app: FastAPI, state: AppState):
    """Mount the page; returns its Blocks."""
    import gradio as gr

    from ..ui import page

    blocks = page.build_ui(state)
    gr.mount_gradio_app(app, blocks, path="/", head=page.HEAD, css=page.CSS, theme=page.THEME, ssr_mode=False)
    quiet_queue(blocks)
    return blocks


def quiet_queue(blocks) -> None:
    """Gradio's event queue polls for work every millisecond while it has none, and for progress every 10 ms:
    ~1,100 wake-ups a second of the server's event loop, 7% of a core on an idle server with one page open. The
    page's live data come over batchscope's own websocket; its Gradio events are clicks, for which 20 ms more to
    start is nothing."""
    queue = getattr(blocks, "_queue", None)
    if queue is None:
        return
    queue.sleep_when_free = max(getattr(queue, "sleep_when_free", 0.0), QUEUE_POLL_S)
    queue.progress_update_sleep_when_free = max(getattr(queue, "progress_update_sleep_when_free", 0.0),
                                                PROGRESS_POLL_S)


# --------------------------------------------------------------------------------------------------- serving

def chain_shutdown_signals(state: AppState) -> None:
    """Have SIGTERM and SIGINT start state.begin_shutdown() before the server's own handler runs, so that
    streams and bursts end at once (cancelled) and the server drains fast, instead of waiting out its graceful
    timeout on requests that would run for minutes. uvicorn installs its handlers before start-up and restores
    the previous ones when it stops, which removes ours with them. Call from the serving loop, on the main
    thread (the only one that can set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue

        def handler(signum, frame, previous=previous):
            try:
                # the handler interrupts the loop's thread, which may hold the locks begin_shutdown takes:
                # run it as the loop's next callback instead
                loop.call_soon_threadsafe(state.begin_shutdown)
            except RuntimeError:        # the loop is closed: nothing left to cancel
                pass
            finally:
                previous(signum, frame)
        signal.signal(sig, handler)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False                    # a host name may resolve anywhere


def check_bind(host: str, token: str | None) -> None:
    """Refuse (ValueError with the reason) to serve beyond this machine without a token."""
    if token is not None and len(token) < 8:
        raise ValueError("--token must be at least 8 characters")
    if not is_loopback(host) and not token:
        raise ValueError(f"refusing to listen on {host} without --token: anyone who can reach this machine could "
                         "drive the engine and read its telemetry. Pass --token SECRET (or set BATCHSCOPE_TOKEN), "
                         "or bind 127.0.0.1")


class CancelledAtShutdown(logging.Filter):
    """A page left open holds long-lived streams (Gradio's event stream among them) that uvicorn cancels once its
    graceful shutdown times out; it logs each with a full traceback. That is the expected end of those streams:
    they go in one line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, asyncio.CancelledError) and "shutdown" in str(exc):
            logging.getLogger("batchscope.app.server").info("closed a stream a page still held open at shutdown")
            return False
        return True


def uvicorn_config(app: FastAPI, host: str = "127.0.0.1", port: int = 7860, log_level: str = "warning"):
    import uvicorn

    error_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, CancelledAtShutdown) for f in error_log.filters):
        error_log.addFilter(CancelledAtShutdown())
    # no per-message deflate: compressing every frame for every viewer costs CPU the engine needs.
    # HTTP through httptools (a dependency; uvicorn's "auto" picks it): h11's Python state machine was 18% of the
    # event loop's samples streaming to 240 clients on the H200, and on the CPU demo httptools cut the delivery delay
    # p50 from 1.0-1.2 to 0.7-0.8 ms. The loop stays asyncio's even where uvloop is installed: uvloop doubled the
    # engine's token gap there (docs/delivery.md).
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, ws_per_message_deflate=False,
                          timeout_graceful_shutdown=3, loop="asyncio")


class ServerThread:
    """Runs the app with uvicorn on a background thread (tests, notebooks). port=0 picks a free port."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self.server = uvicorn.Server(uvicorn_config(app, host, port))
        self.thread = threading.Thread(target=self._run, name="batchscope-server", daemon=True)
        self.host = host
        self.port = port

    def _run(self) -> None:
        try:
            self.server.run()
        except SystemExit:              # uvicorn exits when it cannot bind; start() reports it
            pass

    def start(self, timeout: float = 30.0) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {self.host}:{self.port} (is the port in use?)")
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
