"""What can go wrong in a request, and how each failure becomes a 4xx or 5xx with a JSON reason, in one of two
shapes by API (docs/api-errors.md), whatever raised it (a route, a validation, the middleware, an unknown route):
    /api and the rest   {"error": "the reason"}
    /v1 (OpenAI's)      {"error": {"message": "the reason", "type": ..., "param": ..., "code": ...}}
On /v1 a reason names the request's fields as OpenAI does (`max_tokens`, not batchscope's `max_new_tokens`),
and `param` says which field it is about where the reason starts with it.

AppState and its rooms raise the ones defined here; BusyError (429), EngineTaken (409: a sweep holds the engine, or
another run keeps a sweep from starting) and `validation_reason` come from app/loadtest/refusals.py,
since the load tests raise and the page shows them too. The handlers below map them by type (Starlette looks a
handler up along each exception's MRO, so the order they are added in does not matter).
"""
from __future__ import annotations

import re
from contextlib import contextmanager

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


class ModelNotFound(NotFoundError):
    """An OpenAI request for a model this server does not serve (404, vLLM's `model_not_found`)."""
    param, code = "model", "model_not_found"


@contextmanager
def unknown_id_not_found():
    """Inside it, a KeyError (how app/loadtest says it knows no run or report by that id) is a NotFoundError."""
    try:
        yield
    except KeyError as e:
        raise NotFoundError(e.args[0]) from None


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


class UnsupportedUpload(ValueError):
    """An upload in a form the route cannot read a file from (415): urlencoded, or not one file field."""


STATUS_BY_ERROR = {ValueError: 400, TimelineError: 400, BusyError: 429, NotFoundError: 404, NoEngineError: 409,
                   EngineTaken: 409, ShuttingDownError: 503, EngineUnavailable: 503, EngineFailure: 500,
                   Conflict: 409, NotInThisBuild: 501, UnsupportedUpload: 415}
OPENAI_ERROR_TYPES = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_exceeded"}


# batchscope's names for what OpenAI requests call otherwise (state.sampling and the limits speak batchscope)
OPENAI_NAMES = {"max_new_tokens": "max_tokens"}
_INTERNAL_NAME = re.compile(r"\b(" + "|".join(OPENAI_NAMES) + r")\b")
# a reason that starts with a field's name, after an optional "invalid ...: " lead-in or a "body." location
_LEADING_FIELD = re.compile(r"^(?:[^:]*: )??(?:body\.)?([a-z_]+)(?:\[\d+\])?(?: -?[\d.]+)?"
                            r"(?:[.:]| must| is| needs| \(|$)")


def openai_error(status: int, reason: str, param: str | None = None, code: str | int | None = None) -> dict:
    """OpenAI's error object, with the request's own field names in the message and `param`."""
    message = _INTERNAL_NAME.sub(lambda m: OPENAI_NAMES[m.group(1)], reason)
    if param is None and status == 400:
        found = _LEADING_FIELD.match(message)
        param = found.group(1) if found else None
    kind = OPENAI_ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": status if code is None else code}}


def error_response(request: HTTPConnection, status: int, reason: str, param: str | None = None,
                   code: str | None = None) -> JSONResponse:
    if request.url.path.startswith("/v1"):
        body = openai_error(status, reason, param, code)
    else:
        body = {"error": reason}
    return JSONResponse(body, status_code=status)


def install_error_handlers(app: FastAPI) -> None:
    async def validation(request, exc: RequestValidationError):
        return error_response(request, 400, validation_reason(exc))

    async def http_error(request, exc: StarletteHTTPException):
        if isinstance(exc.__cause__, RecursionError):    # FastAPI's own JSON parse; BodyLimit should catch it first
            return error_response(request, 400, "body JSON is nested too deeply to parse")
        reason = str(exc.detail)
        if exc.status_code in (404, 405) and reason in ("Not Found", "Method Not Allowed"):    # Starlette's words
            reason = (f"no route {request.method} {request.url.path}" if exc.status_code == 404 else
                      f"{request.url.path} does not take {request.method}") + ": the routes are listed at /api/docs"
        return error_response(request, exc.status_code, reason)

    def status_for(code: int):
        async def handler(request, exc):
            named = isinstance(exc, ModelNotFound)     # the one that says which field and why, as vLLM does
            return error_response(request, code, str(exc) or type(exc).__name__, exc.param if named else None,
                                  exc.code if named else None)
        return handler

    async def model_validation(request, exc: ValidationError):     # a model built inside a route
        return error_response(request, 400, validation_reason(exc))

    app.openapi = lambda: documented_errors(app)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(ValidationError, model_validation)
    app.add_exception_handler(StarletteHTTPException, http_error)
    for error, code in STATUS_BY_ERROR.items():      # ValueError covers bad input, the engine's ConfigError too
        app.add_exception_handler(error, status_for(code))


API_ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}},
                    "description": "Any 4xx or 5xx outside /v1: the reason, in words"}
OPENAI_ERROR_SCHEMA = {
    "type": "object", "required": ["error"], "description": "Any 4xx or 5xx on /v1, in OpenAI's shape",
    "properties": {"error": {"type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"], "description": "the request field it is about, by its OpenAI name"},
        "code": {"type": ["integer", "string"], "description": "the status, or a code such as model_not_found"}}}}}


def documented_errors(app: FastAPI) -> dict:
    """The OpenAPI schema (/api/openapi.json), saying what an error body is: FastAPI's default documents a 422
    `{"detail": [...]}` that this server never sends (a validation error is a 400 in the shapes above)."""
    if app.openapi_schema:
        return app.openapi_schema
    from fastapi.openapi.utils import get_openapi

    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    schemas["Error"], schemas["OpenAIError"] = API_ERROR_SCHEMA, OPENAI_ERROR_SCHEMA
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    for path, operations in schema.get("paths", {}).items():
        ref = "#/components/schemas/" + ("OpenAIError" if path.startswith("/v1") else "Error")
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            for status, response in responses.items():
                if status[0] in "45":
                    response["content"] = {"application/json": {"schema": {"$ref": ref}}}
            responses.setdefault("4XX", {"description": "bad input, or not now: the reason",
                                         "content": {"application/json": {"schema": {"$ref": ref}}}})
    app.openapi_schema = schema
    return schema
