"""The batchscope server: one FastAPI app on one port.

    /api/...            JSON routes (health, mode, generate, bursts, A/B, timelines, recordings, replay)
    /v1/...             OpenAI-compatible completions and chat completions (SSE when stream is true)
    /ws/telemetry       live steps, NVML samples, requests, mode changes and stats
    /batchscope-static/ assets/ and plotly.min.js from the installed plotly package (no network at page load)
    /                   the Gradio UI, mounted last so that it never shadows the routes above

Every 4xx carries a JSON reason: {"error": "..."} on /api, OpenAI's {"error": {"message": ...}} on /v1.
Bodies are bounded before any route reads them (`BodyLimit`): size (413) and JSON nesting (400).
"""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import os
import signal
import threading
import time
import uuid
from contextlib import asynccontextmanager
from http.cookies import SimpleCookie
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, AsyncIterator, Literal
from urllib.parse import parse_qs

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")   # before anything imports gradio

from fastapi import APIRouter, Depends, FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import HTTPConnection

from batchscope.telemetry import TimelineError
from batchscope.telemetry.hub import SubscriptionClosed, TooManySubscribers

from .loadgen import BusyError
from .state import (MAX_JSON_DEPTH, MAX_REPLAY_BYTES, AppState, NoEngineError, NotFoundError, ShuttingDownError,
                    json_depth_over)

ASSETS_DIR = Path(str(resources.files("batchscope.assets")))   # package data, wherever it was installed
TOKEN_COOKIE = "batchscope_token"
# JSON requests: the largest legitimate one, /v1/completions with max_burst_requests prompts of
# max_prompt_tokens ids each (256 x 4096 x ~7 bytes), is about 7 MiB
MAX_BODY_BYTES = 8 << 20
REPLAY_PATH = "/api/replay"         # takes up to MAX_REPLAY_BYTES (app/state.py says why that much)
DEPTH_SCAN_INLINE_BRACKETS = 1 << 16    # a body with more brackets is depth-checked off the event loop
WS_SEND_TIMEOUT_S = 60.0            # a viewer that takes no frame for this long is disconnected


def plotly_js_path() -> Path:
    import plotly

    return Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"


# ------------------------------------------------------------------------------------------------------ errors

class EngineFailure(RuntimeError):
    """A request failed inside the engine (500): not the caller's fault."""


def error_response(request: HTTPConnection, status: int, reason: str) -> JSONResponse:
    if request.url.path.startswith("/v1"):
        kind = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_exceeded"}.get(
            status, "invalid_request_error" if status < 500 else "server_error")
        body: dict = {"error": {"message": reason, "type": kind, "param": None, "code": status}}
    else:
        body = {"error": reason}
    return JSONResponse(body, status_code=status)


def _validation_reason(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            return f"body is not valid JSON: {err.get('ctx', {}).get('error', err.get('msg'))}"
        if err.get("type") == "model_attributes_type" and tuple(err.get("loc", ())) == ("body",):
            return "the body must be a JSON object (sent as Content-Type: application/json)"
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
    return "; ".join(parts) or "invalid request"


def install_error_handlers(app: FastAPI) -> None:
    async def validation(request, exc: RequestValidationError):
        return error_response(request, 400, _validation_reason(exc))

    async def http_error(request, exc: StarletteHTTPException):
        if isinstance(exc.__cause__, RecursionError):    # FastAPI's own JSON parse; BodyLimit should catch it first
            return error_response(request, 400, "body JSON is nested too deeply to parse")
        return error_response(request, exc.status_code, str(exc.detail))

    def status_for(code: int):
        async def handler(request, exc):
            return error_response(request, code, str(exc) or type(exc).__name__)
        return handler

    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(StarletteHTTPException, http_error)
    # most specific first does not matter: Starlette looks handlers up along each exception's MRO
    app.add_exception_handler(ValueError, status_for(400))          # bad input, engine ConfigError included
    app.add_exception_handler(TimelineError, status_for(400))
    app.add_exception_handler(BusyError, status_for(429))
    app.add_exception_handler(NotFoundError, status_for(404))
    app.add_exception_handler(NoEngineError, status_for(409))
    app.add_exception_handler(ShuttingDownError, status_for(503))
    app.add_exception_handler(EngineFailure, status_for(500))


# ------------------------------------------------------------------------------------------------- middleware

class TokenAuth:
    """With a token, every request needs `Authorization: Bearer TOKEN`, `?token=TOKEN` or the cookie that a
    `?token=` visit sets (so that the page's own fetch and websocket calls carry it)."""

    def __init__(self, app, token: str):
        self.app, self.token = app, token

    def _presented(self, scope) -> tuple[str | None, bool]:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip(), False
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if "token" in query:
            return query["token"][0], True
        cookie = SimpleCookie()
        try:
            cookie.load(headers.get("cookie", ""))
        except Exception:
            pass
        if TOKEN_COOKIE in cookie:
            return cookie[TOKEN_COOKIE].value, False
        return None, False

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        given, from_query = self._presented(scope)
        if given is None or not hmac.compare_digest(given.encode(), self.token.encode()):
            reason = ("missing or wrong token: send 'Authorization: Bearer TOKEN', or open the page once with "
                      "?token=TOKEN")
            if scope["type"] == "websocket":
                # closing before accept makes the handshake fail with 403
                await send({"type": "websocket.close", "code": 1008, "reason": "token required"})
                return
            return await error_response(HTTPConnection(scope), 401, reason)(scope, receive, send)
        if not from_query or scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_cookie(message):
            if message["type"] == "http.response.start":
                cookie = f"{TOKEN_COOKIE}={self.token}; Path=/; HttpOnly; SameSite=Strict"
                message = {**message, "headers": list(message.get("headers", [])) +
                           [(b"set-cookie", cookie.encode("latin-1"))]}
            await send(message)
        return await self.app(scope, receive, send_with_cookie)


class BodyLimit:
    """Reads /api and /v1 request bodies before any route does, and refuses with a JSON reason:
    - 413 over the size limit (MAX_REPLAY_BYTES on /api/replay, MAX_BODY_BYTES elsewhere): at once when the
      Content-Length says so, or, for a chunked body, as soon as the bytes read pass it (no more is read);
    - 400 for JSON nested deeper than MAX_JSON_DEPTH (recursive parsers fail on deep nesting); /api/replay is
      checked in its thread instead, since it may be large.
    The route then gets the body whole, and the live channel after it (to notice a client that hangs up).
    Gradio's own routes keep Gradio's limits."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(("/api/", "/v1/")):
            return await self.app(scope, receive, send)
        conn = HTTPConnection(scope)
        limit = MAX_REPLAY_BYTES if path == REPLAY_PATH else MAX_BODY_BYTES

        async def refuse(status: int, reason: str, close: bool = False) -> None:
            response = error_response(conn, status, reason)
            if close:                   # else the server would go on reading (and discarding) the rest
                response.headers["connection"] = "close"
            await response(scope, receive, send)

        over = f"request body over the limit of {limit >> 20} MiB"
        declared = dict(scope.get("headers", [])).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            return await refuse(413, over, close=True)
        chunks, seen = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":       # the client left mid-body; answering is a no-op
                return await refuse(400, "the client hung up before sending the whole body")
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > limit:
                return await refuse(413, over, close=True)
            if chunk:
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        del chunks
        if path != REPLAY_PATH and body:
            if body.count(b"[") + body.count(b"{") > DEPTH_SCAN_INLINE_BRACKETS:
                depth = await run_in_threadpool(json_depth_over, body, MAX_JSON_DEPTH)
            else:
                depth = json_depth_over(body, MAX_JSON_DEPTH)
            if depth is not None:
                return await refuse(400, f"body JSON is nested {depth} levels deep, over the limit of "
                                         f"{MAX_JSON_DEPTH}")
        pending = [{"type": "http.request", "body": body, "more_body": False}]
        del body                        # the route's copy is the only one kept

        async def replay_receive():
            if pending:
                return pending.pop()
            return await receive()

        await self.app(scope, replay_receive, send)


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


# ----------------------------------------------------------------------------------------------- dependencies

def get_state(conn: HTTPConnection) -> AppState:
    return conn.app.state.batchscope


State = Annotated[AppState, Depends(get_state)]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


def sse(events: AsyncIterator[Any]) -> StreamingResponse:
    """Server-sent events: each item is one `data:` line (dicts as JSON), ending with `data: [DONE]`."""
    async def body():
        async for ev in events:
            yield f"data: {json.dumps(ev, separators=(',', ':'))}\n\n"
        yield "data: [DONE]\n\n"
    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def final_outputs(handles: list, request: Request) -> list:
    """Wait for requests to finish without holding a thread; cancel them if the client hangs up first."""
    async def one(handle):
        async for d in handle.astream():
            if d.finished:
                break
        # the finishing delta can arrive a moment before the handle marks itself done
        return handle.result(0) if handle.done else await run_in_threadpool(handle.result, 5)

    async def cancel_on_hang_up():
        # the body is read already, so the next message is the disconnect (or the end of the exchange)
        while (await request.receive())["type"] != "http.disconnect":
            pass
        for h in handles:
            h.cancel()

    watcher = asyncio.create_task(cancel_on_hang_up())
    try:
        return await asyncio.gather(*(one(h) for h in handles))
    finally:
        watcher.cancel()


async def merged(handles: list) -> AsyncIterator[tuple[int, Any]]:
    """(index, TokenDelta) from several requests as they come; cancels the unfinished ones if abandoned."""
    try:
        if len(handles) == 1:
            async for d in handles[0].astream():
                yield 0, d
            return
        q: asyncio.Queue = asyncio.Queue()

        async def pump(i, h):
            async for d in h.astream():
                await q.put((i, d))
        tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]
        try:
            left = len(handles)
            while left:
                i, d = await q.get()
                left -= d.finished
                yield i, d
        finally:
            for t in tasks:
                t.cancel()
    finally:
        for h in handles:
            if not h.done:
                h.cancel()


# ------------------------------------------------------------------------------------- /api: the engine itself

control = APIRouter(prefix="/api", tags=["control"])


@control.get("/health")
def health(state: State) -> dict:
    return state.health()


@control.get("/status")
def status(state: State) -> dict:
    return state.status()


class ModeBody(Body):
    mode: str


@control.post("/mode")
def set_mode(body: ModeBody, state: State) -> dict:
    return state.set_mode(body.mode)


class GenerateBody(Body):
    prompt: str | list[int]
    max_new_tokens: int | None = None   # default: 128, capped by the server's limit
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    ignore_eos: bool = False
    stop: list[str] | str | None = None
    chat: bool | None = None            # wrap text as one user message through the chat template (None: when
                                        # the model has one; token ids are never wrapped). false: raw text
    stream: bool = False                # SSE of text deltas


@control.post("/generate")
async def generate(body: GenerateBody, state: State, request: Request):
    ids = await run_in_threadpool(state.encode, body.prompt, body.chat)
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    params = state.sampling(len(ids), body.max_new_tokens, body.temperature, body.top_p, body.top_k, body.seed,
                            body.ignore_eos, stop)
    handle = state.submit(ids, params)
    if body.stream:
        async def events():
            n = 0
            async for _, d in merged([handle]):
                n += len(d.token_ids)
                ev = {"id": handle.id, "delta": d.text, "token_ids": d.token_ids, "finished": d.finished}
                if d.finished:
                    ev.update(finish_reason=d.finish_reason, error=d.error, output_tokens=n, prompt_tokens=len(ids))
                yield ev
        return sse(events())
    (out,) = await final_outputs([handle], request)
    result = {"id": out.id, "text": out.text, "token_ids": out.token_ids, "finish_reason": out.finish_reason,
              "error": out.error, "prompt_tokens": len(out.prompt_token_ids), "output_tokens": len(out.token_ids),
              "ttft_ms": _ms(out.arrival_ns, out.first_token_ns), "e2e_ms": _ms(out.arrival_ns, out.finish_ns)}
    return JSONResponse(result, status_code=500 if out.finish_reason == "error" else 200)


def _ms(t0: int | None, t1: int | None) -> float | None:
    return None if t0 is None or t1 is None else (t1 - t0) / 1e6


# ---------------------------------------------------------------------------------------- /api: load testing

load = APIRouter(prefix="/api", tags=["load"])


class BurstBody(Body):
    num_requests: int = 16
    prompt_tokens: list[int] | int | None = None      # [min, max] or one fixed length; checked in loadgen
    max_new_tokens: list[int] | int | None = None
    arrival: Literal["burst", "poisson", "gamma"] = "burst"
    rate: float = 8.0
    burstiness: float = 1.0
    ignore_eos: bool = True
    seed: int | None = None
    temperature: float = 0.0


def _spec(body: BurstBody) -> dict:
    return body.model_dump()


@load.post("/burst")
def start_burst(body: BurstBody, state: State) -> dict:
    return {"burst_id": state.start_burst(_spec(body))}


@load.get("/bursts")
def list_bursts(state: State) -> dict:
    return state.bursts.list() if state.bursts else {"bursts": [], "ab": []}


@load.get("/bursts/{burst_id}")
def burst_status(burst_id: str, state: State) -> dict:
    return state.burst_status(burst_id)


@load.post("/ab")
def start_ab(body: BurstBody, state: State) -> dict:
    return {"ab_id": state.start_ab(_spec(body))}


@load.get("/ab/{ab_id}")
def ab_status(ab_id: str, state: State) -> dict:
    return state.ab_status(ab_id)


# ------------------------------------------------------------------------------ /api: timelines and recordings

timelines = APIRouter(prefix="/api", tags=["timelines"])


def _download(data: dict, filename: str, download: bool) -> JSONResponse:
    headers = {"Content-Disposition": f'attachment; filename="{filename}"'} if download else {}
    return JSONResponse(data, headers=headers)


# plain `def` routes: building and serialising a long timeline runs in the thread pool, not on the event loop
@timelines.get("/timeline.json")
def timeline(state: State, recording: str | None = None, download: bool = False):
    return _download(state.timeline(recording), f"batchscope-{recording or 'timeline'}.json", download)


@timelines.get("/trace.json")
def perfetto_trace(state: State, recording: str | None = None, download: bool = False):
    return _download(state.perfetto(recording), f"batchscope-{recording or 'timeline'}.trace.json", download)


class RecordingBody(Body):
    name: str | None = None


@timelines.post("/recording/start")
def recording_start(state: State, body: RecordingBody | None = None) -> dict:
    return state.start_recording(body.name if body else None)


@timelines.post("/recording/stop")
def recording_stop(state: State) -> dict:
    return state.stop_recording()


@timelines.get("/recordings")
def recordings(state: State) -> dict:
    return state.recordings()


@timelines.post("/replay")
async def replay_upload(request: Request, state: State) -> dict:
    raw = await request.body()          # BodyLimit has bounded it to MAX_REPLAY_BYTES already
    if not raw:
        raise ValueError("send a batchscope.timeline/1 JSON document as the request body")
    return await run_in_threadpool(state.load_replay, raw)


@timelines.get("/replay.json")
def replay_download(state: State, download: bool = False):
    if state.replay is None:
        raise NotFoundError("no replay loaded: POST a timeline to /api/replay or start with `batchscope replay`")
    return _download(state.replay, "batchscope-replay.json", download)


# -------------------------------------------------------------------------------------- /v1: OpenAI-compatible

openai_api = APIRouter(prefix="/v1", tags=["openai"])

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "abort", "error": "error"}
CHAT_DEFAULT_MAX_TOKENS = 1024      # OpenAI's "until the context ends" is unbounded on random-weight models


class OpenAIBody(BaseModel):
    model_config = ConfigDict(extra="allow")      # clients send fields we do not use (user, metadata, ...)
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None                      # vLLM extension; -1 or 0 means off
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict | None = None
    ignore_eos: bool = False                      # vLLM extension, used by benchmark clients
    n: int = 1
    presence_penalty: float | None = None
    frequency_penalty: float | None = None


class CompletionBody(OpenAIBody):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[ContentPart] | None = None


class ChatBody(OpenAIBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    tools: list | None = None


def _unsupported(body: OpenAIBody) -> None:
    if body.n != 1:
        raise ValueError("n must be 1: batchscope returns one choice per prompt")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(body, name):
            raise ValueError(f"{name} is not supported")
    if getattr(body, "logprobs", None):
        raise ValueError("logprobs are not supported")
    if getattr(body, "echo", False):
        raise ValueError("echo is not supported")
    if getattr(body, "best_of", None) not in (None, 1):
        raise ValueError("best_of is not supported")
    if getattr(body, "tools", None):
        raise ValueError("tools are not supported")


def _openai_sampling(state: AppState, body: OpenAIBody, prompt_len: int, max_tokens: int | None):
    stop = [body.stop] if isinstance(body.stop, str) else (body.stop or [])
    top_k = body.top_k if body.top_k and body.top_k > 0 else 0
    return state.sampling(prompt_len, max_tokens, 1.0 if body.temperature is None else body.temperature,
                          1.0 if body.top_p is None else body.top_p, top_k, body.seed, body.ignore_eos, stop)


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _include_usage(body: OpenAIBody) -> bool:
    return bool((body.stream_options or {}).get("include_usage"))


@openai_api.get("/models")
def models(state: State) -> dict:
    return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": int(state.started),
                                        "owned_by": "batchscope"}]}


@openai_api.post("/completions")
async def completions(body: CompletionBody, state: State, request: Request):
    _unsupported(body)
    prompts = [body.prompt] if isinstance(body.prompt, str) or (body.prompt and isinstance(body.prompt[0], int)) \
        else list(body.prompt)
    if not prompts:
        raise ValueError("prompt is empty")
    if len(prompts) > state.limits.max_burst_requests:
        raise ValueError(f"{len(prompts)} prompts in one request, over the limit of {state.limits.max_burst_requests}")
    ids = [await run_in_threadpool(state.encode, p) for p in prompts]
    max_tokens = 16 if body.max_tokens is None else body.max_tokens        # OpenAI's default for completions
    params = [_openai_sampling(state, body, len(x), max_tokens) for x in ids]
    handles = _submit_all(state, ids, params)
    cid, created, name = f"cmpl-{uuid.uuid4().hex}", int(time.time()), state.model_name

    def chunk(choices: list, **extra) -> dict:
        return {"id": cid, "object": "text_completion", "created": created, "model": name, "choices": choices,
                **extra}

    if body.stream:
        async def events():
            produced = 0
            async for i, d in merged(handles):
                produced += len(d.token_ids)
                if d.finished and d.finish_reason == "error":
                    yield {"error": {"message": d.error or "engine error", "type": "server_error", "code": 500}}
                    return
                if d.text or d.finished:
                    yield chunk([{"index": i, "text": d.text, "logprobs": None,
                                  "finish_reason": FINISH.get(d.finish_reason) if d.finished else None}])
            if _include_usage(body):
                yield chunk([], usage=_usage(sum(map(len, ids)), produced))
        return sse(events())
    outs = await final_outputs(handles, request)
    _raise_engine_error(outs)
    choices = [{"index": i, "text": o.text, "logprobs": None, "finish_reason": FINISH.get(o.finish_reason)}
               for i, o in enumerate(outs)]
    return chunk(choices, usage=_usage(sum(map(len, ids)), sum(len(o.token_ids) for o in outs)))


def _submit_all(state: AppState, ids: list[list[int]], params: list) -> list:
    handles = []
    try:
        for x, p in zip(ids, params):
            handles.append(state.submit(x, p))
    except Exception:
        for h in handles:               # all or nothing: do not leave half a request running
            h.cancel()
        raise
    return handles


def _raise_engine_error(outs) -> None:
    for o in outs:
        if o.finish_reason == "error":
            raise EngineFailure(o.error or "engine error")


def _message_text(m: ChatMessage) -> dict:
    if m.content is None or isinstance(m.content, str):
        return {"role": m.role, "content": m.content or ""}
    texts = []
    for part in m.content:
        if part.type != "text" or part.text is None:
            raise ValueError(f"message content of type {part.type!r} is not supported (text only)")
        texts.append(part.text)
    return {"role": m.role, "content": "".join(texts)}


@openai_api.post("/chat/completions")
async def chat_completions(body: ChatBody, state: State, request: Request):
    _unsupported(body)
    messages = [_message_text(m) for m in body.messages]
    ids = await run_in_threadpool(state.encode_messages, messages)
    max_tokens = body.max_completion_tokens or body.max_tokens
    if max_tokens is None:
        room = (state.engine.info.get("max_model_len") or 10**9) - len(ids)
        max_tokens = max(1, min(CHAT_DEFAULT_MAX_TOKENS, state.limits.max_new_tokens, room))
    handle = state.submit(ids, _openai_sampling(state, body, len(ids), max_tokens))
    cid, created, name = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), state.model_name

    def chunk(choices: list, **extra) -> dict:
        return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": name,
                "choices": choices, **extra}

    if body.stream:
        async def events():
            produced = 0
            yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                          "finish_reason": None}])
            async for _, d in merged([handle]):
                produced += len(d.token_ids)
                if d.finished and d.finish_reason == "error":
                    yield {"error": {"message": d.error or "engine error", "type": "server_error", "code": 500}}
                    return
                if d.text or d.finished:
                    yield chunk([{"index": 0, "delta": {"content": d.text} if d.text else {}, "logprobs": None,
                                  "finish_reason": FINISH.get(d.finish_reason) if d.finished else None}])
            if _include_usage(body):
                yield chunk([], usage=_usage(len(ids), produced))
        return sse(events())
    (out,) = await final_outputs([handle], request)
    _raise_engine_error([out])
    return {"id": cid, "object": "chat.completion", "created": created, "model": name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": out.text}, "logprobs": None,
                         "finish_reason": FINISH.get(out.finish_reason)}],
            "usage": _usage(len(ids), len(out.token_ids))}


# ------------------------------------------------------------------------------------------------- websocket

live = APIRouter(tags=["telemetry"])


@live.websocket("/ws/telemetry")
async def telemetry_ws(ws: WebSocket):
    """Sends hello, then whatever the telemetry hub hands this viewer. The hub coalesces and, for a viewer that
    falls behind, drops frames and says so; this loop only forwards, so a stuck viewer stalls only itself."""
    state: AppState = ws.app.state.batchscope
    await ws.accept()
    closed = asyncio.create_task(_until_disconnect(ws))
    sub = None
    try:
        if state.telemetry is None:
            meta = (state.replay or {}).get("meta", {})
            await ws.send_text(json.dumps({"type": "hello", "replay_only": True, "meta": meta}))
            await closed
            return
        try:
            sub = state.telemetry.hub.subscribe()
        except TooManySubscribers as exc:
            await ws.send_text(json.dumps({"type": "error", "error": str(exc)}))
            await ws.close(code=1013, reason="too many viewers")        # 1013: try again later
            return
        await ws.send_text(json.dumps({**state.telemetry.hello(), "replay_only": False}))
        while True:
            batch = asyncio.ensure_future(sub.get_text())     # frames arrive JSON-encoded once for all viewers
            await asyncio.wait({batch, closed}, return_when=asyncio.FIRST_COMPLETED)
            if closed.done():
                batch.cancel()
                return
            for text in batch.result():
                await asyncio.wait_for(ws.send_text(text), WS_SEND_TIMEOUT_S)
    except (WebSocketDisconnect, asyncio.TimeoutError, RuntimeError, SubscriptionClosed):
        pass                            # the viewer left or stalled, or the hub closed: drop our subscription
    finally:
        closed.cancel()
        if sub is not None:
            sub.close()


async def _until_disconnect(ws: WebSocket) -> None:
    # viewers have nothing to say; reading keeps ping/close handling alive and tells us when they go
    try:
        while True:
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                return
    except (WebSocketDisconnect, RuntimeError):
        return


# ----------------------------------------------------------------------------------------------- the app

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
    for router in (control, load, timelines, openai_api, live):
        app.include_router(router)

    @app.get("/health", include_in_schema=False)
    def bare_health() -> dict:
        return state.health()           # where vLLM-style clients and load balancers look

    plotly_js = plotly_js_path()

    @app.get("/batchscope-static/plotly.min.js", include_in_schema=False)
    def plotly_bundle():
        return FileResponse(plotly_js, media_type="text/javascript", headers={"Cache-Control": "max-age=86400"})

    app.mount("/batchscope-static", StaticFiles(directory=ASSETS_DIR, check_dir=False), name="batchscope-static")

    if ui:
        mount_ui(app, state)
    # the middleware added last runs first: auth before anything reads a body
    app.add_middleware(BodyLimit)
    if token:
        app.add_middleware(TokenAuth, token=token)
    return app


def mount_ui(app: FastAPI, state: AppState) -> None:
    import gradio as gr

    from . import ui

    blocks = ui.build_ui(state)
    extra = {"theme": ui.THEME} if getattr(ui, "THEME", None) is not None else {}
    gr.mount_gradio_app(app, blocks, path="/", head=ui.HEAD, css=ui.CSS, ssr_mode=False, **extra)


# ---------------------------------------------------------------------------------------------- binding

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


def uvicorn_config(app: FastAPI, host: str = "127.0.0.1", port: int = 7860, log_level: str = "warning"):
    import uvicorn

    # no per-message deflate: compressing every frame for every viewer costs CPU the engine needs
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, ws_per_message_deflate=False,
                          timeout_graceful_shutdown=3)


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
