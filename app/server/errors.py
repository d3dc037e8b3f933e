"""What can go wrong in a request, and how each failure becomes a 4xx or 5xx with a JSON reason:
{"error": "..."} on /api, OpenAI's {"error": {"message": ...}} on /v1.

AppState raises the ones defined here; BusyError (429), EngineTaken (409: a sweep holds the engine, or another run
keeps a sweep from starting) and `validation_reason` come from app/loadtest/refusals.py,
since the load tests raise and the page shows them too. The handlers below map them by type (Starlette looks a
handler up along each exception's MRO, so the order they are added in does not matter).
"""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import HTTPConnection

from batchscope.engine.config import EngineUnavailable
from batchscope.telemetry import TimelineError

from ..loadtest.refusals import BusyError, EngineTaken, validation_reason


class NotFoundError(KeyError):
    """No such burst, A/B run or recording (404)."""

    def __str__(self) -> str:           # KeyError quotes its message; a reason should read plainly
        return str(self.args[0]) if self.args else ""


class NoEngineError(RuntimeError):
    """The server runs replay-only: nothing can be generated (409)."""


class ShuttingDownError(RuntimeError):
    """The server is shutting down: no new work is taken (503)."""


class EngineFailure(RuntimeError):
    """A request failed inside the engine (500): not the caller's fault."""


class Conflict(RuntimeError):
    """The request is fine, the moment is not (409): e.g. a profiler window while another one is open."""


class NotInThisBuild(RuntimeError):
    """What was asked for needs a part this build does not have (501), e.g. the trace importer."""


STATUS_BY_ERROR = {ValueError: 400, TimelineError: 400, BusyError: 429, NotFoundError: 404, NoEngineError: 409,
                   EngineTaken: 409, ShuttingDownError: 503, EngineUnavailable: 503, EngineFailure: 500,
                   Conflict: 409, NotInThisBuild: 501}
OPENAI_ERROR_TYPES = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_exceeded"}


def error_response(request: HTTPConnection, status: int, reason: str) -> JSONResponse:
    if request.url.path.startswith("/v1"):
        kind = OPENAI_ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        body: dict = {"error": {"message": reason, "type": kind, "param": None, "code": status}}
    else:
        body = {"error": reason}
    return JSONResponse(body, status_code=status)


def install_error_handlers(app: FastAPI) -> None:
    async def validation(request, exc: RequestValidationError):
        return error_response(request, 400, validation_reason(exc))

    async def http_error(request, exc: StarletteHTTPException):
        if isinstance(exc.__cause__, RecursionError):    # FastAPI's own JSON parse; BodyLimit should catch it first
            return error_response(request, 400, "body JSON is nested too deeply to parse")
        return error_response(request, exc.status_code, str(exc.detail))

    def status_for(code: int):
        async def handler(request, exc):
            return error_response(request, code, str(exc) or type(exc).__name__)
        return handler

    async def model_validation(request, exc: ValidationError):     # a model built inside a route
        return error_response(request, 400, validation_reason(exc))

    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(ValidationError, model_validation)
    app.add_exception_handler(StarletteHTTPException, http_error)
    for error, code in STATUS_BY_ERROR.items():      # ValueError covers bad input, the engine's ConfigError too
        app.add_exception_handler(error, status_for(code))
